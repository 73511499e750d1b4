"""The Lightning strategy a model needs, spawned DDP processes that close their process group,
and what DDP leaves to the model: its buffers."""

from __future__ import annotations

import atexit
import inspect
import itertools
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from litlab.compat import HandlingLauncher
from litlab.errors import ConfigError


def strategy_name(strategy: Any) -> str:
    """A trainer.strategy value's name: the string itself, or the _target_ of a strategy node."""
    return strategy if isinstance(strategy, str) else str(strategy.get("_target_", ""))


def forks_the_ranks(strategy: Any) -> bool:
    """Whether a trainer.strategy value forks the ranks from this process: Lightning's
    ddp_fork and ddp_notebook names, or a strategy node with start_method=fork."""
    if strategy_name(strategy).startswith(("ddp_fork", "ddp_notebook")):
        return True
    return not isinstance(strategy, str) and strategy.get("start_method") == "fork"


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


# DDP's own message (torch) and the one Lightning's DDPStrategy puts in its place
_UNUSED_CUES = (
    "Expected to have finished reduction in the prior iteration",
    "parameters that were not used in producing the loss",
)


@contextmanager
def unused_parameters_explained(strategy: Any) -> Iterator[None]:
    """DDP's error for parameters a step's loss left unused (a net of one's own with a layer
    its forward never calls) as one line, with the strategy that allows them: it came as a
    40-frame traceback (walkthrough 173)."""
    try:
        yield
    except Exception as e:  # (under ddp_spawn: torch's ProcessRaisedException, its text)
        if isinstance(e, ConfigError) or not any(cue in str(e) for cue in _UNUSED_CUES):
            raise
        name = strategy_name(strategy or "")
        launcher = re.match(r"ddp_(spawn|fork|notebook)", name)  # (the ranks started alike)
        allowing = (
            f"trainer.strategy={launcher[0] if launcher else 'ddp'}_find_unused_parameters_true"
            if isinstance(strategy, str) or strategy is None
            else "++trainer.strategy.find_unused_parameters=true"  # (a node: its launch kept)
        )
        raise ConfigError(
            "the model has parameters that a training step's loss did not use (a layer its "
            "forward never calls, or skips in some steps), and DDP all-reduces every one in "
            f"every step: remove them from the net, or set {allowing} (DDP then looks for "
            "them in every step)"
        ) from e


def strategy_for(
    model: L.LightningModule,
    strategy: Any,
    devices: Any,
    num_nodes: int,
    accelerator: str = "auto",
    cuda_devices: int | None = None,
) -> Any:
    """The Lightning strategy to use for this model, given the configured one.

    A GAN steps G and D separately (manual optimization): D's backward has no gradient for G,
    G's none for D. One DDP wrapper around the whole module (Lightning's
    "ddp_find_unused_parameters_true", still there to choose) all-reduces both nets' gradients
    in every backward, zeros for the net not stepping: 2x the traffic a DCGAN needs, 2.2x to
    4.3x (by the nets' sizes) with WGAN-GP's five critic steps. "ddp" and "ddp_spawn" give a
    GAN SeparateNetsDDPStrategy instead: a DDP wrapper per net, each backward all-reduces the
    stepping net's gradients alone (a manual-optimization module that names no ``ddp_nets``
    gets Lightning's one wrapper). GANs are refused under FSDP: their EMA generator
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
    # a module that names its nets gets a wrapper per net, another one Lightning's one wrapper
    # that finds the parameters each backward leaves unused
    separate = bool(getattr(model, "ddp_nets", None))
    if strategy == "ddp" or (strategy == "auto" and many):
        return "ddp_separate_nets" if separate else "ddp_find_unused_parameters_true"
    if strategy == "ddp_spawn":
        return "ddp_spawn_separate_nets" if separate else "ddp_spawn_find_unused_parameters_true"
    return strategy


class ClosingDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy whose spawned processes destroy their process group before their
    interpreter shuts down (Lightning 2.6.6 does so at exit for NCCL alone), and whose spawned
    or forked processes end a run as Lightning ends it in processes it does not start (a stop
    by a signal saves its checkpoint and ends the run as interrupted: litlab.compat.
    HandlingLauncher).

    A gloo group left to the shutdown aborted ddp_spawn's processes now and then after training
    ("terminate called without an active exception", SIGABRT: the fit fails). Gloo's worker
    thread drops a collective's work after the caller has its result, and dropping the work's
    tensors takes the GIL; a spawned process leaves milliseconds after its last collective, a
    thread that asks for the GIL once the interpreter finalizes is ended by pthread_exit, and
    that unwinding through the work's noexcept destructor calls std::terminate. Destroying the
    group while the interpreter is whole joins gloo's threads (the destructor lets go of the GIL).
    """

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method != "popen":  # Lightning's, but its processes' ends handled
            self._launcher = HandlingLauncher(self, start_method=self._start_method)

    def teardown(self) -> None:
        """After a run that ended, close the group at exit, not now: the launcher still collects
        rank 0's results on every rank after this. A spawned process whose run failed never
        gets here (its exception skips Lightning's teardown), so it does not wait at exit on
        gloo threads in a collective that the other ranks left; one stopped by a signal does
        (every rank stops after the same batch: HandlingLauncher). Spawned processes leave through
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


# Lightning's names for DDP in spawned and forked processes, and their parameters
STARTED_DDP = {
    f"ddp_{start}{suffix}": {"start_method": start, **params}
    for start in ("spawn", "fork")
    for suffix, params in (
        ("", {}),
        ("_find_unused_parameters_false", {"find_unused_parameters": False}),
        ("_find_unused_parameters_true", {"find_unused_parameters": True}),
    )
}


def register_closing_ddp() -> None:
    """Lightning's names of DDP in spawned and forked processes registered anew, to
    ClosingDDPStrategy: trainer.strategy=ddp_spawn or ddp_fork from a config, or in a Trainer
    built by hand, gets it."""
    for name, params in STARTED_DDP.items():
        StrategyRegistry.register(
            name,
            ClosingDDPStrategy,
            "DDP in started processes that end a run as Lightning's own processes do (litlab)",
            override=True,
            **params,
        )


# DistributedDataParallel's setting for no buffer broadcasts in the forward passes: newer torch
# deprecates broadcast_buffers (with a warning) for forward_sync_buffers
_NO_BUFFER_BROADCASTS = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers"
    in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)
# Where SeparateNetsDDPStrategy keeps a module's DDP wrappers: a plain dict in the module's
# __dict__, neither submodules (no "module." in the checkpoint's keys) nor state
_WRAPPERS = "_ddp_wrappers"


class SeparateNetsDDPStrategy(ClosingDDPStrategy):
    """DDP for a module whose training steps each train one of its nets (a GAN: D's step, G's
    step): every net the module names in ``ddp_nets`` in a DistributedDataParallel of its own,
    so that a backward all-reduces the gradients of the net it trains and nothing else (one
    wrapper around the whole module all-reduces every net's buckets in every backward, zeros
    for the nets that have no gradient, and must search the graph for them each time).

    The module calls a net through ``ddp_net(module, name)`` where that net's gradients are to
    be averaged over ranks (its training forward), and the net itself elsewhere: a wrapper's
    forward with gradients on prepares its reducer for a backward, and a net whose parameters
    are frozen in that step (D in G's step) has no gradient to give it. The module's state,
    checkpoint keys included, is the module's: the wrappers are kept outside it and dropped at
    teardown. Every parameter and buffer starts from rank 0's (the EMA copy's too), as with one
    wrapper. Unlike Lightning's one wrapper, buffers are not broadcast in every training step:
    between evaluations the other ranks' BatchNorm statistics (and their EMA copies) are their
    own, which nothing reads there (training runs on batch statistics, only rank 0 saves grids
    and checkpoints); litlab.distributed.broadcast_buffers gives every rank rank 0's before each
    evaluation. The nets' parameters must all be used in their step (find_unused_parameters
    off): a net of one's own that leaves some unused needs
    trainer.strategy=ddp_find_unused_parameters_true.
    """

    def configure_ddp(self) -> None:
        from contextlib import nullcontext

        from torch.nn.parallel import DistributedDataParallel

        from litlab.compat import ddp_wrapper_settings

        module = self.model
        assert isinstance(module, L.LightningModule)
        if not getattr(module, "ddp_nets", None):  # a module of one net: Lightning's wrapper
            super().configure_ddp()
            return
        settings, hooked = ddp_wrapper_settings(self)
        if hooked:  # Lightning's go to its one wrapper; a hook's state is kept per bucket index
            raise ConfigError(
                "DDP communication hooks and model averaging are Lightning's, for one wrapper "
                "around the whole module: use trainer.strategy=ddp_find_unused_parameters_true "
                "(a GAN then all-reduces both nets' gradients in every backward)"
            )
        device_ids = self.determine_ddp_device_ids()
        settings = {**_NO_BUFFER_BROADCASTS, **settings}
        # as Lightning builds its one wrapper: https://pytorch.org/docs/stable/notes/cuda.html#id5
        ctx = torch.cuda.stream(torch.cuda.Stream()) if device_ids is not None else nullcontext()
        with ctx:  # each checks its net's shapes on every rank and takes rank 0's parameters
            module.__dict__[_WRAPPERS] = {
                name: DistributedDataParallel(
                    getattr(module, name), device_ids=device_ids, **settings
                )
                for name in module.ddp_nets
            }
        # and the rest, as one wrapper around the module did: the other parameters (the EMA
        # copy's), and every buffer (not all torch versions sync a wrapped net's at build)
        wrapped = {id(p) for name in module.ddp_nets for p in getattr(module, name).parameters()}
        others = (p for p in module.parameters() if id(p) not in wrapped)
        _from_rank0(itertools.chain(others, module.buffers()))

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Lightning's no_sync for manual gradient accumulation (``toggle_model(sync_grad=
        False)``), on every net's wrapper: Lightning's enters it on its one wrapper alone."""
        wrappers = self.lightning_module.__dict__.get(_WRAPPERS, {}).values()
        with ExitStack() as stack:
            if not wrappers:  # a module of one net, in Lightning's one wrapper
                stack.enter_context(super().block_backward_sync())
            for wrapper in wrappers:
                stack.enter_context(wrapper.no_sync())
            yield

    def teardown(self) -> None:
        if isinstance(self.model, L.LightningModule):
            self.model.__dict__.pop(_WRAPPERS, None)
        super().teardown()


def ddp_net(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """The module's net ``name`` as its training forward calls it: its DDP wrapper under
    SeparateNetsDDPStrategy, else the net."""
    wrapper = module.__dict__.get(_WRAPPERS, {}).get(name)
    return getattr(module, name) if wrapper is None else wrapper


def register_separate_nets_ddp() -> None:
    """SeparateNetsDDPStrategy under two names: processes started as scripts (Lightning's "ddp")
    or spawned ("ddp_spawn"), each net's wrapper without the search for unused parameters."""
    for name, start_method in (
        ("ddp_separate_nets", "popen"),
        ("ddp_spawn_separate_nets", "spawn"),
    ):
        StrategyRegistry.register(
            name,
            SeparateNetsDDPStrategy,
            "DDP with a wrapper per net, for GANs (litlab)",
            override=True,
            start_method=start_method,
        )


register_closing_ddp()  # at import, as the config resolvers are registered
register_separate_nets_ddp()


def broadcast_buffers(module: L.LightningModule) -> None:
    """Give every rank global rank 0's buffers (BatchNorm running statistics, EMA counters).

    Buffers are not parameters: each rank updates its own in its forward passes (under a GAN's
    manual optimization DDP never re-broadcasts them), so they drift apart between ranks, and
    checkpoints hold rank 0's. Called before every evaluation, so that all ranks evaluate the
    model that is saved, and a resumed run evaluates as an uninterrupted one.
    """
    _from_rank0(module.buffers())


def _from_rank0(tensors: Iterable[torch.Tensor]) -> None:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)


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
