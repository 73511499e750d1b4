"""GPU tier: MFU of ResNet-50 at 224 px, batch-size scaling up to out of memory, and an
out-of-memory run ending in one line. Skipped without CUDA.

Run on a GPU machine with `pytest -m gpu tests/test_gpu_observability.py` (scripts/gpu_check.sh
does); the GPU check compares summary.json's perf.mfu with the benchmark script's figure.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from conftest import QUIET_CSV, make_cfg, needs_cuda, summary_of
from litlab.train import train_task

pytestmark = [pytest.mark.gpu, needs_cuda]

QUIET = [*QUIET_CSV, "test=false"]


def resnet50(batch: int, batches_per_epoch: int) -> list[str]:
    """ResNet-50 on synthetic 224 px images, with just enough of them for the batches asked."""
    return [
        "model=torchvision",
        "model.net.name=resnet50",
        "data=synthetic",
        "data.image_shape=[3,224,224]",
        f"data.batch_size={batch}",
        f"data.source.train_size={math.ceil(batch * batches_per_epoch / 0.9) + 1}",
        "data.source.test_size=16",
        "data.eval_batch_size=64",
        "trainer=gpu",
        "+trainer.limit_val_batches=1",
        *QUIET,
    ]


def test_resnet50_mfu_lands_in_summary_json(tmp_path):
    # bf16-mixed + channels_last, as the benchmark script's P4 eager run: 8 batches of 256 per
    # epoch, 4 epochs, the first 3 batches not timed.
    cfg = make_cfg(
        tmp_path,
        [*resnet50(256, 8), "trainer.max_epochs=4", "callbacks.speed.channels_last=true"],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary["error"]
    perf = summary["perf"]
    assert perf["precision"] == "bf16-mixed" and perf["peak_flops"] > 1e14, perf
    assert 20e9 < perf["flops_per_image"] < 30e9  # ResNet-50 at 224 px: ~8 GFLOPs fwd, x3
    assert 0.05 < perf["mfu"] < 1.0, perf
    assert perf["mfu"] == pytest.approx(
        perf["flops_per_image"] * perf["train_images_per_s"] / perf["peak_flops"]
    )
    memory = summary["memory"]
    assert 1 < memory["peak_allocated_gb"] <= memory["peak_reserved_gb"] < 150, memory
    print(
        f"ResNet-50 bf16 batch 256: {perf['train_images_per_s']:.0f} img/s, MFU {perf['mfu']:.3f}"
    )


def test_batch_size_scaling_stops_at_out_of_memory(tmp_path):
    # float32 ResNet-50 needs about 0.1 GB per image: 2048 does not fit in an H200's 141 GB.
    cfg = make_cfg(
        tmp_path,
        [
            # the batch size is the finder's to choose (a given one is refused with it)
            *(a for a in resnet50(32, 2048 // 32) if not a.startswith("data.batch_size=")),
            "trainer.precision=32-true",
            "trainer.max_epochs=1",
            "+trainer.limit_train_batches=2",
            "tune.batch_size=true",
            "tune.batch_size_finder.init_val=256",
            "tune.batch_size_finder.max_trials=4",  # 256, 512, 1024, 2048
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary["error"]
    found = summary["tuned"]["batch_size"]
    assert found in (256, 512, 1024), found
    print(f"ResNet-50 fp32: tune.batch_size found {found}")


def test_out_of_memory_ends_in_one_line_and_keeps_the_checkpoint(tmp_path, capsys):
    common = [
        *resnet50(2048, 1),
        "trainer.precision=32-true",
        "+trainer.limit_train_batches=1",
        "model.scheduler=null",  # OneCycleLR's length would change with max_epochs
    ]
    first = make_cfg(tmp_path, [*common, "data.batch_size=16", "trainer.max_epochs=1"])
    train_task(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    stamp = last.stat().st_mtime_ns

    # The same run continued with an absurd batch: float32 activations for 2048 images at
    # 224 px are about 200 GB.
    cfg = make_cfg(tmp_path, [*common, "trainer.max_epochs=2", f"ckpt_path={last}"])
    with pytest.raises(SystemExit) as exit_info:
        train_task(cfg)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("litlab: error: out of memory while training with data.batch_size=2048")
    assert "GB allocated of" in line and "tune.batch_size=true" in line
    assert "trainer.precision=bf16-mixed" in line
    summary = summary_of(cfg)
    assert summary["status"] == "failed" and "out of memory" in summary["error"]
    assert summary["memory"]["peak_allocated_gb"] > 50, summary["memory"]
    assert last.stat().st_mtime_ns == stamp  # the last good checkpoint is kept as it was


class HoldInSetup(Callback):
    """Takes ``gb`` of CUDA memory for a moment in the setup of one stage ("fit", "test"), as
    work done there does (an FID extractor trained at setup, statistics computed at fit start):
    a peak before that stage's first epoch."""

    def __init__(self, gb: float, stage: str) -> None:
        self.gb, self.stage = gb, stage

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == self.stage:
            device = trainer.strategy.root_device
            torch.empty(int(self.gb * 1e9), dtype=torch.uint8, device=device)  # freed at once


@pytest.mark.parametrize("stage", ["fit", "test"])
def test_a_peak_before_the_first_epoch_is_in_the_runs_peaks(tmp_path, stage):
    """summary.json's memory peaks are the run's, since it began: each training and test epoch
    starts its mem/* peaks afresh, and a peak in the fit's setup or sanity check (or a test's
    setup) before it was in none of them, nor in the run's. The epochs' own values stay theirs."""
    cfg = make_cfg(
        tmp_path,
        [
            "trainer=gpu",
            "trainer.max_epochs=1",
            "+callbacks.hold._target_=test_gpu_observability.HoldInSetup",
            "+callbacks.hold.gb=1",
            f"+callbacks.hold.stage={stage}",
            *QUIET_CSV,
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary["error"]
    memory = summary["memory"]
    assert 1 <= memory["peak_allocated_gb"] <= memory["peak_reserved_gb"], memory
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        epochs = [
            float(r["mem/peak_allocated_gb"])
            for r in csv.DictReader(f)
            if r.get("mem/peak_allocated_gb")
        ]
    assert len(epochs) == 2 and max(epochs) < 0.5, epochs  # the training epoch's and the test's
