"""Lightning callbacks that litlab adds: speed switches, divergence guard, GAN evaluation."""

from litlab.callbacks.gan import FID, SampleGrid
from litlab.callbacks.guard import DivergenceGuard
from litlab.callbacks.speed import Speed

__all__ = ["FID", "DivergenceGuard", "SampleGrid", "Speed"]
