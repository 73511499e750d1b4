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
  loader), drawn once before any round: what the model trains at when data costs nothing (the
  GPU goal: a JPEG folder at >= 0.9 of its images/s, end to end).
Rows: (a) data path, seconds for --epochs epochs from the first batch (the loader and its
dataset are built before; the cold cache's decode alone is counted, being its point); (b) end
to end, --epochs epochs of Lightning training through each path, timed from the fit loop's start
(first fetch included; not the workers' start-up, which Lightning runs before it) to its last batch's end, device synced (benchlib.LoopTimer; the model, Trainer and data are built before):
litlab's SmallCNN (width 16), with --model mlp P1's tiny MLP (scripts/tiny_mlp.py, as wide as the
crop: its compute costs little, so the data path shows), or with --model resnet50 torchvision's
ResNet-50 (channels_last; bf16-mixed on a GPU). Sides are compared in images/s, not seconds: torchvision trains on every
file, litlab on the files less its 1% validation split (31 against 30 batches an epoch at 4,000
files). Medians of --repeats rounds, the sides of a round back to back in alternating order.
Results: docs/benchmarks.md, "P2 folders".
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from math import nan
from pathlib import Path

import benchlib
import torch
import torchvision
from benchlib import LoopTimer, Measure, SyntheticOnce, sync
from lightning.fabric.utilities.apply_func import move_data_to_device
from tiny_mlp import TinyMLP  # scripts/, beside this one
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from litlab.data import DataModule, ImageFolder, Source, Streaming
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


def torchvision_loader(root: Path, size: int, workers: int, device: torch.device) -> DataLoader:
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
    return benchlib.torchvision_loader(dataset, BATCH, workers, device)


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
    # What a fit's prepare_data and setup do: the decode of a cold cache (the training folder's;
    # a test/ folder is decoded at the test, and these runs do not test)
    datamodule.source.prepare(test=False)
    datamodule.setup("fit")
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


def train(
    loader: Iterable,
    datamodule: DataModule | None,
    device: torch.device,
    epochs: int,
    net: str,
    size: int,
) -> Measure:
    """Lightning trains SmallCNN(width=16), P1's tiny MLP or ResNet-50 for the epochs on the
    loader or DataModule; seconds and images of the fit loop alone."""
    torch.manual_seed(0)
    if net == "resnet50":
        module = torchvision.models.resnet50(num_classes=10).to(memory_format=torch.channels_last)
        if datamodule is not None:
            datamodule.memory_format = torch.channels_last
    elif net == "mlp":  # P1's tiny MLP, as wide as the crop: a model whose compute costs little
        module = TinyMLP(in_features=3 * size * size)
    else:
        module = SmallCNN(3, 10, width=16)
    model = ImageClassifier(module, partial(torch.optim.AdamW, lr=3e-3), num_classes=10)
    trainer = benchlib.bare_trainer(device, max_epochs=epochs, callbacks=[LoopTimer(skip=None)])
    if datamodule is not None:
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, train_dataloaders=loader)
    loop = LoopTimer.last
    return {"s": loop["s"], "images": loop["batches"] * BATCH}  # drop_last: whole batches


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
    parser.add_argument(
        "--model",
        choices=("small_cnn", "mlp", "resnet50"),
        default="small_cnn",
        help="mlp: P1's tiny MLP (scripts/tiny_mlp.py), whose compute costs little on a CPU",
    )
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

    if "synthetic" in args.sides:  # as many images as the folder's, drawn once, not timed
        files = sum(1 for p in (args.folder / "train").rglob("*") if p.is_file())
        synthetic = SyntheticOnce((3, stored, stored), 10, train_size=files, test_size=BATCH)
        for split in ("train", "test"):
            synthetic.load(split)

    def make(name: str) -> tuple:
        """A side's training loader and DataModule (None for torchvision's), built afresh."""
        where = "device" if name.endswith("on the device") else "workers"
        if name == "torchvision":
            return torchvision_loader(args.folder, args.size, args.workers, device), None
        if name == "litlab, cold cache":
            cold = scratch / "cold"
            shutil.rmtree(cold, ignore_errors=True)
            datamodule = litlab_datamodule(args.folder, args.size, stored, cold, args.workers)
        elif name == "litlab, warm cache":
            datamodule = litlab_datamodule(args.folder, args.size, stored, warm_cache, args.workers)
        elif name == "synthetic":
            datamodule = datamodule_of(synthetic, args.folder, args.size, args.workers)
        elif name.startswith("litlab, files"):
            datamodule = litlab_datamodule(
                args.folder, args.size, stored, None, args.workers, where
            )
        else:
            streamed = Streaming(str(chunks), size=stored, decode=where)
            datamodule = datamodule_of(streamed, args.folder, args.size, args.workers)
        return datamodule.train_dataloader(), datamodule

    def built(name: str) -> tuple[Iterable, DataModule | None, float]:
        """make(name), and the seconds to count of it: those of a cold cache's decode (its
        point), none of any other side's building (outside the timed spans)."""
        start = time.perf_counter()
        loader, datamodule = make(name)
        seconds = time.perf_counter() - start if name == "litlab, cold cache" else 0.0
        return loader, datamodule, seconds

    def measure(name: str) -> Callable[[bool], Measure]:
        def run(warm_up: bool) -> Measure:
            epochs = 1 if warm_up else args.epochs
            loader, datamodule, build_s = built(name)
            start = time.perf_counter()
            images = sum(batches(loader, datamodule, device) for _ in range(epochs))
            data_s = time.perf_counter() - start + build_s
            if args.data_only:
                return {"data s": data_s, "images": images, "e2e s": nan, "e2e images": nan}
            loader, datamodule, build_s = built(name)
            fit = train(loader, datamodule, device, epochs, args.model, args.size)
            return {
                "data s": data_s,
                "images": images,
                "e2e s": fit["s"] + build_s,
                "e2e images": fit["images"],
            }

        return run

    sides = ["torchvision", *(n for n in args.sides if n != "torchvision")]  # the baseline
    results = benchlib.interleaved({n: measure(n) for n in sides}, args.repeats)
    m = benchlib.medians(results)

    def rate(v: Measure, kind: str) -> float:
        return v["images"] / v["data s"] if kind == "data" else v["e2e images"] / v["e2e s"]

    base = m["torchvision"]
    synthetic_rate = rate(m["synthetic"], "e2e") if "synthetic" in m else nan
    rows = [
        [
            name,
            f"{v['data s']:.1f}",
            f"{rate(v, 'data'):,.0f}",
            f"{rate(v, 'data') / rate(base, 'data'):.2f}",
            f"{v['e2e images'] / BATCH / args.epochs:.0f}",
            f"{v['e2e s']:.1f}",
            f"{rate(v, 'e2e'):,.0f}",
            f"{rate(v, 'e2e') / rate(base, 'e2e'):.2f}",
            f"{rate(v, 'e2e') / synthetic_rate:.2f}",
        ]
        for name, v in m.items()
    ]
    header = [
        "side",
        f"data path s ({args.epochs} ep)",
        "img/s",
        "x torchvision",
        "batches/ep",
        "fit loop s",
        "e2e img/s",
        "x torchvision",
        "e2e img/s of synthetic's",
    ]
    print(f"\n{args.folder}: crops of {args.size} px (litlab stores {stored} px), batch {BATCH}")
    print(
        f"{benchlib.rounds_caption(results)}; ratios are of images/s, as the sides train "
        "different numbers of batches (litlab holds 1% out for validation); a cold cache's "
        "seconds include its decode"
    )
    print(benchlib.table(header, rows))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
