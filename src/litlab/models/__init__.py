"""LightningModules: the science (steps, losses, optimizers) of each model family."""

from litlab.models.classifier import ImageClassifier
from litlab.models.gan import GAN

__all__ = ["GAN", "ImageClassifier"]
