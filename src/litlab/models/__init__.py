"""LightningModules: the science (steps, losses, optimizers) of each model family."""

from litlab.models.classifier import ImageClassifier

__all__ = ["ImageClassifier"]
