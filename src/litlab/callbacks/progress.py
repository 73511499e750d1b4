"""Lightning's rich progress bar, reading the logged metrics only when it redraws."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """``RichProgressBar`` that honours ``refresh_rate`` for its metrics too.

    Lightning's rich bar reads the progress-bar metrics after every training batch whatever
    its refresh rate, and reading them copies each value to the host: a device sync per step.
    This one does so every ``refresh_rate`` batches and at the end of the epoch.
    """

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        done = batch_idx + 1
        if done % max(self.refresh_rate, 1) == 0 or done == self.total_train_batches:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
