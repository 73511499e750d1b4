"""Recognising a run's training files in another folder: a seeded sample of the files it trained
on, each with a digest of its bytes, kept in its checkpoints (DataModule.state_dict). eval.py on
a folder other than the training one tests every image of it, unless the folder holds these
files: a copy of the training folder, or the folder moved, whose held-out share alone was never
trained on."""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

SAMPLED = 256  # files: reading them costs little, and a copy holds every one


def folder_of(root: Any) -> Path | None:
    """A data root as the folder it names (~ expanded, absolute, links resolved); None unset."""
    return Path(root).expanduser().resolve() if root else None


def file_digest(path: Path) -> str:
    """A digest of the file's bytes; "" where it cannot be read (missing: another folder)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def file_size(path: Path) -> int:
    """The file's length in bytes; -1 where it cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


def fingerprints(root: Path, names: Sequence[str], seed: int = 0) -> list[list[Any]]:
    """[name, digest, size] of a seeded sample of ``names`` (files under ``root``), in name
    order. (Samples kept before 2026-12-06 hold [name, digest]: every reader takes both.)"""
    chosen = torch.randperm(len(names), generator=torch.Generator().manual_seed(seed))[:SAMPLED]
    return [
        [names[i], file_digest(root / names[i]), file_size(root / names[i])]
        for i in sorted(chosen.tolist())
    ]


def copies_among(trained: Any, held: Any) -> list[tuple[int, int]]:
    """(held position, trained position) for each held-out file whose bytes digest is a trained
    file's (the first trained file of that digest): validation or test images that are copies
    of files trained on (an image folder's cache, litlab.data.check and the streaming
    conversion digest what they read). Digests as int64 arrays (8 bytes a file: a conversion of
    14 million images held every name and digest as Python objects, 0.7 GB a million files)."""
    trained, held = np.asarray(trained, dtype=np.int64), np.asarray(held, dtype=np.int64)
    if not len(trained) or not len(held):
        return []
    unique, first = np.unique(trained, return_index=True)  # sorted; each one's first position
    at = np.minimum(np.searchsorted(unique, held), len(unique) - 1)
    found = np.flatnonzero(unique[at] == held)
    return list(zip(found.tolist(), first[at[found]].tolist(), strict=True))


def copies_sentence(found: Sequence[tuple[str, str]], images: int, split: str) -> str:
    """The one wording of an evaluation split's copies of training files (a run's warning,
    litlab.data.check's, the streaming conversion's): how many, of what, an example; each
    caller says after it what to do there."""
    if split == "val":
        what, of, measured = "validation", "trains on", "val/* and the checkpoints chosen by them"
    else:
        what, of, measured = split, "trains or validates on", "test/*"
    return (
        f"{len(found)} of the {images} {what} images are byte-for-byte copies of files the run "
        f"{of} (e.g. {found[0][0]} is {found[0][1]}): {measured} count them as unseen images"
    )


def files_found(folder: Path, sample: Sequence[Sequence[Any]]) -> int:
    """How many of the sampled files ``folder`` holds under the same name, byte for byte."""
    return sum(1 for name, digest, *_ in sample if digest and file_digest(folder / name) == digest)


def files_found_by_content(
    folder: Path, files: Sequence[str], sample: Sequence[Sequence[Any]]
) -> int:
    """How many of the sampled files' contents are among ``files`` (names under ``folder``),
    byte for byte, under whatever names: only files of a sampled file's length are read (a
    renamed copy of training images; samples without lengths, kept before, are not looked
    for). Contents, not files: a training split's identical images (blank frames) are one."""
    wanted: dict[int, set[str]] = {}
    for entry in sample:
        if len(entry) > 2 and entry[1] and entry[2] >= 0:
            wanted.setdefault(entry[2], set()).add(entry[1])
    found: set[str] = set()
    for name in files:
        digests = wanted.get(file_size(folder / name))
        if digests and (digest := file_digest(folder / name)) in digests:
            found.add(digest)
    return len(found)


def files_found_renamed(folder: Path, sample: Sequence[Sequence[Any]]) -> int:
    """How many of the sampled files ``folder`` holds byte for byte under the same name
    written in the other Unicode form (NFC, NFD: macOS writes "é" as e and an accent; a copy
    through HFS+, ``rsync --iconv`` or a zip can switch them). Their names hash to another
    held-out share, so the run's test split is not this folder's."""
    renamed = [
        [other, digest]
        for name, digest, *_ in sample
        for other in {unicodedata.normalize(form, name) for form in ("NFC", "NFD")} - {name}
    ]
    return files_found(folder, renamed)


def files_found_as_split(folder: Path, sample: Sequence[Sequence[Any]]) -> int:
    """How many of the sampled files of a run on a split layout (named under its root:
    train/<class>/<file>, val/<class>/<file>) ``folder`` holds byte for byte as <class>/<file>:
    it is that run's train/ or val/ folder (or a copy), whose every image the run trained on or
    chose its checkpoints by."""
    return files_found(folder, split_entries(sample))


def split_entries(sample: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """The sampled files of a split layout's folders (train/<class>/<file>, val/...) as
    [<class>/<file>, digest]; none of a run on class folders alone (<class>/<file>)."""
    return [[name.split("/", 1)[1], digest] for name, digest, *_ in sample if name.count("/") >= 2]
