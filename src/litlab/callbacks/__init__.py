"""Lightning callbacks that litlab adds: a ModelCheckpoint that costs less per step, early
stopping that keeps its patience when resumed, speed switches, divergence guard, exact resume and
preemption, EMA of the weights, GAN evaluation, a progress bar without per-step syncs,
throughput and memory monitors, a model summary that counts FLOPs."""

from litlab.callbacks.checkpoint import ModelCheckpoint
from litlab.callbacks.early_stopping import EarlyStopping
from litlab.callbacks.ema import EMA
from litlab.callbacks.gan import FID, SampleGrid
from litlab.callbacks.guard import DivergenceGuard
from litlab.callbacks.monitor import LearningRateMonitor, PeakMemory, Throughput
from litlab.callbacks.preemption import Preemption, RNGState
from litlab.callbacks.progress import ProgressBar
from litlab.callbacks.speed import Speed
from litlab.callbacks.summary import ModelSummary

__all__ = [
    "EMA",
    "FID",
    "DivergenceGuard",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "PeakMemory",
    "Preemption",
    "ProgressBar",
    "RNGState",
    "SampleGrid",
    "Speed",
    "Throughput",
]
