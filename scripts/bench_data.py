"""P2 data path: torchvision's Dataset + DataLoader against litlab's DeviceLoader, side by side.

    python scripts/bench_data.py                                     # CPU: 1.5 min on 2 cores
    python scripts/bench_data.py --device cuda --epochs-fraction 1   # GPU

Fashion-MNIST's 54,000 training images (litlab's split of the 60,000), batch 128, one process:
(a) data path alone: normalized float batches on the device, over one epoch;
(b) end to end: Lightning trains litlab's SmallCNN(width=32) for the first --epochs-fraction of
    an epoch through each path (bf16-mixed on CUDA, as trainer=gpu; 32-true on CPU).
Every repeat runs each path once, in alternating order (A/B interleaved); a first, shorter round
warms up and is not counted; the table shows medians. Results go to docs/benchmarks.md, "P2 data path".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial

import benchlib
import lightning as L
import torch
import torchvision
from benchlib import Measure, sync
from lightning.pytorch.callbacks import Callback
from torchvision.transforms import v2

from litlab.data import DataModule, DeviceLoader, FashionMNIST
from litlab.models import ImageClassifier
from litlab.nets import SmallCNN

BATCH = 128
MEAN, STD = [0.2860], [0.3530]
PATHS = ("torchvision, workers=0", "torchvision, workers=2", "litlab DeviceLoader")


class TorchvisionFashion(torchvision.datasets.FashionMNIST):
    """torchvision's own FashionMNIST per-sample path (PIL image, then the transform), fed the
    arrays litlab read: torchvision's constructor wants the unpacked files, Debian ships .gz."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: v2.Transform):
        torchvision.datasets.VisionDataset.__init__(self, root=None, transform=transform)
        self.train = True
        self.data, self.targets = images[:, 0], labels


def fashion(data_dir: str) -> DataModule:
    datamodule = DataModule(
        FashionMNIST(data_dir, download=False),
        image_shape=[1, 28, 28],
        num_classes=10,
        mean=MEAN,
        std=STD,
        batch_size=BATCH,
    )
    datamodule.prepare_data()
    datamodule.setup()
    return datamodule


def loaders(datamodule: DataModule, device: torch.device) -> dict[str, Callable[[], Iterable]]:
    """Each path's training loader, made afresh for every run as a training script would."""
    images, labels = datamodule.arrays("train")
    # The usual recipe: ToTensor + Normalize, in v2 spelling (ToImage + ToDtype(scale=True)).
    to_tensor = v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    )
    dataset = TorchvisionFashion(images, labels, to_tensor)
    return {
        PATHS[0]: partial(benchlib.torchvision_loader, dataset, BATCH, 0, device),
        PATHS[1]: partial(benchlib.torchvision_loader, dataset, BATCH, 2, device),
        PATHS[2]: partial(DeviceLoader, images, labels, BATCH, True, True, device=device),
    }


def data_path(loader: Iterable, datamodule: DataModule, device: torch.device, limit: int) -> float:
    """Images per second of normalized float batches landing on the device, nothing else."""
    sync(device)
    start, count = time.perf_counter(), 0
    for b, (images, labels) in enumerate(loader):
        if b == limit:
            break
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if images.dtype == torch.uint8:  # litlab's path: the DataModule's per-batch transform
            images = datamodule.transform(images, train=True)
        count += len(labels)
    sync(device)
    return count / (time.perf_counter() - start)


class EpochTimer(Callback):
    """Seconds and images of the training epoch, from its start to its end hook."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sync(pl_module.device)
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sync(pl_module.device)
        self.rate = trainer.num_training_batches * BATCH / (time.perf_counter() - self.start)


def end_to_end(
    path: str,
    make: Callable[[], Iterable],
    datamodule: DataModule,
    device: torch.device,
    limit: int,
) -> float:
    """Images per second of one (partial) training epoch of SmallCNN(width=32) in Lightning."""
    torch.manual_seed(0)
    model = ImageClassifier(
        SmallCNN(1, 10, width=32),
        partial(torch.optim.AdamW, lr=3e-3, weight_decay=5e-4),
        num_classes=10,
    )
    timer = EpochTimer()
    trainer = benchlib.bare_trainer(
        device, max_epochs=1, limit_train_batches=limit, callbacks=[timer]
    )
    if path == PATHS[2]:  # through the DataModule, which makes the DeviceLoader on the run's device
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, train_dataloaders=make())
    return timer.rate


def table(m: dict[str, Measure]) -> str:
    rows = []
    for path in PATHS:
        cells = [path]
        for part in ("data", "e2e"):
            cells += [
                f"{m[path][part]:,.0f}",
                f"{m[path][part] / m[PATHS[0]][part]:.1f}",
                f"{m[path][part] / m[PATHS[1]][part]:.1f}",
            ]
        rows.append(cells)
    header = [
        "path",
        "data path img/s",
        "x vs w0",
        "x vs w2",
        "end-to-end img/s",
        "x vs w0",
        "x vs w2",
    ]
    return benchlib.table(header, rows)


def main() -> None:
    parser = benchlib.arguments(__doc__, data_dir=False)
    parser.add_argument(
        "--epochs-fraction",
        type=float,
        default=0.1,
        help="share of the epoch timed end to end (0.1: the first 42 batches)",
    )
    parser.add_argument("--data-dir", default="data", help="else Debian's dataset-fashion-mnist")
    args = parser.parse_args()
    device = benchlib.start(args)

    datamodule = fashion(args.data_dir)
    makers = loaders(datamodule, device)
    batches = len(makers[PATHS[2]]())
    e2e_batches = max(1, int(batches * args.epochs_fraction))
    print(f"data path: {batches} batches of {BATCH}; end to end: {e2e_batches} batches")

    def measure(path: str, make: Callable[[], Iterable]) -> Callable[[bool], Measure]:
        def rates(warm_up: bool) -> Measure:
            return {
                "data": data_path(make(), datamodule, device, 20 if warm_up else batches),
                "e2e": end_to_end(path, make, datamodule, device, 5 if warm_up else e2e_batches),
            }

        return rates

    variants = {path: measure(path, make) for path, make in makers.items()}
    print()
    print(table(benchlib.medians(benchlib.interleaved(variants, args.repeats))))


if __name__ == "__main__":
    main()
