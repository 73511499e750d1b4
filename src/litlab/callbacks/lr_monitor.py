"""Lightning's LearningRateMonitor, its per-step learning rates in the step's own log row."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor

from litlab.compat import logs_this_step


class LearningRateMonitor(LightningLearningRateMonitor):
    """``lightning.pytorch.callbacks.LearningRateMonitor``, the same names, values and steps.

    On a logging step (every ``trainer.log_every_n_steps``) Lightning's monitor hands the
    learning rates of per-step schedules to every logger itself, a call of its own before the
    step's metrics are handed over at the batch's end: two W&B ``log`` calls and two CSV rows
    for one step. Each W&B call is a round trip to its service process (about 0.5 ms on a
    2-core CPU, that is 0.05 ms a step at log_every_n_steps=10, 3% of a small net's step:
    docs/benchmarks.md, P1). Here they are logged through the module (``self.log``, on the
    step only), so Lightning hands them over with the step's metrics, in one call and one row,
    at the same step (Lightning's monitor stamped them with the step the batch's metrics get).
    As float64 on the CPU: the value exactly (``self.log`` would make a Python float a
    float32 on the module's device: 0.001 logged as 0.0010000000474974513) and no copy to
    the GPU. Per-epoch schedules (a plateau's) keep Lightning's once-an-epoch path.
    """

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.logging_interval == "epoch" or not logs_this_step(trainer):
            return
        stats = self._extract_stats(trainer, "step" if self.logging_interval is None else "any")
        for name, value in stats.items():
            pl_module.log(
                name, torch.tensor(value, dtype=torch.float64), on_step=True, on_epoch=False
            )
