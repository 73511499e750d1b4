"""Lightning callbacks that litlab adds: speed switches, divergence guard, exact resume and
preemption, GAN evaluation, throughput and memory monitors."""

from litlab.callbacks.gan import FID, SampleGrid
from litlab.callbacks.guard import DivergenceGuard
from litlab.callbacks.monitor import PeakMemory, Throughput
from litlab.callbacks.resume import Preemption, RNGState
from litlab.callbacks.speed import Speed

__all__ = [
    "FID",
    "DivergenceGuard",
    "PeakMemory",
    "Preemption",
    "RNGState",
    "SampleGrid",
    "Speed",
    "Throughput",
]
