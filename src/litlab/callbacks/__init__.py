"""Lightning callbacks that litlab adds: speed switches, divergence guard, exact resume and
preemption, GAN evaluation, a progress bar without per-step syncs, throughput and memory monitors."""

from litlab.callbacks.gan import FID, SampleGrid
from litlab.callbacks.guard import DivergenceGuard
from litlab.callbacks.monitor import PeakMemory, Throughput
from litlab.callbacks.preemption import Preemption, RNGState
from litlab.callbacks.progress import ProgressBar
from litlab.callbacks.speed import Speed

__all__ = [
    "FID",
    "DivergenceGuard",
    "PeakMemory",
    "Preemption",
    "ProgressBar",
    "RNGState",
    "SampleGrid",
    "Speed",
    "Throughput",
]
