"""Per-batch image transforms that run on the batch's device: no per-sample Python.

torchvision's v2 transforms draw one random parameter per call, i.e. per batch; augmentation
here draws per sample, which is what training wants when whole batches are transformed at once.
Random resized crops use torchvision's roi_align: one batched call, a box per image.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def per_channel(values: Sequence[float], device: torch.device | str | None = None) -> torch.Tensor:
    """One value per channel (or one for all), shaped [1, C, 1, 1] to broadcast over a batch."""
    return torch.tensor(values, dtype=torch.float32, device=device).view(1, -1, 1, 1)


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


def random_boxes(
    n: int,
    height: int,
    width: int,
    scale: Sequence[float],
    ratio: Sequence[float],
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    attempts: int = 10,
    strict: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes drawn as torchvision's RandomResizedCrop and RandomErasing draw theirs, for ``n``
    images at once: up to ``attempts`` draws of a fraction ``scale`` of the area and an aspect
    w/h in ``ratio`` (log-uniform), sides rounded to whole pixels; the first draw that fits the
    image (``strict``: smaller than it, as RandomErasing asks) at a uniform whole-pixel position.
    Returns [n, 4] boxes (x1, y1, x2, y2) and whether each image had a draw that fits (where
    not, its box is meaningless: each caller has its own fallback)."""
    shape = (n, attempts)
    area = torch.empty(shape, device=device).uniform_(scale[0], scale[1], generator=generator)
    log_ratio = torch.empty(shape, device=device).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator
    )
    aspect = log_ratio.exp()
    w = (area * height * width * aspect).sqrt().round()
    h = (area * height * width / aspect).sqrt().round()
    if strict:
        fits = (w >= 1) & (w < width) & (h >= 1) & (h < height)
    else:
        fits = (w >= 1) & (w <= width) & (h >= 1) & (h <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first attempt that fits
    found = fits.any(dim=1)
    w = torch.where(found, w.gather(1, first).squeeze(1), width)
    h = torch.where(found, h.gather(1, first).squeeze(1), height)
    u = torch.rand(n, 2, device=device, generator=generator)
    x = (u[:, 0] * (width - w + 1)).floor().clamp(max=width - w)  # u < 1, but float rounding
    y = (u[:, 1] * (height - h + 1)).floor().clamp(max=height - h)
    return torch.stack([x, y, x + w, y + h], dim=1), found


def crop_boxes(
    n: int,
    height: int,
    width: int,
    scale: Sequence[float],
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """RandomResizedCrop's boxes, one per image: a fraction ``scale`` of the area with aspect
    ``ratio`` at a uniform position (``random_boxes``); an image with no draw that fits gets
    torchvision's fallback, the whole image cut to the nearest allowed aspect, centred. [n, 4]
    as (x1, y1, x2, y2) in whole pixels. (Clipping a box that does not fit instead, as litlab
    did before, keeps large draws large: at scale (0.08, 1) a mean area of 0.535 where
    torchvision's is 0.488 on square images, 0.506 where it is 0.391 on 256 x 384.)"""
    boxes, found = random_boxes(n, height, width, scale, ratio, generator, device)
    in_ratio = width / height
    w = width if in_ratio <= max(ratio) else round(height * max(ratio))
    h = height if in_ratio >= min(ratio) else round(width / min(ratio))
    x, y = (width - w) // 2, (height - h) // 2
    # Python scalars, not a tensor made on the device: no host-to-device copy (a sync) a batch
    centred = (x, y, x + w, y + h)
    return torch.stack([torch.where(found, boxes[:, i], v) for i, v in enumerate(centred)], 1)


def centre_boxes(n: int, h: int, w: int, fraction: float, device: torch.device) -> torch.Tensor:
    """``n`` copies of the box of the centre square of ``fraction`` of the shorter side, in whole
    pixels (as torchvision's CenterCrop, and as the CPU crops any box): the same pixels on every
    device, and no resampling on an accelerator where the crop is the output's size."""
    side = round(min(h, w) * fraction)
    x, y = round((w - side) / 2), round((h - side) / 2)  # as CenterCrop places it
    # filled from Python scalars, not a tensor made on the device: no host-to-device copy (a
    # sync) a batch
    box = torch.empty(n, 4, device=device)
    for i, value in enumerate((x, y, x + side, y + side)):
        box[:, i] = value
    return box


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Each uint8 image's box, resized to ``size``, antialiased when shrinking: uint8 on the CPU,
    float (0..255) elsewhere.

    On an accelerator: torchvision's roi_align, one batched call (as many bilinear samples per
    output pixel as the box shrinks: an area average when downscaling, exact at 1:1). On the
    CPU that call is slower than torch's uint8 antialiased resize per image (AVX2 kernels,
    channels_last; docs/benchmarks.md, P2 folders), which crops at whole pixels as torchvision's
    RandomResizedCrop does. The loop runs on one thread: these calls are too small to share, and
    OpenMP's hand-offs cost more than they save (about half the loop's time on 2 cores)."""
    if images.device.type != "cpu":
        return roi_crops(images, boxes, size)
    n, c = images.shape[:2]
    out = torch.empty((n, c, *size), dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, (x1, y1, x2, y2) in enumerate(boxes.round().long().tolist()):
            crop = images[i : i + 1, :, y1 : max(y2, y1 + 1), x1 : max(x2, x1 + 1)]
            crop = crop.contiguous(memory_format=torch.channels_last)
            out[i : i + 1] = F.interpolate(crop, size=tuple(size), mode="bilinear", antialias=True)
    finally:
        torch.set_num_threads(threads)
    return out


def roi_crops(images: torch.Tensor, boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """resized_crops in one batched torchvision roi_align call (any device)."""
    from torchvision.ops import roi_align

    index = torch.arange(len(boxes), device=boxes.device, dtype=boxes.dtype)[:, None]
    boxes = torch.cat([index, boxes], 1)
    return roi_align(images.float(), boxes, tuple(size), 1.0, -1, aligned=True)


class BatchTransform:
    """uint8 batch -> (optionally augmented) float batch normalized with mean/std (one, or per
    channel), at ``size`` when given (images stored larger are cropped and resized).

    Training: a random resized crop per image (``crop_scale``: area fraction range, e.g.
    (0.35, 1)), translation, flip, then ``augment`` (a callable on float 0..255 batches, e.g.
    litlab.data.autoaugment.TrivialAugment); evaluation: the centre square of ``eval_crop`` of
    the side, resized (torchvision's Resize + CenterCrop at 0.875 for ImageNet-style evaluation).
    Without ``crop_scale``, training takes evaluation's frame (the whole image at
    ``eval_crop=1``, as every in-memory source's recipe has it).
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        hflip: bool = False,
        translate: int = 0,
        size: Sequence[int] | None = None,
        crop_scale: Sequence[float] | None = None,
        eval_crop: float = 1.0,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.mean, self.std = per_channel(mean), per_channel(std)
        self.augment = augment
        self.hflip = hflip
        self.translate = translate
        self.size = tuple(size) if size is not None else None
        self.crop_scale = tuple(crop_scale) if crop_scale is not None else None
        self.eval_crop = eval_crop

    def _resize(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        """uint8 [N, C, H, W] -> [N, C, *size] (cropped as the split wants): uint8 on the CPU, float
        0..255 where roi_align crops."""
        n, _, h, w = images.shape
        if train and self.crop_scale is not None:
            boxes = crop_boxes(n, h, w, self.crop_scale, device=images.device)
        elif (h, w) != self.size or self.eval_crop < 1.0:
            boxes = centre_boxes(n, h, w, self.eval_crop, images.device)
        else:
            return images
        return resized_crops(images, boxes, self.size)

    def eval_pixels(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images framed as evaluation frames them (the centre ``eval_crop`` of the side,
        resized to ``size``), still uint8 0..255 and on their device: real images for metrics
        that compare pixels with a generator's (FID), which must see what the models see."""
        if self.size is None:
            return images
        view = self._resize(images, train=False)
        return view if view.dtype == torch.uint8 else view.round_().clamp_(0, 255).byte()

    def __call__(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        # Crops, shifts and flips move whole pixels: done on uint8 where the batch still is
        # (a quarter of float's memory traffic), then one conversion and normalization.
        if self.size is not None:
            images = self._resize(images, train)
        if train and self.translate:
            images = random_translate(images, self.translate)
        if train and self.hflip:
            images = random_hflip(images)
        if train and self.augment is not None:
            images = self.augment(images.float())
        if self.mean.device != images.device:
            self.mean, self.std = self.mean.to(images.device), self.std.to(images.device)
        # (x / 255 - mean) / std: one new float tensor, then in place (the same values)
        return images.div(255.0).sub_(self.mean).div_(self.std)

    def to_unit(self, normalized: torch.Tensor) -> torch.Tensor:
        """Map normalized images back to [0, 1] pixels (for grids and feature extractors)."""
        return (
            normalized * self.std.to(normalized.device) + self.mean.to(normalized.device)
        ).clamp(0, 1)
