"""Step curves (train/loss_step; a GAN's d/*, g/*) handed to Lightning on the steps it writes."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from litlab.compat import logs_this_step


class _Held:
    """A batch's curve values not logged yet (a plain object: no nn.Module attribute checks)."""

    values: dict[str, Tensor] | None = None


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
        held = self.__dict__.get("_curves")
        if held is None:
            held = self.__dict__["_curves"] = _Held()
        held.values = values

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)  # type: ignore[misc]
        held = self.__dict__.get("_curves")
        if held is None or held.values is None:
            return
        values, held.values = held.values, None
        trainer = self.trainer  # type: ignore[attr-defined]
        if logs_this_step(trainer) or trainer.is_last_batch:
            self.log_dict(values, on_step=True, on_epoch=False)  # type: ignore[attr-defined]
