"""Lightning's ModelCheckpoint with its state key kept, not rebuilt at each hook call, no
periodic save on an epoch's last batch, and periodic saves at every N steps for GANs too."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from litlab.compat import checkpoint_settings, every_n_train_steps, save_periodic_checkpoint


def inside_an_accumulation(trainer: Any, batch_idx: int) -> bool:
    """Whether the training batch just ended leaves gradients accumulated for a later batch's
    optimizer step (``trainer.accumulate_grad_batches`` > 1; an epoch's last batch always
    steps). Checkpoints hold no gradients: a save or a stop there loses that part of the step."""
    return not trainer.is_last_batch and (batch_idx + 1) % trainer.accumulate_grad_batches != 0


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
    _step_seen: int | None = None  # global_step at the end of the last training batch

    @property
    def state_key(self) -> str:
        settings = checkpoint_settings(self)
        if self._key is None or self._key[0] != settings:
            self._key = (settings, super().state_key)
        return self._key[1]

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A periodic (every_n_train_steps) save that falls on an epoch's last batch is left to
        the epoch's end: resumed from a checkpoint written there, Lightning counts the epoch as
        done and skips its validation and epoch-end hooks (no val/* for it, no best checkpoint
        from it, and the classifier's training sums carried into the next epoch).

        None inside a gradient accumulation either: Lightning's own check (global_step moved
        since its last save) fails on a resumed run's first batches, as the step it last saved
        is not restored: resumed from step.ckpt at step 4 with accumulate_grad_batches=2, it
        wrote step.ckpt again after the first batch, its half of the step's gradient lost."""
        previous, self._step_seen = self._step_seen, trainer.global_step
        if trainer.is_last_batch or inside_an_accumulation(trainer, batch_idx):
            return
        every = every_n_train_steps(self)
        if every < 1 or trainer.lightning_module.automatic_optimization:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        # Manual optimization (the GANs): global_step counts every optimizer's steps, so it moves
        # by two on a batch where D and G both step and can pass over a multiple of N without
        # landing on it (Lightning saves only on one: n_critic=2 and N=1000 skipped 2000, 5000..,
        # a gap of 2N). Saved wherever a multiple was reached or passed during the batch.
        if previous is not None and trainer.global_step // every > previous // every:
            save_periodic_checkpoint(self, trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._step_seen = trainer.global_step  # a resumed run's first batch starts from here
        super().on_train_start(trainer, pl_module)
