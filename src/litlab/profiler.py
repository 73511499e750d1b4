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

from contextlib import AbstractContextManager, nullcontext
from typing import ClassVar

from lightning.pytorch.profilers import PassThroughProfiler, PyTorchProfiler

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
