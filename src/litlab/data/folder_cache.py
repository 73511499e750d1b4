"""An image folder decoded once, by every core, into a memory-mapped uint8 array under the
cache folder (images.u8, labels.npy, digests.npy, meta.json), keyed by the folder's file list,
sizes and times and reused while they are unchanged; files that do not decode are left out and
listed (meta.json "skipped"). digests.npy: a 64-bit digest of each image file's bytes, read as
it is decoded (copies of one file among the splits: litlab.data.folder)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import numpy as np
import torch

from litlab.data.fingerprint import files_found, fingerprints
from litlab.data.folder_index import FolderIndex, scan
from litlab.data.pixels import load_image, why_unreadable
from litlab.errors import DataError
from litlab.files import writer_tag

log = logging.getLogger(__name__)


CACHE_FORMAT = 2  # bump when what the cache holds changes (2: EXIF orientation applied)


def bytes_digest(data: bytes) -> int:
    """A 64-bit digest of a file's bytes (int64): equal for copies of one file."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def _decode_into(
    paths: list[str], start: int, target: str, shape: tuple[int, ...]
) -> tuple[list[tuple[int, str]], list[int]]:
    """Worker: decode files start.. into rows of the memory-mapped array; return the failures
    and each file's bytes_digest (0 for one that cannot be read)."""
    images = np.memmap(target, dtype=np.uint8, mode="r+", shape=shape)
    failed, digests = [], []
    for offset, path in enumerate(paths):
        digest = 0
        try:
            data = Path(path).read_bytes()  # read once: digested, then decoded
            digest = bytes_digest(data)
            images[start + offset] = load_image(io.BytesIO(data), shape[-1], shape[1])
        except Exception as e:  # PIL raises many kinds for damaged files; every one is a skip
            failed.append((start + offset, why_unreadable(e)))
        digests.append(digest)
    images.flush()
    return failed, digests


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
    digests: np.ndarray | None = None  # each image file's bytes_digest (caches before: none)


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
    digests = np.load(folder / "digests.npy") if (folder / "digests.npy").is_file() else None
    return CachedFolder(images, labels, meta["classes"], meta["skipped"], folder, files, digests)


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
    # This folder's cache, or that of a copy of it, under any folder name (cp -a images images2:
    # the key is the files' names, sizes and times, not where they lie); another folder's only
    # where a sample of its files has the same bytes (files of one size with their times
    # pinned, as Nix and reproducible archives leave them, have the same key)
    candidates = sorted({folder, *cache_dir.glob(f"folder-*-{size}px-{key}*")})
    for cache in [c for c in candidates if _built_from(c, root)] or [
        c for c in candidates if _same_bytes(c, root)
    ]:
        return _open(cache, index)
    if (folder / "meta.json").is_file():  # the name is another folder's: this one's beside it
        folder = folder.with_name(f"{folder.name}-{_digest(str(root.resolve()))}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    _say_earlier_caches(cache_dir, root, size, channels)
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


def _meta(folder: Path) -> dict[str, Any]:
    """A cache folder's meta.json; {} for one unfinished or unreadable."""
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _built_from(cache: Path, root: Path) -> bool:
    """Whether the cache was built from the folder ``root``."""
    built = _meta(cache).get("root")
    return bool(built) and Path(built).resolve() == root.resolve()


def _same_bytes(cache: Path, root: Path) -> bool:
    """Whether ``root`` holds the files of the sample the cache was built with, byte for byte
    (caches from before samples were kept: not known, so not)."""
    sample = [entry for entry in _meta(cache).get("sample", []) if entry[1]]
    return bool(sample) and files_found(root, sample) == len(sample)


def _say_earlier_caches(cache_dir: Path, root: Path, size: int, channels: int) -> None:
    """Caches of this folder at this size and number of channels from before its files changed
    stay, each as large as the new one (a folder of a million images: tens of GB): said as a
    new one is built, not deleted (another run may still read one). Not those of other
    channels (data.source.channels=1 beside a 3-channel run's: walkthrough 139), which
    the other runs still read."""
    earlier = [
        path
        for path in cache_dir.glob(f"folder-{glob_escape(root.name)}-{size}px-*")
        if _built_from(path, root) and _meta(path).get("shape", [None])[0] == channels
    ]
    if earlier:
        sizes = sum(f.stat().st_size for path in earlier for f in path.iterdir() if f.is_file())
        log.warning(
            "%d cache(s) of %s from before its files changed stay in %s (%.2g GB): delete "
            "those no run reads (%s)",
            len(earlier),
            root,
            cache_dir,
            sizes / 1e9,
            ", ".join(path.name for path in sorted(earlier)),
        )


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
    digests = np.zeros(len(paths), dtype=np.int64)
    from rich.progress import Progress

    with Progress(transient=True) as progress, ProcessPoolExecutor(workers) as pool:
        task = progress.add_task(f"decoding {root} once ({size} px)", total=len(paths))
        jobs = {
            pool.submit(_decode_into, paths[i : i + chunk], i, str(target), shape): i
            for i in range(0, len(paths), chunk)
        }
        for job in as_completed(jobs):
            failures, digested = job.result()
            failed += failures
            digests[jobs[job] : jobs[job] + len(digested)] = digested
            progress.advance(task, len(digested))
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
    np.save(building / "digests.npy", digests[keep])
    meta = {"count": len(keep), "shape": list(shape[1:]), "classes": index.classes}
    meta.update(root=str(root), files=len(paths), skipped=skipped, format=CACHE_FORMAT)
    meta["sample"] = fingerprints(root, index.files)  # a copy elsewhere: the same bytes
    (building / "meta.json").write_text(json.dumps(meta, indent=1))
