"""The Lightning strategy a model needs, spawned DDP processes that close their process group,
and what DDP leaves to the model: its buffers."""

from __future__ import annotations

import atexit
import re
import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

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


class ClosingDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy whose spawned processes destroy their process group before their
    interpreter shuts down (Lightning 2.6.6 does so at exit for NCCL alone).

    A gloo group left to the shutdown aborted ddp_spawn's processes now and then after training
    ("terminate called without an active exception", SIGABRT: the fit fails). Gloo's worker
    thread drops a collective's work after the caller has its result, and dropping the work's
    tensors takes the GIL; a spawned process leaves milliseconds after its last collective, a
    thread that asks for the GIL once the interpreter finalizes is ended by pthread_exit, and
    that unwinding through the work's noexcept destructor calls std::terminate. Destroying the
    group while the interpreter is whole joins gloo's threads (the destructor lets go of the GIL).
    """

    def teardown(self) -> None:
        """After a run that ended, close the group at exit, not now: the launcher still collects
        rank 0's results on every rank after this. A spawned process whose run failed never
        gets here (its exception skips Lightning's teardown), so it does not wait at exit on
        gloo threads in a collective that the other ranks left. Spawned processes leave through
        sys.exit, which runs atexit; forked ones (ddp_fork) through os._exit, which runs neither
        atexit nor the interpreter's shutdown."""
        super().teardown()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            atexit.unregister(close_process_group)  # once, however many runs end in this process
            atexit.register(close_process_group)


def close_process_group() -> None:
    """Destroy this process's default process group, if it still has one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# Lightning's names for DDP in spawned processes, and their parameters
SPAWNED_DDP = {
    "ddp_spawn": {},
    "ddp_spawn_find_unused_parameters_false": {"find_unused_parameters": False},
    "ddp_spawn_find_unused_parameters_true": {"find_unused_parameters": True},
}


def register_closing_ddp() -> None:
    """Lightning's spawned-DDP names registered anew, to ClosingDDPStrategy: trainer.strategy=
    ddp_spawn from a config, or in a Trainer built by hand, gets it."""
    for name, params in SPAWNED_DDP.items():
        StrategyRegistry.register(
            name,
            ClosingDDPStrategy,
            "DDP in spawned processes that close their process group at exit (litlab)",
            override=True,
            start_method="spawn",
            **params,
        )


register_closing_ddp()  # at import, as the config resolvers are registered


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
