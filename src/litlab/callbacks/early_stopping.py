"""Early stopping that waits as long as the config says, also in a resumed run."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason


class EarlyStopping(LightningEarlyStopping):
    """Lightning's EarlyStopping with the configured ``patience`` kept when a checkpoint is
    restored: Lightning restores the checkpoint's, so `resume=<run> callbacks.early_stopping.
    patience=20` (the way to train on a run that early stopping ended) was silently ignored, and
    the run stopped again after one epoch. What it counted (epochs without improvement, the best
    score) is restored as before; the class name, and so the checkpoint's state key, is
    Lightning's, so checkpoints written with either restore into the other.

    A run that it stopped, resumed (to train further: `resume=<run> trainer.max_epochs=<more>`)
    starts its wait again: its restored count stopped it again after one epoch, and the
    restored stop was said and recorded as this fit's (walkthrough 160, review 161). A run it
    did not stop (preempted, requeued) restores its count exactly."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        patience = self.patience
        super().load_state_dict(state_dict)
        self.patience = patience
        if self.stopping_reason != EarlyStoppingReason.NOT_STOPPED or self.stopped_epoch > 0:
            if self.stopping_reason in (
                EarlyStoppingReason.PATIENCE_EXHAUSTED,
                EarlyStoppingReason.NOT_STOPPED,  # (a state from before reasons were kept)
            ):
                self.wait_count = 0
            self.stopped_epoch = 0
            self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = None
