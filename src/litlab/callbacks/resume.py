"""State for exact resumption, and checkpoints on preemption signals."""

from __future__ import annotations

import logging
import random
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

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


class Preemption(Callback):
    """On SIGTERM (and SIGUSR1 outside SLURM) finish the current batch, save ``last.ckpt`` in
    the checkpoint folder, and stop; ``python train.py resume=<run folder>`` continues.

    Lightning turns SIGTERM into a SIGTERMException at the next batch boundary (on every rank);
    SIGUSR1 is routed the same way here. Under SLURM with auto-requeue, Lightning handles
    SIGUSR1 itself (hpc checkpoint and requeue).
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self._previous: Any = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (
            trainer._accelerator_connector.cluster_environment.__class__.__name__
            == "SLURMEnvironment"
        ):
            return
        try:
            self._previous = signal.signal(
                signal.SIGUSR1, lambda *_: signal.raise_signal(signal.SIGTERM)
            )
        except ValueError:  # not in the main thread: leave signals alone
            self._previous = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGUSR1, self._previous)
            self._previous = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit":
            trainer.save_checkpoint(self.path)
            log.warning("stopped by a signal; saved %s to resume from", self.path)
