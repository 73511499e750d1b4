"""Stop a run whose loss became NaN or infinite, before a broken checkpoint is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.config import clipping_option
from litlab.errors import ConfigError, TrainingDiverged


def newest_saved(trainer: L.Trainer) -> str:
    """The most recently written of the run's checkpoints (last, periodic step, best), or ""."""
    written = [
        Path(path)
        for callback in trainer.checkpoint_callbacks
        for path in (
            getattr(callback, "last_model_path", ""),
            getattr(callback, "best_model_path", ""),
        )
        if path and Path(path).is_file()
    ]
    return str(max(written, key=lambda p: p.stat().st_mtime_ns)) if written else ""


class DivergenceGuard(Callback):
    """Watches every loss a training step returns.

    Each step adds the losses into one float32 sum on the device (one op, no host sync): a NaN
    or an infinity stays non-finite in a sum. The sum is read every ``check_every_n_steps``
    training batches (not optimizer steps: with gradient accumulation, or a GAN's D and G
    steps, they differ) and before every checkpoint save, where the weights to be saved are checked too, so
    a checkpoint is never written from diverged weights: the last good one stays in place.
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

    def check(self, trainer: L.Trainer, weights: dict[str, Any] | None = None) -> None:
        """Raise TrainingDiverged on every rank if a loss became non-finite on any rank since
        the last check, or (at a save) any of the ``weights`` to be saved. Every rank reaches
        each check at the same batch (and at each save, which every rank prepares), so one
        rank's NaN stops all of them together: a rank that went on would wait for the stopped
        one in the next collective, or save diverged weights."""
        device = trainer.strategy.root_device
        names, flags = list(self._sums), [~total.isfinite() for total in self._sums.values()]
        if weights is not None:  # a finite loss can still be followed by NaN weights (an inf
            # gradient). The flag is there on every rank, also one that saves no weights itself
            # (FSDP's full state dict is rank 0's): the ranks' flags are reduced as one tensor.
            tensors = [
                t for t in weights.values() if type(t) is torch.Tensor and t.is_floating_point()
            ]
            names.append("the weights")
            flags.append(
                torch.stack([~t.isfinite().all() for t in tensors]).any()
                if tensors
                else torch.zeros((), dtype=torch.bool, device=device)
            )
        if not names:
            return
        broken = torch.stack([flag.to(device) for flag in flags]).float()
        broken = trainer.strategy.reduce(broken, reduce_op="sum")  # any rank's
        broken = [name for name, flag in zip(names, broken.tolist(), strict=True) if flag]
        if not broken:
            for total in self._sums.values():
                total.zero_()
            return
        kept = newest_saved(trainer)
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
        # the module's parameters and buffers (a metric's state may be infinite by design:
        # MaxMetric starts at -inf)
        names = {name for name, _ in pl_module.named_parameters()}
        names |= {name for name, _ in pl_module.named_buffers()}
        saved = checkpoint.get("state_dict") or {}
        self.check(trainer, {name: saved[name] for name in names if name in saved})

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer)
