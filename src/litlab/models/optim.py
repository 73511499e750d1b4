"""Optimizers and LR schedules from `_partial_` configs; the module supplies params and length."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import rank_zero_only
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, OneCycleLR, ReduceLROnPlateau

from litlab.compat import (
    batches_done_this_epoch,
    one_cycle_phases,
    stepping_batches,
    training_batches,
)
from litlab.errors import ConfigError

log = logging.getLogger(__name__)

# Schedule arguments that mean "how long the schedule runs", by scheduler class.
_LENGTH_ARGS = ("total_steps", "T_max", "total_iters")

Interval = Literal["step", "epoch"]


def schedule_length(trainer: Any, interval: Interval) -> int:
    """Training length in the scheduler's unit: optimizer steps, or the epochs the run trains
    (trainer.max_epochs, fewer where trainer.max_steps ends it sooner: the epochs those steps
    reach into)."""
    if interval == "step":
        return stepping_batches(trainer)
    epochs = trainer.max_epochs
    max_steps = getattr(trainer, "max_steps", -1)  # (a benchmark's stand-in has none)
    if max_steps is not None and max_steps >= 0:
        steps = stepping_batches(trainer)  # min(max_steps, the epochs' steps)
        batches = training_batches(trainer)
        if batches and not math.isinf(batches):  # (limit_train_batches=0: none to count)
            per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
            reached = math.ceil(steps / per_epoch)
            epochs = reached if epochs is None or epochs < 0 else min(epochs, reached)
    if epochs is None or epochs < 0:
        raise ConfigError(
            "an LR schedule stepped every epoch (model.scheduler_interval=epoch) runs over the "
            "run's epochs, which are not set: set trainer.max_epochs (or trainer.max_steps)"
        )
    return int(epochs)


def schedules_left_unfinished(trainer: Any) -> list[str]:
    """The fit's LR schedules that a stop before the run's end left with steps to go (trainer.
    max_time: sized by max_epochs or max_steps, a schedule cannot know when the time runs out),
    each as "OneCycleLR at step 144 of 400"."""
    unfinished = []
    for config in getattr(trainer, "lr_scheduler_configs", None) or []:
        scheduler = config.scheduler
        lengths = (getattr(scheduler, arg, None) for arg in _LENGTH_ARGS)
        length = next((n for n in lengths if isinstance(n, int)), None)
        if length is not None and scheduler.last_epoch < length:
            name = type(scheduler).__name__
            unfinished.append(f"{name} at {config.interval} {scheduler.last_epoch} of {length}")
    return unfinished


def resumed_length(trainer: Any, interval: Interval) -> int:
    """The length a restored schedule needs to end at this run's end: the steps already taken
    plus those still to come at this run's optimizer steps per epoch, which differ from the
    checkpoint's run's when the batch size or the number of devices changed at an epoch's end
    (the whole run at the new rate would count the steps taken at the old rate wrongly).
    Epoch schedules, and runs whose length is set by trainer.max_steps alone: as at the start."""
    whole = schedule_length(trainer, interval)
    batches, epochs = trainer.num_training_batches, trainer.max_epochs
    if interval != "step" or epochs is None or epochs < 0 or math.isinf(batches):
        return whole
    accumulate = trainer.accumulate_grad_batches
    per_epoch = math.ceil(batches / accumulate)
    done = batches_done_this_epoch(trainer) // accumulate
    length = trainer.global_step + per_epoch * (epochs - trainer.current_epoch) - done
    return min(length, trainer.max_steps) if trainer.max_steps >= 0 else length


# What wrappers put into parameter names: FSDP, activation checkpointing, torch.compile
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def unwrapped_name(name: str) -> str:
    """A parameter's name as in the module before FSDP, checkpointing or compile wrapped it."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def parameter_ndims(named: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, int]:
    """Each parameter's number of dimensions by name, taken before any wrapping: FSDP with its
    original parameters (Lightning's) shows every parameter as a flat 1-D view of its shard."""
    return {unwrapped_name(name): param.ndim for name, param in named}


# A vision transformer's class (distillation, register) tokens and position embeddings, and a Swin's relative position
# bias tables and attention logit scales (torchvision's and timm's names): learned inputs and
# scales, not weights; shrunk towards zero a ViT forgets where each patch lies. torchvision's
# and timm's recipes spare them (transformer_embedding_decay, no_weight_decay).
EMBEDDINGS = (
    "class_token",
    "pos_embedding",
    "cls_token",
    "dist_token",
    "reg_token",
    "pos_embed",
    "absolute_pos_embed",
    "relative_position_bias_table",
    "logit_scale",
)
# The grouping rule's version, recorded in a classifier's checkpoints: 2 spares EMBEDDINGS; 1,
# the rule before (checkpoints without a record), decayed them by their shape. A resumed run
# keeps its checkpoint's: the optimizer's saved state is laid out in that rule's groups.
DECAY_GROUPING = 2


def spared_by_name(name: str) -> bool:
    """Whether the parameter ``name`` is one of EMBEDDINGS."""
    return name.rpartition(".")[2] in EMBEDDINGS


def optimized_parameters(
    named: Iterable[tuple[str, torch.nn.Parameter]],
    decay_norm_and_bias: bool,
    ndims: dict[str, int] | None = None,
    grouping: int = DECAY_GROUPING,
) -> list[Any]:
    """What the optimizer is built on: every parameter that trains (its weight decay on all of
    them; not a frozen backbone's), or with ``decay_norm_and_bias`` false the two groups of
    :func:`weight_decay_groups`."""
    named = [(name, param) for name, param in named if param.requires_grad]
    if decay_norm_and_bias:
        return [param for _, param in named]
    return weight_decay_groups(named, ndims, grouping)


def weight_decay_groups(
    named: Iterable[tuple[str, torch.nn.Parameter]],
    ndims: dict[str, int] | None = None,
    grouping: int = DECAY_GROUPING,
) -> list[dict[str, Any]]:
    """Two parameter groups of ``named`` (optimized_parameters gives those that train):
    "decay" (weight matrices and kernels: the optimizer's weight decay) and "no_decay" (weight
    decay 0: parameters of one dimension or none, i.e. normalization scales and shifts and
    biases; and, from ``grouping`` 2, a transformer's token and position
    embeddings, EMBEDDINGS). The rule of timm's ``param_groups_weight_decay`` and of FFCV's and
    Goyal et al.'s ImageNet recipes; the group names label the LR monitor's curves.
    ``ndims`` (``parameter_ndims`` of the module before it was wrapped) gives the parameters'
    own dimensions where the shapes seen now are not theirs (under FSDP: every one flat, 1-D,
    and by shape none would decay); a parameter it does not name is taken as it is now."""
    decay, no_decay = [], []
    for name, param in named:
        ndim = (ndims or {}).get(unwrapped_name(name), param.ndim)
        spared = ndim <= 1 or (grouping >= 2 and spared_by_name(unwrapped_name(name)))
        (no_decay if spared else decay).append(param)
    return [
        {"params": decay, "name": "decay"},
        {"params": no_decay, "name": "no_decay", "weight_decay": 0.0},
    ]


# torch.optim classes with a fused implementation (one kernel over all of a group's tensors
# instead of several small ops per tensor) on these devices, and the arguments that choose an
# implementation or rule the fused one out. Adagrad's fused kernel is CPU-only: not listed.
_FUSED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
_FUSED_DEVICES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_IMPLEMENTATION_ARGS = ("fused", "foreach", "capturable", "differentiable")


def make_optimizer(
    factory: Callable[..., Optimizer],
    params: Iterable[Any],
    trainer: Any = None,
    clipped: bool = False,
) -> Optimizer:
    """The optimizer of a ``_partial_`` config on ``params`` (tensors or parameter groups), with
    torch's fused implementation where it has one and the config chose none: Adam, AdamW and SGD
    on the CPU or CUDA, every parameter a dense tensor of float32, float64 or bfloat16. The same
    update as torch's default implementation, to rounding, in fewer kernels: a tiny MLP's Adam
    step on a CPU took 0.38 ms as a loop over tensors and 0.13 ms fused (docs/benchmarks.md, P1).
    A config that sets ``fused``, ``foreach``, ``capturable`` or ``differentiable``
    (``+model.optimizer.fused=false``) is built as it says.

    Not fused where that would change what is learned or stop the run: under ``trainer``'s
    GradScaler (``precision=16-mixed``), where a fused step unscales the gradients itself so
    Lightning would hand ``on_before_optimizer_step`` scaled ones; under any mixed precision
    when gradients are ``clipped`` (Lightning refuses to clip for an optimizer that could unscale
    in its step: a RuntimeError at the first step); on float16 weights (``precision=16-true``),
    where fused Adam keeps its float16 second moment, which underflows to 0, and divides by eps
    (steps thousands of times too large; torch's default fails there with inf, which the
    divergence guard stops). A checkpoint's optimizer state is loaded into the implementation
    built here (``keep_the_built_implementation``), not the one it was saved from."""
    params = list(params)
    func = getattr(factory, "func", factory)
    given = getattr(factory, "keywords", {})
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    plugin = getattr(trainer, "precision_plugin", None)
    scaled = getattr(plugin, "scaler", None) is not None
    fused = (
        inspect.isclass(func)
        and func in _FUSED
        and not scaled
        and not (clipped and isinstance(plugin, MixedPrecision))
        and not any(arg in given for arg in _IMPLEMENTATION_ARGS)
        and bool(tensors)
        and all(
            isinstance(p, torch.Tensor)
            and p.dtype in _FUSED_DTYPES
            and not p.is_sparse
            and p.device.type in _FUSED_DEVICES
            for p in tensors
        )
    )
    optimizer = factory(params=params, **({"fused": True} if fused else {}))
    optimizer.register_load_state_dict_post_hook(keep_the_built_implementation)
    return optimizer


def keep_the_built_implementation(optimizer: Optimizer) -> None:
    """After ``optimizer.load_state_dict``: the implementation chosen when the optimizer was
    built, not the saved one. torch restores every parameter group's settings as saved, its
    ``fused``, ``foreach``, ``capturable`` and ``differentiable`` too: a checkpoint saved fused
    would step fused after a resume with ``+model.optimizer.fused=false`` or on float16
    weights, and one saved before litlab chose fused would never be. Where that changes whether
    the step counts live on the parameter's device (fused or capturable: float32 there) or on
    the CPU, they are moved as torch places them when it builds the state itself; otherwise
    they stay where torch loaded them."""
    for group in optimizer.param_groups:
        was = bool(group.get("fused") or group.get("capturable"))
        for key in _IMPLEMENTATION_ARGS:
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
        on_device = bool(group.get("fused") or group.get("capturable"))
        if on_device == was:
            continue
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[param]["step"] = (
                    step.to(dtype=torch.float32, device=param.device)
                    if on_device
                    else step.to("cpu")
                )


def build_optimizer(
    factory: Callable[..., Optimizer],
    params: Iterable[torch.nn.Parameter],
    scheduler: Callable[..., Any] | None,
    interval: Interval,
    trainer: Any,
    monitor: str | None = None,
    mode: Literal["min", "max"] = "max",
) -> tuple[Optimizer, dict[str, Any] | None]:
    """Call the optimizer factory on params, and the scheduler factory on it, filling the length.

    ReduceLROnPlateau watches ``monitor`` in the direction ``mode`` (the run's objective, unless
    the scheduler config sets its own mode); it steps after each validation, which only epochs
    of ``trainer.check_val_every_n_epoch`` have.
    """
    optimizer = make_optimizer(
        factory, params, trainer, clipped=bool(getattr(trainer, "gradient_clip_val", None))
    )
    if scheduler is None:
        return optimizer, None
    func = getattr(scheduler, "func", scheduler)
    given = getattr(scheduler, "keywords", {})
    if inspect.isclass(func) and issubclass(func, ReduceLROnPlateau):
        if monitor is None:
            raise ConfigError(
                "ReduceLROnPlateau needs a metric to watch: set model.scheduler_monitor"
            )
        built = scheduler(optimizer=optimizer, **({} if "mode" in given else {"mode": mode}))
        every = int(getattr(trainer, "check_val_every_n_epoch", None) or 1)
        return optimizer, {
            "scheduler": built,
            "interval": "epoch",
            "frequency": every,
            "monitor": monitor,
            # stepped by the module itself (ImageClassifier.on_train_epoch_end), which stops a
            # run whose monitor is never logged; Lightning's own check raised also where the
            # validation was still to come (val_check_interval beyond the first epoch's end)
            "strict": False,
        }
    wanted = inspect.signature(func).parameters
    length = {
        arg: schedule_length(trainer, interval)
        for arg in _LENGTH_ARGS
        if arg in wanted and arg not in given
    }
    total = given.get("total_steps") or length.get("total_steps")
    if inspect.isclass(func) and issubclass(func, OneCycleLR) and total:
        _check_one_cycle(float(given.get("pct_start", wanted["pct_start"].default) * total))
    built = scheduler(optimizer=optimizer, **length)
    built.litlab_length_args = tuple(length)  # filled from the run's length: refit on resume
    return optimizer, {"scheduler": built, "interval": interval}


def _check_one_cycle(warm_up_steps: float) -> None:
    """Refuse a one-cycle schedule whose warm-up is one step (pct_start x total steps = 1):
    torch's OneCycleLR divides by the length of a phase, which that makes 0."""
    if warm_up_steps - 1 == 0:
        raise ConfigError(
            "model.scheduler: a one-cycle warm-up of exactly one step (pct_start x the run's "
            "optimizer steps = 1), which torch's OneCycleLR cannot schedule (it divides by the "
            "phase's length, 0); train more steps (more epochs, or a smaller data.batch_size: more "
            "steps an epoch) or set another model.scheduler.pct_start"
        )


def _one_cycle_phase_ends(scheduler: OneCycleLR, total: int) -> list[float]:
    """OneCycleLR's phase ends for ``total`` steps, as its constructor computes them."""
    phases = one_cycle_phases(scheduler)
    pct_start = (phases[0]["end_step"] + 1) / scheduler.total_steps
    if len(phases) == 3:
        return [pct_start * total - 1, 2 * pct_start * total - 2, total - 1]
    return [pct_start * total - 1, total - 1]


# Schedules that can change their length part way: OneCycleLR is a function of the step and
# the phase ends; CosineAnnealingLR's recursive form reaches eta_min exactly at the new T_max
# once its current LR is the closed form's at the step reached under the new T_max.
_REFITTABLE = (OneCycleLR, CosineAnnealingLR)


def _cosine_refit(scheduler: CosineAnnealingLR) -> None:
    """Set the current LRs of a cosine schedule whose T_max changed to its closed form at the
    step reached: its recursive steps scale the current LR, which stays at eta_min for ever
    after a finished schedule (an extended run trained at LR 0) and keeps the old curve's
    level otherwise."""
    t, length, floor = scheduler.last_epoch, scheduler.T_max, scheduler.eta_min
    lrs = [
        floor + (base - floor) * (1 + math.cos(math.pi * t / length)) / 2
        for base in scheduler.base_lrs
    ]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr


def fit_schedules_to_run(trainer: Any) -> None:
    """Make restored LR schedules span this run's length, not the checkpoint's run's.

    A schedule's length (OneCycleLR total_steps, CosineAnnealingLR T_max) comes from
    trainer.max_epochs when the run starts; resuming restores the checkpoint's length with the
    rest of the schedule's state. A run resumed with another length (trainer.max_epochs, or
    batch size / devices for step schedules) then gets a schedule that ends at its own end,
    continuing from the steps already taken (``resumed_length``; OneCycleLR would otherwise
    fail when stepped past its old end). Other schedules cannot change length part way: one
    clear error. Lengths set explicitly in the config, and runs that did not start from a
    checkpoint (the batch-size finder's trials step one schedule through several short fits),
    are left alone.
    """
    if not trainer.ckpt_path:
        return
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        for arg in getattr(scheduler, "litlab_length_args", ()):
            old, new = getattr(scheduler, arg), resumed_length(trainer, config.interval)
            if old == new:
                continue
            name = type(scheduler).__name__
            if not isinstance(scheduler, _REFITTABLE):
                raise ConfigError(
                    f"{name} cannot change its length part way ({old} -> {new} {config.interval}s): "
                    "resume with the trainer.max_epochs (and batch size) the run started with"
                )
            if isinstance(scheduler, OneCycleLR):
                ends = _one_cycle_phase_ends(scheduler, new)
                _check_one_cycle(ends[0] + 1)
                for phase, end in zip(one_cycle_phases(scheduler), ends, strict=True):
                    phase["end_step"] = end
            setattr(scheduler, arg, new)
            if isinstance(scheduler, OneCycleLR):  # the LR is a function of the step: set the
                scheduler.last_epoch -= 1  # current step's under the new length, not the old
                scheduler.step()
            else:
                _cosine_refit(scheduler)
            if rank_zero_only.rank == 0:  # said once, not by every rank
                log.warning(
                    "%s now spans %d %ss instead of %d (the run is longer or shorter than the "
                    "checkpoint's run); it continues from %s %d",
                    name,
                    new,
                    config.interval,
                    old,
                    config.interval,
                    scheduler.last_epoch,
                )
