"""Switches that change how fast a model computes: memory layout and compilation leave what it
computes as it is (to rounding); matmul_precision "high"/"medium" computes float32 matmuls in
TF32/bf16 on GPUs that have them, a change of numerics by choice."""

from __future__ import annotations

import logging

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torchmetrics import Metric

log = logging.getLogger(__name__)


# torch's cap on the graphs compiled for one function, for the nets litlab compiles in place
RECOMPILE_LIMIT = 64


class Speed(Callback):
    """channels_last memory format, in-place torch.compile of the nets, float32 matmul precision.

    Compiling in place (``nn.Module.compile``) keeps parameter names, so checkpoints written with
    compile on load with compile off and vice versa.
    """

    def __init__(
        self,
        channels_last: bool = False,
        compile: bool = False,
        matmul_precision: str | None = None,
    ):
        if matmul_precision not in (None, "highest", "high", "medium"):
            from litlab.errors import ConfigError

            raise ConfigError(
                f"matmul_precision must be highest, high or medium, got {matmul_precision!r}"
            )
        self.channels_last = channels_last
        self.compile = compile
        self.matmul_precision = matmul_precision
        self._precision_before: str | None = None
        self._limit_before: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.matmul_precision:
            # torch's setting is the process's: put back at teardown, or the next job of a sweep
            # run in this process (Hydra's basic launcher, Optuna's sweeper) would compute its
            # matmuls in this one's precision
            self._precision_before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(self.matmul_precision)
        if self.channels_last:
            pl_module.to(memory_format=torch.channels_last)
            datamodule = trainer.datamodule
            if datamodule is not None and hasattr(datamodule, "memory_format"):
                datamodule.memory_format = torch.channels_last
        if self.compile:
            if stage == "fit":
                # torch keeps compiled graphs per function for the whole process and stops
                # compiling one after torch._dynamo.config.recompile_limit (8) of them, running it
                # eagerly; every net compiled in place goes through one function of torch's, so
                # the cap is on all of a process's nets together: a GAN's G, its average and D,
                # in training and evaluation, took 6 of the 8, and the jobs of a sweep share a
                # process. Each fit compiles afresh, under a cap of 64 (put back at teardown).
                torch.compiler.reset()
                if self._limit_before is None:
                    self._limit_before = torch._dynamo.config.recompile_limit
                torch._dynamo.config.recompile_limit = max(self._limit_before, RECOMPILE_LIMIT)
            # A module may name what can be compiled (a GAN with a gradient penalty keeps its
            # discriminator eager: torch.compile has no double backward); else every net.
            names = getattr(pl_module, "compile_targets", None)
            for name, child in pl_module.named_children():
                if names is not None and name not in names:
                    continue
                if not isinstance(child, Metric) and any(True for _ in child.parameters()):
                    child.compile()
                    log.info("compiled %s in place", name)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._put_back_process_settings()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._put_back_process_settings()  # a failed job of a sweep that goes on: no teardown call

    def _put_back_process_settings(self) -> None:
        if self._precision_before is not None:
            torch.set_float32_matmul_precision(self._precision_before)
            self._precision_before = None
        if self._limit_before is not None:
            torch._dynamo.config.recompile_limit = self._limit_before
            self._limit_before = None
