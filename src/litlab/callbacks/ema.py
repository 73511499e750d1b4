"""Exponential moving average of the weights: Lightning's EMAWeightAveraging, tested as validated."""

from __future__ import annotations

import itertools
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging, WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.optim.swa_utils import AveragedModel

from litlab.errors import ConfigError
from litlab.models.gan import AveragedCopy, ema_with_warmup


class EMA(EMAWeightAveraging):
    """Lightning's EMA callback (torch.optim.swa_utils.AveragedModel of the whole module,
    BatchNorm statistics included): validation runs on the averaged weights, checkpoints hold
    them as ``state_dict`` (eval.py tests them) and the raw weights beside them, and a resumed
    fit continues both.

    The average lives on the device the run trains on (``callbacks.ema.device``: another, such
    as ``cpu`` to spare GPU memory at a copy of every weight to the host each step).

    Two traps fixed. Under 16-bit weights (``trainer.precision=bf16-true``) the average stays in
    float32 (it is copied before Lightning casts the module), but Lightning's swap around
    validation copies it into the module and back out of it, rounding the average to 16 bits at
    every validation: here the module's own weights are kept aside and put back instead.
    And Lightning also calls the callback's ``on_load_checkpoint`` in
    ``trainer.test(ckpt_path=...)``; after a fit the averaged copy still exists, and the parent
    then loads the checkpoint's raw weights into the module, so the test after training would
    score the raw weights, not the averaged ones that validation chose the checkpoint by.
    """

    def __init__(
        self,
        device: Any = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ):
        if not 0.0 < decay < 1.0:  # (walkthrough 160: 1.5 and -0.5 trained, a garbage average)
            raise ConfigError(f"callbacks.ema.decay must lie in (0, 1), got {decay}")
        if update_starting_at_epoch is not None:
            # Lightning then also updates the average at each epoch's end, after validation and
            # before the best checkpoint is written: best.ckpt would hold weights one update
            # past the ones whose validation chose it.
            raise ConfigError(
                "callbacks.ema.update_starting_at_epoch is not supported (best.ckpt would not "
                "hold the validated weights); use callbacks.ema.update_starting_at_step"
            )
        # The GAN's EMA: the decay ramps up as min(decay, (1 + n) / (10 + n)). Lightning's
        # constant decay keeps 0.999^n of the random initial weights (and BatchNorm statistics)
        # in the average: after a 400-step run two thirds, and a model near chance. Its
        # constructor takes no other average function: the base class's is called instead.
        WeightAveraging.__init__(
            self,
            device=device,
            use_buffers=use_buffers,
            multi_avg_fn=ema_with_warmup(decay),
            **kwargs,
        )
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = None
        self._raw_weights: list[Tensor] | None = None  # the module's, while validating the average

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning keeps the average on callbacks.ema.device, else on the module's device as
        # it is at setup, which is before the strategy moves the module: on a GPU run the
        # average lived on the CPU, and every step copied all weights to the host (a sync) and
        # averaged them there. The device the strategy trains on, unless the config names one.
        chosen = self._device
        if chosen is None:
            self._device = trainer.strategy.root_device
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            self._device = chosen
        if self._average_model is not None and type(self._average_model) is AveragedModel:
            # the same object and state, updated without torch's two host syncs a step
            self._average_model.__class__ = AveragedCopy

    def _follow_until_averaged(self, pl_module: L.LightningModule) -> None:
        """Before its first update (update_starting_at_step) the average is the weights as they
        are, not the copy made at setup: validation, checkpoints and the end of fit use them."""
        average = self._average_model
        if average is None or int(average.n_averaged) > 0:
            return
        for kept, current in self._pairs(pl_module):
            kept.data.copy_(current.data)

    def _pairs(self, pl_module: L.LightningModule) -> list[tuple[Tensor, Tensor]]:
        """(the average's, the module's) for every parameter and buffer."""
        average = self._average_model
        assert average is not None
        return list(
            zip(
                itertools.chain(average.module.parameters(), average.module.buffers()),
                itertools.chain(pl_module.parameters(), pl_module.buffers()),
                strict=True,
            )
        )

    def _swap_models(self, pl_module: L.LightningModule) -> None:
        pairs = self._pairs(pl_module)
        if self._raw_weights is None:  # validation starts: the module takes the average
            self._raw_weights = [current.detach().clone() for _, current in pairs]
            for kept, current in pairs:
                current.data.copy_(kept.data)
        else:  # validation ends: the module's own weights back, the average untouched
            for (_, current), raw in zip(pairs, self._raw_weights, strict=True):
                current.data.copy_(raw)
            self._raw_weights = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._follow_until_averaged(pl_module)
        super().on_validation_epoch_start(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._follow_until_averaged(pl_module)
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        # The average's state_dict also holds the module's other state as it was copied at the
        # start (torchmetrics' persistent states: the classifier's val/acc_best at -inf); those
        # are the run's, not averaged: taken from the module as it is now.
        raw = checkpoint.get("current_model_state")
        if raw is not None:
            averaged = {n for n, _ in pl_module.named_parameters()}
            if self._average_model is not None and self._average_model.use_buffers:
                averaged |= {n for n, _ in pl_module.named_buffers()}
            for name in checkpoint["state_dict"]:
                if name not in averaged and name in raw:
                    checkpoint["state_dict"][name] = raw[name]

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._follow_until_averaged(pl_module)
        super().on_train_end(trainer, pl_module)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
