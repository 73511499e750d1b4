"""Write a litlab in-memory dataset as a folder of image files, for tests and benchmarks offline.

    python scripts/make_image_folder.py .data/fashion_jpeg                      # 70,000 28-px JPEGs
    python scripts/make_image_folder.py .data/fashion64 --size 64 --rgb         # small RGB JPEGs
    python scripts/make_image_folder.py .data/fashion400 --size 400 --rgb --jitter 0.25 --limit 2000
    python scripts/make_image_folder.py .data/digits_png --source digits --format png

Layout: ``<out>/train/<class>/<n>.jpg`` and ``<out>/test/<class>/<n>.jpg`` (ImageNet's), the
splits of the source (Fashion-MNIST: its official 60,000/10,000). ``--size`` resizes (bicubic),
``--jitter`` makes each image's width and height differ by up to that fraction (ImageNet-like
mixed sizes and aspect ratios), ``--rgb`` writes three channels. Files are written by all
cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

# Class folders named so that their sorted order (a folder's label in litlab: its position) is
# the source's label order (plain names sorted would put bag and ankle-boot first), each the
# label's number and the dataset's own name for it ("T-shirt/top": a folder cannot hold "/"),
# which eval.py matches either way: a model of the in-memory source tests on the folder, and a
# model of the folder on the source (walkthrough 182: "0-t-shirt" was refused)
FASHION = ["t-shirt_top", "trouser", "pullover", "dress", "coat"]
FASHION += ["sandal", "shirt", "sneaker", "bag", "ankle-boot"]
CLASSES = {
    "fashion_mnist": [f"{i}-{name}" for i, name in enumerate(FASHION)],
    "digits": [str(i) for i in range(10)],
}


def load(source: str, split: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [N, H, W] and labels [N] of a litlab source's split."""
    from litlab.data import Digits, FashionMNIST

    if source == "digits":
        dataset = Digits(size=28).load(split)
    else:
        src = FashionMNIST(data_dir)
        src.prepare()
        dataset = src.load(split)
    images, labels = dataset.tensors
    return images[:, 0].numpy(), labels.numpy()


def write_one(job: tuple[np.ndarray, str, int, bool, float, str, int]) -> None:
    pixels, path, size, rgb, jitter, fmt, seed = job
    image = Image.fromarray(pixels).convert("RGB" if rgb else "L")
    if size != pixels.shape[0] or jitter:
        rng = np.random.default_rng(seed)
        w, h = (round(size * (1 + rng.uniform(-jitter, jitter))) for _ in range(2))
        image = image.resize((w, h), Image.Resampling.BICUBIC)
    image.save(path, quality=95) if fmt == "jpg" else image.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("out", help="the folder to write (created; refused if not empty)")
    parser.add_argument("--source", choices=sorted(CLASSES), default="fashion_mnist")
    parser.add_argument("--data-dir", default="data", help="where litlab looks for the source")
    parser.add_argument("--size", type=int, default=28, help="image side in pixels")
    parser.add_argument("--jitter", type=float, default=0.0, help="vary width/height by up to this")
    parser.add_argument("--rgb", action="store_true", help="three channels")
    parser.add_argument("--format", choices=("jpg", "png"), default="jpg")
    parser.add_argument("--limit", type=int, help="at most this many images per split")
    args = parser.parse_args()

    out, jobs = Path(args.out), []
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # written over, another run's images would stay beside these (jpg, then png: each twice)
        sys.exit(f"{out} is not an empty folder; give a new one or remove it first")
    for split in ("train", "test"):
        images, labels = load(args.source, split, args.data_dir)
        if args.limit:
            images, labels = images[: args.limit], labels[: args.limit]
        for name in CLASSES[args.source]:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        for i, (pixels, label) in enumerate(zip(images, labels, strict=True)):
            path = out / split / CLASSES[args.source][label] / f"{i:06d}.{args.format}"
            jobs.append((pixels, str(path), args.size, args.rgb, args.jitter, args.format, i))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(write_one, jobs, chunksize=256))
    print(f"wrote {len(jobs)} images to {out}")


if __name__ == "__main__":
    main()
