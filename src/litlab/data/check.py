"""Pre-flight check of an image folder before a long run: classes, counts, sizes, bad files.

    python -m litlab.data.check /path/to/images            # root/<class>/ or root/train|test/ (val/...)
    python -m litlab.data.check /path/to/images --size 64  # also time the decode at 64 px

Every file is opened and decoded (at reduced scale where the format allows) by every core, as
litlab's cache would; the exit status is 0 when every file is readable, 1 otherwise (the
unreadable files are listed; a run skips them and counts them in summary.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

from litlab.data.folder import FolderIndex, load_image, scan, split_folders
from litlab.errors import DataError, fail


def probe(path: str, size: int) -> tuple[str, tuple[int, int] | None, str | None]:
    """(mode, (width, height), None) of a readable file, else (.., None, reason)."""
    try:
        with Image.open(path) as image:
            mode, dims = image.mode, image.size
        load_image(path, size, 3)
        return mode, dims, None
    except Exception as e:  # every failure of a damaged file is a finding here
        return "?", None, f"{type(e).__name__}: {e}".splitlines()[0][:160]


def splits(root: Path) -> dict[str, FolderIndex]:
    """The folders a run reads, by name: train/ and its held-out folder, or the whole root."""
    folders = split_folders(root)
    if folders is not None:
        return {path.name: scan(path) for path in folders.values()}
    return {"all": scan(root)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litlab.data.check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=Path, help="the image folder")
    parser.add_argument("--size", type=int, default=32, help="decode size, as data.source.size")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    try:
        found = splits(args.root)
    except DataError as e:
        fail(str(e))
    bad_total = 0
    for split, index in found.items():
        paths = [str(index.root / f) for f in index.files]
        start = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(probe, paths, [args.size] * len(paths), chunksize=64))
        seconds = time.perf_counter() - start
        per_class = Counter(index.labels)
        console.print(f"{index.root} ({split}): {len(paths)} files, {len(index.classes)} classes")
        table = Table()
        table.add_column("class")
        table.add_column("images", justify="right")
        for label, name in enumerate(index.classes):
            table.add_row(name, str(per_class[label]))
        console.print(table)
        dims = sorted(d[0] * d[1] for _, d, _ in results if d)
        modes = Counter(mode for mode, d, _ in results if d)
        bad = [(f, why) for f, (_, _, why) in zip(index.files, results, strict=True) if why]
        bad_total += len(bad)
        if dims:
            sides = [int(d**0.5) for d in (dims[0], dims[len(dims) // 2], dims[-1])]
            console.print(
                f"sides (sqrt of pixels): min {sides[0]}, median {sides[1]}, max {sides[2]}"
            )
        console.print(f"modes: {dict(modes)}")
        console.print(f"decoded at {args.size} px: {len(paths) / seconds:,.0f} images/s")
        for name, why in bad[:50]:
            console.print(f"[red]unreadable[/red] {name}: {why}")
        if len(bad) > 50:
            console.print(f"... and {len(bad) - 50} more unreadable files")
    console.print(f"{bad_total} unreadable file(s)" if bad_total else "every file is readable")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
