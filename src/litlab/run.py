"""Run plumbing shared by every task: the run folder, its summary.json, and clean user errors."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import math
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

import litlab
from litlab.config import absolute_data_paths, build, in_sweep
from litlab.distributed.launchers import as_launched, is_rank_scratch, launched_as
from litlab.errors import (
    AlreadyCompleted,
    ConfigError,
    LitlabError,
    Requeued,
    Terminated,
    fail,
    first_line,
)
from litlab.files import (
    atomic_file,
    in_progress,
    pid_namespace,
    resumable_checkpoints,
    run_process,
    started_s,
)
from litlab.folders import restore_saved_config
from litlab.overrides import RUN_LABELS

log = logging.getLogger("litlab")

# In a run folder whose fit trained to its end (written then, removed when a later fit writes a
# checkpoint there): the fit's record, what the run's summary has from it (final metrics,
# checkpoints, best score), JSON. A requeued cluster job that finds it and not COMPLETED
# (stopped while testing) tests again from it, training nothing (litlab.resume.continue_in_place).
TRAINED = ".trained"
# ... and whose whole run then completed (its test too): a requeued job does nothing. Removed
# when a later fit there begins to train, or a later part of the run ends otherwise: the
# folder's summary then no longer says the run completed.
COMPLETED = ".completed"
# What a fit puts into the summary beside its metrics (litlab.train.record_checkpoints, and
# the epochs its last values are of: Run.epoch_ended).
FIT_RECORD = ("best_checkpoint", "last_checkpoint", "best_score", "epochs", "training_limit")
FIT_RECORD += ("early_stopped",)
FIT_RECORD += ("global_step",)
FIT_RECORD += ("loss_far_above_chance",)
# What the first part of a run decided for all of it, kept in the summary of every later part
# (resume=, a requeued job): the values the finders chose (train.py; a resume never tunes).
WHOLE_RUN = ("tuned", "optuna_trial")
# What a fit in spawned processes (ddp_spawn) recorded there, carried to the main process's Run
# (Run.take_spawned_record)
SPAWNED_FIT = ("epochs", "global_step", "training_limit", "steps_per_epoch")


class _NoAdverts(logging.Filter):
    """Drop Lightning's "Tip: try installing <cloud product>" lines from every run's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdverts())
# lightning 2.6 calls a torch.utils._pytree API that torch 2.14 deprecates; nothing for users to do.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
# Lightning counts trainer.log_every_n_steps across epochs (since 2.0), so epochs shorter than
# the interval still get their per-step curves; its warning says otherwise.
warnings.filterwarnings("ignore", message=r"The number of training batches \(\d+\) is smaller")
# litlab's checkpoints have fixed names (best, last, step), overwritten: a resumed run writes
# into its folder's checkpoints/ as it should.
warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
# Mixed precision keeps float32 parameters: the summary's 32-bit size estimate is right.
warnings.filterwarnings(
    "ignore", message=r"Precision (bf16|16)-mixed is not supported by the model"
)
# litlab steps ReduceLROnPlateau itself and stops a run whose watched metric is never logged;
# Lightning's no-op pass (strict=False) says it skipped an epoch still without a validation.
warnings.filterwarnings("ignore", message=r"ReduceLROnPlateau conditioned on metric .* `False`")


def freeze_the_imports() -> None:
    """Move every object that exists now (what the command's imports made: torch's operator
    registry, sympy, scipy...) out of the garbage collector's sight (``gc.freeze``): they live
    until the process ends anyway. The interpreter's last collection at exit walked them all:
    1.5 s of every command's and DDP rank's end on 2 CPU cores (a run's summary.json written ->
    its process gone: 1.9-2.1 s; py-spy: gc_collect_main), and so did every full collection
    during the run. Objects made later (the run's own, and modules imported later) are
    collected and finalized as before, at exit too. For the command-line entry points, first
    thing: a library user's interpreter keeps Python's default."""
    gc.freeze()


def into_log_files(exc: Exception) -> None:
    """The error that ended a run, into its log file (train.log) alone, which ended without
    it: the console shows it as fail()'s `litlab: error:` line or as Python's traceback."""
    if isinstance(exc, LitlabError):
        message, exc_info = f"litlab: error: {exc}", None
    else:
        message, exc_info = (
            f"the run failed: {first_line(exc)}",
            (type(exc), exc, exc.__traceback__),
        )
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, exc_info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _log_file_sizes() -> dict[str, int]:
    """The length of each log file (Hydra's train.log) the root logger writes to, now."""
    sizes = {}
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.flush()
            with contextlib.suppress(OSError):
                sizes[handler.baseFilename] = os.path.getsize(handler.baseFilename)
    return sizes


def _cut_log_files(sizes: dict[str, int]) -> None:
    """Each log file back to its length in ``sizes``: the lines a run refused before it
    touched the folder's earlier run logged (its start-up lines) go, as its summary does."""
    for handler in logging.getLogger().handlers:
        size = sizes.get(getattr(handler, "baseFilename", ""))
        if isinstance(handler, logging.FileHandler) and size is not None:
            handler.flush()  # (appended: the handler's later lines follow the cut)
            with contextlib.suppress(OSError):
                if os.path.getsize(handler.baseFilename) > size:
                    os.truncate(handler.baseFilename, size)


def _offline_wandb_parts(run_dir: Path) -> set[Path]:
    """The W&B offline run folders (one a part of the run) in ``run_dir``'s wandb folder."""
    from litlab.loggers import wandb_folder

    return set(wandb_folder(run_dir).glob("offline-run-*"))


def _drop_offline_wandb_parts(run_dir: Path, before: set[Path]) -> None:
    """The offline W&B parts made by a resume refused (or failed) after its loggers started,
    before it touched the run (a schedule that cannot change its length, found as the fit
    restores it), go, as its log lines do: each held that refusal alone, and `wandb sync` of
    the run's parts would have closed the W&B run as failed over the run's completed one.
    wandb's links into a part gone (latest-run, its debug logs) point into the newest part
    left. A part logged online is the server's."""
    from litlab.loggers import wandb_folder

    new = sorted(_offline_wandb_parts(run_dir) - before)
    for part in new:
        shutil.rmtree(part, ignore_errors=True)
    if not new:
        return
    folder = wandb_folder(run_dir)
    left = sorted(_offline_wandb_parts(run_dir), key=lambda part: part.name)
    for link in folder.iterdir():
        if not link.is_symlink() or link.exists():
            continue
        # latest-run -> the part; debug.log -> the part's logs/debug.log: the newest part left's
        target = Path(os.readlink(link))
        inside = target.relative_to(folder) if target.is_absolute() else target
        link.unlink(missing_ok=True)
        if not left or not inside.parts or inside.is_absolute():
            continue
        again = left[-1].joinpath(*inside.parts[1:])  # the same file of the part left
        if again.exists():
            with contextlib.suppress(OSError):
                link.symlink_to(again if target.is_absolute() else again.relative_to(folder))
    log.warning(
        "W&B: the offline part this resume started (%s) is removed with it; the run's W&B "
        "parts are as they were",
        ", ".join(part.name for part in new),
    )


def build_list(node: DictConfig | None, path: str) -> list[Any]:
    """Instantiate every entry of a group like callbacks/ or logger/; null entries are off."""
    if not node:
        return []
    built = []
    for name, entry in node.items():
        if entry is None:
            continue
        if not isinstance(entry, DictConfig) or "_target_" not in entry:
            raise ConfigError(f"{path}.{name} needs a _target_ (or null to turn it off)")
        built.append(build(entry, f"{path}.{name}"))
    return built


def git_state(cwd: str | os.PathLike) -> tuple[str | None, bool | None]:
    """The checkout's commit, and whether its tracked files differ from it (the run's code is
    then not the commit's alone), from one ``git status``; (None, None) outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain=v2", "--branch", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None, None
    oid = next((line.split()[2] for line in out if line.startswith("# branch.oid ")), None)
    commit = oid if oid and oid != "(initial)" else None
    return commit, any(not line.startswith("#") for line in out)


def versions() -> dict[str, str]:
    import hydra
    import torchmetrics
    import torchvision

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "lightning": lightning.__version__,
        "torchmetrics": torchmetrics.__version__,
        "hydra": hydra.__version__,
        "litlab": litlab.__version__,
    }


def config_digest(cfg: DictConfig) -> str:
    """A short hash of what the run computes: the resolved config without paths, run labels,
    loggers and the checkpoint it starts from (a resumed part, whose W&B id and ckpt_path are
    added, computes the same run). One command run in two folders has one digest: a value that
    is one of paths.* or lies under one (the checkpoints' dirpath, trainer.default_root_dir,
    data.data_dir) is hashed as that path's name. Found by value, not by interpolation: a
    checkpoint's config is stored resolved (evaluate.py's trained_config_digest digests one)."""
    plain = OmegaConf.to_container(
        OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), resolve=True
    )
    absolute_data_paths(plain)
    paths = plain.pop("paths", None) or {}
    for key in (*RUN_LABELS, "ckpt_path"):
        plain.pop(key, None)
    folders = [(str(path).rstrip("/"), key) for key, path in paths.items() if path]
    folders = sorted((f for f in folders if f[0]), key=lambda folder: -len(folder[0]))
    named = _paths_named(plain, folders)
    return hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _paths_named(node: Any, folders: list[tuple[str, str]]) -> Any:
    """``node`` with every string that is one of ``folders`` (path, name; longest first) or
    lies under one, written from its name: <run>/checkpoints -> <paths.output_dir>/checkpoints."""
    if isinstance(node, dict):
        return {key: _paths_named(value, folders) for key, value in node.items()}
    if isinstance(node, list):
        return [_paths_named(value, folders) for value in node]
    if isinstance(node, str):
        for folder, name in folders:
            if node == folder or node.startswith(f"{folder}/"):
                return f"<paths.{name}>{node[len(folder) :]}"
    return node


def ended_as(
    exc: BaseException | None, folder: Path, task: str = "train"
) -> tuple[str, str | None]:
    """(status, error) of a run in ``folder`` that ended with ``exc`` (None: it completed), as
    summary.json and the loggers' run summaries say it."""
    if exc is None:
        return "completed", None
    if isinstance(exc, Requeued):
        return (
            "requeued",
            "preempted; the scheduler requeued the job, which continues in this folder",
        )
    # SIGTERMException is a SystemExit; Lightning ends Ctrl-C with one (a KeyboardInterrupt
    # outside its fit reaches here as it is)
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        trained = read_summary(folder / TRAINED)
        if trained is not None:  # the fit had trained to its end (stopped while testing)
            tested = trained.get("best_checkpoint") or trained.get("last_checkpoint")
            if not tested:
                return "interrupted", (
                    "stopped by a signal after its fit trained to its end; it kept no "
                    "checkpoint to test (checkpoints were off)"
                )
            return "interrupted", (
                f"stopped by a signal after its fit trained to its end; test it with: "
                f"{as_launched(f'python train.py resume={folder}')} (its {Path(tested).name}, "
                "training nothing), or train it further with: "
                f"{as_launched(f'python train.py resume={folder} trainer.max_epochs=<more>')}"
            )
        if task == "eval":
            return "interrupted", "stopped by a signal; run eval.py again"
        if resumable_checkpoints(folder):  # what resume= continues from
            # Lightning's SIGTERMException in a fit (spawned ranks' too: compat.HandlingLauncher):
            # a checkpoint at the stop; not litlab.run's, outside the trainer
            exact = isinstance(exc, SIGTERMException) and not isinstance(exc, Terminated)
            since = "" if exact else " from its last checkpoint"
            return (
                "interrupted",
                f"stopped by a signal; continue{since} with: "
                f"{as_launched(f'python train.py resume={folder}')}",
            )
        return "interrupted", (
            "stopped by a signal before its first checkpoint (each epoch's end; SIGTERM and "
            "SIGUSR1 save one, Ctrl-C does not): nothing to resume, start it again"
        )
    if lost_a_peer(exc) and task == "train" and resumable_checkpoints(folder):
        return "failed", (
            f"another process of the run ended (killed, out of memory, its node lost? its own "
            f"log or the launcher's output says why), and this one lost it "
            f"({type(exc).__name__}: {first_line(exc)}); continue from the newest "
            f"checkpoint with: {as_launched(f'python train.py resume={folder}')}"
        )
    return "failed", f"{type(exc).__name__}: {exc}"


def lost_a_peer(exc: BaseException) -> bool:
    """Whether a collective failed because another rank's process is gone: gloo's "Connection
    reset by peer" / "closed by peer", NCCL's "closed by remote peer" (walkthrough 153: a rank
    killed, and rank 0's summary held gloo's message alone); not a setup error (a port in use)."""
    cues = ("Connection reset by peer", "Connection closed by peer", "closed by remote peer")
    return isinstance(exc, RuntimeError) and any(cue in str(exc) for cue in cues)


def to_number(value: Any) -> float | None:
    number = float(value.item() if isinstance(value, torch.Tensor) else value)
    return None if math.isnan(number) else number


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically: readers see the old file or the new one, never half of one."""
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=2, default=str) + "\n")


def read_summary(path: Path) -> dict[str, Any] | None:
    """A folder's summary.json; None where there is none (or it cannot be read as one)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def killed_part_s(folder: Path, summary: dict[str, Any]) -> float | None:
    """How long the part of a run that was killed before it could write its total ran: from
    its start to the last file it wrote in the run folder (checkpoints, CSV and W&B logs; not
    .hydra/, summary.json or log files, which the continuing run writes first)."""
    start = started_s(summary)
    if start is None:
        return None
    last = start
    for path in folder.rglob("*"):
        parts = path.relative_to(folder).parts
        if parts[0] == ".hydra" or path.name == "summary.json" or path.suffix == ".log":
            continue
        with contextlib.suppress(OSError):  # a file removed meanwhile, a broken link
            if path.is_file():
                last = max(last, path.stat().st_mtime)
    return last - start


# _stop_on_sigterm's state: the process that set it ("owner": forked children inherit it), a
# stop held while the run records what it finished (Run.defer_stop: "held", "pending"), ranks
# started from this process that a SIGTERM is passed on to (passing_sigterm_on: "ranks"), and
# whether a stop came as SLURM's warning signal, which requeues the job ("requeue").
_SIGTERM: dict[str, Any] = {
    "owner": None,
    "held": False,
    "pending": False,
    "ranks": False,
    "requeue": False,
}


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM outside Lightning's trainer: end the run as Lightning's fit ends on it (see
    Run). In a forked child (an image folder's decoding workers): SIGTERM's default. Called by
    Lightning's own handler (which calls the one it found: inside trainer.fit/test), nothing:
    Lightning's handling applies there (a flag the training and test loops stop on).
    The run's multiprocessing children (ddp_spawn's ranks, decoding workers) are sent SIGTERM
    too: they would otherwise go on, and the run wait for them."""
    if os.getpid() != _SIGTERM["owner"]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if signal.getsignal(signal.SIGTERM) is not _stop_on_sigterm:
        return
    if _SIGTERM["ranks"]:  # they stop after a batch with the stop's checkpoint, and end the fit
        _pass_on_sigterm()
        _SIGTERM["pending"] = True
        return
    if _SIGTERM["held"]:
        _SIGTERM["pending"] = True
        return
    _stop_now()


def _pass_on_sigterm() -> None:
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGTERM)


@contextlib.contextmanager
def passing_sigterm_on() -> Iterator[None]:
    """Around a fit or test whose ranks run in processes started from this one (ddp_spawn,
    ddp_fork: litlab.compat.HandlingLauncher): a SIGTERM here (a job's reaches every process)
    is passed on to the ranks and held, not raised. The ranks stop after a batch and write the
    stop's checkpoint, and the fit ends with their stop; a fit they finished anyway (the signal
    came at its last batch) is recorded as trained before the held stop ends the run
    (stop_if_asked). Raised here at once, the run was recorded before the ranks had written
    anything ("before its first checkpoint: nothing to resume"), or as a stop a resume= could
    not continue (a fit that had trained to its end)."""
    before = _SIGTERM["ranks"]
    _SIGTERM["ranks"] = True
    try:
        yield
    finally:
        _SIGTERM["ranks"] = before


def sigterm_pending() -> bool:
    """Whether a SIGTERM came that the run has not acted on yet (held, or passed on to ranks)."""
    return bool(_SIGTERM["pending"])


def _stop_now() -> None:
    _pass_on_sigterm()
    raise Terminated


def hold_sigterm(signum: int, frame: Any) -> None:
    _SIGTERM["pending"] = True


def _stop_on_sigusr1(signum: int, frame: Any) -> None:
    """SIGUSR1 (SLURM's warning before a time limit, ``--signal=USR1@<seconds>``) outside the
    training loop, where the Preemption callback does not take it (the fit's setup, between the
    fit and its test, the test): the run stops as SIGTERM stops it there (at once, or held
    where the run holds SIGTERM), and a stop that ends the run requeues its SLURM job
    (``stop_requeues``: Preemption.hand_over). SIGUSR1's default had ended the process at once
    (its summary left "running", nothing requeued); inside trainer.test, Lightning's SLURM
    handler (which finds this one set, and is then not set) wrote hpc_ckpt_<n>.ckpt from inside
    the handler (a collective under DDP) and requeued the job while its test went on."""
    if os.getpid() != _SIGTERM["owner"]:  # a forked child: the default
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGUSR1)
        return
    ask_a_requeue()
    handler = signal.getsignal(signal.SIGTERM)  # Lightning's in the trainer, or the run's
    if callable(handler):
        handler(signal.SIGTERM, frame)


def hold_a_stop(requeue: bool = False) -> None:
    """A stop for the run to act on where it next can (``Run.stop_if_asked``), as a SIGTERM
    held; ``requeue``: it came as SLURM's warning signal (SIGUSR1), the job is requeued."""
    _SIGTERM["pending"] = True
    if requeue:
        ask_a_requeue()


def ask_a_requeue() -> None:
    """The run's stop came as SLURM's warning signal (SIGUSR1): in training, outside it, or as
    the fit ended; its SLURM job is requeued once the run has ended on it (stop_requeues)."""
    _SIGTERM["requeue"] = True


def stop_requeues() -> bool:
    """Whether a stop of this run came as SLURM's warning signal (ask_a_requeue): a requeue of
    the job, once the run has ended on it (Preemption.hand_over)."""
    return bool(_SIGTERM["requeue"])


class HoldStopAfterTest(lightning.pytorch.Callback):
    """Holds a SIGTERM from the test's end to the run's (Run.defer_stop): the test's metrics
    and the loggers' close are recorded, and the run completes.

    Under DDP (several processes) a SIGTERM during the test is held from its start: the test
    ends on every rank, and the run with it. Lightning's own handler stops the signalled rank
    alone, after its batch, and broadcasts from inside the handler: the ranks' test batches
    differ (each image is tested once), so the other ranks waited in the metrics' sync, or in
    a collective the signalled rank never joined, forever (a ddp_spawn or ddp_fork rank sent
    SIGTERM in the test: hung). A single process stops at once, as Lightning stops it.
    Lightning's teardown puts its handler's predecessor back."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        main = threading.current_thread() is threading.main_thread()
        if trainer.world_size > 1 and main:
            signal.signal(signal.SIGTERM, hold_sigterm)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.defer_stop()


class Run:
    """One task run in one folder. Use as a context manager around the task's work.

    On exit it writes summary.json (status, metrics, durations, versions, config digest) from
    global rank 0. A LitlabError becomes one line on stderr and exit status 2; any other
    exception is a bug: the summary says failed and the traceback is kept. With
    ``keep_going`` (a job of a sweep) any failure is recorded, reported in one line and
    swallowed, so that the sweep goes on; ``objective`` is then None. Exits (SystemExit, e.g.
    a scheduler's requeue, and KeyboardInterrupt) are recorded and never swallowed.

    In a folder that already has a summary.json (a run continued by ``resume=`` or a requeued
    job), the earlier summary is kept under "previous_summary"; a run refused (a LitlabError)
    or failed (an Exception) before it began to train or test (past the run's end, a config its
    checkpoints do not match, a setting the fit's setup rejects) leaves the folder's
    summary.json, and the Hydra files that its start wrote over (litlab.folders), as they were;
    other failures are recorded as usual.

    SIGTERM (``kill``, ``scancel``, ``docker stop``, a pod's eviction) outside Lightning's
    trainer (the data's setup: a folder's first decode; an FID extractor's training) ends the
    run as Lightning ends a fit on it: SIGTERMException, the summary "interrupted", exit status
    143 (it killed the process, the summary left "running"). Only where SIGTERM had no handler
    (a submitit job's own is left be); inside trainer.fit/test Lightning's handling applies
    (the Preemption callback's in training: a checkpoint to resume from).
    """

    def __init__(self, cfg: DictConfig, task: str, keep_going: bool = False) -> None:
        self.dir = Path(cfg.paths.output_dir)
        self.summary: dict[str, Any] = {
            "task": task,
            "status": "running",
            "error": None,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "metrics": {},
            "durations_s": {},
        }
        self._cfg = cfg
        self._keep_going = keep_going
        self._t0 = time.perf_counter()
        self._previous: dict[str, Any] | None = None
        self._began = False  # training or a test began: the folder may have changed
        self._entered_ns = time.time_ns()
        self._completed = False  # the folder held a completed run as this one began (rank 0)
        self._sigterm: Any = None  # the SIGTERM handler this run replaced (SIG_DFL), if it did
        self._sigusr1: Any = None  # and SIGUSR1's
        # the earlier part's last validation (resume=, a requeued job): (its epoch, its val/*),
        # kept as the run's once this part's fit begins from a checkpoint not before it
        self._earlier_validation: tuple[int, dict[str, Any]] | None = None
        self._validated_before: tuple[int, dict[str, Any]] | None = None
        self._trained_before = False  # an earlier part trained the fit (this one tests it)
        self._log_sizes: dict[str, int] = {}  # the log files' lengths as the run began (rank 0)
        self._wandb_parts: set[Path] = set()  # its W&B offline parts as the run began (rank 0)
        self._spawned: dict[str, Any] = {}  # what a fit's and test's spawned rank 0 measured

    def __enter__(self) -> Run:
        self.dir.mkdir(parents=True, exist_ok=True)
        from litlab.callbacks.monitor import reset_cuda_peaks, reset_rss_peak

        reset_rss_peak()  # mem/rss_gb: this run's peak (data, finders, fit, test)
        reset_cuda_peaks()  # and summary.json's CUDA peaks (PeakMemory)
        if rank_zero_only.rank == 0:  # a run killed hard still says it was started, where, by whom
            # A run that continues this folder (resume=, a requeued job) keeps what the folder's
            # summary said before, and puts it back if it stops before any phase began.
            self._previous = read_summary(self.dir / "summary.json")
            state, pid = run_process(self._previous)
            if state == "alive":  # the same command again while it runs: a grid sweep's, a
                # job of a sweep whose own process was killed (review 187: the live run's
                # newest rows dropped, a job trained by two processes, then failed in both)
                restore_saved_config(self.dir)
                fail(in_progress(self.dir, pid, "this command"))
            self._completed = (self.dir / COMPLETED).is_file()
            self._log_sizes = _log_file_sizes()
            if self._previous is not None:  # (only a run continued here is put back)
                self._wandb_parts = _offline_wandb_parts(self.dir)
                earlier = {k: v for k, v in self._previous.items() if k != "previous_summary"}
                self.summary["previous_summary"] = earlier
                if earlier.get("task") == self.summary["task"]:
                    self.summary.update({k: earlier[k] for k in WHOLE_RUN if k in earlier})
                    validated = (earlier.get("epochs") or {}).get("validated")
                    metrics = earlier.get("metrics") or {}
                    if isinstance(validated, int) and isinstance(metrics, dict):
                        values = {k: v for k, v in metrics.items() if k.startswith("val/")}
                        self._earlier_validation = (validated, values)
                # the wall time of every earlier part of the run (each summary keeps one back)
                before = earlier.get("durations_s") or {}
                total = before.get("total")
                if total is None:  # killed (SIGKILL, out of memory, node lost): no total
                    total = killed_part_s(self.dir, earlier)
                    self.summary["durations_s"]["earlier_estimated"] = True
                spent = (total or 0) + (before.get("earlier") or 0)
                self.summary["durations_s"]["earlier"] = round(spent, 3)
            self.summary.update(
                pid=os.getpid(), host=platform.node(), pid_namespace=pid_namespace()
            )
            # how to start it again (a report's resume line for a run killed hard); a layout
            # the launchers' checks refuse is theirs to say, later
            try:
                self.summary["launched_as"] = launched_as()
            except Exception as e:
                log.warning("how this run was launched is not recorded (%s)", first_line(e))
            from litlab.sweep import asked_trial

            if trial := asked_trial():  # a job of an Optuna sweep: its trial, for resume=
                with contextlib.suppress(Exception):  # (an unresolvable config: failed below)
                    trial["config_digest"] = config_digest(self._cfg)
                self.summary["optuna_trial"] = trial
            write_json(self.dir / "summary.json", self.summary)
        # last: a SIGTERMException raised inside __enter__ would leave the `with` unrecorded
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            _SIGTERM.update(owner=os.getpid(), held=False, pending=False, requeue=False)
            self._sigterm = signal.signal(signal.SIGTERM, _stop_on_sigterm)
            # the train task's (its Preemption hands the stop over to a requeue); eval.py keeps
            # Lightning's SLURM handler in its test, which requeues it (review 188)
            train = self.summary["task"] == "train"
            if train and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
                self._sigusr1 = signal.signal(signal.SIGUSR1, _stop_on_sigusr1)
        return self

    def take_spawned_record(self, record: dict[str, Any]) -> None:
        """A fit's or test's record from its spawned rank 0 (ddp_spawn: this process saw no
        batch; litlab.resume.FitMilestones.spawned_record): its epochs into the summary, and
        its rates, memory peaks and data account kept for ``spawned_performance``, a test's
        added to the fit's."""
        for key in SPAWNED_FIT:
            if key in record:
                self.summary[key] = record[key]
        kept = self._spawned
        if isinstance(record.get("perf"), dict):
            perf = kept.setdefault("perf", {})
            perf.update({k: v for k, v in record["perf"].items() if v is not None or k not in perf})
        if isinstance(record.get("memory"), dict):
            before = kept.get("memory", {})
            kept["memory"] = {
                **before,
                **{k: max(before.get(k, v), v) for k, v in record["memory"].items()},
            }
        if isinstance(record.get("data"), dict):
            before = kept.get("data", {})
            splits = {**before.get("splits", {}), **record["data"].get("splits", {})}
            kept["data"] = {**before, **record["data"], **({"splits": splits} if splits else {})}

    def spawned_performance(self) -> dict[str, Any]:
        """The "perf", "memory" and "data" that spawned processes measured (take_spawned_record);
        empty where the fit and test ran in this process."""
        return dict(self._spawned)

    def defer_stop(self) -> None:
        """From here a SIGTERM outside the trainer is held (see ``stop_if_asked``): the fit or
        test has finished, and what records it (the .trained mark, the test's metrics, the
        loggers' close) must not be cut off part way."""
        _SIGTERM["held"] = True

    def stop_if_asked(self) -> None:
        """End holding SIGTERM; one that came meanwhile stops the run now (Terminated)."""
        pending = _SIGTERM["pending"]
        _SIGTERM.update(held=False, pending=False)
        if pending:
            _stop_now()

    def phase(self, name: str) -> _Phase:
        """Time a phase; a fit begins when it trains (``training_began``), after its setup."""
        if name != "fit":
            self._began = True
        return _Phase(self, name)

    def training_began(self) -> None:
        """The fit's setup passed (its checkpoint restored): a failure now is recorded, and a
        run that had completed in the folder is trained further (COMPLETED goes; TRAINED, the
        record of its checkpoints, stays until one is written: checkpoints_change)."""
        self._began = True
        if rank_zero_only.rank == 0:
            (self.dir / COMPLETED).unlink(missing_ok=True)

    def _trained_here(self) -> bool:
        """Whether a fit trained in the run folder since this run began: wrote a checkpoint
        there, or began to train over the completed run there (its COMPLETED mark gone). A fit
        in spawned processes (trainer.strategy=ddp_spawn) tells this process's Run nothing, and
        a resume that trained there, then failed, put the folder's previous summary back."""
        if self._completed and not (self.dir / COMPLETED).is_file():
            return True
        folder = self.dir / "checkpoints"
        return folder.is_dir() and any(
            p.stat().st_mtime_ns >= self._entered_ns for p in folder.glob("*.ckpt")
        )

    def checkpoints_change(self) -> None:
        """The fit writes its first checkpoint: the folder's run is trained further, no longer
        the one its marks describe (a fit that failed before, or saved nothing, leaves TRAINED:
        its checkpoints are still the ones it describes)."""
        if rank_zero_only.rank == 0:
            for mark in (TRAINED, COMPLETED):
                (self.dir / mark).unlink(missing_ok=True)

    def mark_trained(self) -> None:
        """The fit trained to its end: its record (TRAINED), for a job requeued while testing."""
        if rank_zero_only.rank == 0:
            (self.dir / COMPLETED).unlink(missing_ok=True)  # completed once it is tested
            record = {key: self.summary.get(key) for key in FIT_RECORD}
            write_json(self.dir / TRAINED, {**record, "metrics": dict(self.summary["metrics"])})

    def take_fit_record(self, record: dict[str, Any]) -> None:
        """A fit's record (an earlier part of this run trained) into this part's summary."""
        self.summary["metrics"].update(record.get("metrics") or {})
        self.summary.update({key: record.get(key) for key in FIT_RECORD})
        self._trained_before = True

    def fit_began_at(self, epochs: int, resumed: bool) -> None:
        """The fit trains from ``epochs`` epochs done (a checkpoint's; 0 for a new fit). A
        resumed part keeps the earlier part's last validation (its epoch and val/* values) as
        the run's until it validates itself (a resume that trains on without validating: the
        report's val/* columns were empty), where that validation is not past the checkpoint
        it continues from (a resume from an older checkpoint: those values are of later
        weights)."""
        earlier = self._earlier_validation if resumed else None
        self._validated_before = earlier if earlier and earlier[0] <= epochs else None
        validated = self._validated_before[0] if self._validated_before else None
        if not resumed:  # a new fit: none validated yet (null read as unknown: walkthrough 176)
            validated = 0
        self.summary["epochs"] = {"trained": epochs, "validated": validated}

    def epoch_ended(self, kind: str, epoch: int) -> None:
        """An epoch (1-based) was trained (``kind`` "trained") or validated ("validated"):
        summary.json's "epochs" says which epoch the last train/* and val/* values are of (they
        differ under trainer.check_val_every_n_epoch, and in a run stopped part way)."""
        self.summary.setdefault("epochs", {})[kind] = epoch
        if kind == "validated":
            self._validated_before = None  # this part's own values from here

    def record_metrics(self, metrics: dict[str, Any]) -> None:
        """The run's final logged values; not the monitors' per-epoch perf/* and mem/* (the
        last epoch's rates), whose whole-run figures are summary.json's "perf" and "memory".
        A resumed part that has not validated yet keeps the earlier part's val/* values."""
        if self._validated_before and not any(k.startswith("val/") for k in metrics):
            self.summary["metrics"].update(self._validated_before[1])
        self.summary["metrics"].update(
            {k: to_number(v) for k, v in metrics.items() if not k.startswith(("perf/", "mem/"))}
        )

    def say_results(self) -> None:
        """One line into the run's log (train.log, eval.log) and the console: the objective and
        every test/* value, with the checkpoint tested. They were in summary.json and in
        Lightning's table on the console alone: the log file of a finished run (a cluster
        job's record) held none of its figures, an eval's none at all. Rank 0's."""
        metrics, objective = self.summary["metrics"], self.summary.get("objective") or {}
        metric, value = objective.get("metric"), objective.get("value")
        tested = {k: v for k, v in sorted(metrics.items()) if k.startswith("test/")}
        figures = [
            f"{k} {v:.4g}" + (" (the objective)" if k == metric else "")
            for k, v in tested.items()
            if isinstance(v, int | float)
        ]
        if value is not None and metric not in tested:  # a validation metric's best
            figures.insert(0, f"{metric} {value:.4g} (the objective)")
        if not figures or rank_zero_only.rank != 0:
            return
        checkpoint = self.summary.get("tested_checkpoint") or self.summary.get("checkpoint")
        step = self.summary.get("tested_checkpoint_step", self.summary.get("checkpoint_step"))
        where = f"; tested {checkpoint}" if tested and checkpoint else ""
        where += f" (step {step})" if where and step is not None else ""
        log.info("results: %s%s; all in %s", ", ".join(figures), where, self.dir / "summary.json")

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        # a second SIGTERM while the summary is written: the default; not where the run set
        # another since (Preemption's hand-over ignores it: SLURM's SIGTERM after a requeue)
        if self._sigterm is not None and signal.getsignal(signal.SIGTERM) is _stop_on_sigterm:
            signal.signal(signal.SIGTERM, self._sigterm)
        self._sigterm = None
        if self._sigusr1 is not None and signal.getsignal(signal.SIGUSR1) is _stop_on_sigusr1:
            signal.signal(signal.SIGUSR1, self._sigusr1)
        self._sigusr1 = None
        if _SIGTERM["pending"] and exc is None:  # a SIGTERM as the finished run was recorded
            log.warning("a signal to stop came as the run ended; it had completed")
        _SIGTERM.update(held=False, pending=False, requeue=False)
        if isinstance(exc, AlreadyCompleted):  # every rank: nothing ran, the folder as it was
            if rank_zero_only.rank == 0:
                restore_saved_config(self.dir)
            if self._previous is not None:
                self.summary = self._previous  # the run as it completed (its objective)
                if rank_zero_only.rank == 0:
                    write_json(self.dir / "summary.json", self._previous)
            log.warning("litlab: %s", exc)
            return True
        status, error = ended_as(exc, self.dir, self.summary["task"])
        self.summary["status"] = status
        last = self.dir / "checkpoints" / "last.ckpt"
        if exc is not None and not self.summary.get("last_checkpoint") and last.is_file():
            self.summary["last_checkpoint"] = str(last)  # a fit ended early: where it resumes
        if error is not None:
            self.summary["error"] = error
        self.summary["durations_s"]["total"] = round(time.perf_counter() - self._t0, 3)
        self.summary["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        kept = False  # the folder's earlier run left as it was (rank 0 decides: it writes)
        if rank_zero_only.rank == 0:
            # a refusal, a failure or a signal (Ctrl-C, SIGTERM) before anything was trained or
            # tested: the folder's earlier run is as it was
            untouched = exc is not None and not self._began and not self._trained_here()
            kept = untouched and self._previous is not None
            if untouched:  # Hydra's files of an earlier run in the folder, as they were
                restore_saved_config(self.dir)
            if kept:
                # refused or failed before it touched the run (a resume past the run's end, a
                # config the checkpoints do not match, a fit that failed in its setup): the
                # folder's summary stays what it was
                write_json(self.dir / "summary.json", self._previous)
                _drop_offline_wandb_parts(self.dir, self._wandb_parts)  # (its W&B parts too)
                # and its log ends where it ended (the line of a part dropped on the console
                # alone: train.log held it without the refusal that dropped it, walkthrough 186)
                _cut_log_files(self._log_sizes)
            else:
                self._write()
                if exc is not None:  # the folder's summary no longer says its run completed
                    (self.dir / COMPLETED).unlink(missing_ok=True)
            if exc is None and (self.dir / TRAINED).is_file():  # trained, then all the rest
                (self.dir / COMPLETED).touch()
            if not kept:  # a sweep's job its sweep's stop left untold, continued by resume=
                _tell_the_study(self.summary, self.dir)
                _refresh_its_sweep(self.dir)
        # how to go on, once (every rank of a DDP run has the same to say)
        said = rank_zero_only.rank == 0
        if exc is None and not said and is_rank_scratch(self.dir):  # torchrun's, srun's ranks
            _remove_rank_scratch(self.dir)  # > 0: their log, kept where they fail
        if isinstance(exc, SIGTERMException):
            if said:
                log.warning("litlab: %s", self.summary["error"])
            sys.exit(143)  # 128 + SIGTERM: the run did not finish
        if status == "interrupted":  # Ctrl-C: how to go on (it was in summary.json alone)
            if said:
                log.warning("litlab: %s", self.summary["error"])
            if _ctrl_c(exc):  # 128 + SIGINT, as a shell says it (Lightning's exit says 1: failed)
                raise SystemExit(130) from exc
        # A sweep goes on after a failed job, not after an exit (a scheduler's requeue, Ctrl-C).
        if isinstance(exc, Exception) and self._keep_going:
            log.error("litlab: job failed (the sweep goes on): %s", self.summary["error"])
            return True
        # the console has it from fail() or Python; the log file is rank 0's, as the summary,
        # and a run refused before it touched a folder's earlier run leaves that run's log be
        if isinstance(exc, Exception) and rank_zero_only.rank == 0 and not kept:
            into_log_files(exc)
        if isinstance(exc, LitlabError):
            fail(str(exc))
        return False

    @property
    def objective(self) -> float | None:
        """The sweep objective; None unless the run completed with a value, which Optuna's
        sweeper records as a failed trial (NaN would abort it) and the basic sweeper ignores."""
        value = (self.summary.get("objective") or {}).get("value")
        return float(value) if self.summary["status"] == "completed" and value is not None else None

    def config_digest(self) -> str:
        """The run's config digest: of its config as it began where a resume set train=false
        to test again what an earlier part trained (an Optuna trial's digest: walkthrough 163)."""
        cfg = self._cfg
        if self._trained_before and not cfg.get("train"):
            cfg = cfg.copy()
            cfg.train = True
        return config_digest(cfg)

    def _write(self) -> None:
        cfg = self._cfg
        try:
            digest = self.config_digest()
        except Exception:  # an unresolvable config is itself the error being reported
            digest = None
        commit, dirty = git_state(cfg.paths.get("root_dir", "."))
        self.summary.update(
            run_dir=str(self.dir),
            config_digest=digest,
            git_commit=commit,
            git_dirty=dirty,
            versions=versions(),
        )
        write_json(self.dir / "summary.json", self.summary)


def _remove_rank_scratch(folder: Path) -> None:
    """A completed run's scratch folder of a rank other than 0 (under torchrun or srun): its
    Hydra files and log; one holding anything else (a profiler's file of this rank: review
    159) is left as it is."""
    entries = list(folder.iterdir()) if folder.is_dir() else []
    if all(e.name == ".hydra" or (e.is_file() and e.suffix == ".log") for e in entries):
        shutil.rmtree(folder, ignore_errors=True)


def _ctrl_c(exc: BaseException | None) -> bool:
    """Whether Ctrl-C ended the run: a KeyboardInterrupt, or the SystemExit(1) Lightning ends a
    fit or test with while handling one."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, SystemExit) and isinstance(exc.__context__, KeyboardInterrupt)


def _refresh_its_sweep(run_dir: Path) -> None:
    """A job of a sweep run again outside it (resume=): its sweep's summary, from every job."""
    if not in_sweep() and rank_zero_only.rank == 0:
        from litlab.sweep import refresh_sweep_summary  # (litlab.sweep imports this module)

        refresh_sweep_summary(run_dir)


def _tell_the_study(summary: dict[str, Any], run_dir: Path) -> None:
    if summary.get("optuna_trial") and not in_sweep():  # (in a sweep its sweeper tells)
        from litlab.sweep import tell_the_study  # (litlab.sweep imports this module)

        if said := tell_the_study(summary, run_dir):
            log.info("%s", said)


class _Phase:
    """Times one phase (fit, test, ...) of a run into summary['durations_s']."""

    def __init__(self, run: Run, name: str) -> None:
        self.run, self.name = run, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.run.summary["durations_s"][self.name] = round(time.perf_counter() - self.t0, 3)


def print_config_tree(cfg: DictConfig, keys: tuple[str, ...]) -> None:
    """Print the resolved config as a rich tree, one branch per top-level group. Into a log
    (not a terminal: SLURM's, ``> run.log``) its lines are printed whole, not cut at rich's
    80 columns (paths and overrides are the long lines)."""
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    ordered = [k for k in keys if k in cfg] + [k for k in cfg if k not in keys]
    for key in ordered:
        node = cfg[key]
        text = OmegaConf.to_yaml(node, resolve=True) if isinstance(node, DictConfig) else str(node)
        tree.add(f"[bold]{key}[/bold]").add(Syntax(text, "yaml", theme="ansi_dark"))
    console = Console()
    if not console.is_terminal:
        console = Console(width=100_000)
    console.print(tree)
