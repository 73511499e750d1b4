"""Optimizers and LR schedules from `_partial_` configs; the module supplies params and length."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import OneCycleLR

log = logging.getLogger(__name__)

# Schedule arguments that mean "how long the schedule runs", by scheduler class.
_LENGTH_ARGS = ("total_steps", "T_max", "total_iters")

Interval = Literal["step", "epoch"]


def schedule_length(trainer: Any, interval: Interval) -> int:
    """Training length in the scheduler's unit: optimizer steps or epochs."""
    if interval == "step":
        return int(trainer.estimated_stepping_batches)
    return int(trainer.max_epochs)


def build_optimizer(
    factory: Callable[..., Optimizer],
    params: Iterable[torch.nn.Parameter],
    scheduler: Callable[..., Any] | None,
    interval: Interval,
    trainer: Any,
) -> tuple[Optimizer, dict[str, Any] | None]:
    """Call the optimizer factory on params, and the scheduler factory on it, filling the length."""
    optimizer = factory(params=params)
    if scheduler is None:
        return optimizer, None
    func = getattr(scheduler, "func", scheduler)
    given = getattr(scheduler, "keywords", {})
    wanted = inspect.signature(func).parameters
    length = {
        arg: schedule_length(trainer, interval)
        for arg in _LENGTH_ARGS
        if arg in wanted and arg not in given
    }
    built = scheduler(optimizer=optimizer, **length)
    built.litlab_length_args = tuple(length)  # filled from the run's length: refit on resume
    return optimizer, {"scheduler": built, "interval": interval}


def fit_schedules_to_run(trainer: Any) -> None:
    """Make restored LR schedules span this run's length, not the checkpoint's run's.

    A schedule's length (OneCycleLR total_steps, CosineAnnealingLR T_max, ...) comes from
    trainer.max_epochs when the run starts; resuming restores the checkpoint's length with the
    rest of the schedule's state. A run resumed with another trainer.max_epochs (to train
    further, or to stop sooner) then gets a schedule that ends at the new end, continuing from
    the steps already taken (OneCycleLR would otherwise fail when stepped past its old end).
    Lengths set explicitly in the config, and runs that did not start from a checkpoint (the
    batch-size finder's trials step one schedule through several short fits), are left alone.
    """
    if not trainer.ckpt_path:
        return
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        for arg in getattr(scheduler, "litlab_length_args", ()):
            old, new = getattr(scheduler, arg), schedule_length(trainer, config.interval)
            if old == new:
                continue
            if isinstance(scheduler, OneCycleLR):  # its phase ends are fractions of the length
                for phase in scheduler._schedule_phases:
                    phase["end_step"] = (phase["end_step"] + 1) * new / old - 1
            setattr(scheduler, arg, new)
            log.warning(
                "%s now spans %d %ss instead of %d (trainer.max_epochs differs from the "
                "checkpoint's run); it continues from %s %d",
                type(scheduler).__name__,
                new,
                config.interval,
                old,
                config.interval,
                scheduler.last_epoch,
            )
