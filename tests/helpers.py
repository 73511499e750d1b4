"""Test-only callbacks, importable by child processes (tests/ is put on PYTHONPATH)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class DumpWeights(Callback):
    """Each rank saves its final parameters: proves ranks end with identical weights.

    (BatchNorm running statistics are per rank between steps; DDP broadcasts rank 0's at each
    forward, and checkpoints come from rank 0. trainer.sync_batchnorm=true makes them global.)
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        parameters = {name: p.detach().cpu() for name, p in pl_module.named_parameters()}
        torch.save(parameters, self.folder / f"rank{trainer.global_rank}.pt")


class InjectNaN(Callback):
    """Poisons the first parameter of a submodule at a given training batch (a fault injector)."""

    def __init__(self, at_batch: int, module: str) -> None:
        self.at_batch, self.module = at_batch, module

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.at_batch:
            with torch.no_grad():
                next(getattr(pl_module, self.module).parameters()).fill_(float("nan"))


class SignalAt(Callback):
    """Sends a real signal to this process at the end of a given training batch (a preemption)."""

    def __init__(self, batch: int, signum: str = "SIGTERM") -> None:
        self.batch, self.signum = batch, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import os
        import signal

        if trainer.fit_loop.total_batch_idx == self.batch and trainer.is_global_zero:
            os.kill(os.getpid(), getattr(signal, self.signum))
