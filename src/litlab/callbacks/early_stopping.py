"""Early stopping that waits as long as the config says, also in a resumed run."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping


class EarlyStopping(LightningEarlyStopping):
    """Lightning's EarlyStopping with the configured ``patience`` kept when a checkpoint is
    restored: Lightning restores the checkpoint's, so `resume=<run> callbacks.early_stopping.
    patience=20` (the way to train on a run that early stopping ended) was silently ignored, and
    the run stopped again after one epoch. What it counted (epochs without improvement, the best
    score) is restored as before; the class name, and so the checkpoint's state key, is
    Lightning's, so checkpoints written with either restore into the other."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        patience = self.patience
        super().load_state_dict(state_dict)
        self.patience = patience
