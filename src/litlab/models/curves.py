"""Step curves (train/loss_step; a GAN's d/*, g/*) handed to Lightning on the steps it writes."""

from __future__ import annotations

from typing import Any

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
            self.log_dict(values, on_step=True, on_epoch=False)  # type: ignore[attr-defined]
