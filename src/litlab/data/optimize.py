"""Convert an image folder into LitData chunks that ``data=streaming`` trains on.

    python -m litlab.data.optimize /path/to/images /path/to/chunks
    python -m litlab.data.optimize /path/to/images s3://bucket/chunks --max-side 512

SRC is laid out as for ``data=image_folder``: ``SRC/<class>/*`` (a fixed ``--test-fraction``,
decided file by file from its name, is held out for testing) or ``SRC/train/<class>/`` beside
``SRC/test/`` (or ``val/``). ``--val-fraction`` of the training images (the same split, file by
file, as the DataModule's ``data.val_fraction`` with ``data.split_seed=0``) become the
validation split, so the three splits hold the very images
``data=image_folder`` would use. Each image is stored as its file's bytes (JPEG, PNG, WebP as
they are), or re-encoded as JPEG when ``--max-side`` shrinks it; files that do not decode are
skipped with a warning and counted. LitData's ``optimize`` does the writing, on every core, with
its progress bar, to a folder or an object store (credentials from the environment), each
worker a slice of the items in order (the same stream at every conversion); each split's labels
are recorded in stream order in ``DST/meta`` (FID's class-stratified samples). Re-running is
safe: a finished conversion of the same files and options, its splits whole, is left alone; an
unfinished or damaged one (or one made before the labels were recorded) is written again from
the start. Files of yours that LitData would delete in DST are refused in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from litlab.data.fingerprint import copies_among, copies_sentence, fingerprints, folder_of
from litlab.data.folder_cache import bytes_digest, cache_key
from litlab.data.folder_index import (
    FolderIndex,
    check_classes_present,
    check_same_classes,
    scan,
    split_folders,
    test_split,
    train_folder,
    unread,
    validation_split,
)
from litlab.data.pixels import eight_bit, upright
from litlab.data.streaming import (
    META_FORMAT,
    _litdata,
    damaged_chunk,
    encode_labels,
    join,
    missing_credentials,
    read_meta,
)
from litlab.errors import DataError, LitlabError, fail
from litlab.files import pid_namespace, writer_tag

# Workers forked from this process start at once; spawned ones import torch again (~5 s each).
START_METHOD = "fork" if sys.platform == "linux" else None
Item = tuple[str, int, str]  # (path, label, name relative to SRC)


def source_splits(
    root: Path, test_fraction: float, val_fraction: float
) -> tuple[list[str], dict[str, list[Item]], str]:
    """(classes, {split: items}, key): the images of each split, as an image folder and the
    DataModule split them, and a key of every file's name, size and time and the fractions."""
    folders = split_folders(root)
    given_val = None
    if folders is not None:
        for split in ("test", "val"):
            if split in folders:
                check_same_classes(folders["train"], folders[split])
        train, test = scan(folders["train"]), scan(folders["test"])
        indexes = [train, test]
        train_items, test_items = _items(train), _items(test)
        train_names = train.files
        if "val" in folders:  # a validation folder of its own: all of train/ is trained on
            given_val = scan(folders["val"])
            indexes.append(given_val)
    else:
        whole = scan(root)
        indexes = [whole]
        items = _items(whole)
        keep, held = test_split(whole.files, test_fraction)
        train_items = [items[i] for i in keep.tolist()]
        test_items = [items[i] for i in held.tolist()]
        train_names = [whole.files[i] for i in keep.tolist()]
    if given_val is not None:
        splits = {"train": shuffled(train_items), "val": shuffled(_items(given_val))}
    else:
        fit, val = validation_split(train_names, val_fraction, 0)  # data.split_seed's default
        splits = {
            "train": shuffled([train_items[i] for i in fit.tolist()]),
            "val": shuffled([train_items[i] for i in val.tolist()]),
        }
    splits["test"] = shuffled(test_items)
    # every class keeps training files (the folder path's rule; unreadable ones: convert())
    train_labels = torch.tensor([label for _, label, _ in splits["train"]], dtype=torch.long)
    check_classes_present(train_labels, indexes[0].classes, train_folder(root), "train")
    for index in indexes:  # what the conversion leaves out, as the check and a run say it
        if note := unread(index):
            print(f"{index.root}: {note}")
    key = hashlib.sha256(
        # "by name": the splits' method (file by file, from the names), part of what was written
        repr(
            [cache_key(i, 0, 0) for i in indexes] + [test_fraction, val_fraction, "by name"]
        ).encode()
    )
    return indexes[0].classes, splits, key.hexdigest()[:16]


def shuffled(items: list[Item]) -> list[Item]:
    """The items in a fixed random order. Folders list their images class by class, and LitData
    shuffles the order of chunks and then items only within blocks of a chunk (of 32 items:
    streaming.ITEM_SHUFFLE_WINDOW): written in folder order, a chunk would hold one or two
    classes and so would every training batch."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(0))
    return [items[i] for i in order.tolist()]


def _items(index: FolderIndex) -> list[Item]:
    return [
        (str(index.root / f), label, f) for f, label in zip(index.files, index.labels, strict=True)
    ]


def encode(item: Item, max_side: int | None, quality: int) -> Any:
    """One image as a LitData sample: its file's bytes (re-encoded as JPEG when ``max_side``
    shrinks it), label and name; nothing at all for a file that does not decode."""
    path, label, name = item
    try:
        data = Path(path).read_bytes()
        digest = bytes_digest(data)  # the file's own bytes (copies among the splits)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # the whole file: a truncated one fails here, not in training
                if max_side and max(image.size) > max_side:
                    # 8 bits first: Pillow's reducing resize refuses 16-bit modes ("wrong mode")
                    gray = image.mode in ("1", "L", "F") or image.mode.startswith("I")
                    small = eight_bit(upright(image), 1 if gray else 3)  # JPEG drops EXIF
                    small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
                    buffer = io.BytesIO()
                    small.save(buffer, "JPEG", quality=quality)
                    data = buffer.getvalue()
    except Exception as e:  # every failure of a damaged file is a skip
        # (PIL names the bytes it was given: "<_io.BytesIO object at 0x7f...>")
        why = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "its bytes", str(e))
        print(f"skipped unreadable image {name}: {type(e).__name__}: {why}", file=sys.stderr)
        return
    record = os.environ.get(LABELS_VARIABLE)
    if record:  # this worker's items in the order it writes them (LitData's writer rank)
        rank = int(os.environ.get("DATA_OPTIMIZER_GLOBAL_RANK", "0"))
        _record(Path(record) / f"{rank}.txt", f"{label}\n")
        _record(Path(record) / f"{rank}.digests", json.dumps([digest, name]) + "\n")
    yield {"image": data, "label": label, "name": name}


def _record(path: Path, line: str) -> None:
    """One line appended to a worker's record file (one handle per file, written at once)."""
    if str(path) not in _RECORDS:
        _RECORDS[str(path)] = open(path, "a", buffering=1)  # noqa: SIM115 - closed at exit
    _RECORDS[str(path)].write(line)


def recorded_copies(records: dict[str, Path]) -> dict[str, list[list[str]]]:
    """Each held-out split's images whose source files are byte-for-byte copies of files
    converted into an earlier split (val: of train; test: of train or val), as [held-out name,
    training name] (``<split>:<class>/<file>``), from the digests encode() recorded in each
    split's record folder. The digests are read into arrays and the names of the copies alone
    afterwards (8 bytes a file held, not a name and a digest as Python objects)."""
    earlier: list[tuple[str, list[Path]]] = []  # the splits read, with their record files
    digests: list[np.ndarray] = []
    copies: dict[str, list[list[str]]] = {}
    for split in ("train", "val", "test"):
        if split not in records:
            continue
        files = sorted(records[split].glob("*.digests"))
        held = np.fromiter(_recorded_digests(files), dtype=np.int64)
        if digests and (found := copies_among(np.concatenate(digests), held)):
            held_names = _names_at([(split, files)], {h for h, _ in found})
            trained_names = _names_at(earlier, {t for _, t in found})
            copies[split] = [[held_names[h], trained_names[t]] for h, t in found]
        earlier.append((split, files))
        digests.append(held)
    return copies


def _recorded(files: list[Path]) -> Iterator[str]:
    """The record files' lines (``[digest, name]``, one image each), in order."""
    for path in files:
        with open(path) as lines:
            yield from lines


def _recorded_digests(files: list[Path]) -> Iterator[int]:
    for line in _recorded(files):
        yield int(line[1 : line.index(",")])  # (json's "[digest, name]": twice as fast)


def _names_at(splits: list[tuple[str, list[Path]]], positions: set[int]) -> dict[int, str]:
    """``<split>:<name>`` at these positions of the splits' records read one after another."""
    at = 0
    names = {}
    for split, files in splits:
        for line in _recorded(files):
            if at in positions:
                names[at] = f"{split}:{json.loads(line)[1]}"
            at += 1
    return names


# Where encode() records the labels it writes, one file per LitData writer rank: LitData's index
# lists the ranks' chunks in rank order, each rank's items in the order written, so the files
# joined in rank order are the split's labels in stream order (skipped files leave no gap).
LABELS_VARIABLE = "LITLAB_OPTIMIZE_LABELS"
_RECORDS: dict[str, Any] = {}  # a worker's open record files, by path


def recorded_labels(folder: Path, written: int) -> list[int] | None:
    """The labels encode() recorded in ``folder``, in stream order; None unless they count
    exactly the ``written`` items."""
    files = sorted(folder.glob("*.txt"), key=lambda f: int(f.stem))
    labels = [int(line) for f in files for line in f.read_text().split()]
    return labels if len(labels) == written else None


def _written(output_dir: str) -> int:
    """How many samples LitData wrote to one split (its index.json)."""
    litdata = _litdata()
    return len(litdata.StreamingDataset(output_dir))


def intact(dst: str, meta: dict[str, Any]) -> bool:
    """Whether each split of a finished conversion still reads with the count it recorded, and
    (in a local folder) holds every chunk file its index lists at its size (a split removed or
    rewritten since, or a chunk deleted, is converted again, not vouched for by the meta: review
    172, "nothing to do" was said over missing chunks)."""
    for split, report in meta["splits"].items():
        try:
            if _written(join(dst, split)) != report["images"]:
                return False
            if damaged_chunk(join(dst, split)):
                return False
        except Exception:  # a missing or damaged split fails in LitData's many ways
            return False
    return True


def streamed_labels(output_dir: str) -> list[int]:
    """A written split's labels read back from its chunks (where encode() did not record them:
    reads the whole split)."""
    return [int(item["label"]) for item in _litdata().StreamingDataset(output_dir)]


# LitData's staging folders, one per machine unless these are set (its defaults: $TMPDIR/chunks
# and $TMPDIR/data), emptied by every optimize() as it starts.
STAGING_VARIABLES = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
STAGING_PREFIX = "litlab-optimize-"


def _remove_abandoned_staging(parent: Path) -> None:
    """Remove the staging folders of this host's conversions whose process is gone and that
    nothing changed for an hour: LitData ends a conversion stopped by Ctrl-C with os._exit,
    past any cleanup (they can hold the chunks of a whole split bound for an object store).
    Only folders of this pid namespace (``writer_tag``: containers with the host's name number
    their processes apart); the hour is a margin for machines of one name sharing the disk."""
    mine = f"{STAGING_PREFIX}{socket.gethostname()}-{pid_namespace()}-"
    for folder in parent.glob(f"{mine}*"):
        try:
            changed = max(p.stat().st_mtime for p in [folder, *folder.iterdir()])
        except OSError:
            continue
        if time.time() - changed < 3600:
            continue
        mark = re.fullmatch(r"(\d+)-[0-9a-f]{12}", folder.name.removeprefix(mine))
        if mark is None or int(mark[1]) == os.getpid():  # (another host's name may start so)
            continue
        try:
            os.kill(int(mark[1]), 0)
        except OverflowError:
            continue  # no pid of this machine
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


@contextmanager
def private_staging() -> Iterator[Path]:
    """Give LitData's optimize() staging folders of this conversion's own, removed afterwards.

    LitData stages the chunks bound for an object store (and merges index files) in one folder
    per machine, $TMPDIR/chunks, and every optimize() deletes that folder as it starts: two
    conversions at once on one machine (two jobs on a node, two users of a login node) deleted
    each other's staged chunks before their upload (seen: FileNotFoundError on chunk-0-0.bin),
    or could upload the other's chunk of the same name. The private folder is made beside the
    folder the user's DATA_OPTIMIZER_CACHE_FOLDER names (a scratch disk; not inside it, which
    other LitData jobs delete; inside it only where its parent is / or not writable), else in
    $TMPDIR; the forked workers inherit it. (os.environ is the process's: one conversion at a
    time per process.)"""
    user = os.environ.get(STAGING_VARIABLES[0])
    parent = Path(tempfile.gettempdir())
    if user:
        parent = Path(os.path.abspath(user)).parent
        if parent == Path(parent.anchor) or not os.access(parent, os.W_OK):
            parent = Path(os.path.abspath(user))  # a mount point's (/scratch): on that disk still
    parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(parent)
    private = parent / f"{STAGING_PREFIX}{writer_tag()}"
    private.mkdir()
    before = {name: os.environ.get(name) for name in STAGING_VARIABLES}
    os.environ[STAGING_VARIABLES[0]] = str(private / "chunks")
    os.environ[STAGING_VARIABLES[1]] = str(private / "data")
    try:
        yield private
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(private, ignore_errors=True)


def convert(
    src: Path,
    dst: str,
    max_side: int | None = None,
    quality: int = 90,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    workers: int | None = None,
    chunk_bytes: str | int = "64MB",
    replace: bool = False,
) -> dict[str, Any]:
    """Write SRC's splits to DST as LitData datasets, then DST/meta; return the meta. A
    finished conversion of other files, fractions or options at DST is refused unless
    ``replace``: runs trained on it resume and test on its splits."""
    litdata = _litdata()
    check_scheme(dst)
    src = src.resolve()  # the meta's advice (convert it again: SRC DST) works from any folder
    if "://" not in dst and Path(dst).expanduser().resolve().is_relative_to(src):
        raise DataError(  # its folder would be one more class folder of SRC (with no images)
            f"{dst} lies inside {src}: there it would be taken for a class folder of the images "
            "(the next run or conversion of the folder refuses it); write the chunks outside "
            f"{src}"
        )
    classes, splits, key = source_splits(src, test_fraction, val_fraction)
    options = {"max_side": max_side, "quality": quality if max_side else None}
    try:
        meta = read_meta(dst)
        if (
            meta.get("source_key") == key
            and meta.get("options") == options
            and "label_items" in meta  # written before the labels were recorded: again
            and intact(dst, meta)
        ):
            print(f"{dst} already holds this conversion of {src}; nothing to do")
            return meta
    except DataError:
        meta = None  # nothing there yet, or an unfinished conversion: write it all
    other = meta is not None and (meta.get("source_key"), meta.get("options")) != (key, options)
    fractions = {"test": test_fraction, "val": val_fraction}
    if (
        other
        and not replace
        and intact(dst, meta)
        and not same_splits(src, meta, fractions, options)
    ):
        refuse_replacing(dst, meta, src, fractions, options)
    for split, items in splits.items():
        if not items:
            raise DataError(f"the {split} split of {src} would be empty; add images or fractions")
    check_destination(dst)
    with private_staging() as private:  # not LitData's folder, shared by every conversion
        # An earlier conversion's meta would mark this one finished while its splits are rewritten:
        # until the end, DST/meta says "unfinished" (a run refuses it; a new conversion redoes it).
        _write_meta(dst, {"format": META_FORMAT, "unfinished": True, "source": str(src)})
        report, labels, records = {}, {}, {}
        for split, items in splits.items():
            record = records[split] = private / "labels" / split
            record.mkdir(parents=True)
            os.environ[LABELS_VARIABLE] = str(record)  # the forked workers inherit it
            try:
                litdata.optimize(
                    fn=partial(encode, max_side=max_side, quality=quality),
                    inputs=items,
                    output_dir=join(dst, split),
                    chunk_bytes=chunk_bytes,
                    num_workers=max(1, min(workers or os.cpu_count() or 1, len(items))),
                    reorder_files=False,  # LitData would sort by file size, which follows the class
                    # each worker a slice of the items, written in their order (LitData's default
                    # hands them out as workers ask: another order at every conversion)
                    keep_data_ordered=True,
                    mode="overwrite",
                    start_method=START_METHOD,
                )
            finally:
                os.environ.pop(LABELS_VARIABLE, None)
            written = _written(join(dst, split))
            report[split] = {"images": written, "skipped": len(items) - written}
            labels[split] = recorded_labels(record, written)
            if labels[split] is None:
                print(
                    f"the {split} split's labels were not recorded in order (LitData wrote "
                    f"{written} items): FID samples of it will not be class-stratified",
                    file=sys.stderr,
                )
            if split == "train":  # a class whose files were all unreadable: refused as a run does
                trained = labels[split]
                if trained is None:
                    trained = streamed_labels(join(dst, split))
                # (the meta still says unfinished: a run refuses DST, converting again redoes it)
                check_classes_present(
                    torch.tensor(trained, dtype=torch.long), classes, train_folder(src), split
                )
        meta = {
            "format": META_FORMAT,
            "classes": classes,
            "splits": report,
            "source": str(src),
            "source_key": key,
            "options": options,
            "fractions": {"test": test_fraction, "val": val_fraction},
        }
        copies = recorded_copies(records)
        for split, found in copies.items():  # (a run on the chunks says them again)
            print(
                f"warning: {copies_sentence(found, report[split]['images'], split)} (recorded "
                "with the chunks; runs on them say it again): remove the copies from the image "
                "folder and convert it again",
                file=sys.stderr,
            )
        meta["copies_of_training"] = copies  # (a conversion before 2026-12-07: none recorded)
        # a sample of the files trained on (and validated on, a val/ folder's), named under SRC,
        # with their bytes' digests: eval.py recognises a copy of SRC by them (checkpoints keep
        # them as an image folder run's)
        named = [
            Path(path).relative_to(src).as_posix()
            for split in ("train", "val")
            if split == "train" or split_folders(src) is not None
            for path, _, _ in splits.get(split, [])
        ]
        meta["trained_files"] = fingerprints(src, named)
        _write_meta(dst, meta, labels)  # last: the conversion is finished
        return read_meta(dst)


# What a conversion writes under DST: each split's and the meta's LitData index and chunks
# (and, until the end, the index of each writer and node: 0.index.json, 0-index.json).
_OWN_OBJECT = re.compile(r"(train|val|test|meta)/((\d+[.-])?index\.json|chunk-\d+-\d+\.bin)")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def check_scheme(dst: str) -> None:
    """Refuse a URL that LitData cannot write a conversion to, before anything is read."""
    url = _URL.match(dst)
    if url is None or url[1] in ("s3", "gs"):
        return
    if url[1] == "r2":  # LitData's R2 client needs a Lightning data connection a URL lacks
        raise DataError(
            f"{dst}: LitData writes to r2:// only through a Lightning Studio's data connection "
            "(a /teamspace/lightning_storage/ path), not from a URL; convert to a local "
            "folder, s3:// or gs://"
        )
    raise DataError(
        f"{dst}: LitData cannot write a conversion to {url[1]}://; convert to a local folder "
        "(or s3://, gs://), then copy that folder there to stream it"
    )


def check_destination(dst: str) -> None:
    """Refuse a destination holding files of the user's that a conversion would delete.

    LitData's overwrite (which a re-run needs) removes in a local DST/<split> and DST/meta every
    file ending in .bin or index.json and the .checkpoints folder (model.bin, my-index.json);
    on an object store every object whose key starts with DST/<split> or DST/meta, without the
    slash: DST/train/notes.txt, and also DST/train_raw/... or DST/trainer.log. Files and
    objects of an earlier conversion, and other names, are fine."""
    url = _URL.match(dst)
    if url is None:
        doomed = [str(f) for f in _local_doomed(Path(dst))]
        what, own = "file(s)", "folder"
        rule = "every .bin and *index.json file in its train, val, test and meta folders"
    else:
        bucket, _, prefix = dst[url.end() :].partition("/")
        prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        doomed = [
            f"{url[0]}{bucket}/{key}"
            for key in _object_keys(url[1], bucket, prefix)
            if key[len(prefix) :].startswith(("train", "val", "test", "meta"))
            and not _OWN_OBJECT.fullmatch(key[len(prefix) :])
        ]
        what, own = "object(s)", "prefix"
        rule = "everything whose name starts with train, val, test or meta"
    if doomed:
        raise DataError(
            f"{dst} holds {len(doomed)} {what} that converting there would delete (LitData "
            f"replaces {rule}), e.g. {', '.join(doomed[:3])}; convert into a {own} of its own, "
            f"e.g. {dst.rstrip('/')}/litdata"
        )


def _local_doomed(dst: Path) -> list[Path]:
    """The user's files that LitData's overwrite deletes in a local DST (resolver.py,
    ``_assert_dir_has_index_file``)."""
    doomed = []
    for folder in ("train", "val", "test", "meta"):
        if not (dst / folder).is_dir():
            continue
        for path in sorted((dst / folder).iterdir()):
            name = f"{folder}/{path.name}"
            if path.name == ".checkpoints" or (
                path.name.endswith((".bin", "index.json")) and not _OWN_OBJECT.fullmatch(name)
            ):
                doomed.append(path)
    return doomed


def _object_keys(scheme: str, bucket: str, prefix: str) -> Iterator[str]:
    """The keys under ``prefix`` in an s3:// or gs:// bucket, listed with the client LitData
    writes with (boto3; google-cloud-storage, which LitData needs for gs:// too)."""
    if scheme == "s3":
        from litdata.streaming.fs_provider import S3FsProvider

        client = S3FsProvider().client.client
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            yield from (item["Key"] for item in page.get("Contents", []))
        return
    try:
        from google.cloud import storage
    except ImportError as e:
        raise DataError(
            "converting to gs:// needs google-cloud-storage: pip install google-cloud-storage"
        ) from e
    yield from (blob.name for blob in storage.Client().list_blobs(bucket, prefix=prefix))


def _write_meta(
    dst: str, meta: dict[str, Any], labels: dict[str, list[int] | None] | None = None
) -> None:
    """DST/meta: item 0 the meta, then one item for each split's labels in stream order
    (``label_items`` names it; a run reads only the items it needs)."""
    recorded = {split: v for split, v in (labels or {}).items() if v is not None}
    items = [encode_labels(v) for v in recorded.values()]
    if labels is not None:  # a finished conversion: the splits whose labels were recorded
        meta = {**meta, "label_items": {split: i + 1 for i, split in enumerate(recorded)}}
    _litdata().optimize(
        fn=_meta_item,
        inputs=[json.dumps(meta), *items],
        output_dir=join(dst, "meta"),
        chunk_size=1,
        num_workers=1,
        keep_data_ordered=True,  # item i+1: label_items' index
        mode="overwrite",
        start_method=START_METHOD,
        verbose=False,
    )


def _meta_item(text: str) -> dict[str, str]:
    return {"json": text}


# A size as LitData reads one: a number and its unit (tb, gb, mb, kb, t, g, m, k, b).
_SIZE = re.compile(r"\s*\d+(\.\d+)?\s*([tgmk]b?|b)\s*", re.IGNORECASE)


def chunk_size(text: str) -> str | int:
    """--chunk-bytes as LitData takes it: a size with its unit (64MB), or a number of bytes
    (LitData refuses a bare number given as text, with a traceback)."""
    if text.strip().isdigit():
        return int(text)
    if not _SIZE.fullmatch(text):
        fail(f"--chunk-bytes {text}: give a size such as 64MB or 512kb, or a number of bytes")
    return text


def same_splits(
    src: Path, meta: dict[str, Any], fractions: dict[str, float], options: dict[str, Any]
) -> bool:
    """Whether a finished conversion of ``src`` (its ``meta``) differs from this one (at
    ``fractions``) only in fractions that its own split folders make moot (test/ for
    --test-fraction, val/ for --val-fraction): the same files and options, the same splits
    (review 172: refused as "test fraction 0.2 -> 0.3")."""
    folders = split_folders(src) or {}
    then = meta.get("fractions") or {}
    if folder_of(meta.get("source")) != src or not folders or meta.get("options") != options:
        return False
    # the fractions asked for, those the folders make moot at the earlier conversion's
    asked = {k: float(then[k]) if k in folders and k in then else v for k, v in fractions.items()}
    if asked == fractions:  # no fraction is moot: the files or a fraction that splits changed
        return False
    return source_splits(src, asked["test"], asked["val"])[2] == meta.get("source_key")


def refuse_replacing(
    dst: str,
    meta: dict[str, Any],
    src: Path,
    fractions: dict[str, float],
    options: dict[str, Any],
) -> None:
    """A finished conversion at DST of other files, fractions or options than asked, refused:
    written over, the runs trained on it would be tested on splits holding their own training
    images, and could no longer resume (walkthrough 168: replaced without a word)."""
    then = meta.get("fractions") or {}
    differs = [
        f"{name} fraction {then.get(name)} -> {value:g}"
        for name, value in fractions.items()
        if then.get(name) is not None and float(then[name]) != value
    ]
    if meta.get("options", options) != options:
        differs.append(f"options {meta.get('options')} -> {options}")
    if folder_of(meta.get("source")) != src:
        differs.append(f"source {meta.get('source')} -> {src}")
    raise DataError(
        f"{dst} holds a finished conversion of {meta.get('source')} "
        f"({'; '.join(differs) or 'its files changed since'}), which runs trained on it resume "
        "and test on: convert into another folder, or give --replace to write this one over it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litlab.data.optimize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", type=Path, help="the image folder")
    parser.add_argument("dst", help="output folder or URL (s3://, gs://)")
    parser.add_argument(
        "--max-side",
        type=int,
        default=None,
        help="shrink images whose longer side exceeds this (keep the shorter side at or above "
        "the training size: evaluation crops the centre square of the shorter side)",
    )
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of shrunk images")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="without SRC/test/")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="as data.val_fraction")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    parser.add_argument(
        "--chunk-bytes", default="64MB", help="LitData chunk size: 64MB, 512kb, or bytes"
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="write over a finished conversion of other files, fractions or options at DST",
    )
    args = parser.parse_args(argv)
    if args.max_side is not None and args.max_side < 1:
        fail(f"--max-side must be a positive number of pixels, got {args.max_side}")
    args.chunk_bytes = chunk_size(args.chunk_bytes)
    try:
        meta = convert(
            args.src,
            args.dst,
            args.max_side,
            args.quality,
            args.test_fraction,
            args.val_fraction,
            args.workers,
            args.chunk_bytes,
            args.replace,
        )
    except LitlabError as e:
        fail(str(e))
    except Exception as e:
        if why := missing_credentials(args.dst, e):
            fail(why)
        raise
    counts = ", ".join(
        f"{s} {r['images']} ({r['skipped']} skipped)" for s, r in meta["splits"].items()
    )
    print(f"{args.dst}: {len(meta['classes'])} classes; {counts}")
    trained = meta["splits"]["train"]["images"]
    # streaming.yaml's batch of 128 fits a split of that many (a small folder's did not: 176)
    batch = (
        "" if trained >= 128 else f" data.batch_size={2 ** max(0, (trained // 4).bit_length() - 1)}"
    )
    print(
        f"train on it: python train.py data=streaming data.source.input_dir={args.dst} "
        f"data.num_classes={len(meta['classes'])}{batch}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
