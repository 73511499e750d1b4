"""A folder of class folders: its files in a fixed order with their labels (``scan``), its
layout (one folder, or train/ beside test/ or val/), and its held-out splits, decided file by
file from a hash of each file's name (``split_by_name``): a folder that gains, loses or cannot
read some files keeps every other file in its split (beyond the smallest folders), so a test
image never becomes a training image between runs, for a resumed run, or for ``eval.py`` of an
older checkpoint."""

from __future__ import annotations

import hashlib
import logging
import os
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from litlab.errors import ConfigError, DataError

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


@dataclass
class FolderIndex:
    """The image files of a folder of class folders, in a fixed order, and their labels."""

    root: Path
    classes: list[str]
    files: list[str] = field(default_factory=list)  # relative to root
    labels: list[int] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # files without an image suffix
    outside: list[str] = field(default_factory=list)  # images beside the class folders


# Folders that systems write beside or inside the user's own: a Mac zip's __MACOSX (``._name``
# files), a Synology NAS's @eaDir (a thumbnail JPEG of each image, in every folder: trained on,
# they would be near-copies of the images, at other sizes, in every split), its recycle bin and
# snapshots, QNAP's, Windows' at a drive's root, ext4's lost+found. Compared case-folded
# (Windows writes $Recycle.Bin on its system drive, $RECYCLE.BIN on others).
SYSTEM_FOLDERS = frozenset(
    name.casefold()
    for name in (
        "__MACOSX",
        "@eaDir",
        "#recycle",
        "#snapshot",
        "@Recycle",
        "@Recently-Snapshot",
        "$RECYCLE.BIN",
        "System Volume Information",
        "lost+found",
    )
)


def left_out(name: str) -> bool:
    """A hidden file or folder (``.ipynb_checkpoints``, macOS's ``._name``), or a folder a
    system writes (SYSTEM_FOLDERS: a Mac zip's ``__MACOSX``, a Synology NAS's ``@eaDir``)."""
    return name.startswith(".") or name.casefold() in SYSTEM_FOLDERS


def system_folders_in(root: Path) -> list[str]:
    """The folders systems write (SYSTEM_FOLDERS) under ``root``, as paths under it: what a
    scan leaves out, and a scan before 2026-12-07 read."""
    found = []
    for folder, dirs, _ in os.walk(root, followlinks=True):
        found += [
            os.path.relpath(os.path.join(folder, d), root)
            for d in dirs
            if d.casefold() in SYSTEM_FOLDERS
        ]
        dirs[:] = [d for d in dirs if not left_out(d)]
        if len(found) >= 3:
            break
    return found


def class_names(root: Path) -> list[str]:
    """The class folders of ``root``, sorted (their labels are their positions)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not left_out(e.name))


def check_same_classes(train: Path, test: Path) -> None:
    """A split layout's train and test folders must name the same classes: labels are positions
    in the sorted names, so a class missing from one side would relabel every class after it."""
    a, b = class_names(train), class_names(test)
    if a != b:
        missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise DataError(
            f"{train} and {test} have different class folders (only in {train.name}/: "
            f"{missing or 'none'}; only in {test.name}/: {extra or 'none'}); give both the same "
            f"class folders, with the same names{encoding_hint(a, b)}"
        )
    trained = {os.path.realpath(train / name): name for name in a}
    held = {os.path.realpath(test / name): name for name in b}
    # one a link to the other, or inside it: a folder's real path or one of its parents' is the
    # other side's (linear in the classes: ImageNet-21k has 21,000); as (test, train) names
    shared = [
        (name, trained[p]) for real, name in held.items() for p in lineage(real) if p in trained
    ]
    shared += [
        (held[p], name) for real, name in trained.items() for p in lineage(real) if p in held
    ]
    if shared:
        held_name, trained_name = shared[0]
        raise DataError(
            f"{test / held_name} is {train / trained_name}, or holds it or lies in it (a link): "
            f"the {test.name} split would measure images trained on; give {test.name}/ images "
            "of its own"
        )


def encoding_hint(a: Sequence[str], b: Sequence[str]) -> str:
    """Where two lists of class names differ only in how their letters are encoded (macOS
    writes "é" as e and an accent, NFD; most systems as one letter, NFC: the names look the
    same but are not), or only in upper and lower case, a sentence saying so; else ""."""
    if list(a) == list(b):
        return ""
    return _spelled_otherwise(lambda form: sorted(map(form, a)) == sorted(map(form, b)))


def _spelled_otherwise(same: Callable[[Callable[[str], str]], bool]) -> str:
    """The sentence for names that ``same`` finds alike once written in one Unicode form
    (ENCODED_OTHERWISE), or in one form and case (CASED_OTHERWISE where case alone differs,
    else ENCODED_AND_CASED_OTHERWISE); "" where they differ otherwise."""

    def nfc(name: str) -> str:
        return unicodedata.normalize("NFC", name)

    if same(nfc):
        return ENCODED_OTHERWISE
    if not same(lambda name: nfc(name).casefold()):
        return ""
    return CASED_OTHERWISE if same(str.casefold) else ENCODED_AND_CASED_OTHERWISE


CASED_OTHERWISE = (
    " (they differ only in upper and lower case: class names are compared exactly, as labels; "
    "rename them to one spelling)"
)
ENCODED_AND_CASED_OTHERWISE = (
    " (they differ in upper and lower case and in how accented letters are encoded, Unicode "
    "NFD as macOS writes names against NFC: rename them to one spelling in one form, e.g. "
    "`convmv -r -f utf8 -t utf8 --nfc --notest <folder>`, then the case)"
)


ENCODED_OTHERWISE = (
    " (they differ only in how accented letters are encoded, Unicode NFD as macOS writes "
    "names against NFC: rename them in one form, e.g. `convmv -r -f utf8 -t utf8 --nfc "
    "--notest <folder>`)"
)


def encoding_hint_among(names: Sequence[str], known: Sequence[str]) -> str:
    """encoding_hint for ``names`` not among ``known`` (some of a model's classes): where each
    is one of them written in the other Unicode form, or in other upper and lower case, the
    sentence saying so; else ""."""
    return _spelled_otherwise(
        lambda form: bool(names) and {form(n) for n in names} <= {form(k) for k in known}
    )


def lineage(path: str) -> list[str]:
    """A real path and the folders above it, nearest first."""
    return [path, *map(str, Path(path).parents)]


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


def file_digests(dataset: Dataset) -> np.ndarray | None:
    """Each item's file's bytes digest (a cached image folder's: folder_cache.bytes_digest);
    None where they are not known (files read as they go, a cache from before digests)."""
    if isinstance(dataset, Subset):
        digests = file_digests(dataset.dataset)
        return None if digests is None else digests[np.asarray(dataset.indices, dtype=np.int64)]
    return getattr(dataset, "digests", None)


def scan(root: Path) -> FolderIndex:
    """``root/<class>/**/<image>``, classes and files sorted (torchvision's ImageFolder order).

    Hidden files and folders (``.ipynb_checkpoints``, macOS's ``._name`` files) and the folders
    systems write (``__MACOSX``, a Synology NAS's ``@eaDir`` thumbnails: SYSTEM_FOLDERS) are left
    out; links are followed, but a folder or image already read (a link back up the tree,
    a second name for an image) is not read again, and one folder or image in two classes is
    refused. Files without an image suffix are listed in ``ignored``."""
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise DataError(f"image folder {root} {what}; put images in {root}/<class name>/")
    classes = class_names(root)
    if not classes:
        raise DataError(f"{root} has no class folders; put images in {root}/<class name>/")
    index = FolderIndex(root, classes)
    read: dict[str, str] = {}  # every real folder read, and whose class it is
    links: list[tuple[str, int]] = []  # image files that are links, with their labels
    for label, name in enumerate(classes):
        found = []
        for folder, names in _walk(root / name, read, name):
            where = os.path.relpath(folder, root)  # once a folder: a million files are common
            for n, is_link in names:
                path = os.path.join(where, n)
                if not _is_image_name(n):
                    index.ignored.append(path)
                    continue
                found.append(path)
                if is_link:
                    links.append((path, label))
        index.files += sorted(found)
        index.labels += [label] * len(found)
    if links:
        _read_linked_images_once(index, links, read)
    index.outside = sorted(
        e.name
        for e in os.scandir(root)
        if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
    )
    if not index.files:
        raise DataError(f"{root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return index


def _walk(
    top: Path, read: dict[str, str], name: str
) -> Iterator[tuple[str, list[tuple[str, bool]]]]:
    """(folder, [(file name, is a link)]) of ``top`` and the folders below it,
    as os.walk (top down, links followed, sub-folders in sorted order) but with whether each
    file is a link (a file's directory entry says so: no call per file). A real folder read
    before (recorded in ``read`` with its class) is not read again; in another class, refused."""
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        real = os.path.realpath(folder)
        if read.get(real, name) != name:  # a folder of two classes: two labels an image
            raise DataError(
                f"{folder} is a folder of class {read[real]!r} too (a link): its images "
                f"would carry two labels; keep each image in one class folder"
            )
        if real in read:  # each copy would be trained on, and land in test as well
            continue
        read[real] = name
        folders, files = [], []
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if left_out(entry.name):
                        continue
                    try:
                        is_dir = entry.is_dir()  # through a link
                    except OSError:
                        is_dir = False
                    if is_dir:
                        folders.append(entry.name)
                    else:
                        files.append((entry.name, entry.is_symlink()))
        except OSError as error:  # os.walk's default: an unlisted folder is passed over
            log.warning("%s could not be listed (%s): its images are not read", folder, error)
            continue
        yield folder, files
        # sorted: of two links to one folder, the first name reads it on every machine (a
        # file's name decides its split); popped in that order
        stack += [os.path.join(folder, f) for f in sorted(folders, reverse=True)]


def _read_linked_images_once(
    index: FolderIndex, links: list[tuple[str, int]], read: dict[str, str]
) -> None:
    """Image files that are links to an image read under another name (alias.jpg -> 1.jpg in a
    folder read, or two links to one image) are read once: each name is split on its own, so
    one picture could be trained on and tested. A link to an image of another class is
    refused (two labels). A broken link stays, to be reported unreadable."""
    labels = {name: label for label, name in enumerate(index.classes)}
    first: dict[str, int] = {}  # an image outside the folder: the label of its first link
    dropped = set()
    for path, label in sorted(links):
        target = os.path.realpath(os.path.join(index.root, path))
        folder, name = os.path.split(target)
        if folder in read and _is_image_name(name) and os.path.isfile(target):
            other = labels[read[folder]]  # read under its own name there
        elif target in first:
            other = first[target]
        else:
            first[target] = label
            continue
        if other != label:
            raise DataError(
                f"{index.root / path} is an image of class {index.classes[other]!r} too (a "
                "link): it would carry two labels; keep each image in one class folder"
            )
        dropped.add(path)
    if dropped:
        log.info(
            "%s: %d link(s) to images read under another name, read once", index.root, len(dropped)
        )
        kept = [i for i, f in enumerate(index.files) if f not in dropped]
        index.files = [index.files[i] for i in kept]
        index.labels = [index.labels[i] for i in kept]


def _holds_an_image_file(folder: Path) -> bool:
    """Whether ``folder`` (a class folder) or a folder below it holds a file named as an image,
    hidden ones aside (as ``scan`` reads them)."""
    for _, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not left_out(d)]
        if any(_is_image_name(f) and not left_out(f) for f in files):
            return True
    return False


def _is_image_name(name: str) -> bool:
    return not left_out(name) and os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def unread(index: FolderIndex) -> str | None:
    """What of the folder a run does not read, in words (None: nothing): files without an image
    suffix, by kind, and images beside the class folders rather than in one."""
    said = []
    if index.ignored:
        kinds = Counter(os.path.splitext(f)[1].lower() or "(no suffix)" for f in index.ignored)
        said.append(
            ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            + f" (no image suffix; litlab reads {', '.join(sorted(IMAGE_SUFFIXES))})"
        )
    if index.outside:
        said.append(
            f"{len(index.outside)} image(s) beside the class folders (e.g. {index.outside[0]}): "
            f"an image's class is the folder it is in, {index.root}/<class name>/"
        )
    return "not read: " + "; ".join(said) if said else None


def train_folder(root: Path) -> Path:
    """Where a folder's training class folders are: root/train, or root itself."""
    folders = split_folders(root)
    return folders["train"] if folders is not None else root


_LEFT_SAID: set[Path] = set()  # the split layouts whose unread entries were said
_SPLIT_NAMED_SAID: set[Path] = set()  # roots whose split-named class folders were said


def _say_what_a_split_layout_leaves(root: Path, folders: dict[str, Path]) -> None:
    """Once a process: what a folder laid out in splits holds beside the folders read (a
    valid/ beside val/, an unlabeled/ folder, images at the root): not read, and said (the
    flat layout says what it leaves out; this one said nothing)."""
    if root in _LEFT_SAID:
        return
    _LEFT_SAID.add(root)
    read = {path.name for path in folders.values()}
    left = sorted(p.name for p in root.iterdir() if p.name not in read and not left_out(p.name))
    if left:
        log.warning(
            "%s is laid out in splits (%s): %s beside them not read",
            root,
            ", ".join(f"{split}: {path.name}/" for split, path in folders.items()),
            ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else ""),
        )


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
        _say_what_a_split_layout_leaves(root, folders)
        return folders
    names = class_names(root) if root.is_dir() else []
    if names and all(n.lower() in SPLIT_NAMES for n in names):
        # a held-out folder alone (walkthrough 160: eval.py on heldout/test/<class>/)
        alone = f"; to test a model on {root / names[0]} alone, data.source.root={root / names[0]}"
        raise DataError(
            f"{root} holds folders named like splits ({', '.join(names)}), not class folders; "
            f"lay it out as {root}/train/<class>/ beside {root}/test/<class>/ (or val/, valid/, "
            f"validation/), or as {root}/<class>/"
            + (alone if len(names) == 1 and names[0].lower() in HELD_OUT_FOLDERS else "")
        )
    # a test/ beside the class folders, no train/ (not train/: a class of CIFAR-100's)
    splits = [n for n in names if n.lower() in HELD_OUT_FOLDERS]
    if splits and root not in _SPLIT_NAMED_SAID:
        _SPLIT_NAMED_SAID.add(root)
        log.warning(
            "%s: %s named like a split, taken as class folder(s) of the %d (a split layout has "
            "%s/train/<class>/ beside %s/test/<class>/); move it out if it is not a class",
            root,
            ", ".join(f"{n}/" for n in splits),
            len(names),
            root,
            root,
        )
    return None


def missing_classes(labels: torch.Tensor, classes: list[str]) -> list[str]:
    """The classes of which ``labels`` hold no image."""
    counts = torch.bincount(labels, minlength=len(classes))
    return [classes[i] for i in (counts == 0).nonzero().flatten().tolist()]


def check_classes_present(
    labels: torch.Tensor,
    classes: list[str],
    where: Path,
    split: str,
    among: Sequence[str] | None = None,
) -> None:
    """Every class must have training images: a class the model never saw is never predicted,
    and all its test images count as errors. A held-out split without a class is a warning.
    ``among``: only these classes are checked (a folder labelled by the model's classes, eval.py:
    the ones it has folders of)."""
    empty = [c for c in missing_classes(labels, classes) if among is None or c in among]
    if not empty:
        return
    if split == "train":
        bare = [c for c in empty if not _holds_an_image_file(where / c)]
        if bare == empty:  # (walkthrough 150: an empty folder was told its files were unreadable)
            raise DataError(
                f"class folder(s) {bare} of {where} hold no image file: every class folder is a "
                "class, and each needs training images; add images to them or remove the folders"
            )
        raise DataError(
            f"class folder(s) {empty} of {where} leave no readable image for training (their "
            "files are unreadable, or all fall in the share held out for testing or validation, "
            "chosen file by file from the names"
            + (f"; {bare} hold no image file" if bare else "")
            + "); add images to them or remove the folders"
        )
    log.warning("the %s split of %s holds no image of class(es) %s", split, where, empty)


def test_split(names: Sequence[str], fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, test) positions of a folder's files without a split folder: about ``fraction``
    of each class, file by file (``split_by_name``)."""
    return split_by_name(names, fraction, "test", "data.source.test_fraction")


def validation_split(
    names: Sequence[str], fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, validation) positions of a folder's training files, file by file, by ``seed``."""
    return split_by_name(names, fraction, f"val-{seed}", "data.val_fraction")
