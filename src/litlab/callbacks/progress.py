"""Lightning's rich progress bar, its per-batch work paced by the clock, not by the batches."""

from __future__ import annotations

from time import monotonic
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from torch import Tensor


class ProgressBar(RichProgressBar):
    """``RichProgressBar`` that does its per-batch work at most ``refresh_rate`` times a second.

    ``refresh_rate`` is the rich bar's redraws per second (Lightning's meaning). Lightning's bar
    nevertheless updates its task, reads the progress-bar metrics (each value copied to the
    host: a device sync) and asks its drawing thread for a redraw after every training batch;
    each redraw builds the whole table while holding the GIL. On nets whose steps take a few
    milliseconds that cost as much as a quarter of the step (docs/benchmarks.md, P1). This bar
    does that work when 1/refresh_rate seconds have passed since it last did, and at the
    epoch's last batch (and the newest batch before a validation or an early end of the epoch):
    the display looks the same, and its cost no longer grows with the steps.
    """

    # The latest values of the step curves, shown beside the bar's own metrics. Logged with
    # prog_bar=True, Lightning's logger connector would copy each to the host after every
    # training batch, long after it was logged (a device sync per step on a GPU); read here,
    # they are copied when the bar redraws.
    STEP_CURVES = ("train/loss_step", "d/loss", "g/loss")

    def __init__(self, refresh_rate: int = 4, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._due = 0.0  # monotonic() at which the next batch is drawn
        # the newest batch's index, until drawn (not the batch: on a GPU it would stay
        # allocated through the next step; Lightning's bar reads the index only)
        self._undrawn: int | None = None

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = monotonic()
        self._undrawn = batch_idx
        if now >= self._due or batch_idx + 1 == self.total_train_batches:
            self._due = now + 1.0 / max(self.refresh_rate, 1)
            self._draw(trainer, pl_module)

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Draw the newest training batch, where not drawn yet."""
        if self._undrawn is not None:
            batch_idx, self._undrawn = self._undrawn, None
            super().on_train_batch_end(trainer, pl_module, None, None, batch_idx)

    # An epoch that ends early (trainer.max_steps, a GAN's max_g_steps, a stop signal) and a
    # validation within the epoch (val_check_interval) show its newest batch, not an older one.
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._draw(trainer, pl_module)
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._draw(trainer, pl_module)
        super().on_validation_start(trainer, pl_module)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        for name in self.STEP_CURVES:
            value = trainer.callback_metrics.get(name)
            if isinstance(value, Tensor) and name not in items:
                items[name] = value.item()
        return items
