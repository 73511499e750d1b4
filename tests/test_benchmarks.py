"""The benchmark harness (scripts/benchlib.py): its hand-written PyTorch loop must do the train
task's very work, or every ratio the benchmarks print (P1, P3, P4) compares different things.
The scripts themselves run on a GPU only when one is lent; this keeps their shared parts working."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # scripts/ is not a package


@pytest.mark.parametrize(
    "recipe",
    [
        [],
        # folder_resnet50's weight-decay groups, and clipping that cuts every step's gradient
        [
            "model.decay_norm_and_bias=false",
            "model.optimizer.weight_decay=0.5",
            "trainer.gradient_clip_val=0.05",
        ],
        ["trainer.gradient_clip_val=0.001", "+trainer.gradient_clip_algorithm=value"],
    ],
    ids=["default", "decay-groups-clip-norm", "clip-value"],
)
def test_the_raw_loop_and_the_train_task_end_on_the_same_loss(tmp_path, recipe):
    """The default CNN with its step-counted one-cycle schedule, 12 steps, both ways."""
    overrides = [
        *recipe,
        "trainer.max_steps=12",
        "+trainer.limit_val_batches=0",
        "test=false",
        "extras.print_config=false",
        "logger=csv",
        "callbacks.progress_bar=null",
    ]
    cfg = benchlib.compose(overrides, tmp_path / "raw")
    raw = benchlib.raw_classifier(cfg, torch.device("cpu"), steps=12)
    _, summary = benchlib.litlab_run([*overrides, *benchlib.timer_override()])
    task = benchlib.LoopTimer.last
    assert raw["steps"] == task["batches"] == 12 and summary["status"] == "completed"
    assert task["loss"] == pytest.approx(raw["loss"], abs=1e-5)


def test_the_raw_dcgan_loop_and_litlab_s_gan_end_on_the_same_loss():
    """P5's hand-written G and D steps against litlab's GAN, 4 batches of a tiny DCGAN; under
    bf16 autocast too (where this CPU has it), which needs Lightning's uncached autocast."""
    import bench_throughput

    args = argparse.Namespace(
        gan_channels=1, gan_size=16, gan_width=8, gan_batch=8, warm_steps=1, steps=3
    )
    overrides = bench_throughput.dcgan_overrides(args, torch.device("cpu"), 4)
    benchlib.litlab_run([*overrides, "callbacks.progress_bar=null", *benchlib.timer_override()])
    task = benchlib.LoopTimer.last
    cfg = benchlib.compose(overrides, benchlib.REPO / "outputs" / "unused")
    raw = bench_throughput.raw_dcgan(cfg, torch.device("cpu"), steps=4, skip=0)
    assert task["batches"] == 4
    assert task["loss"] == raw["loss"]


def test_synthetic_once_draws_each_split_once_as_synthetic_does():
    from litlab.data import Synthetic

    once = benchlib.SyntheticOnce((3, 8, 8), num_classes=4, train_size=32, test_size=8)
    again = benchlib.SyntheticOnce((3, 8, 8), num_classes=4, train_size=32, test_size=8)
    drawn = Synthetic((3, 8, 8), num_classes=4, train_size=32, test_size=8).load("train")
    assert again.load("train") is once.load("train")
    assert all(
        torch.equal(a, b) for a, b in zip(once.load("train").tensors, drawn.tensors, strict=True)
    )


def test_overhead_task_sides_log_to_csv_where_wandb_is_missing():
    """The GPU machine has no wandb: P1's train-task variants must not ask for it."""
    import bench_overhead

    args = argparse.Namespace(net="cnn", steps=5, data_dir=None, overrides=[])
    without = bench_overhead.overrides(args, torch.device("cpu"), False, None)
    offline = bench_overhead.overrides(args, torch.device("cpu"), False, "offline")
    assert "logger=csv" in without and not any("wandb" in o for o in without)
    assert "logger.wandb.mode=offline" in offline
    # --device cpu runs the train task on the CPU too (auto would take a GPU where there is one)
    assert "trainer.accelerator=cpu" in without


class _Slow(__import__("lightning").pytorch.Callback):
    """A second's work at the fit's start, at each epoch's end and at the fit's end: none of it
    is per-step work, and the raw loops that P1/P4/P5 compare against do none of it."""

    def _sleep(self, *_):
        import time

        time.sleep(0.5)

    on_train_start = on_train_epoch_end = on_train_end = _sleep


@pytest.mark.parametrize("max_steps", [6, -1])
def test_the_loop_timer_times_the_raw_loops_window(max_steps):
    """From batch `skip`'s start (its fetch done) to the last batch's end: a fit ending on
    max_steps or on max_epochs, with slow start and end hooks around the loop, times the steps
    alone and counts each of them once; skip=None starts at the fit loop's start."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    for skip in (0, 2, None):
        timer = benchlib.LoopTimer(skip=skip)
        trainer = benchlib.bare_trainer(
            torch.device("cpu"),
            max_epochs=2,
            max_steps=max_steps,
            limit_train_batches=4,
            callbacks=[_Slow(), timer],
        )
        trainer.fit(BoringModel())
        steps = 6 if max_steps == 6 else 8
        assert benchlib.LoopTimer.last["batches"] == steps - (skip or 0)
        # one slow epoch end (2 epochs) falls inside the loop; nothing else may
        assert 0.5 <= benchlib.LoopTimer.last["s"] < 0.9


def test_time_to_accuracy_names_what_the_raw_loop_lacks():
    import bench_time_to_accuracy as p3

    def lacks(*overrides):
        return p3.raw_loop_lacks(benchlib.compose(list(overrides), REPO / "outputs" / "unused"))

    assert lacks("experiment=fashion_fast") == []
    assert lacks("experiment=fashion_fast", "trainer.accumulate_grad_batches=2") == [
        "trainer.accumulate_grad_batches"
    ]
    assert lacks("model/scheduler=plateau") == ["model/scheduler=plateau"]
    assert "model.tta_flip" in lacks("experiment=fashion_sprint")
    assert lacks("+trainer.limit_train_batches=1") == ["trainer.limit_train_batches"]  # one batch
    assert lacks("trainer.max_steps=50", "+trainer.limit_train_batches=0.5") == [
        "trainer.max_steps",
        "trainer.limit_train_batches",
    ]
