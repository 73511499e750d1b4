"""Folders of image files (the ImageFolder source): scanned once, decoded in parallel, cached
as uint8 at a fixed size.

Decoding is what makes image folders slow: a JPEG is decoded every time a per-sample pipeline
reads it, every epoch. Here every image is decoded once, by every core, into a square uint8
array at the stored size (the centre square of the shorter side, resized with antialiasing;
JPEGs are decoded at 1/2 to 1/8 scale when that still covers the stored size), and written to a
memory-mapped file under the cache folder, keyed by the folder's file list, sizes and times.
Later epochs, and later runs, index that array like any in-memory dataset (litlab's
DeviceLoader); crops, flips and normalization happen per batch on the device.

Files that cannot be read (truncated, not an image, empty, too large for PIL's
decompression-bomb guard) are skipped with a warning and counted; unusual modes are converted
(CMYK, palette, grayscale, RGBA without its alpha, 16-bit scaled to 8).

Held-out splits (test without a split folder, validation) are decided file by file, by a hash of
the file's name (``split_by_name``): a folder that gains, loses or cannot read some files keeps
every other file in its split (beyond the smallest folders), so a test image never becomes a
training image between runs, for a resumed run, or for ``eval.py`` of an older checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps
from torch.utils.data import Dataset, Subset, TensorDataset

from litlab.data.fingerprint import fingerprints
from litlab.data.sources import Source, Split, labels_of
from litlab.errors import ConfigError, DataError, first_line
from litlab.files import writer_tag

log = logging.getLogger(__name__)

# What PIL decodes and torchvision's ImageFolder lists (.ppm: GTSRB), and JPEG's other names.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
    | {".ppm", ".pgm", ".pbm", ".pnm"}
)
# A root laid out in splits: train/ beside the first of these (the test split).
HELD_OUT_FOLDERS = ("test", "val", "valid", "validation")
# Folder names that mean splits, not classes: a root whose every folder is one of them is a
# split layout litlab does not read (refused, rather than trained as classes named so).
SPLIT_NAMES = frozenset(
    {"train", "training", "testing", "dev", "eval", "holdout", *HELD_OUT_FOLDERS}
)
CACHE_FORMAT = 2  # bump when what the cache holds changes (2: EXIF orientation applied)


@dataclass
class FolderIndex:
    """The image files of a folder of class folders, in a fixed order, and their labels."""

    root: Path
    classes: list[str]
    files: list[str] = field(default_factory=list)  # relative to root
    labels: list[int] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # files without an image suffix


def class_names(root: Path) -> list[str]:
    """The class folders of ``root``, sorted (their labels are their positions)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def check_same_classes(train: Path, test: Path) -> None:
    """A split layout's train and test folders must name the same classes: labels are positions
    in the sorted names, so a class missing from one side would relabel every class after it."""
    a, b = class_names(train), class_names(test)
    if a != b:
        missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise DataError(
            f"{train} and {test} have different class folders (only in {train.name}/: "
            f"{missing or 'none'}; only in {test.name}/: {extra or 'none'}); give both the same "
            "class folders, with the same names"
        )


def hashed_fraction(name: str, salt: str) -> float:
    """A number in [0, 1) fixed by a file's name (relative to its split's folder) and ``salt``."""
    digest = hashlib.blake2b(f"{salt}/{name}".replace(os.sep, "/").encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2**64


def split_by_name(
    names: Sequence[str], fraction: float, salt: str, setting: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) positions of ``names``: a file is held out when the hash of its name
    falls under ``fraction``, whatever the other files (about ``fraction`` of each class; not an
    exact count, which would move files between splits when others come or go). A folder so
    small that no file (or every file) falls under it holds out the file of the lowest hash
    (keeps the highest): both sides are never empty. ``setting`` names the fraction."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"{setting} must lie strictly between 0 and 1, got {fraction}")
    if len(names) < 2:
        raise DataError(f"{setting}: {len(names)} image(s) cannot be split in two; add images")
    hashes = torch.tensor([hashed_fraction(n, salt) for n in names], dtype=torch.float64)
    held = hashes < fraction
    if not held.any():
        held[hashes.argmin()] = True
    if held.all():
        held[hashes.argmax()] = False
    return (~held).nonzero().flatten(), held.nonzero().flatten()


def file_names(dataset: Dataset) -> list[str]:
    """The file behind each item of an image folder's dataset (or a Subset of one)."""
    if isinstance(dataset, Subset):
        names = file_names(dataset.dataset)
        return [names[i] for i in dataset.indices]
    return list(dataset.files)  # type: ignore[attr-defined]


def scan(root: Path) -> FolderIndex:
    """``root/<class>/**/<image>``, classes and files sorted (torchvision's ImageFolder order).

    Hidden files and folders (``.ipynb_checkpoints``, macOS's ``._name`` files) are left out;
    links are followed, but a folder already read (a link back up the tree) is not read again.
    Files without an image suffix are listed in ``ignored``."""
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise DataError(f"image folder {root} {what}; put images in {root}/<class name>/")
    classes = class_names(root)
    if not classes:
        raise DataError(f"{root} has no class folders; put images in {root}/<class name>/")
    index = FolderIndex(root, classes)
    for label, name in enumerate(classes):
        found, read = [], set()
        for folder, folders, names in os.walk(root / name, followlinks=True):
            real = os.path.realpath(folder)
            if real in read:  # each copy would be trained on, and land in test as well
                folders.clear()
                continue
            read.add(real)
            # sorted: of two links to one folder, the first name reads it on every machine
            # (a file's name decides its split)
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            where = os.path.relpath(folder, root)  # once a folder: a million files are common
            for n in names:
                if n.startswith("."):
                    continue
                path = os.path.join(where, n)
                is_image = os.path.splitext(n)[1].lower() in IMAGE_SUFFIXES
                (found if is_image else index.ignored).append(path)
        index.files += sorted(found)
        index.labels += [label] * len(found)
    if not index.files:
        raise DataError(f"{root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return index


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
    return f"{kind}: {first_line(error)}" if str(error).strip() else kind


def _decode_into(
    paths: list[str], start: int, target: str, shape: tuple[int, ...]
) -> list[tuple[int, str]]:
    """Worker: decode files start.. into rows of the memory-mapped array; return the failures."""
    images = np.memmap(target, dtype=np.uint8, mode="r+", shape=shape)
    failed = []
    for offset, path in enumerate(paths):
        try:
            images[start + offset] = load_image(path, shape[-1], shape[1])
        except Exception as e:  # PIL raises many kinds for damaged files; every one is a skip
            failed.append((start + offset, why_unreadable(e)))
    images.flush()
    return failed


def cache_key(index: FolderIndex, size: int, channels: int) -> str:
    """What the cached array depends on: every file's name, size and modification time, and the
    stored size. Not the inode or change time: a folder copied anew with its times (rsync -a,
    cp -p to a node's local disk for each job) keeps its cache. A file replaced by one of the
    same byte size with its modification time set back is not seen (delete the cache folder)."""
    digest = hashlib.sha256(repr((CACHE_FORMAT, size, channels, index.classes)).encode())
    root = str(index.root)
    for name, label in zip(index.files, index.labels, strict=True):
        try:
            stat = os.stat(os.path.join(root, name))
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:  # a broken link: its decode fails and it is skipped and counted
            size = mtime = -1
        digest.update(f"{name}\0{label}\0{size}\0{mtime}\n".encode())
    return digest.hexdigest()[:16]


def split_folders(root: Path) -> dict[str, Path] | None:
    """``{"train": root/train, "test": root/<held out>}`` when the folder is laid out in splits
    (ImageNet's train/ beside val/; or test/, valid/, validation/), with ``"val"`` too when
    test/ and one of val/, valid/, validation/ are both there; else None. A root whose every
    folder is named like a split, in a layout not understood, is refused."""
    held_out = [root / n for n in HELD_OUT_FOLDERS if (root / n).is_dir()]
    if (root / "train").is_dir() and held_out:
        folders = {"train": root / "train", "test": held_out[0]}
        if held_out[0].name == "test" and len(held_out) > 1:
            folders["val"] = held_out[1]
        return folders
    names = class_names(root) if root.is_dir() else []
    if names and all(n.lower() in SPLIT_NAMES for n in names):
        raise DataError(
            f"{root} holds folders named like splits ({', '.join(names)}), not class folders; "
            f"lay it out as {root}/train/<class>/ beside {root}/test/<class>/ (or val/, valid/, "
            f"validation/), or as {root}/<class>/"
        )
    return None


def missing_classes(labels: torch.Tensor, classes: list[str]) -> list[str]:
    """The classes of which ``labels`` hold no image."""
    counts = torch.bincount(labels, minlength=len(classes))
    return [classes[i] for i in (counts == 0).nonzero().flatten().tolist()]


def check_classes_present(
    labels: torch.Tensor, classes: list[str], where: Path, split: str
) -> None:
    """Every class must have training images: a class the model never saw is never predicted,
    and all its test images count as errors. A held-out split without a class is a warning."""
    empty = missing_classes(labels, classes)
    if not empty:
        return
    if split == "train":
        raise DataError(
            f"class folder(s) {empty} of {where} leave no readable image for training; add "
            "images to them or remove the folders"
        )
    log.warning("the %s split of %s holds no image of class(es) %s", split, where, empty)


@dataclass
class CachedFolder:
    """A folder's decoded images (memory-mapped uint8 tensor), labels, classes and skips, and
    the file of each image (relative to the folder)."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    skipped: list[dict[str, str]]
    path: Path
    files: list[str]


def _open(folder: Path, index: FolderIndex) -> CachedFolder:
    """The cache of ``index``'s files (its key): every file's image but the skipped ones."""
    meta = json.loads((folder / "meta.json").read_text())
    count, shape = meta["count"], tuple(meta["shape"])
    images = torch.from_file(
        str(folder / "images.u8"), shared=False, size=count * int(np.prod(shape)), dtype=torch.uint8
    ).view(count, *shape)
    labels = torch.from_numpy(np.load(folder / "labels.npy"))
    skipped = {s["file"] for s in meta["skipped"]}
    files = [f for f in index.files if f not in skipped]
    if len(files) != count:
        raise DataError(f"the cache {folder} does not match its folder; delete it and run again")
    return CachedFolder(images, labels, meta["classes"], meta["skipped"], folder, files)


def cached_folder(
    root: Path,
    size: int,
    channels: int,
    cache_dir: Path,
    workers: int | None = None,
    index: FolderIndex | None = None,
) -> CachedFolder:
    """The folder decoded once into ``cache_dir`` (reused while its files are unchanged);
    ``index``: its scan, where already made."""
    index = index or scan(root)
    key = cache_key(index, size, channels)
    folder = cache_dir / f"folder-{root.name}-{size}px-{key}"
    if (folder / "meta.json").is_file():
        return _open(folder, index)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A folder of its own for each build, never an existing one: two builds in one folder wipe
    # each other's rows.
    building = folder.with_name(f"{folder.name}.building-{writer_tag()}")
    building.mkdir()  # raises if it exists
    try:
        _build(index, building, size, channels, workers)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    try:
        building.rename(folder)  # another process may have finished the same cache first
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
    return _open(folder, index)


def _build(
    index: FolderIndex, building: Path, size: int, channels: int, workers: int | None
) -> None:
    """Decode ``index``'s files into ``building``: images.u8, labels.npy and meta.json."""
    root = index.root
    shape = (len(index.files), channels, size, size)
    target = building / "images.u8"
    np.memmap(target, dtype=np.uint8, mode="w+", shape=shape).flush()
    paths = [os.path.join(root, f) for f in index.files]
    workers = max(1, workers or os.cpu_count() or 1)
    chunk = max(64, min(4096, len(paths) // (workers * 8) or 1))
    failed: list[tuple[int, str]] = []
    from rich.progress import Progress

    with Progress(transient=True) as progress, ProcessPoolExecutor(workers) as pool:
        task = progress.add_task(f"decoding {root} once ({size} px)", total=len(paths))
        jobs = {
            pool.submit(_decode_into, paths[i : i + chunk], i, str(target), shape): len(
                paths[i : i + chunk]
            )
            for i in range(0, len(paths), chunk)
        }
        for job in as_completed(jobs):
            failed += job.result()
            progress.advance(task, jobs[job])
    keep = np.setdiff1d(np.arange(len(paths)), [i for i, _ in failed])
    if failed:  # compact: the cache holds the readable images only
        images = np.memmap(target, dtype=np.uint8, mode="r+", shape=shape)
        for row, source in enumerate(keep):
            images[row] = images[source]
        images.flush()
        del images
        os.truncate(target, len(keep) * int(np.prod(shape[1:])))
    skipped = [{"file": index.files[i], "reason": reason} for i, reason in sorted(failed)]
    np.save(building / "labels.npy", np.asarray(index.labels, dtype=np.int64)[keep])
    meta = {"count": len(keep), "shape": list(shape[1:]), "classes": index.classes}
    meta.update(root=str(root), files=len(paths), skipped=skipped, format=CACHE_FORMAT)
    (building / "meta.json").write_text(json.dumps(meta, indent=1))


class Unreadable(NamedTuple):
    """What a dataset read as it goes yields for a file that does not decode (``skip_unreadable``
    drops it): the file, so that a run counts each unreadable file once, however many passes
    and ranks read it."""

    file: str


class FileImages(Dataset):
    """Images decoded from their files as they are read (DataLoader workers): for folders too
    large to cache. ``encoded``: JPEGs are handed on as their bytes, for the run's device to
    decode (litlab.data.decode), with the file's path (a JPEG the device cannot decode is
    counted by its file too). An unreadable file yields ``Unreadable``, which
    ``skip_unreadable`` drops."""

    def __init__(
        self,
        index: FolderIndex,
        positions: Sequence[int],
        size: int,
        channels: int,
        encoded: bool = False,
    ):
        self.index, self.positions = index, list(positions)
        self.size, self.channels, self.encoded = size, channels, encoded
        self.targets = [index.labels[p] for p in self.positions]
        self.files = [index.files[p] for p in self.positions]
        self.classes = index.classes

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.size, self.size)

    def __getitem__(self, i: int) -> tuple | Unreadable:
        path = self.index.root / self.index.files[self.positions[i]]
        try:
            image = worker_item(path.read_bytes(), self.size, self.channels, self.encoded)
        except Exception as e:
            warnings.warn(f"skipped unreadable image {path}: {e}", stacklevel=1)
            return Unreadable(str(path))
        return (image, self.targets[i], str(path)) if self.encoded else (image, self.targets[i])


class ImageFolder(Source):
    """Your own images: ``root/<class>/<image>``, or ``root/train/<class>/`` beside
    ``root/test/<class>/`` (or ``root/val/``, ImageNet's layout; ``valid/``, ``validation/``);
    JPEG, PNG, WebP, ... of any size and mode. Each image becomes the centre square of its
    shorter side at ``size`` pixels. Every class needs training images (refused otherwise).

    ``cache=True`` (default): every image is decoded once, by ``workers`` processes (every core
    by default), into a memory-mapped uint8 array under ``cache_dir``, reused by later epochs
    and runs while the folder's files are unchanged (litlab.data.folder). ``cache=False``:
    decoded as read by the DataLoader's workers, for folders whose decoded size
    (images x channels x size^2 bytes) is more than the disk or memory can hold; with
    ``decode="device"`` the workers only read the files and JPEGs are decoded a batch at a time
    on the run's device (nvJPEG on a GPU; litlab.data.decode). Unreadable
    files are skipped with a warning and counted (summary.json "data"). Without a split folder,
    about ``test_fraction`` of the images is held out for testing, file by file (by name);
    ``test_all``: every image is a test image (eval.py on a folder other than the training
    one sets it; training splits, which evaluation reads only for FID's real statistics, are
    then the whole folder too).
    """

    name = "image_folder"

    @property
    def label(self) -> str:
        return f"{self.name} {self.root}"

    def __init__(
        self,
        root: str,
        size: int,
        channels: int = 3,
        test_fraction: float = 0.2,
        cache: bool = True,
        cache_dir: str = ".cache/litlab",
        workers: int | None = None,
        decode: str = "workers",
        test_all: bool = False,
    ) -> None:
        check_decoded_shape(size, channels)
        check_decode(decode, cache)
        self.root = Path(root).expanduser()
        self.size, self.channels = size, channels
        self.test_fraction = test_fraction
        self.cache, self.cache_dir, self.workers = cache, Path(cache_dir), workers
        self.decode, self.test_all = decode, test_all
        self._opened: dict[Path, CachedFolder | FolderIndex] = {}
        self.report: dict[str, object] = {"test_all": True} if test_all else {}

    def __getstate__(self) -> dict:
        """A copy sent to other processes (ddp_spawn) opens its folders afresh: the memory-mapped
        caches are not pickled."""
        return {**self.__dict__, "_opened": {}}

    def _opened_folder(self, folder: Path) -> CachedFolder | FolderIndex:
        """``folder``'s cache (decoded at the first call where missing; cache=true) or the index
        of its files (cache=false), once a process: Lightning calls ``prepare`` and ``load``
        several times a run, and scanning a folder stats every file (a million files: tens of
        seconds). Files added or changed later are seen by a new ImageFolder (every run, test
        and eval.py builds its own), not by this one."""
        opened = self._opened.get(folder)
        if isinstance(opened, CachedFolder) or (opened is not None and not self.cache):
            return opened
        index = opened or scan(folder)  # scanned by an earlier prepare(test=False)
        self._opened[folder] = (
            cached_folder(folder, self.size, self.channels, self.cache_dir, self.workers, index)
            if self.cache
            else index
        )
        return self._opened[folder]

    def _scanned(self, folder: Path) -> None:
        """``folder`` scanned (once a process; the scan its decode uses later), not decoded."""
        if folder not in self._opened:
            self._opened[folder] = scan(folder)

    def _split_folders(self) -> dict[str, Path] | None:
        return split_folders(self.root)

    def prepare(self, test: bool = True) -> None:
        """Scan (and, cached, decode) every split once per node, before any process loads; the
        classes of held-out folders checked against train/'s. ``test=False`` (a fit that does
        not read the test split): its folder only scanned, its decode left to the test."""
        if not self.root.is_dir():
            raise DataError(
                f"image folder {self.root} does not exist; set data.source.root to a folder of "
                "class subfolders"
            )
        folders = self._split_folders() or {"all": self.root}
        for split, folder in folders.items():
            if split not in ("train", "all"):
                check_same_classes(folders["train"], folder)
            if self.cache and (test or split != "test"):
                self._opened_folder(folder)
            else:
                self._scanned(folder)

    def _whole(self, folder: Path, split: str) -> Dataset:
        """Every image of one folder of class folders: cached (a TensorDataset over the
        memory-mapped array) or as files."""
        opened = self._opened_folder(folder)
        if isinstance(opened, FolderIndex):
            return FileImages(
                opened, range(len(opened.files)), self.size, self.channels, self.decode == "device"
            )
        cached = opened
        dataset = TensorDataset(cached.images, cached.labels)
        dataset.classes = cached.classes  # type: ignore[attr-defined]
        dataset.files = cached.files  # type: ignore[attr-defined]
        if split not in self.report:
            self.report[split] = {"images": len(cached.labels), "skipped": len(cached.skipped)}
            if cached.skipped:
                self.report[split]["skipped_files"] = cached.skipped[:20]
                first = cached.skipped[0]
                log.warning(
                    "skipped %d unreadable file(s) in %s, e.g. %s (%s)",
                    len(cached.skipped),
                    folder,
                    first["file"],
                    first["reason"],
                )
        return dataset

    def load(self, split: Split) -> Dataset:
        self.prepare(test=split == "test")
        folders = self._split_folders()
        if folders is not None:
            whole = self._whole(folders[split], split)
            check_classes_present(labels_of(whole), whole.classes, folders[split], split)
            return whole
        whole = self._whole(self.root, "all")
        if self.test_all:
            keep = test = torch.arange(len(labels_of(whole)))
        else:
            keep, test = test_split(file_names(whole), self.test_fraction)
        chosen = test if split == "test" else keep
        subset = Subset(whole, chosen.tolist())
        subset.classes = whole.classes  # type: ignore[attr-defined]
        check_classes_present(labels_of(subset), whole.classes, self.root, split)
        return subset

    def validation_split(
        self, train: Dataset, fraction: float, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decided file by file from the file's name and ``seed`` (``split_by_name``); every
        class keeps training images (a class's few files can all fall in validation)."""
        keep, val = validation_split(file_names(train), fraction, seed)
        folders = self._split_folders()
        where = folders["train"] if folders is not None else self.root
        classes = train.classes  # type: ignore[attr-defined]
        check_classes_present(labels_of(train)[keep], classes, where, "train")
        return keep, val

    def fingerprints(self, trained: Dataset) -> list[list[str]] | None:
        """A seeded sample of the files of ``trained`` (a split of this folder) with digests of
        their bytes, where test images are held out by file name (no split folders): eval.py
        recognises a copy of this folder by them (litlab.data.fingerprint)."""
        if self._split_folders() is not None or self.test_all:
            return None
        return fingerprints(self.root, file_names(trained))

    def given_validation(self) -> Dataset | None:
        """root/val/ (or valid/, validation/) when it lies beside train/ and test/."""
        folders = self._split_folders()
        if folders is None or "val" not in folders:
            return None
        log.info("validation: %s (data.val_fraction does not apply)", folders["val"])
        return self.load("val")  # type: ignore[arg-type]


def test_split(names: Sequence[str], fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, test) positions of a folder's files without a split folder: about ``fraction``
    of each class, file by file (``split_by_name``)."""
    return split_by_name(names, fraction, "test", "data.source.test_fraction")


def validation_split(
    names: Sequence[str], fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, validation) positions of a folder's training files, file by file, by ``seed``."""
    return split_by_name(names, fraction, f"val-{seed}", "data.val_fraction")
