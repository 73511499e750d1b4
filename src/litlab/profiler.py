"""The Trainer's profiler when none is asked for (``trainer.profiler``'s default).

Lightning wraps every hook it calls, on the module, the strategy and each callback, in
``trainer.profiler.profile(name)``: about 95 calls a training step with litlab's default
callbacks. Without a profiler it uses ``PassThroughProfiler``, whose ``profile`` is still a
generator-based context manager (a generator made, entered and closed per call): 0.5-0.8 ms a
step on a 2-core CPU, more than a tenth of a small net's step (docs/benchmarks.md, P1
attribution). This one hands out one shared null context instead; it records nothing, as the
pass-through does. ``trainer.profiler=simple|advanced|pytorch`` profiles as in Lightning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from lightning.pytorch.profilers import PassThroughProfiler, PyTorchProfiler
from torch.profiler import ProfilerAction

log = logging.getLogger("litlab")
_NOTHING = nullcontext()


class NoProfiler(PassThroughProfiler):
    """Lightning's pass-through profiler without its per-call cost."""

    def profile(self, action_name: str) -> AbstractContextManager:  # type: ignore[override]
        return _NOTHING


class TrainingStepProfiler(PyTorchProfiler):
    """Lightning's PyTorchProfiler whose schedule counts training steps only (``debug=profile``).

    Lightning's steps the schedule on validation and test steps as well, each stage with its
    own count: over several epochs the validation steps reached the schedule's window too (a
    second trace named after training_step held a validation epoch and the checkpoint saves;
    the table mixed both, and torch's profiler crashed stopping it in about half the runs).
    """

    STEP_FUNCTIONS: ClassVar[set[str]] = {"training_step"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps_needed = steps_to_record(kwargs.get("schedule"))
        self.steps_trained = 0

    def stop(self, action_name: str) -> None:
        if action_name.endswith("training_step"):
            self.steps_trained += 1
        super().stop(action_name)

    def summary(self) -> str:
        # A run shorter than the schedule's window records fewer steps than it says, or none.
        needed, trained = self.steps_needed, self.steps_trained
        if needed is not None and 0 < trained < needed:
            log.warning(
                "trainer.profiler: its schedule records after %d training batches, the run "
                "trained %d: the trace holds fewer steps than its active count; raise "
                "trainer.limit_train_batches or shorten the schedule",
                needed,
                trained,
            )
            self.steps_needed = None  # once, not again when a later stage describes it
        return super().summary()


def steps_to_record(schedule: Callable[[int], ProfilerAction] | None) -> int | None:
    """How many training steps a profiler schedule needs to record its window, as Lightning steps
    it (it asks for the action of step 1 after the first training step): the first step that
    saves. None without a schedule, or one that never saves in the first 10000 steps."""
    if schedule is None:
        return None
    return next(
        (n for n in range(1, 10_000) if schedule(n) == ProfilerAction.RECORD_AND_SAVE), None
    )
