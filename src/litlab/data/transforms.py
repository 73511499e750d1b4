"""Per-batch image transforms that run on the batch's device: no per-sample Python.

torchvision's v2 transforms draw one random parameter per call, i.e. per batch; augmentation
here draws per sample, which is what training wants when whole batches are transformed at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def random_hflip(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mirror a random half of the batch left-right."""
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(3), images)


def random_translate(
    images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shift each image by up to ``max_shift`` pixels in x and y, filling with zeros.

    Same as torchvision's RandomCrop(size, padding=max_shift), drawn per sample. An index
    gather: differentiable with respect to the pixels (DiffAugment uses it on generated images).
    """
    n, c, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    dy, dx = torch.randint(
        0, 2 * max_shift + 1, (2, n, 1), device=images.device, generator=generator
    )
    rows = (dy + torch.arange(h, device=images.device))[:, None, :, None]
    cols = (dx + torch.arange(w, device=images.device))[:, None, None, :]
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


class BatchTransform:
    """uint8 batch -> (optionally augmented) float batch normalized with mean/std (one, or per channel)."""

    def __init__(
        self, mean: Sequence[float], std: Sequence[float], hflip: bool = False, translate: int = 0
    ):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.hflip = hflip
        self.translate = translate

    def __call__(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        if train and self.translate:
            images = random_translate(images, self.translate)
        if train and self.hflip:
            images = random_hflip(images)
        if self.mean.device != images.device:
            self.mean, self.std = self.mean.to(images.device), self.std.to(images.device)
        return (images.float() / 255.0 - self.mean) / self.std

    def to_unit(self, normalized: torch.Tensor) -> torch.Tensor:
        """Map normalized images back to [0, 1] pixels (for grids and feature extractors)."""
        return (
            normalized * self.std.to(normalized.device) + self.mean.to(normalized.device)
        ).clamp(0, 1)
