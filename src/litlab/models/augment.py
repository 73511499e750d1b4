"""Training-batch augmentation that a classifier applies in its step: random erasing per image.

Mixup and CutMix come from torchvision (``torchvision.transforms.v2.MixUp``/``CutMix``), whose
one draw per batch is what mixing wants. torchvision's ``RandomErasing`` also draws once per
call: on a batch it would erase the same rectangle in every image, or in none (torchvision
issue #8484). Here each image gets its own draw, in a few batched tensor ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from litlab.data.transforms import random_boxes
from litlab.errors import ConfigError


def random_erasing(
    images: Tensor,
    p: float = 0.5,
    scale: Sequence[float] = (0.02, 0.33),
    ratio: Sequence[float] = (0.3, 3.3),
    value: float | None = 0.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Erase one rectangle in each image with probability ``p``: a fraction ``scale`` of the
    area, aspect ``ratio`` (log-uniform), at a uniform position; filled with ``value``, or
    with standard normal noise per pixel when ``value`` is None, in the normalized space (as
    timm's and torchvision's "random" value; Zhong et al. 2020's RE-R draws uniform pixels).

    The boxes are torchvision's (``random_boxes``: up to 10 draws, the first smaller than the
    image; none: nothing erased), its aspect h/w in ``ratio``.
    """
    n, _, h, w = images.shape
    device = images.device
    inverse = (1 / ratio[1], 1 / ratio[0])  # random_boxes' aspect is w/h
    boxes, found = random_boxes(n, h, w, scale, inverse, generator, device, strict=True)
    left, top, right, bottom = boxes.unbind(1)
    erase = (torch.rand(n, device=device, generator=generator) < p) & found
    rows = torch.arange(h, device=device)[None, :, None]
    cols = torch.arange(w, device=device)[None, None, :]
    inside = (
        (rows >= top[:, None, None])
        & (rows < bottom[:, None, None])
        & (cols >= left[:, None, None])
        & (cols < right[:, None, None])
        & erase[:, None, None]
    )
    if value is None:
        fill = torch.randn(images.shape, device=device, dtype=images.dtype, generator=generator)
    else:
        fill = torch.full((), value, device=device, dtype=images.dtype)
    return torch.where(inside[:, None], fill, images)


class RandomErasing:
    """random_erasing with its settings, as a classifier's ``erasing`` (images normalized:
    ``value=0`` fills with the data's mean)."""

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: float | None = 0.0,
    ) -> None:
        if not 0.0 <= p <= 1.0 or not 0.0 < scale[0] <= scale[1] <= 1.0 or ratio[0] <= 0:
            raise ConfigError(
                f"RandomErasing needs 0 <= p <= 1, 0 < scale[0] <= scale[1] <= 1, ratio > 0; "
                f"got p={p}, scale={list(scale)}, ratio={list(ratio)}"
            )
        self.p, self.scale, self.ratio, self.value = p, tuple(scale), tuple(ratio), value

    def __call__(self, images: Tensor) -> Tensor:
        return random_erasing(images, self.p, self.scale, self.ratio, self.value)

    def __repr__(self) -> str:
        return (
            f"RandomErasing(p={self.p}, scale={self.scale}, ratio={self.ratio}, value={self.value})"
        )
