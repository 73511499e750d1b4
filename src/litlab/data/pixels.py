"""One image file into a uint8 array, as image folders store and read them: the centre square
of its shorter side at a fixed size (JPEGs decoded at 1/2 to 1/8 scale where that still covers
it), upright as viewers show it (EXIF orientation), in 8 bits and the chosen channels (CMYK,
palette, RGBA without its alpha, 16-bit scaled to 8); files that do not decode are named with
the reason (``why_unreadable``) and skipped by the datasets that read them."""

from __future__ import annotations

import io
import logging
import re
import warnings
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps

from litlab.errors import ConfigError, first_line

log = logging.getLogger(__name__)


# Wider gray modes to 8 bits by a fixed scale of their mode, the same for every file (a raw
# value is one gray in the whole folder): integers (16-bit PNG and TIFF) from 0-65535, floats
# from 0-1.
_WIDE_GRAY_TOP = {"I;16": 65535.0, "I;16B": 65535.0, "I;16L": 65535.0, "I": 65535.0, "F": 1.0}


def eight_bit(image: Image.Image, channels: int) -> Image.Image:
    """Any PIL mode as 8-bit grayscale (channels=1) or RGB (3)."""
    top = _WIDE_GRAY_TOP.get(image.mode)
    if top is not None:
        pixels = np.asarray(image, dtype=np.float64) * (255.0 / top)
        image = Image.fromarray(pixels.round().clip(0, 255).astype(np.uint8))
    return image.convert("L" if channels == 1 else "RGB")  # CMYK, P, LA, RGBA, 1, ...


def check_decoded_shape(size: int, channels: int) -> None:
    """What ``load_image`` can make: a positive side, gray or RGB."""
    if channels not in (1, 3):
        raise ConfigError(f"channels must be 1 or 3, got {channels}")
    if size < 1:
        raise ConfigError(f"size must be a positive number of pixels, got {size}")


def check_decode(where: str, cache: bool = False) -> None:
    """Where files read as they go are decoded: in the loader's workers (PIL) or on the run's
    device (litlab.data.decode); a cached folder was decoded once already."""
    if where not in ("workers", "device"):
        raise ConfigError(f"data.source.decode must be 'workers' or 'device', got {where!r}")
    if where == "device" and cache:
        raise ConfigError(
            "data.source.decode=device decodes files as they are read: set data.source.cache=false "
            "(a cached folder is decoded once, by every core, and read as pixels)"
        )


def turned(image: Image.Image) -> bool:
    """Whether a picture is stored turned or mirrored, with an EXIF orientation saying how to
    show it (phone and camera photos; viewers and browsers show it upright). A damaged EXIF
    block reads as not turned: the pixels are still there."""
    try:
        return image.getexif().get(ExifTags.Base.Orientation, 1) in range(2, 9)
    except Exception:  # PIL raises many kinds for a malformed EXIF block
        return False


def upright(image: Image.Image) -> Image.Image:
    """The picture as viewers show it: its EXIF orientation applied (torchvision's ImageFolder
    and timm do not: a model would learn, and be tested on, photos lying on their side)."""
    return ImageOps.exif_transpose(image) if turned(image) else image


def load_image(path: str | Path | BinaryIO, size: int, channels: int) -> np.ndarray:
    """The centre square of an image (a file, or its bytes in a file object), upright (its EXIF
    orientation applied), resized to ``size``: uint8 [channels, size, size]."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # refuse, don't thrash
        with Image.open(path) as image:
            # JPEG: decode at the smallest 1/2..1/8 scale that still covers size x size.
            image.draft("L" if channels == 1 else "RGB", (size, size))
            image = eight_bit(upright(image), channels)
            w, h = image.size
            side = min(w, h)
            box = ((w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side)
            image = image.resize((size, size), Image.Resampling.BICUBIC, box=box, reducing_gap=3.0)
            pixels = np.array(image, dtype=np.uint8)  # a writable copy
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


JPEG_START, JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"


def worker_item(data: bytes, size: int, channels: int, encoded: bool = True) -> torch.Tensor:
    """What a loader's worker hands on for one file's bytes: decoded as ``load_image`` does
    (uint8 [channels, size, size]), or, when ``encoded`` (the run's device decodes JPEGs:
    ``data.source.decode=device``, litlab.data.decode), a whole 8-bit RGB or gray JPEG as its
    bytes (uint8 [n]). Decoded here even then: other formats, JPEGs in modes a GPU decoder may
    refuse (CMYK), JPEGs stored turned (an EXIF orientation: see ``upright``), a JPEG without
    its end marker (truncated: PIL refuses it, and a GPU decoder might return part of a
    picture); the decompression-bomb guard applies to both (PIL reads the header only)."""
    whole_jpeg = bytes(data[:3]) == JPEG_START and bytes(data[-16:]).rstrip(b"\0")[-2:] == JPEG_END
    if encoded and whole_jpeg:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.format == "JPEG" and image.mode in ("RGB", "L") and not turned(image):
                    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.from_numpy(load_image(io.BytesIO(data), size, channels))


def why_unreadable(error: Exception) -> str:
    """A damaged file's decoding error in one line, as the cache and the check list it."""
    kind = type(error).__name__
    # PIL names the buffer it read ("cannot identify image file <_io.BytesIO object at 0x...>"),
    # not the file: dropped (the file is named beside the reason)
    text = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", first_line(error))
    return f"{kind}: {text}" if str(error).strip() else kind


class Unreadable(NamedTuple):
    """What a dataset read as it goes yields for a file that does not decode (``skip_unreadable``
    drops it): the file, so that a run counts each unreadable file once, however many passes
    and ranks read it, and says why once, in the run's process (``why_unreadable``)."""

    file: str
    reason: str = ""
