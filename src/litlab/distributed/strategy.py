"""The Lightning strategy a model needs, and what DDP leaves to the model: its buffers."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch

from litlab.errors import ConfigError


def strategy_name(strategy: Any) -> str:
    """A trainer.strategy value's name: the string itself, or the _target_ of a strategy node."""
    return strategy if isinstance(strategy, str) else str(strategy.get("_target_", ""))


def _many_processes(devices: Any, num_nodes: int, accelerator: str, cuda_devices: int) -> bool:
    """Whether Lightning will start more than one process for these trainer settings."""
    if num_nodes > 1:
        return True
    if devices in ("auto", -1, "-1"):  # Lightning's auto: every GPU (on a GPU accelerator), else 1
        return accelerator in ("auto", "gpu", "cuda") and cuda_devices > 1
    if isinstance(devices, int):
        return devices > 1
    if isinstance(devices, str):
        return "," in devices.strip(",") or (devices.isdigit() and int(devices) > 1)
    return len(devices) > 1


def strategy_for(
    model: L.LightningModule,
    strategy: Any,
    devices: Any,
    num_nodes: int,
    accelerator: str = "auto",
    cuda_devices: int | None = None,
) -> Any:
    """The Lightning strategy to use for this model, given the configured one.

    A GAN steps G and D separately (manual optimization): in D's step G's parameters produce
    no gradient and in G's step D's are frozen, so DDP must look for unused parameters in
    each backward. Lightning's "ddp_find_unused_parameters_true" does exactly that and keeps
    one DDP wrapper (checkpoint keys unchanged); wrapping G and D separately would need a
    custom strategy for the same effect. GANs are refused under FSDP: their EMA generator
    (AveragedModel) and its samples for FID and grids take whole parameters, which FSDP shards.
    """
    name = strategy_name(strategy)
    if model.automatic_optimization:
        return strategy
    if "fsdp" in name.lower():
        raise ConfigError(
            f"trainer.strategy={name} does not support GANs (their EMA generator and its "
            "samples for FID take whole parameters, which FSDP shards; a DCGAN fits on one "
            "GPU); use trainer.strategy=ddp"
        )
    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count()
    many = _many_processes(devices, num_nodes, str(accelerator), cuda_devices)
    if strategy == "ddp" or (strategy == "auto" and many):
        return "ddp_find_unused_parameters_true"
    if strategy == "ddp_spawn":
        return "ddp_spawn_find_unused_parameters_true"
    return strategy


def broadcast_buffers(module: L.LightningModule) -> None:
    """Give every rank global rank 0's buffers (BatchNorm running statistics, EMA counters).

    Buffers are not parameters: each rank updates its own in its forward passes (under a GAN's
    manual optimization DDP never re-broadcasts them), so they drift apart between ranks, and
    checkpoints hold rank 0's. Called before every evaluation, so that all ranks evaluate the
    model that is saved, and a resumed run evaluates as an uninterrupted one.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for buffer in module.buffers():
        torch.distributed.broadcast(buffer.data, src=0)


_QUIETED: set[str] = set()


def log_job_value(module: L.LightningModule, name: str, value: float | torch.Tensor) -> None:
    """Log an epoch value that is already the job's: the same on every rank (reduced by the
    caller, in the same hook on every rank).

    Not ``sync_dist=True``: Lightning reduces such values lazily, when something first reads the
    epoch's metrics, and its progress bar reads them on rank 0 alone, so rank 0 would reduce
    there while the other ranks reduce later, and any collective in between (one a model runs in
    ``on_train_epoch_end``) pairs with the wrong one: a gloo size mismatch or a hang. Lightning's
    advice to sync epoch values is silenced for these names only.
    """
    if name not in _QUIETED:
        _QUIETED.add(name)
        message = f"It is recommended to use `self.log({name!r}, ..., sync_dist=True)`"
        warnings.filterwarnings("ignore", message=re.escape(message))
    module.log(name, value, on_step=False, on_epoch=True, sync_dist=False)


def fsdp_strategy(wrap: Sequence[str] = (), state_dict_type: str = "full", **kwargs: Any) -> Any:
    """Lightning's FSDPStrategy with auto-wrapping at the named block classes (e.g. BasicBlock).

    ``state_dict_type``: "full" writes one consolidated checkpoint file from rank 0; "sharded"
    writes a folder with one shard per rank (faster, consolidate with Lightning's
    ``python -m lightning.pytorch.utilities.consolidate_checkpoint <folder>``).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    from litlab.config import get_class

    classes = {get_class(name, "trainer.strategy.wrap") for name in wrap}
    return FSDPStrategy(auto_wrap_policy=classes or None, state_dict_type=state_dict_type, **kwargs)


def forward_is_collective(trainer: Any) -> bool:
    """Whether each forward pass of the model is a collective of every rank (FSDP gathers each
    wrapped block's parameters as it runs): every rank must then run as many evaluation
    batches as the others. Under DDP an evaluation forward syncs nothing."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    strategy = getattr(trainer, "strategy", None)
    many = trainer is not None and trainer.world_size > 1
    return many and isinstance(strategy, FSDPStrategy | ModelParallelStrategy)
