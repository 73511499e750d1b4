"""P2 folder rows: a folder of JPEG files through torchvision's per-sample pipeline and litlab's.

    python scripts/make_image_folder.py .data/fashion64 --size 64 --rgb --limit 20000
    python scripts/bench_folder.py .data/fashion64 --size 64
    python scripts/make_image_folder.py .data/fashion400 --size 400 --rgb --jitter 0.25 --limit 2000
    python scripts/bench_folder.py .data/fashion400 --size 224 --stored 256 --epochs 1

The same files (``<folder>/train/<class>/*.jpg``), batch 128, a random resized crop (area 0.35-1)
and flip per image at --size, normalized float batches on --device:
- torchvision: ``datasets.ImageFolder`` + PIL + ``RandomResizedCrop`` + ``RandomHorizontalFlip``
  + ToTensor/Normalize (v2), ``DataLoader(num_workers=<cores>)``: every epoch decodes every file;
- litlab, cold: ``data=image_folder`` with an empty cache: every file decoded once (all cores,
  at --stored px) into the memory-mapped cache, then the epochs from it (crops on the device);
- litlab, warm: the same once the cache exists (every later run on the folder);
- litlab, files: ``data.source.cache=false``: decoded at --stored px by DataLoader workers every
  epoch (PIL's reduced-scale JPEG decoding), crops on the device;
- litlab, streamed: ``data=streaming`` on the folder converted once into local LitData chunks
  (``python -m litlab.data.optimize``, timed apart): the files' bytes read from the chunks and
  decoded at --stored px by LitData's workers every epoch, crops on the device.
- "..., decoded on the device": the same two with ``data.source.decode=device``: the workers
  only read the bytes, each batch of JPEGs is decoded in one call on --device (nvJPEG on a
  GPU; on a CPU libjpeg-turbo in the main process, at full size: for GPUs, not CPUs).
- synthetic: as many random images as the folder's, in memory at --stored px (the device
  loader): what the model trains at when data costs nothing (the GPU goal: a JPEG folder at
  >= 0.9 of it, end to end).
Rows: (a) data path, seconds for --epochs epochs; (b) end to end, seconds for --epochs epochs of
Lightning training through each path: litlab's SmallCNN (width 16), or with --model resnet50
torchvision's ResNet-50 (channels_last; bf16-mixed on a GPU). Medians of --repeats rounds,
the sides of a round back to back in alternating order. Results: docs/benchmarks.md, "P2 folders".
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import benchlib
import torch
import torchvision
from benchlib import sync
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from litlab.data import DataModule, ImageFolder, Source, Streaming, Synthetic
from litlab.data.optimize import convert
from litlab.models import ImageClassifier
from litlab.nets import SmallCNN

BATCH = 128
MEAN, STD = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]
SIDES = (
    "torchvision",
    "litlab, cold cache",
    "litlab, warm cache",
    "litlab, files",
    "litlab, streamed",
    "litlab, files, decoded on the device",
    "litlab, streamed, decoded on the device",
    "synthetic",
)


def torchvision_loader(root: Path, size: int, workers: int) -> DataLoader:
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(str(root / "train"), transform=transform)
    return DataLoader(
        dataset, BATCH, shuffle=True, drop_last=True, num_workers=workers, persistent_workers=True
    )


def litlab_datamodule(
    root: Path, size: int, stored: int, cache: Path | None, workers: int, decode: str = "workers"
):
    source = ImageFolder(
        str(root),
        size=stored,
        cache=cache is not None,
        cache_dir=str(cache or "."),
        workers=workers,
        decode=decode,
    )
    return datamodule_of(source, root, size, workers)


def datamodule_of(source: Source, root: Path, size: int, workers: int) -> DataModule:
    datamodule = DataModule(
        source,
        image_shape=[3, size, size],
        num_classes=len([p for p in (root / "train").iterdir() if p.is_dir()]),
        mean=MEAN,
        std=STD,
        batch_size=BATCH,
        val_fraction=0.01,
        hflip=True,
        random_resized_crop=[0.35, 1.0],
        loader="auto",
        num_workers=workers,
    )
    datamodule.prepare_data()  # the decode of a cold cache
    datamodule.setup()
    return datamodule


def batches(loader: Iterable, datamodule: DataModule | None, device: torch.device) -> int:
    """Run through one epoch of normalized float batches on the device; return the images."""
    count = 0
    for batch in loader:
        batch = move_data_to_device(batch, device)  # as Lightning moves it
        if datamodule is not None:  # litlab's decode (where on the device), crop, flip, normalize
            images, _ = datamodule.ready(batch, train=True)
        else:
            images = batch[0]
        count += len(images)
    sync(device)
    return count


def train(make: Callable[[], tuple], device: torch.device, epochs: int, net: str) -> None:
    """Lightning trains SmallCNN(width=16) or ResNet-50 for the epochs on the loader or
    DataModule."""
    torch.manual_seed(0)
    loader, datamodule = make()
    if net == "resnet50":
        module = torchvision.models.resnet50(num_classes=10).to(memory_format=torch.channels_last)
        if datamodule is not None:
            datamodule.memory_format = torch.channels_last
    else:
        module = SmallCNN(3, 10, width=16)
    model = ImageClassifier(module, partial(torch.optim.AdamW, lr=3e-3), num_classes=10)
    trainer = benchlib.bare_trainer(device, max_epochs=epochs)
    if datamodule is not None:
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, train_dataloaders=loader)


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=1, data_dir=False)
    parser.add_argument(
        "folder", type=Path, help="a folder with train/<class>/ (make_image_folder.py)"
    )
    parser.add_argument("--size", type=int, default=64, help="crop side the model sees")
    parser.add_argument("--stored", type=int, help="litlab's stored side (default: 1.15 x size)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, help="default: all (on a CPU, not the device decode)"
    )
    parser.add_argument("--data-only", action="store_true", help="the data path rows alone")
    parser.add_argument("--model", choices=("small_cnn", "resnet50"), default="small_cnn")
    args = parser.parse_args()
    device = benchlib.start(args)
    if args.sides is None:
        gpu = device.type != "cpu"
        args.sides = [n for n in SIDES if gpu or not n.endswith("on the device")]
    stored = args.stored or round(args.size * 1.15)
    scratch = Path(tempfile.mkdtemp(prefix="litlab-bench-folder-"))
    warm_cache, chunks = scratch / "warm", scratch / "chunks"
    if "litlab, warm cache" in args.sides:
        litlab_datamodule(args.folder, args.size, stored, warm_cache, args.workers)  # built once
    if any(n.startswith("litlab, streamed") for n in args.sides):
        start = time.perf_counter()
        convert(args.folder, str(chunks), workers=args.workers)
        print(f"converted {args.folder} into LitData chunks in {time.perf_counter() - start:.1f} s")

    def side(name: str) -> Callable[[], tuple]:
        where = "device" if name.endswith("on the device") else "workers"
        if name == "synthetic":  # as many images as the folder's: counted once, not timed
            files = sum(1 for p in (args.folder / "train").rglob("*") if p.is_file())

        def make() -> tuple:
            if name == "torchvision":
                return torchvision_loader(args.folder, args.size, args.workers), None
            if name == "litlab, cold cache":
                cold = scratch / "cold"
                shutil.rmtree(cold, ignore_errors=True)
                datamodule = litlab_datamodule(args.folder, args.size, stored, cold, args.workers)
            elif name == "litlab, warm cache":
                datamodule = litlab_datamodule(
                    args.folder, args.size, stored, warm_cache, args.workers
                )
            elif name == "synthetic":
                shape = (3, stored, stored)
                source = Synthetic(shape, num_classes=10, train_size=files, test_size=BATCH)
                datamodule = datamodule_of(source, args.folder, args.size, args.workers)
            elif name.startswith("litlab, files"):
                datamodule = litlab_datamodule(
                    args.folder, args.size, stored, None, args.workers, where
                )
            else:
                streamed = Streaming(str(chunks), size=stored, decode=where)
                datamodule = datamodule_of(streamed, args.folder, args.size, args.workers)
            return datamodule.train_dataloader(), datamodule

        return make

    def measure(name: str) -> Callable[[bool], dict[str, float]]:
        make = side(name)

        def run(warm_up: bool) -> dict[str, float]:
            epochs = 1 if warm_up else args.epochs
            start = time.perf_counter()
            loader, datamodule = make()
            images = sum(batches(loader, datamodule, device) for _ in range(epochs))
            data_s = time.perf_counter() - start
            if args.data_only:
                return {"data s": data_s, "images": images, "e2e s": float("nan")}
            start = time.perf_counter()
            train(make, device, epochs, args.model)
            return {"data s": data_s, "images": images, "e2e s": time.perf_counter() - start}

        return run

    sides = ["torchvision", *(n for n in args.sides if n != "torchvision")]  # the baseline
    results = benchlib.medians(benchlib.interleaved({n: measure(n) for n in sides}, args.repeats))
    base = results["torchvision"]
    synthetic = results.get("synthetic", {"images": float("nan"), "e2e s": 1.0})
    rows = [
        [
            name,
            f"{m['data s']:.1f}",
            f"{m['images'] / m['data s']:,.0f}",
            # images/s, not seconds: the streamed split is the folder's less its validation part
            f"{m['images'] / m['data s'] / (base['images'] / base['data s']):.2f}",
            f"{m['e2e s']:.1f}",
            f"{base['e2e s'] / m['e2e s']:.2f}",
            # the trainer runs the batches the data path counted: e2e images/s over synthetic's
            f"{m['images'] / m['e2e s'] / (synthetic['images'] / synthetic['e2e s']):.2f}",
        ]
        for name, m in results.items()
    ]
    header = [
        "side",
        f"data path s ({args.epochs} ep)",
        "img/s",
        "x faster",
        "end to end s",
        "x faster",
        "e2e img/s of synthetic's",
    ]
    print(f"\n{args.folder}: crops of {args.size} px (litlab stores {stored} px), batch {BATCH}")
    print(benchlib.table(header, rows))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
