"""State for exact resumption, and checkpoints on preemption signals."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.errors import Requeued

log = logging.getLogger(__name__)


class RNGState(Callback):
    """Saves and restores every random generator with the checkpoint (Lightning does not), so
    that augmentation, dropout and GAN noise continue exactly where an interrupted run stopped."""

    @property
    def state_key(self) -> str:
        return "RNGState"

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _submitit_signal() -> signal.Signals | None:
    """The signal submitit sends before a preemption or time limit, inside a submitit job."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


class Preemption(Callback):
    """On SIGTERM (and SIGUSR1 outside SLURM) finish the current batch, save ``last.ckpt`` in
    the checkpoint folder, and stop; ``python train.py resume=<run folder>`` continues.

    Lightning turns SIGTERM into a SIGTERMException at the next batch boundary (on every rank);
    SIGUSR1 is routed the same way here. Under SLURM with auto-requeue, Lightning handles
    SIGUSR1 itself (hpc checkpoint and requeue). Inside a submitit job (Hydra's submitit
    launcher) submitit's preemption signal (USR2) is routed the same way too, and once the
    run has saved ``last.ckpt`` and closed its loggers, :meth:`hand_over` lets submitit's own
    handler requeue the job, which then continues in the same folder
    (litlab.resume.continue_in_place).

    The handlers are set when training starts, after Lightning has taken its snapshot of the
    signal handlers, so that Lightning's teardown puts the originals back.
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self._taken: dict[signal.Signals, Any] = {}  # signal -> the handler it had before
        self._received: signal.Signals | None = None
        self._scheduler: Any = None  # submitit's handler, once a preemption was checkpointed

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._received = self._scheduler = None
        slurm = (
            trainer._accelerator_connector.cluster_environment.__class__.__name__
            == "SLURMEnvironment"
        )
        for signum in {None if slurm else signal.SIGUSR1, _submitit_signal()} - {None}:
            with contextlib.suppress(ValueError):  # not in the main thread: leave signals alone
                self._taken[signum] = signal.signal(signum, self._stop)

    def _stop(self, signum: int, frame: Any) -> None:
        self._received = signal.Signals(signum)
        signal.raise_signal(signal.SIGTERM)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def _restore(self) -> dict[signal.Signals, Any]:
        taken, self._taken = self._taken, {}
        for signum, previous in taken.items():
            signal.signal(signum, previous)
        return taken

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        previous = self._restore().get(self._received)
        if not (isinstance(exception, SIGTERMException) and trainer.state.fn == "fit"):
            return
        trainer.save_checkpoint(self.path)
        log.warning("stopped by a signal; saved %s to resume from", self.path)
        if self._received is not None and self._received == _submitit_signal():
            self._scheduler = previous if callable(previous) else None

    def hand_over(self) -> None:
        """After a checkpointed preemption inside a submitit job: submitit requeues the job
        (from global rank 0) and exits, as litlab.errors.Requeued. Otherwise nothing."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        try:
            scheduler(self._received, None)
        except SystemExit as e:
            raise Requeued(e.code) from e


def hand_over_preemption(trainer: L.Trainer) -> None:
    """Let the cluster scheduler requeue a run that stopped for a preemption (see Preemption)."""
    for callback in trainer.callbacks:
        if isinstance(callback, Preemption):
            callback.hand_over()
