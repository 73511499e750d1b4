"""Optimizers and LR schedules from `_partial_` configs; the module supplies params and length."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.optim import Optimizer

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
    return optimizer, {"scheduler": scheduler(optimizer=optimizer, **length), "interval": interval}
