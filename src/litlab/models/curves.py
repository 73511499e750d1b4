"""Step curves (train/loss_step; a GAN's d/*, g/*) handed to Lightning on the steps it writes,
as means over the ranks."""

from __future__ import annotations

from typing import Any

import torch

from litlab.compat import logs_this_step


class StepCurves:
    """LightningModule mixin: ``log_step_curves`` in the training step.

    Lightning writes a training step's logged values every ``trainer.log_every_n_steps``
    batches; ``self.log`` on the other steps costs its logging machinery for nothing, so the
    values are logged only on those steps and at an epoch's last batch (the run ends with its
    last values). Lightning also writes the step at which the run stops (``trainer.should_stop``),
    which a callback may decide after the training step (max_time's Timer): the values held
    from the last logging step went out stamped with the stop's step. So a batch's values are
    kept until its end (the module's ``on_train_batch_end``, after every callback's) and logged
    there, from that one hook (values logged from two hooks under one name are two entries in
    Lightning's results, and the later-registered one, never reset before the epoch's end, wins).
    """

    def log_step_curves(self, values: dict[str, Any]) -> None:
        # in the instance's __dict__: no nn.Module attribute checks, every step
        self.__dict__["_step_curves"] = values

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)  # type: ignore[misc]
        values = self.__dict__.pop("_step_curves", None)
        trainer = self.trainer  # type: ignore[attr-defined]
        if values is not None and (logs_this_step(trainer) or trainer.is_last_batch):
            if trainer.world_size > 1:  # every rank logs the same steps: a collective is safe
                values = mean_over_ranks(trainer, values)
            self.log_dict(values, on_step=True, on_epoch=False)  # type: ignore[attr-defined]


def mean_over_ranks(trainer: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The tensors of ``values`` as their means over the ranks, in one all-reduce on the device
    (each rank's curve was its own batch's; the job's was rank 0's). Not Lightning's
    ``sync_dist``: it reduces when a value is read, and rank 0's progress bar reads them alone."""
    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if not names:
        return values
    stacked = torch.stack([values[k].detach().float() for k in names])
    means = trainer.strategy.reduce(stacked, reduce_op="mean")
    return {**values, **dict(zip(names, means.unbind(), strict=True))}
