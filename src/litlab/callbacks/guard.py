"""Stop a run whose loss became NaN or infinite, before a broken checkpoint is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.config import clipping_option
from litlab.errors import ConfigError, TrainingDiverged


class DivergenceGuard(Callback):
    """Watches every loss a training step returns.

    Each step adds the losses into one float32 sum on the device (one op, no host sync): a NaN
    or an infinity stays non-finite in a sum. The sum is read every ``check_every_n_steps``
    steps and before every checkpoint save, so a checkpoint is never written from diverged
    weights: the last good one stays in place.
    """

    def __init__(self, check_every_n_steps: int = 50) -> None:
        if check_every_n_steps < 1:
            raise ConfigError(f"check_every_n_steps must be at least 1, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        # Per loss name: the sum of its values since the last check (a sum of this many finite
        # losses stays far below float32's 3e38, whatever precision they came in).
        self._sums: dict[str, torch.Tensor] = {}
        self._batches = 0

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        losses = outputs if isinstance(outputs, dict) else {"loss": outputs}
        for name, value in losses.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                total = self._sums.get(name)
                if total is None or total.device != value.device:
                    total = self._sums[name] = torch.zeros((), device=value.device)
                total.add_(value.detach() if value.dim() == 0 else value.detach().sum())
        self._batches += 1
        if self._batches % self.check_every_n_steps == 0:
            self.check(trainer)

    def check(self, trainer: L.Trainer) -> None:
        broken = [name for name, total in self._sums.items() if not bool(total.isfinite())]
        if not broken:
            for total in self._sums.values():
                total.zero_()
            return
        callback = trainer.checkpoint_callback
        last = Path(callback.dirpath) / "last.ckpt" if callback and callback.dirpath else None
        kept = (
            str(last) if last and last.is_file() else (callback.best_model_path if callback else "")
        )
        where = (
            f"the last good checkpoint is {kept}" if kept else "no checkpoint had been written yet"
        )
        raise TrainingDiverged(
            f"training diverged: {', '.join(broken)} became NaN or infinite by step {trainer.global_step}; "
            f"{where}. Lower the learning rate, add "
            f"{clipping_option(trainer.lightning_module) or 'gradient clipping'}, or try another loss"
        )

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer)
