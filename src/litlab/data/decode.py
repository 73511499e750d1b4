"""JPEGs decoded on the run's device, a whole batch at once (nvJPEG on a GPU).

With ``data.source.decode=device`` (files read as they go: an image folder with
``cache=false``, or streamed chunks), the loader's workers only read each file: a JPEG travels
on as its encoded bytes, and the main process decodes the whole batch in one call of
torchvision's ``decode_jpeg`` on the run's device (nvJPEG on CUDA, libjpeg-turbo on a CPU run),
then takes each image's centre square at the stored size, as the workers' PIL path does
(``folder.load_image``). Other formats (PNG, WebP, ...) are still decoded in the workers.
CUDA is never touched inside a worker (it does not survive their fork); a JPEG nvJPEG refuses
(some CMYK files) is decoded by PIL instead, and one nothing decodes is skipped and counted.

torchvision 0.29 deprecates its decoders for TorchCodec's (same call, ``torchcodec.decoders``);
torchvision's is used because it ships with every torch install, the GPU machines included.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.data.folder import load_image

JPEG_START = b"\xff\xd8\xff"


def worker_item(data: bytes, size: int, channels: int) -> Tensor:
    """What a loader's worker hands on for one file: a JPEG as its bytes (uint8 [n]) for the
    device to decode, any other format decoded here (uint8 [channels, size, size])."""
    if data[:3] == JPEG_START:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.from_numpy(load_image(io.BytesIO(data), size, channels))


class Encoded:
    """A batch's images as the workers handed them (JPEG bytes or pixels). Not a tensor nor a
    collection: Lightning's transfer to the device and the loader's pinning leave it on the
    host, where ``decode_jpeg`` wants its input."""

    def __init__(self, items: Sequence[Tensor]) -> None:
        self.items = list(items)

    def __repr__(self) -> str:
        return f"Encoded({len(self.items)} images)"


def _decode_jpeg(data: list[Tensor], channels: int, device: torch.device) -> list[Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module's docstring
        return decode_jpeg(data, mode=mode, device=device)


def _one(data: Tensor, size: int, channels: int, device: torch.device) -> Tensor | None:
    """One JPEG the batched call refused: on the device alone, else by PIL, else None."""
    try:
        return _decode_jpeg([data], channels, device)[0]
    except RuntimeError:
        pass
    try:
        return torch.from_numpy(load_image(io.BytesIO(data.numpy().tobytes()), size, channels))
    except Exception as e:  # a damaged file is a skip, whatever PIL raises
        warnings.warn(f"skipped an image that does not decode: {e}", stacklevel=2)
        return None


def centre_squares(images: Sequence[Tensor], size: int) -> Tensor:
    """uint8 [C, H, W] images (any sizes, one device) -> uint8 [n, C, size, size]: the centre
    square of the shorter side (the box ``load_image`` takes), resized bicubic with
    antialiasing; one resize call per distinct square side."""
    by_side: dict[int, list[int]] = {}
    squares = []
    for i, image in enumerate(images):
        h, w = image.shape[-2:]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        squares.append(image[:, top : top + side, left : left + side])
        by_side.setdefault(side, []).append(i)
    c = images[0].shape[0]
    out = torch.empty((len(images), c, size, size), dtype=torch.uint8, device=images[0].device)
    for side, index in by_side.items():
        batch = torch.stack([squares[i] for i in index])
        if side != size:
            batch = F.interpolate(batch.float(), (size, size), mode="bicubic", antialias=True)
            batch = batch.round_().clamp_(0, 255).to(torch.uint8)
        out[torch.tensor(index, device=out.device)] = batch
    return out


def decode(
    encoded: Encoded, size: int, channels: int, device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """A batch's images as uint8 [n, channels, size, size] on ``device``, and a bool mask of
    the batch's positions they fill (False: did not decode, skipped)."""
    device = torch.device(device)
    items = encoded.items
    pictures: list[Tensor | None] = [t if t.dim() == 3 else None for t in items]
    jpegs = [i for i, t in enumerate(items) if t.dim() == 1]
    if jpegs:
        try:
            decoded: list[Tensor | None] = list(
                _decode_jpeg([items[i] for i in jpegs], channels, device)
            )
        except RuntimeError:  # one file the decoder refuses fails the whole call
            decoded = [_one(items[i], size, channels, device) for i in jpegs]
        for i, image in zip(jpegs, decoded, strict=True):
            pictures[i] = image
    keep = torch.tensor([p is not None for p in pictures])
    found = [p.to(device, non_blocking=True) for p in pictures if p is not None]
    if not found:
        return torch.empty((0, channels, size, size), dtype=torch.uint8, device=device), keep
    return centre_squares(found, size), keep


def skip_unreadable(batch: list) -> tuple[Tensor | Encoded, Tensor, int]:
    """Collate a file-reading loader's batch: the readable samples, and how many were skipped
    (third). Pixels become one uint8 tensor; a batch with encoded JPEGs stays ``Encoded``."""
    good = [b for b in batch if b is not None]
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), len(batch)
    if any(image.dim() == 1 for image, _ in good):
        labels = torch.tensor([int(label) for _, label in good])
        return Encoded([image for image, _ in good]), labels, len(batch) - len(good)
    images, labels = torch.utils.data.default_collate(good)
    return images, labels, len(batch) - len(good)


def pixels(item: Tensor, size: int, channels: int) -> Tensor:
    """One worker item as uint8 [channels, size, size] on the CPU (metrics that read a split's
    images one by one, such as FID's real statistics)."""
    if item.dim() == 3:
        return item
    images, keep = decode(Encoded([item]), size, channels, "cpu")
    if not keep[0]:
        raise ValueError("an image of the split does not decode")
    return images[0]
