"""Pre-flight check of an image folder before a long run: classes, counts, sizes, bad files, and
whether a run would accept the folder at all.

    python -m litlab.data.check /path/to/images            # root/<class>/ or root/train|test/ (val/...)
    python -m litlab.data.check /path/to/images --size 64 --num-classes 10 --batch-size 256

Every image file is opened and decoded (at reduced scale where the format allows) by every core,
as the first run's cache would (about as long as that first decode); the rate is printed. The
run's rules are applied to the readable files: the same classes in every split folder, every
class with training images once the test and validation files (held out by name, as a run
holds them out) are set aside, at least --batch-size training images for each of --processes
(of the --train-fraction trained on), and --num-classes when given. The images each split would hold are printed,
and validation or test images that are byte-for-byte copies of files a run would train on.

Output: plain lines; each unreadable file on a line of its own, tab-separated:
"unreadable<TAB><path><TAB><reason>". Files without an image suffix (.heic, .txt, ...) and hidden
files are not read by litlab: they are counted, not decoded.

Exit status: 0 the folder is ready; 1 a run would train, skipping the unreadable files listed (and
counting them in summary.json); 2 a run would be refused (the reasons are printed), or bad input.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from PIL import Image

from litlab.data.fingerprint import copies_among, copies_sentence
from litlab.data.folder_cache import bytes_digest
from litlab.data.folder_index import (
    HELD_OUT_FOLDERS,
    FolderIndex,
    check_classes_present,
    check_same_classes,
    missing_classes,
    scan,
    split_folders,
    test_split,
    unread,
    validation_split,
)
from litlab.data.pixels import check_decoded_shape, load_image, why_unreadable
from litlab.errors import DataError, LitlabError, fail


def probe(
    path: str, size: int, channels: int
) -> tuple[str, tuple[int, int] | None, str | None, int]:
    """(mode, (width, height), None, digest of its bytes) of a readable file, else (.., None,
    reason, ..)."""
    digest = 0
    try:
        data = Path(path).read_bytes()
        digest = bytes_digest(data)
        with warnings.catch_warnings():  # a decompression bomb is a finding, not a stray warning
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                mode, dims = image.mode, image.size
        load_image(io.BytesIO(data), size, channels)
        return mode, dims, None, digest
    except Exception as e:  # every failure of a damaged file is a finding here
        return "?", None, why_unreadable(e), digest


def splits(root: Path) -> dict[str, FolderIndex]:
    """The folders a run reads, by the run's split names: train and test (the held-out folder:
    test/, or val/ beside train/ as ImageNet has it) and val (beside both); or "all" for a root of
    class folders (test and validation files are then held out by name)."""
    folders = split_folders(root)
    if folders is not None:
        return {split: scan(path) for split, path in folders.items()}
    return {"all": scan(root)}


SPLIT_ORDER = ("train", "val", "test")


def copies_said(
    root: Path, held: dict[str, list[Path]], trained: list[Path], digests: dict[Path, int]
) -> list[str]:
    """A warning for each held-out split with byte-for-byte copies of files a run would train
    on (for the test split: or validate on), as a run says them (DataModule._say_copies)."""
    notes, earlier = [], list(trained)
    for split in ("val", "test"):
        files = held.get(split, [])
        found = copies_among([digests[p] for p in earlier], [digests[p] for p in files])
        if found:
            named = [
                (os.path.relpath(files[h], root), os.path.relpath(earlier[t], root))
                for h, t in found
            ]
            notes.append(copies_sentence(named, len(files), split))
        earlier += files  # (the test split's: copies of validation files too)
    return notes


def refusals(
    root: Path,
    found: dict[str, FolderIndex],
    readable: dict[str, list[int]],
    args: argparse.Namespace,
    digests: dict[Path, int] | None = None,
) -> tuple[list[str], list[str], dict[str, int]]:
    """(why a run would refuse the folder, warnings, the images of each split) with only the
    ``readable`` files (positions in each split's index), as ImageFolder.load and its
    validation split decide; ``digests`` (each file's bytes): copies of training files among
    the held-out ones are warned of."""
    refused: list[str] = []
    notes: list[str] = []
    sizes: dict[str, int] = {}
    held: dict[str, list[Path]] = {}

    def files_and_labels(split: str, keep: list[int]) -> tuple[list[str], torch.Tensor]:
        index = found[split]
        labels = torch.tensor([index.labels[i] for i in keep], dtype=torch.long)
        return [index.files[i] for i in keep], labels

    def held_out(split: str, labels: torch.Tensor, classes: list[str]) -> None:
        if missing := missing_classes(labels, classes):
            notes.append(f"the {split} split holds no image of class(es) {missing}")

    try:
        classes = found["train" if "train" in found else "all"].classes
        if args.num_classes is not None and len(classes) != args.num_classes:
            splits = [f"{c}/" for c in classes if c.lower() in HELD_OUT_FOLDERS]
            refused.append(
                f"{len(classes)} class folders but --num-classes {args.num_classes}; "
                f"set data.num_classes={len(classes)}"
                + (f" (or move {', '.join(splits)} out: named like a split)" if splits else "")
            )
        if "all" in found:
            names, labels = files_and_labels("all", readable["all"])
            keep, test = test_split(names, args.test_fraction)
            held_out("test", labels[test], classes)
            sizes["test"] = len(test)
            where = root
            held["test"] = [root / names[i] for i in test.tolist()]
        else:
            for split, index in found.items():
                if split != "train":
                    check_same_classes(found["train"].root, index.root)
                    files, split_labels = files_and_labels(split, readable[split])
                    held_out(split, split_labels, classes)
                    sizes[split] = len(split_labels)
                    held[split] = [index.root / name for name in files]
            names, labels = files_and_labels("train", readable["train"])
            keep, where = torch.arange(len(names)), found["train"].root
        if "val" not in found:  # validation is carved out of the training files
            train, val = validation_split([names[i] for i in keep], args.val_fraction, args.seed)
            held_out("validation", labels[keep][val], classes)
            sizes["val"] = len(val)
            held["val"] = [where / names[i] for i in keep[val].tolist()]
            keep = keep[train]
        if digests is not None:
            notes += copies_said(root, held, [where / names[i] for i in keep.tolist()], digests)
        fit = max(1, round(len(keep) * args.train_fraction))  # data.train_fraction's share
        sizes["train"] = fit  # what trains, as a run's summary.json counts it (refused too)
        check_classes_present(labels[keep], classes, where, "train")
        share = fit // args.processes
        if share < args.batch_size:  # as the run refuses it (drop_last: no batch at all)
            each = f" of each of the {args.processes} processes" if args.processes > 1 else ""
            refused.append(
                f"batch_size {args.batch_size} exceeds the {share} training images{each}; "
                "lower data.batch_size (and --batch-size)"
            )
    except LitlabError as e:
        refused.append(str(e))
    return refused, notes, dict(sorted(sizes.items(), key=lambda kv: SPLIT_ORDER.index(kv[0])))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m litlab.data.check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=lambda p: Path(p).expanduser(), help="the image folder")
    parser.add_argument("--size", type=int, default=36, help="decode side (data.source.size)")
    parser.add_argument("--channels", type=int, default=3, help="1 or 3 (data.source.channels)")
    parser.add_argument("--num-classes", type=int, help="data.num_classes, checked when given")
    parser.add_argument(
        "--test-fraction", type=float, default=0.2, help="data.source.test_fraction"
    )
    parser.add_argument("--val-fraction", type=float, default=0.1, help="data.val_fraction")
    parser.add_argument("--seed", type=int, default=0, help="data.split_seed")
    parser.add_argument("--batch-size", type=int, default=128, help="data.batch_size (per process)")
    parser.add_argument(
        "--processes", type=int, default=1, help="trainer.devices x trainer.num_nodes"
    )
    parser.add_argument("--train-fraction", type=float, default=1.0, help="data.train_fraction")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="decoding processes (all cores)"
    )
    args = parser.parse_args(argv)
    try:
        check_decoded_shape(args.size, args.channels)
    except LitlabError as e:
        parser.error(str(e))
    if not 0.0 < args.train_fraction <= 1.0:
        parser.error("--train-fraction must lie in (0, 1]")
    for option in ("workers", "batch_size", "processes"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    for option in ("test_fraction", "val_fraction"):
        if not 0.0 < getattr(args, option) < 1.0:
            parser.error(f"--{option.replace('_', '-')} must lie strictly between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        found = splits(args.root)
    except DataError as e:
        fail(str(e))
    bad_total, readable, digests = 0, {}, {}
    for split, index in found.items():
        paths = [str(index.root / f) for f in index.files]
        start = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:
            jobs = len(paths) * [args.size], len(paths) * [args.channels]
            results = list(pool.map(probe, paths, *jobs, chunksize=64))
        digests.update((Path(path), result[3]) for path, result in zip(paths, results, strict=True))
        seconds = time.perf_counter() - start
        bad = [i for i, (_, _, why, _) in enumerate(results) if why]
        readable[split] = [i for i, (_, _, why, _) in enumerate(results) if not why]
        bad_total += len(bad)
        classes = len(index.classes)
        print(f"{index.root} ({split}): {len(paths)} image files, {classes} class(es)")
        images, unreadable = Counter(index.labels), Counter(index.labels[i] for i in bad)
        width = max(len(name) for name in [*index.classes, "class"])
        print(f"  {'class':<{width}}  {'images':>8}  {'unreadable':>10}")
        for label, name in enumerate(index.classes):
            print(f"  {name:<{width}}  {images[label]:>8}  {unreadable[label]:>10}")
        dims = sorted(d[0] * d[1] for _, d, _, _ in results if d)
        if dims:
            sides = [int(d**0.5) for d in (dims[0], dims[len(dims) // 2], dims[-1])]
            print(f"sides (sqrt of pixels): min {sides[0]}, median {sides[1]}, max {sides[2]}")
        print(f"modes: {dict(Counter(mode for mode, d, _, _ in results if d))}")
        print(f"decoded at {args.size} px: {len(paths) / seconds:,.0f} images/s")
        if note := unread(index):
            print(note)
        for i in bad:
            print(f"unreadable\t{paths[i]}\t{results[i][2]}")
    refused, notes, sizes = refusals(args.root, found, readable, args, digests)
    if sizes:
        print("readable images a run holds: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    for note in notes:
        print(f"warning: {note}")
    for reason in refused:
        print(f"refused: {reason}")
    if refused:
        print("a run would refuse this folder")
        return 2
    if bad_total:
        print(f"{bad_total} unreadable file(s): a run skips them and counts them in summary.json")
        return 1
    print("every file is readable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
