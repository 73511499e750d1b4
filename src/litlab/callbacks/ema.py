"""Exponential moving average of the weights: Lightning's EMAWeightAveraging, tested as validated."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn

from litlab.errors import ConfigError


class EMA(EMAWeightAveraging):
    """Lightning's EMA callback (torch.optim.swa_utils.AveragedModel of the whole module,
    BatchNorm statistics included): validation runs on the averaged weights, checkpoints hold
    them as ``state_dict`` (eval.py tests them) and the raw weights beside them, and a resumed
    fit continues both.

    One trap fixed: Lightning also calls the callback's ``on_load_checkpoint`` in
    ``trainer.test(ckpt_path=...)``; after a fit the averaged copy still exists, and the parent
    then loads the checkpoint's raw weights into the module, so the test after training would
    score the raw weights, not the averaged ones that validation chose the checkpoint by.
    """

    def __init__(self, *args: Any, update_starting_at_epoch: int | None = None, **kwargs: Any):
        if update_starting_at_epoch is not None:
            # Lightning then also updates the average at each epoch's end, after validation and
            # before the best checkpoint is written: best.ckpt would hold weights one update
            # past the ones whose validation chose it.
            raise ConfigError(
                "callbacks.ema.update_starting_at_epoch is not supported (best.ckpt would not "
                "hold the validated weights); use callbacks.ema.update_starting_at_step"
            )
        super().__init__(*args, **kwargs)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
