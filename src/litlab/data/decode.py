"""JPEGs decoded on the run's device, a whole batch at once (nvJPEG on a GPU).

With ``data.source.decode=device`` (files read as they go: an image folder with
``cache=false``, or streamed chunks), the loader's workers only read each file: a JPEG travels
on as its encoded bytes (``folder.worker_item``), and the main process decodes the whole batch
in one call of torchvision's ``decode_jpeg`` on the run's device (nvJPEG on CUDA,
libjpeg-turbo on a CPU run), then takes each image's centre square at the stored size, resized
bicubic with antialiasing (torch's, within a few levels of PIL's at any scale: up to 6-7 on a
56-px JPEG shrunk 1.56x, review 171; the workers' PIL path decodes JPEGs at reduced
scale first, so the two paths' pixels differ more where a file is reduced 2x or more: 3 levels on
average, up to about 25 at sharp edges, measured on 64-px crops of 300-500-px JPEGs; 5-13 on
average, up to 91, on fine patterns such as an 8-px checkerboard, where the reduced-scale decode
is the inexact one; a run uses one path throughout, FID's real images included). Other formats
and unusual JPEGs are still decoded in the workers. CUDA is never touched inside a worker (it
does not survive their fork); a JPEG the decoder refuses is decoded by PIL instead, and one
nothing decodes is skipped and counted.

torchvision 0.29 deprecates its decoders for TorchCodec's (same call, ``torchcodec.decoders``);
torchvision's is used because it ships with every torch install, the GPU machines included.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.data.pixels import Unreadable, load_image
from litlab.errors import DataError

log = logging.getLogger(__name__)

RESIZE_BYTES = 1 << 30  # float pixels resized in one call at most (huge images: fewer a call)


class Encoded:
    """A batch's images as the workers handed them (JPEG bytes or pixels). Not a tensor nor a
    collection: Lightning's transfer to the device and the loader's pinning (torch pins only
    what has a ``pin_memory`` method) leave it on the host, where ``decode_jpeg`` wants it."""

    def __init__(self, items: Sequence[Tensor], files: Sequence[str] = ()) -> None:
        self.items, self.files = list(items), list(files)  # files: what an unreadable is counted as

    def __repr__(self) -> str:
        return f"Encoded({len(self.items)} images)"


def _decode_jpeg(data: list[Tensor], channels: int, device: torch.device) -> list[Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module's docstring
        return decode_jpeg(data, mode=mode, device=device)


def _decoded(
    data: list[Tensor], size: int, channels: int, device: torch.device
) -> list[Tensor | None]:
    """The JPEGs decoded in one call; when the decoder refuses the call (one file fails it
    all), each half again, down to the file, which PIL then decodes or nothing does (None)."""
    try:
        return list(_decode_jpeg(data, channels, device))
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:
        if len(data) > 1:
            half = len(data) // 2
            head = _decoded(data[:half], size, channels, device)
            return head + _decoded(data[half:], size, channels, device)
    try:
        pixels = load_image(io.BytesIO(data[0].numpy().tobytes()), size, channels)
        return [torch.from_numpy(pixels)]
    except Exception as e:  # a damaged file is a skip, whatever PIL raises
        warnings.warn(f"skipped an image that does not decode: {e}", stacklevel=2)
        return [None]


def centre_squares(images: Sequence[Tensor], size: int) -> Tensor:
    """uint8 [C, H, W] images (any sizes, one device) -> uint8 [n, C, size, size]: the centre
    square of the shorter side (the box ``load_image`` takes), resized bicubic with
    antialiasing; one resize call per distinct square side (and at most RESIZE_BYTES a call)."""
    by_side: dict[int, list[int]] = {}
    squares = []
    for i, image in enumerate(images):
        h, w = image.shape[-2:]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        squares.append(image[:, top : top + side, left : left + side])
        by_side.setdefault(side, []).append(i)
    c = images[0].shape[0]
    pieces, order = [], []
    for side, index in by_side.items():
        step = max(1, RESIZE_BYTES // (4 * c * side * side))
        for start in range(0, len(index), step):
            batch = torch.stack([squares[i] for i in index[start : start + step]])
            if side != size:
                batch = F.interpolate(batch.float(), (size, size), mode="bicubic", antialias=True)
                batch = batch.round_().clamp_(0, 255).to(torch.uint8)
            pieces.append(batch)
        order += index
    out = torch.cat(pieces)
    if len(by_side) == 1:  # already in the batch's order
        return out
    where = torch.empty(len(order), dtype=torch.long)
    where[torch.tensor(order)] = torch.arange(len(order))
    return out.index_select(0, _to(where, out.device))


def _to(index: Tensor, device: torch.device) -> Tensor:
    """A host index on ``device`` without waiting for it (pinned memory, when on CUDA)."""
    if device.type != "cuda":
        return index
    return index.pin_memory().to(device, non_blocking=True)


def decode(
    encoded: Encoded, size: int, channels: int, device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """A batch's images as uint8 [n, channels, size, size] on ``device``, in the batch's order,
    and a bool mask (on the host) of the batch's positions they fill (False: did not decode)."""
    device = torch.device(device)
    items = encoded.items
    pictures: list[Tensor | None] = [t if t.dim() == 3 else None for t in items]
    jpegs = [i for i, t in enumerate(items) if t.dim() == 1]
    if jpegs:
        if device.type == "cuda":
            # torchvision decodes on a stream of its own that does not wait for this one: its
            # output could take memory that queued kernels of the last step still read
            # (pytorch/vision#9606; torchcodec synchronizes likewise, meta-pytorch/torchcodec#1634)
            torch.cuda.current_stream(device).synchronize()
        decoded = _decoded([items[i] for i in jpegs], size, channels, device)
        for i, image in zip(jpegs, decoded, strict=True):
            pictures[i] = image
    keep = torch.tensor([p is not None for p in pictures])
    found = [p.to(device) for p in pictures if p is not None]
    if not found:
        return torch.empty((0, channels, size, size), dtype=torch.uint8, device=device), keep
    return centre_squares(found, size), keep


def kept(labels: Tensor, keep: Tensor) -> Tensor:
    """The labels of the images that decoded (``keep`` on the host), without a device sync."""
    if bool(keep.all()):
        return labels
    return labels.index_select(0, _to(keep.nonzero().squeeze(1), labels.device))


def skip_unreadable(batch: list) -> tuple[Tensor | Encoded, Tensor, list[Unreadable]]:
    """Collate a file-reading loader's batch: the readable samples, and the files skipped
    (third; ``Unreadable`` items). Pixels become one uint8 tensor; a batch with encoded JPEGs
    (samples of (image, label, file)) stays ``Encoded``, naming its files."""
    good = [b for b in batch if not isinstance(b, Unreadable)]
    skipped = [b for b in batch if isinstance(b, Unreadable)]
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), skipped
    if any(b[0].dim() == 1 for b in good):
        labels = torch.tensor([int(b[1]) for b in good])
        return Encoded([b[0] for b in good], [b[2] for b in good]), labels, skipped
    images, labels = torch.utils.data.default_collate([b[:2] for b in good])
    return images, labels, skipped


def all_unreadable(labels: Tensor, trainer: Any) -> bool:
    """Whether a training batch lost every image to unreadable files (``skip_unreadable``): one
    process then skips the step, as Lightning allows; the ranks of a multi-process fit cannot
    (each training step is a collective): one clear line instead. (Evaluation steps run empty
    batches through, their values logged with no weight: every rank logs what the others do.)"""
    if len(labels):
        return False
    if trainer.world_size > 1:
        raise DataError(
            f"every file of a training batch on rank {trainer.global_rank} was unreadable, "
            "which the ranks of a multi-process run cannot skip; list the unreadable files "
            "with python -m litlab.data.check <root> and remove them, or set "
            "data.source.cache=true (unreadable files are left out before training)"
        )
    return True


def stack_samples(items: Sequence, shape: Sequence[int], chunk: int = 256) -> tuple[Tensor, Tensor]:
    """A dataset's items read one at a time (metrics such as FID's real statistics), as uint8
    [n, *shape] on the CPU and their labels: JPEGs left encoded are decoded here, ``chunk`` at a
    time; unreadable ones dropped, and said (the loaders' workers no longer say them)."""
    images, labels = [torch.empty((0, *shape), dtype=torch.uint8)], [torch.empty(0).long()]
    dropped: list[Unreadable] = []
    for start in range(0, len(items), chunk):
        pixels, these, skipped = skip_unreadable(list(items[start : start + chunk]))
        dropped += skipped
        if isinstance(pixels, Encoded):
            pixels, keep = decode(pixels, shape[1], shape[0], "cpu")
            these = kept(these, keep)
        if len(these):
            images.append(pixels)
            labels.append(these)
    if dropped:
        first = dropped[0]
        log.warning(
            "skipped %d unreadable image(s) of %d, e.g. %s (%s)",
            len(dropped),
            len(items),
            first.file,
            first.reason or "?",
        )
    return torch.cat(images), torch.cat(labels)
