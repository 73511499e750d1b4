"""Differentiable augmentation for GANs (DiffAugment, Zhao et al. 2020).

A discriminator that sees augmented real images beside plain generated ones teaches the
generator the augmentation (shifted borders, cut-out squares). DiffAugment applies the same
kind of random transform to every image D sees, real or generated, in D's step and in G's step;
the transforms are differentiable, so G learns through them. The three policies follow the
authors' reference implementation (mit-han-lab/data-efficient-gans, DiffAugment_pytorch.py):
translation by up to 1/8 of the size (zero fill), cutout of a half-size square, and colour
(brightness, saturation, contrast). Parameters are drawn per image from the generator given,
so that a GAN's ranks draw different ones and a resumed run draws the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from litlab.data.transforms import random_translate
from litlab.errors import ConfigError

POLICIES = ("color", "translation", "cutout")


def _uniform(images: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.rand(
        images.shape[0], 1, 1, 1, dtype=images.dtype, device=images.device, generator=generator
    )


def random_color(images: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Brightness +U(-0.5, 0.5), saturation x U(0, 2), contrast x U(0.5, 1.5), per image."""
    images = images + (_uniform(images, generator) - 0.5)
    mean = images.mean(dim=1, keepdim=True)
    images = (images - mean) * (_uniform(images, generator) * 2) + mean
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    return (images - mean) * (_uniform(images, generator) + 0.5) + mean


def random_cutout(
    images: Tensor, ratio: float = 0.5, generator: torch.Generator | None = None
) -> Tensor:
    """Zero a square of ``ratio`` times the image size at a random centre (clipped at the edges)."""
    n, _, h, w = images.shape
    ch, cw = int(h * ratio + 0.5), int(w * ratio + 0.5)
    device = images.device
    top = torch.randint(0, h + 1 - ch % 2, (n, 1, 1), device=device, generator=generator) - ch // 2
    left = torch.randint(0, w + 1 - cw % 2, (n, 1, 1), device=device, generator=generator) - cw // 2
    rows = torch.arange(h, device=device)[None, :, None]
    cols = torch.arange(w, device=device)[None, None, :]
    inside = (rows >= top) & (rows < top + ch) & (cols >= left) & (cols < left + cw)
    return images * (~inside).unsqueeze(1).to(images.dtype)


def parse_policy(policy: str | Sequence[str] | None) -> tuple[str, ...]:
    """["translation", "cutout"] (or "translation,cutout") -> a tuple; None or empty -> ()."""
    if not policy:
        return ()
    names = tuple(p.strip() for p in (policy.split(",") if isinstance(policy, str) else policy))
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise ConfigError(
            f"diffaugment takes a list of {', '.join(POLICIES)}, e.g. [translation,cutout]; "
            f"got {unknown}"
        )
    return names


def diff_augment(
    images: Tensor, policy: Sequence[str], generator: torch.Generator | None = None
) -> Tensor:
    """Apply the policies in order (as the reference does: color, translation, cutout)."""
    for name in policy:
        if name == "color":
            images = random_color(images, generator)
        elif name == "translation":
            shift = int(min(images.shape[-2:]) * 0.125 + 0.5)
            images = random_translate(images, shift, generator)
        else:
            images = random_cutout(images, 0.5, generator)
    return images
