"""Lightning's ModelCheckpoint with its state key kept, not rebuilt at each hook call, and no
periodic save on an epoch's last batch."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from litlab.compat import checkpoint_settings


class ModelCheckpoint(LightningModelCheckpoint):
    """``lightning.pytorch.callbacks.ModelCheckpoint``, the same in all but cost and one case.

    Lightning reads each callback's ``state_key`` at every hook it calls on it (the name it
    profiles under): six times a training step. ModelCheckpoint's is a string made from a dict
    of five settings each time (about 3 us on a 2-core CPU, with the three checkpoints of the
    default callbacks 50 us a step); this one makes it again only when a setting changed. The
    key, which names the callback's state in checkpoints, is Lightning's to the character (the
    same class name): checkpoints written with either class resume with the other.
    """

    _key: tuple[tuple[Any, ...], str] | None = None

    @property
    def state_key(self) -> str:
        settings = checkpoint_settings(self)
        if self._key is None or self._key[0] != settings:
            self._key = (settings, super().state_key)
        return self._key[1]

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        """A periodic (every_n_train_steps) save that falls on an epoch's last batch is left to
        the epoch's end: resumed from a checkpoint written there, Lightning counts the epoch as
        done and skips its validation and epoch-end hooks (no val/* for it, no best checkpoint
        from it, and the classifier's training sums carried into the next epoch)."""
        if trainer.is_last_batch:
            return
        super().on_train_batch_end(trainer, *args, **kwargs)
