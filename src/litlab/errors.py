"""Errors a user can fix: each carries one line that says what to do."""

import sys
from typing import NoReturn

from lightning.pytorch.utilities.exceptions import SIGTERMException


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """A library's exception (or its message) in one short line (the message's first line, or
    the exception's type)."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def fail(message: str) -> NoReturn:
    """End the process as litlab ends on a user's mistake: one line on stderr, exit status 2."""
    print(f"litlab: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class LitlabError(Exception):
    """A mistake in the input (config, data, checkpoint) that the user can correct."""


class ConfigError(LitlabError):
    """A config value is missing, of the wrong type or out of range."""


class DataError(LitlabError):
    """Data files are missing, unreadable or not what the config says."""


class CheckpointError(LitlabError):
    """A checkpoint is missing, corrupt or of another model family."""


class TrainingDiverged(LitlabError):
    """A loss became NaN or infinite; the last good checkpoint is kept."""


class OutOfMemory(LitlabError):
    """Training ran out of device memory; a smaller batch or a lower precision fits."""


class AlreadyCompleted(LitlabError):
    """A training run started again in a folder whose run completed (a requeued batch script
    runs its commands again): it leaves that run as it is, trains nothing, exits 0."""


class Requeued(SystemExit):
    """A cluster scheduler (SLURM, submitit) requeued the job after its preemption checkpoint.

    A SystemExit, so that the scheduler's exit status is kept and no sweep swallows it; the
    requeued job starts in the same run folder and continues from that checkpoint.
    """


class Terminated(SIGTERMException):
    """SIGTERM outside Lightning's trainer (litlab.run's handler): the run ends as Lightning
    ends a fit on SIGTERM. Under DDP this rank alone may have been signalled (``kill <pid>``):
    rank 0 passes it on to the ranks it started (litlab.distributed.multirun)."""
