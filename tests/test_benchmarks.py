"""The benchmark harness (scripts/benchlib.py): its hand-written PyTorch loop must do the train
task's very work, or every ratio the benchmarks print (P1, P3, P4) compares different things.
The scripts themselves run on a GPU only when one is lent; this keeps their shared parts working."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # scripts/ is not a package


def test_the_raw_loop_and_the_train_task_end_on_the_same_loss(tmp_path):
    """The default CNN with its step-counted one-cycle schedule, 12 steps, both ways."""
    overrides = [
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
