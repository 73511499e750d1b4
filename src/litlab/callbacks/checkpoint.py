"""Lightning's ModelCheckpoint with its state key kept, not rebuilt at each hook call, no
periodic save on an epoch's last batch or inside a gradient accumulation, periodic saves at
every N steps for GANs too, and its best kept when a run folder moved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from litlab.compat import (
    checkpoint_settings,
    every_n_train_steps,
    save_periodic_checkpoint,
    saves_at_batch_ends,
    time_triggered,
)


def inside_an_accumulation(trainer: Any, batch_idx: int) -> bool:
    """Whether the training batch just ended leaves gradients accumulated for a later batch's
    optimizer step (``trainer.accumulate_grad_batches`` > 1; an epoch's last batch always
    steps). Checkpoints hold no gradients: a save or a stop there loses that part of the step."""
    return not trainer.is_last_batch and (batch_idx + 1) % trainer.accumulate_grad_batches != 0


def relocated(state: dict[str, Any], old: Path, new: Path) -> dict[str, Any]:
    """A ModelCheckpoint's state with its paths under ``old`` moved under ``new``, where the
    file it names as its best (or, without one, its last) is there: the folder was moved or
    copied. Else (a new run started from another run's checkpoint) the state as it was."""

    def moved(path: Any) -> Any:
        if not path or not Path(path).is_relative_to(old):
            return path
        return str(new / Path(path).relative_to(old))

    named = state.get("best_model_path") or state.get("last_model_path")
    if not named or moved(named) == named or not Path(moved(named)).is_file():
        return state
    keys = ("best_model_path", "kth_best_model_path", "last_model_path")
    return {
        **state,
        **{key: moved(state[key]) for key in keys if key in state},
        "best_k_models": {moved(p): v for p, v in (state.get("best_k_models") or {}).items()},
        "dirpath": str(new),
    }


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
        wrote step.ckpt again after the first batch, its half of the step's gradient lost.

        A checkpoint with neither every_n_train_steps nor train_time_interval (the best's, the
        last's) returns at once: Lightning's checks find nothing to do there, and their cost
        (trainer properties read, about 15 us on a 2-core CPU) came every batch, twice with the
        default callbacks."""
        if not saves_at_batch_ends(self):
            return
        previous, self._step_seen = self._step_seen, trainer.global_step
        if trainer.is_last_batch or inside_an_accumulation(trainer, batch_idx):
            return
        every = every_n_train_steps(self)
        if every < 1 or trainer.lightning_module.automatic_optimization:
            if not time_triggered(self) and self._step_seen % every:
                return  # not a multiple of N: Lightning's checks would find no save due
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        # Manual optimization (the GANs): global_step counts every optimizer's steps, so it moves
        # by two on a batch where D and G both step and can pass over a multiple of N without
        # landing on it (Lightning saves only on one: n_critic=2 and N=1000 skipped 2000, 5000..,
        # a gap of 2N). Saved wherever a multiple was reached or passed during the batch.
        if previous is not None and trainer.global_step // every > previous // every:
            save_periodic_checkpoint(self, trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning restores the best score and the paths only where the checkpoint was saved
        in this same folder: a run folder moved or copied elsewhere and continued with resume=
        started with no best, so the first validation after it overwrote best.ckpt and became
        the run's objective. Where this callback's files are in the new folder, as they were
        in the old one, the state is the run's, its paths moved along."""
        stored = state_dict.get("dirpath")
        if stored and self.dirpath and stored != self.dirpath:
            state_dict = relocated(state_dict, Path(stored), Path(self.dirpath))
        super().load_state_dict(state_dict)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._step_seen = trainer.global_step  # a resumed run's first batch starts from here
        super().on_train_start(trainer, pl_module)
