"""Folders of image files (the ImageFolder source): scanned once, decoded in parallel, cached
as uint8 at a fixed size.

Decoding is what makes image folders slow: a JPEG is decoded every time a per-sample pipeline
reads it, every epoch. Here every image is decoded once, by every core, into a square uint8
array at the stored size (litlab.data.pixels: the centre square of the shorter side, resized
with antialiasing; JPEGs decoded at 1/2 to 1/8 scale when that still covers the stored size),
and written to a memory-mapped file under the cache folder, keyed by the folder's file list,
sizes and times (litlab.data.folder_cache). Later epochs, and later runs, index that array like
any in-memory dataset (litlab's DeviceLoader); crops, flips and normalization happen per batch
on the device. Folders too large to cache are read as they go (``FileImages``).

Files that cannot be read (truncated, not an image, empty, too large for PIL's
decompression-bomb guard) are skipped with a warning and counted; unusual modes are converted
(CMYK, palette, grayscale, RGBA without its alpha, 16-bit scaled to 8).

Held-out splits (test without a split folder, validation) are decided file by file, by a hash of
the file's name (litlab.data.folder_index), so a test image never becomes a training image
between runs, for a resumed run, or for ``eval.py`` of an older checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import Dataset, Subset, TensorDataset

from litlab.data.fingerprint import copies_among, fingerprints
from litlab.data.folder_cache import CachedFolder, cached_folder
from litlab.data.folder_index import (
    FolderIndex,
    check_classes_present,
    check_same_classes,
    class_names,
    encoding_hint_among,
    file_digests,
    file_names,
    scan,
    split_folders,
    system_folders_in,
    test_split,
    train_folder,
    unread,
    validation_split,
)
from litlab.data.pixels import (
    Unreadable,
    check_decode,
    check_decoded_shape,
    why_unreadable,
    worker_item,
)
from litlab.data.sources import Source, Split, labels_of
from litlab.errors import DataError

log = logging.getLogger(__name__)

FILES_KEY_VERSION = 1  # files_key's rule (which files, how keyed): checkpoints of another skip


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
        except Exception as e:  # said once by the run (DataModule.ready), not every epoch
            return Unreadable(str(path), why_unreadable(e))
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
    then the whole folder too). ``classes``: label by these class names (the model's, which
    eval.py gives for a folder other than the training one), so a folder holding some of them
    is labelled as the model was; a class folder not among them is refused.
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
        classes: Sequence[str] | None = None,
    ) -> None:
        check_decoded_shape(size, channels)
        check_decode(decode, cache)
        self.root = Path(root).expanduser()
        self.size, self.channels = size, channels
        self.test_fraction = test_fraction
        self.cache, self.cache_dir, self.workers = cache, Path(cache_dir), workers
        self.decode, self.test_all = decode, test_all
        self.classes = None if classes is None else [str(c) for c in classes]
        self._opened: dict[Path, CachedFolder | FolderIndex] = {}
        self._listed: dict[Path, tuple[str, int]] = {}  # each scanned folder's (key, files)
        self._files_key: dict[str, object] | None = None
        # a fit continued from a checkpoint: its files_key (DataModule.continues)
        self.continued_files: dict[str, Any] | None = None
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
        index = opened or self._scan(folder)  # scanned by an earlier prepare(test=False)
        self._check_known_classes(index.classes, folder)  # from the scan: before any decode
        self._opened[folder] = (
            cached_folder(folder, self.size, self.channels, self.cache_dir, self.workers, index)
            if self.cache
            else index
        )
        return self._opened[folder]

    def _scanned(self, folder: Path) -> None:
        """``folder`` scanned (once a process; the scan its decode uses later), not decoded."""
        if folder not in self._opened:
            self._opened[folder] = self._scan(folder)

    def _scan(self, folder: Path) -> FolderIndex:
        """``folder``'s index; what it leaves unread said in the run's log."""
        index = scan(folder)
        if (note := unread(index)) and rank_zero_only.rank == 0:  # (each rank scans: once)
            log.warning("%s: %s", folder, note)
        self._listed[folder] = self._trained_files_key(folder, index)
        return index

    def _trained_files_key(self, folder: Path, index: FolderIndex) -> tuple[str, int]:
        """(key, count) of the files of ``folder`` that train or validate, by name and class
        folder (files_key): none of a test/ folder; of a folder without split folders, those
        its test split does not hold out (by name: a file added there for testing changes
        nothing that trains)."""
        files, labels = index.files, index.labels
        folders = self._split_folders()
        if folders is not None and folder == folders.get("test"):
            files = labels = []
        elif folders is None and len(files) >= 2 and not self.test_all:
            keep = test_split(files, self.test_fraction)[0].tolist()
            files, labels = [files[i] for i in keep], [labels[i] for i in keep]
        digest = hashlib.sha256()
        for name, label in zip(files, labels, strict=True):
            digest.update(f"{name}\0{index.classes[label]}\n".encode())
        return digest.hexdigest(), len(files)

    def _listing_key(self, listed: list[tuple[str, str, int]]) -> str:
        return hashlib.sha256(repr(listed).encode()).hexdigest()[:16]

    def unreadable_names(self) -> list[str]:
        """The files a cached decode skipped as unreadable, named under the root: the decoded
        images leave them out, so the same images remain in the same order when they go."""
        return sorted(
            (folder.relative_to(self.root) / entry["file"]).as_posix()
            for folder, opened in self._opened.items()
            if isinstance(opened, CachedFolder)
            for entry in opened.skipped
        )

    def _key_with(self, names: Sequence[str]) -> str | None:
        """files_key's key of the folder now with the files ``names`` (under the root) that are
        gone put back; None where one cannot be (its class folder gone)."""
        listed = []
        for folder in sorted((self._split_folders() or {"all": self.root}).values()):
            index = scan(folder)
            below = folder.relative_to(self.root)
            gone = [
                (self.root / n).relative_to(folder).as_posix()
                for n in names
                if (self.root / n).is_relative_to(folder) and not (self.root / n).exists()
            ]
            if gone:
                by_class = {
                    c: [f for f, k in zip(index.files, index.labels, strict=True) if k == i]
                    for i, c in enumerate(index.classes)
                }
                for name in gone:
                    if name.split("/", 1)[0] not in by_class:
                        return None
                    by_class[name.split("/", 1)[0]].append(name)
                files = [f for c in index.classes for f in sorted(by_class[c])]
                labels = [i for i, c in enumerate(index.classes) for _ in by_class[c]]
                index = replace(index, files=files, labels=labels)
            listed.append((below.as_posix(), *self._trained_files_key(folder, index)))
        return self._listing_key(listed)

    def files_key(self) -> dict[str, object] | None:
        """Which image files train and validate: a key of their names under the root and their
        class folders (not their bytes), and their count, as this run scanned them. Kept in
        checkpoints: a fit continued on the folder changed since (files added, removed, renamed,
        moved to another class) is refused (check_files); a copy of the folder elsewhere has the
        same key; test files come and go freely. None with ``test_all`` (eval.py's folder)."""
        if self.test_all:
            return None
        if self._files_key is None:
            listed = []
            for folder in sorted((self._split_folders() or {"all": self.root}).values()):
                if folder not in self._listed:
                    self._scan(folder)
                listed.append((folder.relative_to(self.root).as_posix(), *self._listed[folder]))
            key = self._listing_key(listed)
            files = sum(files for *_, files in listed)
            self._files_key = {"v": FILES_KEY_VERSION, "key": key, "files": files}
        return self._files_key

    def check_files(self, trained: dict[str, Any] | None) -> None:
        """Refuse to continue a fit whose checkpoint's files (``trained``: its files_key) are
        not the folder's now: it would go on with other training and validation images (its
        best checkpoint chosen across two validation sets, a mid-epoch resume's order over other
        files)."""
        now = self.files_key()
        if not trained or not now or trained.get("v") != now["v"]:  # (another rule: unknown)
            return
        if trained.get("key") == now["key"]:
            return
        # files that never gave an image, removed since (as the run and the check tool say to
        # do): the same images (review 171: the resume was refused, "put the folder back")
        if trained.get("without") and self._key_with(trained["without"]) == trained["key"]:
            return
        # (a run begun before: more files then; review 161: not for a file added since)
        more = (trained.get("files") or 0) > (now.get("files") or 0)
        system = system_folders_in(self.root) if more else []
        why = (
            f" (it holds {', '.join(system)}: folders a NAS or a drive writes, which litlab "
            "has left out since 2026-12-07 and a run begun before trained on: such a run "
            "cannot go on with the same images; start a new run)"
            if system
            else ""
        )
        raise DataError(
            f"{self.label} changed since the checkpoint was written ({trained.get('files')} "
            f"training and validation image files then, {now['files']} now; or files renamed "
            "or moved to another class): a resumed run would go "
            f"on with other images; put the folder back as it was, or start a new run on it{why}"
        )

    def _split_folders(self) -> dict[str, Path] | None:
        return split_folders(self.root)

    def known_classes(self) -> list[str] | None:
        """The training class folders, from a scan (no decode); None for eval.py's folder of
        some of a model's classes (``classes``), or a root that is not a folder (prepare says)."""
        if self.classes is not None or not self.root.is_dir():
            return None
        return list(self._train_index().classes)

    def check_class_files(self) -> None:
        """Refuse a training class folder without an image file, from the scan (no decode):
        before the class count's advice, which counts it (walkthrough 182: "set
        data.num_classes=6", then refused for the empty folder)."""
        index = self._train_index()
        labels = torch.as_tensor(index.labels, dtype=torch.long)
        check_classes_present(labels, index.classes, train_folder(self.root), "train")

    def _train_index(self) -> FolderIndex:
        """The training class folders' scan (once a process)."""
        train = train_folder(self.root)
        self._scanned(train)
        return self._opened[train]

    def prepare(self, test: bool = True) -> None:
        """Scan (and, cached, decode) every split once per node, before any process loads; the
        classes of held-out folders checked against train/'s. ``test=False`` (a fit that does
        not read the test split): its folder only scanned, its decode left to the test."""
        if not self.root.is_dir():
            what = "is a file, not a folder" if self.root.exists() else "does not exist"
            raise DataError(
                f"image folder {self.root} {what}; set data.source.root to a folder of "
                "class subfolders"
            )
        folders = self._split_folders() or {"all": self.root}
        for split, folder in folders.items():
            if split not in ("train", "all"):
                check_same_classes(folders["train"], folder)
            self._scanned(folder)
        self.check_files(self.continued_files)  # a fit continued: before any decode
        for split, folder in folders.items():
            if self.cache and (test or split != "test"):
                self._opened_folder(folder)

    def _whole(self, folder: Path, split: str) -> Dataset:
        """Every image of one folder of class folders: cached (a TensorDataset over the
        memory-mapped array) or as files."""
        opened = self._opened_folder(folder)
        if isinstance(opened, FolderIndex):
            labels, classes = self._labels(torch.as_tensor(opened.labels), opened.classes, folder)
            index = replace(opened, labels=labels.tolist(), classes=classes)
            return FileImages(
                index, range(len(index.files)), self.size, self.channels, self.decode == "device"
            )
        cached = opened
        labels, classes = self._labels(cached.labels, cached.classes, folder)
        dataset = TensorDataset(cached.images, labels)
        dataset.classes = classes  # type: ignore[attr-defined]
        dataset.files = cached.files  # type: ignore[attr-defined]
        dataset.digests = cached.digests  # type: ignore[attr-defined]
        if split not in self.report:
            self.report[split] = {"images": len(cached.labels), "skipped": len(cached.skipped)}
            if cached.skipped:
                self.report[split]["skipped_files"] = cached.skipped[:20]
                first = cached.skipped[0]
                if rank_zero_only.rank == 0:  # (each rank opens the cache: once, walkthrough 182)
                    log.warning(
                        "skipped %d unreadable file(s) in %s, e.g. %s (%s)",
                        len(cached.skipped),
                        folder,
                        first["file"],
                        first["reason"],
                    )
        return dataset

    def _labels(
        self, labels: torch.Tensor, classes: list[str], folder: Path
    ) -> tuple[torch.Tensor, list[str]]:
        """(labels, class names): the folder's own, or, given ``classes``, each image labelled by
        its class's position among them."""
        if self.classes is None or self.classes == classes:
            return labels, classes
        self._check_known_classes(classes, folder)
        position = torch.tensor([self.classes.index(name) for name in classes], dtype=torch.long)
        return position[labels.long()], self.classes

    def _check_known_classes(self, classes: list[str], folder: Path) -> None:
        """Given the model's ``classes`` (eval.py on another folder): a class folder of
        ``folder`` not among them is refused (from the scan, before a decode: the whole folder
        was decoded into a new cache first, and left behind)."""
        if self.classes is None:
            return
        unknown = [name for name in classes if name not in self.classes]
        if unknown:
            raise DataError(
                f"class folder(s) {unknown} of {folder} are not among the model's classes "
                f"{self.classes}; test it on folders named as its classes (remove or rename "
                f"these){encoding_hint_among(unknown, self.classes)}"
            )

    def _check_present(self, labels: torch.Tensor, classes: list[str], where: Path, split: str):
        """``check_classes_present``, but for given ``classes`` only over those with a class
        folder here (a folder of some of the model's classes is what it was given for). With
        ``test_all`` (every image tested) the training split is not trained on: not checked."""
        if self.test_all and split == "train":
            return
        own = None if self.classes is None else class_names(where)
        check_classes_present(labels, classes, where, split, own)

    def load(self, split: Split) -> Dataset:
        self.prepare(test=split == "test")
        folders = self._split_folders()
        if folders is not None:
            if split == "test" and folders["test"].name != "test":  # ImageNet's val/: said
                log.info("test split: %s (no test/ beside train/)", folders["test"])
            if split == "test" and self.report.pop("test_all", False):  # recorded true (144)
                log.warning(
                    "data.source.test_all: %s has split folders; its test split is %s alone (to "
                    "test every image of a folder, give a folder of class folders)",
                    self.root,
                    folders["test"],
                )
            whole = self._whole(folders[split], split)
            self._check_present(labels_of(whole), whole.classes, folders[split], split)
            return whole
        whole = self._whole(self.root, "all")
        if self.test_all:
            keep = test = torch.arange(len(labels_of(whole)))
        else:
            keep, test = test_split(file_names(whole), self.test_fraction)
        chosen = test if split == "test" else keep
        subset = Subset(whole, chosen.tolist())
        subset.classes = whole.classes  # type: ignore[attr-defined]
        self._check_present(labels_of(subset), whole.classes, self.root, split)
        return subset

    def validation_split(
        self, train: Dataset, fraction: float, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decided file by file from the file's name and ``seed`` (``split_by_name``); every
        class keeps training images (a class's few files can all fall in validation); a class
        without validation images is said (val/* then measure the other classes alone), as the
        check says it. With ``test_all`` (eval.py: nothing is validated), none: every image is
        of the real statistics a GAN's FID takes from the training split."""
        if self.test_all:
            return torch.arange(len(train)), torch.arange(0)
        keep, val = validation_split(file_names(train), fraction, seed)
        folders = self._split_folders()
        where = folders["train"] if folders is not None else self.root
        classes = train.classes  # type: ignore[attr-defined]
        labels = labels_of(train)
        self._check_present(labels[keep], classes, where, "train")
        self._check_present(labels[val], classes, where, "validation")
        return keep, val

    def fingerprints(
        self, trained: Dataset, validated: Dataset | None = None
    ) -> list[list[Any]] | None:
        """A seeded sample of the files of ``trained`` (a split of this folder) with digests of
        their bytes: eval.py recognises a copy of this folder by them (where test images are
        held out by file name), resume= one moved (litlab.data.fingerprint);
        in a split layout, of the training folder (named under the root: train/<class>/...),
        and of the validation folder where it has one (val/<class>/...: its images chose the
        checkpoints; eval.py on it tested them as new, walkthrough 139)."""
        if self.test_all:
            return None
        folders = self._split_folders()
        if folders is None:
            return fingerprints(self.root, file_names(trained))
        sample = []
        for split, dataset in (("train", trained), ("val", validated)):
            if split in folders and dataset is not None:
                below = folders[split].relative_to(self.root).as_posix()
                sample += fingerprints(self.root, [f"{below}/{n}" for n in file_names(dataset)])
        return sample

    def files_in(self, split: Split) -> int | None:
        """How many image files ``split`` holds, from a scan (unreadable ones too: known only
        once read); None where the folder is not there (prepare says so) or for eval.py's
        folder tested whole."""
        if self.test_all or not self.root.is_dir():
            return None
        folders = self._split_folders()
        if folders is not None:
            if split not in folders:
                return None
            self._scanned(folders[split])
            return len(self._opened[folders[split]].files)
        self._scanned(self.root)
        names = self._opened[self.root].files
        held = test_split(names, self.test_fraction)[1] if len(names) >= 2 else names
        return len(held) if split == "test" else None

    def copies(
        self, trained: dict[str, Dataset], held: tuple[str, Dataset]
    ) -> list[tuple[str, str]] | None:
        """(held-out file, training file) for each image of ``held`` (a split's name and
        images) whose file is a byte-for-byte copy of one of ``trained``'s (splits by name): a
        duplicate in a split layout's val/ or test/, or a copy under another name in a folder
        without split folders, whose names hash the two into other splits (walkthrough 150:
        "img copy.JPG"), is measured as unseen. Names under the root. None where the files'
        digests are not known (cache=false; a cache built before 2026-12-07)."""
        if self.test_all:
            return None
        folders = self._split_folders()

        def below(split: str) -> str:
            if folders is not None and split in folders:
                return folders[split].relative_to(self.root).as_posix() + "/"
            return ""

        splits = [held, *trained.items()]
        digests = [file_digests(dataset) for _, dataset in splits]
        if any(d is None for d in digests):
            return None
        found = copies_among(np.concatenate(digests[1:]), digests[0])
        if not found:
            return []
        names = [[below(split) + n for n in file_names(dataset)] for split, dataset in splits]
        trained_names = [name for split in names[1:] for name in split]
        return [(names[0][h], trained_names[t]) for h, t in found]

    def given_validation(self) -> Dataset | None:
        """root/val/ (or valid/, validation/) when it lies beside train/ and test/."""
        folders = self._split_folders()
        if folders is None or "val" not in folders:
            return None
        log.info("validation: %s (data.val_fraction does not apply)", folders["val"])
        return self.load("val")  # type: ignore[arg-type]
