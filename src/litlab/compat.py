"""Every touch of a framework's private parts, in one place.

Each function says why no public API serves and the version it was checked against (Lightning
2.6.6, torch 2.14.1, OmegaConf 2.3, wandb 0.31). tests/test_compat.py exercises every one of
them, so that an upgrade that changes one breaks a test here rather than a user's run.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import csv_logs
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.loops.fit_loop import _FitLoop as LightningFitLoop
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.loops.training_epoch_loop import (
    _TrainingEpochLoop as LightningTrainingEpochLoop,
)
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.trainer.call import _interrupt
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig
from torch.multiprocessing import ProcessExitedException

from litlab.errors import Terminated

log = logging.getLogger("litlab")

# -- Lightning ---------------------------------------------------------------------------------


def cuda_checks_without_nvml_where_it_finds_no_gpu() -> bool:
    """Undo Lightning's ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (set when lightning is imported, so
    that ``torch.cuda.is_available()`` asks NVML instead of initializing CUDA in a process that
    may fork) where NVML finds no GPU, or cannot be loaded: there torch falls back to the plain
    CUDA check anyway, after a failed ``dlopen`` of NVML on every call. torch's optimizers make
    that call in every ``step()`` (``_accelerator_graph_capture_health_check``): 61 us a step on
    this 2-core CPU, as much again with a GAN's two optimizers, and nothing to gain where no GPU
    can be poisoned. Where NVML counts GPUs, Lightning's setting stays. Private: torch's
    ``torch.cuda._device_count_nvml`` (-1: NVML unavailable). ROCm builds never count through
    NVML (always -1), and their plain check initializes HIP: left as Lightning set it there.
    Returns whether it was undone."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1" or torch.version.hip:
        return False
    if torch.cuda._device_count_nvml() > 0:
        return False
    del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    return True


cuda_checks_without_nvml_where_it_finds_no_gpu()  # once lightning is imported, as above


def stop_at_batch_end(trainer: L.Trainer) -> None:
    """Make Lightning stop training after the current batch as it does for SIGTERM: it raises
    SIGTERMException once the batch's bookkeeping is done, and callbacks see it in on_exception.

    ``trainer._signal_connector.received_sigterm`` is the flag Lightning's SIGTERM handler sets;
    ``trainer.should_stop`` instead ends the fit as finished, without the exception that marks a
    preemption. (Lightning's own handler is not used under DDP: it broadcasts from inside the
    signal handler, and only the signalled rank raises, so ranks deadlock.)
    """
    trainer._signal_connector.received_sigterm = True


def take_stop_mark(trainer: L.Trainer) -> bool:
    """Clear Lightning's SIGTERM mark (see stop_at_batch_end) and return whether it was set."""
    marked = bool(trainer._signal_connector.received_sigterm)
    trainer._signal_connector.received_sigterm = False
    return marked


def count_steps_as_saved_in_validation(checkpoint: dict[str, Any]) -> None:
    """Give a checkpoint written after a batch whose validation ran inside the epoch
    (``val_check_interval``) the loggers' step count from before that batch, as Lightning's
    own checkpoints written there (ModelCheckpoint at ``on_validation_end``) hold it.

    Lightning resumes such a checkpoint (its last batch completed, at a validation point) by
    skipping that validation and only then counting the batch in ``_batches_that_stepped``, the
    step its loggers write. A checkpoint saved after the batch was counted (a stop raised at
    the batch's end, as Lightning's SIGTERM handling raises it) resumed with every later row of
    the CSV and W&B curves one step late. Private: the loop's ``_batches_that_stepped`` and the
    checkpoint's ``loops`` layout."""
    checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


def stops_when_asked(trainer: L.Trainer) -> bool:
    """Whether ``trainer.should_stop`` ends the fit now: min_epochs and min_steps are met
    (Lightning's private ``fit_loop._can_stop_early``; no public one)."""
    return bool(trainer.fit_loop._can_stop_early)


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether Lightning hands this training step's logged values to the loggers (every
    ``trainer.log_every_n_steps`` batches, counted across epochs). A step metric logged only
    then costs Lightning's logging machinery once per interval instead of every step; the
    decision is Lightning's private ``_logger_connector.should_update_logs`` (no public one)."""
    return trainer._logger_connector.should_update_logs


def stepping_batches(trainer: L.Trainer) -> int:
    """``trainer.estimated_stepping_batches``, without its side effect on a resumed run.

    Asked before the checkpoint is restored (in configure_optimizers, for a schedule counted
    in steps), Lightning builds the train loader then, and later never gives it the loader state
    the checkpoint holds (``fit_loop.setup_data`` returns early once a loader exists, and only it
    loads those states): a run resumed mid-epoch would start that epoch again from its first
    batch. Dropping the loader built for the estimate (private ``fit_loop._combined_loader``)
    lets the fit build it again after the restore, as it does without a step schedule. The
    global random generators are left as they were: a torch DataLoader draws a seed from them
    at each ``iter()``, which here would come after a resumed run restored them (RNGState) and
    shift every later draw (data order, augmentation, dropout).
    """
    with _train_loader_for_counting(trainer):
        return int(trainer.estimated_stepping_batches)


def training_batches(trainer: L.Trainer) -> float:
    """``trainer.num_training_batches``, an epoch's batches, before the fit has built its loader
    (as ``stepping_batches``: built, counted and dropped); inf for a loader without a length.
    Lightning counts them for ``estimated_stepping_batches`` except when max_epochs is -1."""
    with _train_loader_for_counting(trainer) as loop:
        if math.isinf(trainer.num_training_batches) and loop._combined_loader is None:
            loop.setup_data()
    return trainer.num_training_batches


@contextmanager
def _train_loader_for_counting(trainer: L.Trainer) -> Iterator[Any]:
    """The fit loop (None: a benchmark's stand-in with the counts alone), for a block that may
    build the train loader to count its batches: a loader built there is dropped after it
    (private ``fit_loop._combined_loader``), and the global random generators are left as they
    were (see ``stepping_batches``)."""
    from lightning.pytorch.utilities.seed import isolate_rng

    loop = getattr(trainer, "fit_loop", None)
    built = loop is None or loop._combined_loader is not None
    with isolate_rng():
        yield loop
    if not built:
        loop._combined_loader = None


def shuffle_as_on_a_local_disk(dataset: Any) -> None:
    """A LitData ``StreamingDataset`` shuffled as on a local disk, wherever it lies.

    LitData (0.2.76) reads a dataset on a parallel filesystem (NFS, Lustre, GPFS, BeeGFS,
    PanFS, Vast: what clusters share datasets on) in place, and there shuffles with its
    WindowShuffle: whole chunks dealt to ranks and workers in an order that depends on neither
    the seed nor the epoch, items shuffled within a window. Each rank then trains on the same
    images every epoch, and the items that do not fill a rank's last batches are never seen (5
    to 10% of 1,273 digits in 18 chunks, on 1 to 3 ranks). No public option turns it off (only
    LITDATA_POSIX_FAST=0, which also gives up the in-place reads): its profile (private
    ``posix_fast``) keeps the in-place reads and takes a kind that shuffles fully (FullShuffle:
    chunks and items in a new order each epoch, every item once)."""
    import dataclasses

    profile = getattr(dataset, "posix_fast", None)
    if profile is not None and profile.window_shuffle:
        dataset.posix_fast = dataclasses.replace(profile, kind="posix")


def continue_item_shuffle_window(dataset: Any, saved: dict[str, Any]) -> None:
    """A LitData ``StreamingDataset`` continuing an epoch that a checkpoint stopped, with the
    in-chunk shuffle window that epoch had (its state's ``item_shuffle_window``: LitData's
    default, 256, before 2026-12-04; litlab's data.source.shuffle_window since). LitData refuses
    a state of another window (``ValueError``), and forced, it would repeat or skip items of that
    epoch. Its window is private (``_item_shuffle_window``); the run goes on with the
    checkpoint's window for its later epochs too, and says so where it was given another
    (data.source.shuffle_window on resume=: recorded, and silently not applied)."""
    from litdata.streaming.shuffle import resolve_item_shuffle_window

    if "item_shuffle_window" in saved:
        window = resolve_item_shuffle_window(saved["item_shuffle_window"])
        given = getattr(dataset, "_item_shuffle_window", window)
        if given != window:
            log.warning(
                "data.source.shuffle_window=%s is not this run's: it continues the epoch the "
                "checkpoint stopped in, and the epochs after it, with the window it started "
                "with (%s); start a new run for another",
                given,
                saved["item_shuffle_window"],
            )
        dataset._item_shuffle_window = window


def batches_done_this_epoch(trainer: L.Trainer) -> int:
    """How many of the current training epoch's batches a resumed run has already trained:
    0 at an epoch's start (a new run, or one resumed from an epoch's end). Lightning keeps it in
    its loops' private progress trackers: an epoch started but not completed is mid-epoch, and
    its batch tracker counts the batches processed."""
    loop = trainer.fit_loop
    epochs = loop.epoch_progress.current
    if epochs.started <= epochs.completed:
        return 0
    return int(loop.epoch_loop.batch_progress.current.processed)


def epoch_to_train(trainer: L.Trainer) -> int:
    """The epoch whose batches a training loader's pass begun now will give: the number Lightning
    gives samplers' ``set_epoch`` (its fit loop's processed epochs). Not ``current_epoch``:
    Lightning begins the pass at setup, and a run resumed from last.ckpt (written at epoch e's
    end) is then still in epoch e, whose end it runs again before the pass's batches train e+1."""
    return int(trainer.fit_loop.epoch_progress.current.processed)


def epochs_trained(checkpoint: dict[str, Any]) -> int:
    """How many training epochs a checkpoint's run went through to their end: Lightning's fit
    loop progress (``loops.fit_loop.epoch_progress``, not a documented part of the file); its
    ``epoch`` field is the epoch under way, the same in last.ckpt at the end of epoch e and in
    a checkpoint from the middle of it. An epoch that ended before its last batch is not
    counted (:func:`reopen_an_epoch_cut_short`)."""
    from lightning.pytorch.loops.progress import _BatchProgress, _Progress

    try:
        loops = checkpoint["loops"]["fit_loop"]
        epoch, batches = _Progress(), _BatchProgress()
        epoch.load_state_dict(loops["epoch_progress"])
        batches.load_state_dict(loops["epoch_loop.batch_progress"])
    except (KeyError, TypeError):
        return int(checkpoint.get("epoch", 0))
    return epoch.current.processed - _ended_before_its_last_batch(epoch, batches)


def epoch_ran_to_its_end(trainer: L.Trainer) -> bool:
    """Whether the training epoch now ending ran all its batches (not stopped part way): the
    condition under which Lightning steps epoch schedules (its private
    ``_num_ready_batches_reached``)."""
    return bool(trainer.fit_loop.epoch_loop._num_ready_batches_reached())


class _FitLoop(LightningFitLoop):
    """Lightning's fit loop, restarting only an unfinished epoch: see
    :func:`restart_finished_epochs_as_epoch_based`."""

    @_Loop.restarting.setter  # type: ignore[attr-defined,untyped-decorator]
    def restarting(self, restarting: bool) -> None:
        progress = self.epoch_progress.current
        unfinished = progress.ready != progress.processed or progress.started != progress.processed
        _Loop.restarting.fset(self, restarting and unfinished)

    def load_state_dict(self, state_dict: dict, prefix: str = "") -> None:
        super().load_state_dict(state_dict, prefix)
        if reopen_an_epoch_cut_short(self):
            self.restarting = True
            self.epoch_loop.reopened = True


class _TrainingEpochLoop(LightningTrainingEpochLoop):
    """Lightning's epoch loop, counting the loggers' steps right in a reopened epoch (see
    :func:`reopen_an_epoch_cut_short`). Resumed on a batch after which validation ran inside
    the epoch, Lightning skips that validation and counts the batch in
    ``_batches_that_stepped``, as for a checkpoint written during that validation; a reopened
    epoch's checkpoint was written after the batch was counted (at the epoch's end, or after
    the fit), so every later CSV/W&B row was one step late (steps 0-9, then 11-40)."""

    reopened = False  # the fit loop reopened this epoch from a checkpoint

    def _should_check_val_fx(self, data_fetcher: Any) -> bool:
        """Also validate where trainer.max_steps ends the fit inside an epoch (one that
        validates: check_val_every_n_epoch), as at an epoch's end. Lightning ends the fit there
        unvalidated: val/*, best.ckpt and the test (of best.ckpt) were of the epoch's end
        before, and missed the schedule's last steps (a one-cycle's annealing; found by
        review). A stop asked for in the step (should_stop: a GAN's max_g_steps) validates
        already (Lightning's own rule)."""
        if self.restarting and self._restored_at_cut:
            # resumed from a checkpoint written in that validation (best.ckpt; before the batch
            # was counted, as Lightning's in-epoch ones are): where it validated, so that
            # Lightning skips that validation and counts the batch (else every later CSV/W&B
            # row came one step early; review)
            return True
        if self._at_the_cut() and self._should_check_val_epoch():
            return True
        return super()._should_check_val_fx(data_fetcher)

    _restored_at_cut = False  # the checkpoint resumed from was written in a cut's validation

    def _at_the_cut(self) -> bool:
        """trainer.max_steps reached inside an epoch (not at its last batch)."""
        cut = self.max_steps >= 0 and self.global_step >= self.max_steps
        return cut and not self.batch_progress.is_last_batch

    def on_save_checkpoint(self) -> dict:
        state = super().on_save_checkpoint()
        state["validated_at_max_steps"] = bool(self.trainer.validating and self._at_the_cut())
        return state

    def on_load_checkpoint(self, state_dict: dict) -> None:
        super().on_load_checkpoint(state_dict)
        self._restored_at_cut = bool(state_dict.get("validated_at_max_steps"))

    def on_advance_end(self, data_fetcher: Any) -> None:
        if self.reopened and self._skip_next_val:  # the resumed batch: counted already
            self._batches_that_stepped -= 1
        self.reopened = False
        super().on_advance_end(data_fetcher)


def reopen_an_epoch_cut_short(fit_loop: LightningFitLoop) -> bool:
    """Give an epoch that ended before its last batch (``trainer.max_steps`` reached, or a stop
    inside the epoch) the counters of a checkpoint written inside it: started, not processed.

    Lightning closes such an epoch's counters as if it had ended, and a checkpoint written then
    (last.ckpt at the epoch's end, or after the fit) resumed wrongly: without max_steps, or
    with a larger one, the epoch's remaining batches were skipped (max_steps=-1), or trained as
    the next epoch, which then never ran (a larger max_steps). Reopened, it resumes as any
    checkpoint from inside an epoch does: its remaining batches, then the next epochs. Whether
    the epoch reached its last batch is the loop's own ``is_last_batch`` (also true at a
    ``limit_train_batches`` limit). Private: the loops' progress counters."""
    epoch = fit_loop.epoch_progress
    if not _ended_before_its_last_batch(epoch, fit_loop.epoch_loop.batch_progress):
        return False
    for counts in (epoch.current, epoch.total):
        counts.processed = counts.started - 1
        counts.completed = counts.processed
    return True


def _ended_before_its_last_batch(epoch: Any, batches: Any) -> bool:
    """Whether the fit loop's last epoch (its ``_Progress``) closed before its last batch (the
    epoch loop's ``_BatchProgress``)."""
    ended = epoch.current.ready == epoch.current.started == epoch.current.processed
    trained = epoch.current.processed > 0 and batches.current.ready > 0
    return ended and trained and not batches.is_last_batch


# The hooks Lightning calls on every callback at every training step, then at every batch of
# the other loops (validation, test, predict).
TRAINING_STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
BATCH_HOOKS = (
    *TRAINING_STEP_HOOKS,
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_batch_hooks_left_to_the_base_class(trainer: L.Trainer) -> None:
    """Lightning calls each per-batch hook on every callback, the base class's no-ops included:
    six hooks a training step over litlab's default callbacks, most of them no-ops, each wrapped
    in the profiler's context and named for it (about 2 us a callback and hook on a 2-core CPU,
    0.1-0.2 ms a step; docs/benchmarks.md). Its dispatch skips an attribute that is not callable
    (``_call_callback_hooks``: ``if callable(fn)``), so a callback's instance gets ``None`` for
    each batch hook its class leaves to ``Callback``. Hooks a class overrides or an instance sets
    are untouched, and so are callbacks added later (a module's ``configure_callbacks``)."""
    for callback in trainer.callbacks:
        for name in BATCH_HOOKS:
            own = name in vars(callback)  # a hook set on the instance itself
            if not own and getattr(type(callback), name, None) is getattr(L.Callback, name):
                setattr(callback, name, None)


def restart_finished_epochs_as_epoch_based(trainer: L.Trainer) -> L.Trainer:
    """Resume from an epoch's end with ``trainer.max_steps`` set as without it. Lightning
    2.6.6's fit loop calls itself restarting whenever max_steps is set (``_FitLoop.restarting``:
    "... or self._iteration_based_training()"), also when the checkpoint's epoch had finished:
    the next epoch then starts with the finished one's batch counters and trains none of its
    batches (one, without validation), so a resumed run silently loses an epoch. A checkpoint
    from within an epoch (started, not processed) restarts as before, and so does one from an
    epoch that ended before its last batch (:func:`reopen_an_epoch_cut_short`). The loop's class
    is swapped in place, so that everything the Trainer set on it stays."""
    if type(trainer.fit_loop) is LightningFitLoop:
        trainer.fit_loop.__class__ = _FitLoop
    if type(trainer.fit_loop.epoch_loop) is LightningTrainingEpochLoop:
        trainer.fit_loop.epoch_loop.__class__ = _TrainingEpochLoop
    return trainer


def _child_observer_class() -> type:
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    class JobObserver(_ChildProcessObserver):
        """Lightning's watcher of the rank processes it started, with a grace period: the
        SIGKILL of every process waits until ``grace_s`` has passed without the main process
        leaving the job (a job whose ranks all fail is then failed by the main process)."""

        def __init__(self, *args: Any, grace_s: float = 60, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.job_over = threading.Event()
            self.grace_s = grace_s

        def _run(self) -> bool:
            return self.job_over.is_set() or super()._run()

        def _terminate_all(self) -> None:
            if not self.job_over.wait(self.grace_s):  # still in the job: hung, as feared
                super()._terminate_all()

    return JobObserver


@contextmanager
def rank_watchers_with_grace(grace_s: float = 60) -> Iterator[list[Any]]:
    """While the block runs, Lightning's script launcher watches the rank processes it starts
    with a grace period (see _child_observer_class). Lightning kills every process, the main
    one included, as soon as a rank exits with an error; a sweep (run by the main process)
    would lose its later jobs. No public switch exists: the launcher module's private
    ``_launch_process_observer`` is replaced for the block (absent: Lightning's default)."""
    import lightning.pytorch.strategies.launchers.subprocess_script as script_launcher

    started: list[Any] = []
    original = getattr(script_launcher, "_launch_process_observer", None)
    observer_class = _child_observer_class()

    def launch(child_processes: list[subprocess.Popen]) -> None:
        observer = observer_class(
            main_pid=os.getpid(), child_processes=child_processes, grace_s=grace_s
        )
        observer.start()
        started.append(observer)

    if original is not None:
        script_launcher._launch_process_observer = launch
    try:
        yield started
    finally:
        if original is not None:
            script_launcher._launch_process_observer = original
        for observer in started:
            observer.job_over.set()


class CheapHookName:
    """Mixed into litlab's LightningModules before ``L.LightningModule``: Lightning sets the
    module's private ``_current_fx_name`` before and after each hook it calls (about 40 times a
    training step with the default callbacks), through ``nn.Module.__setattr__``, whose
    parameter and buffer checks (``isinstance`` through metaclasses) cost about 3 us each on a
    2-core CPU. A hook's name is a string, never a parameter, buffer or module: it is stored
    where ``nn.Module.__setattr__`` would store it, in the instance's ``__dict__``, directly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name":
            self.__dict__[name] = value
        else:
            super().__setattr__(name, value)


def every_n_train_steps(callback: Any) -> int:
    """A ModelCheckpoint's every_n_train_steps (private ``_every_n_train_steps``; 0: none)."""
    return int(callback._every_n_train_steps or 0)


def time_triggered(callback: Any) -> bool:
    """Whether a ModelCheckpoint saves every train_time_interval (private
    ``_train_time_interval``)."""
    return callback._train_time_interval is not None


def saves_at_batch_ends(callback: Any) -> bool:
    """Whether a ModelCheckpoint may save at the end of a training batch: with an
    every_n_train_steps or a train_time_interval; without either its ``on_train_batch_end``
    decides nothing (its saves come at epoch or validation ends)."""
    return every_n_train_steps(callback) > 0 or time_triggered(callback)


def checkpoint_settings(callback: Any) -> tuple[Any, ...]:
    """What ``ModelCheckpoint.state_key`` is made of: its monitor and mode, and its private
    trigger settings (``_every_n_train_steps``, ``_every_n_epochs``, ``_train_time_interval``),
    which have no public readers."""
    return (
        callback.monitor,
        callback.mode,
        callback._every_n_train_steps,
        callback._every_n_epochs,
        callback._train_time_interval,
    )


def save_periodic_checkpoint(callback: Any, trainer: L.Trainer) -> None:
    """What ``ModelCheckpoint.on_train_batch_end`` does when its every_n_train_steps is due (the
    checks, then its top-k and last saves), for a save it would not see as due: its private
    ``_should_skip_saving_checkpoint``, ``_monitor_candidates``, ``_save_topk_checkpoint`` and
    ``_save_last_checkpoint``, ``_defer_save_until_validation`` and ``_last_time_checked``."""
    if callback._should_skip_saving_checkpoint(trainer):
        return
    candidates = callback._monitor_candidates(trainer)
    if callback.monitor is not None and callback.monitor not in candidates:
        callback._defer_save_until_validation = True
        return
    callback._save_topk_checkpoint(trainer, candidates)
    callback._save_last_checkpoint(trainer, candidates)
    callback._last_time_checked = time.monotonic()


def flat_hyperparameters(params: dict[str, Any]) -> dict[str, Any]:
    """A nested config as flat "a.b.c" keys with loggable values, as Lightning's loggers make
    them (its ``_convert_params``/``_flatten_dict``: private, and the same rules for W&B)."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    return _flatten_dict(_convert_params(params), delimiter=".")


class AppendingWriter(csv_logs.ExperimentWriter):
    """Lightning's CSV ExperimentWriter that keeps an existing metrics.csv (a resumed run
    appends to it): Lightning's deletes the file in the private ``_check_log_dir_exists``, with
    no option."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])  # old columns stay; rows append


def _a_tests_row(row: dict[str, str]) -> bool:
    """Whether a metrics.csv row holds a test's values (test/*, with its monitors' mem/*, perf/*)
    and nothing a fit logs."""
    logged = [key for key, value in row.items() if value and key not in ("epoch", "step")]
    tested = any(key.startswith("test/") for key in logged)
    return tested and all(key.startswith(("test/", "mem/", "perf/")) for key in logged)


class AppendingCSVLogger(csv_logs.CSVLogger):
    """Lightning's CSVLogger that keeps the history of a resumed run (same run folder). The
    logger makes its writer in ``experiment`` from the private ``_fs`` and ``_experiment``.
    At module level: ddp_spawn pickles the trainer's loggers."""

    cut_at_first_row = False  # a resumed fit: rows from its first step on go (log_metrics)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.cut_at_first_row and step is not None:
            self.cut_at_first_row = False
            dropped = self.forget_from(step)
            if dropped:
                log.info(
                    "metrics.csv: %d row(s) logged after the checkpoint (step %d on) dropped; "
                    "the resumed run logs those steps again",
                    dropped,
                    step,
                )
        super().log_metrics(metrics, step)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """The rows held so far written out with each checkpoint (Lightning's writer holds
        them for ``flush_logs_every_n_steps``, 100): a run killed hard after a checkpoint
        resumes from it, logging only the steps after it again, and a row logged before it
        (the rate LearningRateMonitor logs at an epoch's start) was lost (review 170)."""
        super().after_save_checkpoint(checkpoint_callback)
        self.save()

    def forget_from(self, step: int) -> int:
        """Drop the rows of metrics.csv logged at ``step`` or later; how many. A run killed
        hard after its last checkpoint had logged steps that its resume logs again: each step
        was in the file twice. A test's row at ``step`` itself stays (the test of a finished
        run, trained further from its end: the resumed fit tests at a later step): it was lost
        where the resumed fit logged from that step, and kept where it logged from a later one.
        One after it goes (a resume from an older checkpoint tests at that step again)."""
        from litlab.files import atomic_file

        path = self.experiment.metrics_file_path
        if not self._fs.isfile(path):
            return 0
        with self._fs.open(path, "r", newline="") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), reader.fieldnames or []

        def logged_at(row: dict[str, str]) -> int:
            return int(float(row["step"]))

        kept = [
            row
            for row in rows
            if not row.get("step")
            or logged_at(row) < step
            or (logged_at(row) == step and _a_tests_row(row))
        ]
        if len(kept) < len(rows):
            with atomic_file(path, "w") as f:  # csv's own line ends, as Lightning's writer
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(kept)
        return len(rows) - len(kept)

    @property
    @rank_zero_experiment
    def experiment(self) -> csv_logs.ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning's loggers stamp metrics with now: its private ``_batches_that_stepped``
    (``trainer.global_step`` counts optimizer steps: a GAN's G and D steps both)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def forget_logged_after_checkpoint(trainer: L.Trainer) -> None:
    """A resumed fit, as it begins to train: its CSV history from the step it logs first goes
    then (those steps were logged after the checkpoint and are logged again). Not from the
    checkpoint's own step: Lightning counts one more from a checkpoint written inside an epoch
    (a step checkpoint, a validation mid-epoch) as the epoch loop resets, after this hook."""
    for logger in trainer.loggers if trainer.is_global_zero else []:
        if isinstance(logger, AppendingCSVLogger):
            logger.cut_at_first_row = True


# The exit status of a started process (ddp_spawn, ddp_fork) whose run a SIGTERM stopped:
# 128 + SIGTERM, as a stopped run's own process exits
STOPPED_EXIT = 143


class HandlingLauncher(_MultiProcessingLauncher):
    """Lightning's launcher of spawned or forked DDP processes (ddp_spawn, ddp_fork), whose
    processes handle a run's end as Lightning handles it in every process it does not start
    itself (``_call_and_handle_interrupt``'s ``_interrupt``: the callbacks', datamodule's and
    strategy's on_exception, the loggers' "failed"), and end a stop asked for by a signal with
    exit status 143, which the main process raises as Lightning's SIGTERMException.

    Lightning 2.6.6 runs the fit in a started process without that handling (it runs in the main
    process alone, on what the processes raised), so a SIGTERM or SIGUSR1 stopped the ranks
    without the stop's checkpoint (litlab.callbacks.Preemption writes it in on_exception: a
    resume lost the steps since the last one); and its SIGTERMException, a SystemExit without a
    code, ended each process with status 0 and no result, for which the main process waited
    forever (a run whose rank was signalled hung until killed). Private: the launcher class,
    its ``_wrapping_function``, ``lightning.pytorch.trainer.call._interrupt`` and
    ``Trainer._teardown``."""

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        # a SIGTERM to this process meanwhile is passed on to the ranks and held (litlab.run)
        from litlab.run import passing_sigterm_on, sigterm_pending  # (not at import: a cycle)

        # The last launch's processes (the fit's, ended) are not this launch's (the test's):
        # ranks forked from here inherit the list, and Lightning's SIGTERM handler in a rank
        # kills them (multiprocessing asserts that only their parent may: AssertionError, the
        # run "failed" where it should stop)
        self.procs = []
        self._log_handlers = _log_handlers()  # pickled with the launcher into spawned ranks
        folder = tempfile.mkdtemp(prefix="litlab-spawned-")
        self._stop_record = os.path.join(folder, "record.pt")  # (pickled too: rank 0 writes)
        with passing_sigterm_on():
            try:
                return super().launch(function, *args, trainer=trainer, **kwargs)
            except ProcessExitedException as e:
                self._take_stop_record(trainer)
                if e.exit_code == STOPPED_EXIT:  # the run, all of its processes, was stopped
                    raise SIGTERMException() from e
                # a rank ended by it before it could stop at a batch (this process passed it
                # on; or the rank alone got it before Lightning's handlers: SIGTERM's default)
                if sigterm_pending() or e.signal_name == "SIGTERM":
                    raise Terminated() from e
                raise
            except BaseException:
                self._take_stop_record(trainer)
                raise
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    def _take_stop_record(self, trainer: Any) -> None:
        """What the started rank 0 recorded as its fit or test ended early (a signal, an error:
        ``_save_stop_record``), into this process's trainer, as at a normal end: the run's
        summary had no metrics, epochs, steps or best checkpoint (its files were there)."""
        if trainer is None or not os.path.isfile(self._stop_record):
            return
        try:
            saved = torch.load(self._stop_record, weights_only=False)
            self.update_main_process_results(trainer, saved["extra"])
            if saved["best"] and trainer.checkpoint_callback is not None:
                trainer.checkpoint_callback.best_model_path = saved["best"]
        except Exception as e:  # (the stop's own error is the one to raise)
            logging.getLogger("litlab").debug("the spawned rank 0's record unread: %s", e)

    def _save_stop_record(self, trainer: Any) -> None:
        """In the started rank 0, as its fit or test ends early (after the callbacks'
        on_exception): what get_extra_results sends back at a normal end, and the best
        checkpoint's path (Lightning sends it apart)."""
        best = getattr(trainer.checkpoint_callback, "best_model_path", None) or None
        saved = {"extra": self.get_extra_results(trainer), "best": best}
        torch.save(saved, self._stop_record + ".part")
        os.replace(self._stop_record + ".part", self._stop_record)

    def _wrapping_function(self, process_idx: int, trainer: Any, function: Callable, *rest: Any):
        if not logging.getLogger().handlers:  # a spawned process (a forked one has the parent's)
            _log_as(getattr(self, "_log_handlers", []), to_files=process_idx == 0)
        record = self._save_stop_record if process_idx == 0 else None
        handled = functools.partial(_handled, trainer, function, record)  # in the started process
        super()._wrapping_function(process_idx, trainer, handled, *rest)

    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        """Also what the callbacks and the module that record a run (``spawned_record``) saw
        in the started rank 0: the main process, where the run's summary is written, saw no
        batch (a classifier's test class by class: walkthrough 165)."""
        extra = super().get_extra_results(trainer)
        records = {
            type(callback).__qualname__: callback.spawned_record(trainer)
            for callback in trainer.callbacks
            if hasattr(callback, "spawned_record")
        }
        module = trainer.lightning_module
        if hasattr(module, "spawned_record"):
            records[_MODULE_RECORD] = module.spawned_record()
        return {**extra, "litlab_records": records}

    def update_main_process_results(self, trainer: Any, extra: dict[str, Any]) -> None:
        records = extra.pop("litlab_records", {})
        super().update_main_process_results(trainer, extra)
        for callback in trainer.callbacks:
            if type(callback).__qualname__ in records and hasattr(callback, "take_spawned_record"):
                callback.take_spawned_record(records[type(callback).__qualname__])
        module = trainer.lightning_module
        if _MODULE_RECORD in records and hasattr(module, "take_spawned_record"):
            module.take_spawned_record(records[_MODULE_RECORD])


_MODULE_RECORD = "<the LightningModule>"  # (no callback's class name)


def _log_handlers() -> list[dict[str, Any]]:
    """The root logger's handlers as Hydra set them up (its console and train.log), described
    so that a spawned process can set up the same: a process started by ``spawn`` has no
    handler, and its ranks' lines (the batches an epoch, FLOPs, warnings) were lost or printed
    bare by Python's last-resort handler, never in train.log (walkthrough 165)."""
    described = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            where = {"file": handler.baseFilename}
        elif isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stdout,
            sys.stderr,
        ):
            where = {"stream": "stderr" if handler.stream is sys.stderr else "stdout"}
        else:
            continue
        formatter = handler.formatter
        described.append(
            {
                **where,
                "level": handler.level,
                "format": formatter._fmt if formatter else None,
                "datefmt": formatter.datefmt if formatter else None,
            }
        )
    return [{"root_level": logging.getLogger().level}, *described] if described else []


def _log_as(described: list[dict[str, Any]], to_files: bool) -> None:
    """The handlers ``_log_handlers`` described, on this process's root logger; the log files
    (train.log, appended to) only where ``to_files`` (rank 0: the other ranks' lines go to the
    console, as those of the ranks trainer=ddp starts)."""
    root = logging.getLogger()
    for entry in described:
        if "root_level" in entry:
            root.setLevel(entry["root_level"])
            continue
        if "file" in entry:
            if not to_files:
                continue
            handler: logging.Handler = logging.FileHandler(entry["file"], mode="a")
        else:
            handler = logging.StreamHandler(getattr(sys, entry["stream"]))
        handler.setLevel(entry["level"])
        handler.setFormatter(logging.Formatter(entry["format"], entry["datefmt"]))
        root.addHandler(handler)


def _handled(
    trainer: Any, function: Callable, record: Callable | None, *args: Any, **kwargs: Any
) -> Any:
    try:
        return function(*args, **kwargs)
    except BaseException as e:
        if trainer is not None:
            _interrupt(trainer, e)
            if record is not None:  # (rank 0: what the main process's summary records)
                try:
                    record(trainer)
                except Exception as unsent:
                    logging.getLogger("litlab").debug("the stop's record unsent: %s", unsent)
        if isinstance(e, SIGTERMException):
            # every rank stops here together (they agreed on the stop and saved together): torn
            # down as Lightning tears a stopped run down in its own processes, and as a run that
            # ended is (ClosingDDPStrategy closes the group at exit; without, gloo aborted the
            # process now and then, SIGABRT: the stop read "failed")
            if trainer is not None:
                trainer._teardown()
            raise SystemExit(STOPPED_EXIT) from e
        raise


# -- W&B (through Lightning's WandbLogger) -------------------------------------------------------


def wandb_init_arguments(logger: Any) -> dict[str, Any]:
    """The keyword arguments WandbLogger will pass to ``wandb.init`` (its private
    ``_wandb_init``): litlab switches a failed online start to offline there, and drops
    Lightning's ``anonymous=None``; the logger has no public way to change them once built."""
    return logger._wandb_init


def wandb_started(logger: Any) -> bool:
    """Whether the W&B run exists (reading ``logger.experiment`` would start one)."""
    return logger._experiment is not None


# -- OmegaConf -------------------------------------------------------------------------------------


def config_node(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` as a node, without resolving interpolations or ``???`` (``_get_node``;
    OmegaConf's public getters resolve, and a config is checked before it resolves)."""
    return cfg._get_node(key)


def is_none_node(node: Any) -> bool:
    """Whether a config node holds None (``_is_none``; OmegaConf.is_none needs the parent)."""
    return node._is_none()


# -- torch -----------------------------------------------------------------------------------------


def one_cycle_phases(scheduler: torch.optim.lr_scheduler.OneCycleLR) -> list[dict[str, Any]]:
    """OneCycleLR's phases (dicts with ``end_step``): the constructor computes them from
    total_steps and keeps them in the private ``_schedule_phases``; changing a running
    schedule's length means changing them there."""
    return scheduler._schedule_phases


def cpu_probe_bf16() -> bool:
    """torch's probe for AVX512-BF16 (``torch.cpu._is_avx512_bf16_supported``; no public one),
    used where /proc/cpuinfo does not exist."""
    probe: Callable[[], bool] | None = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe and probe())


def ema_update(ema: Sequence[torch.Tensor], current: Sequence[torch.Tensor], decay: Any) -> None:
    """ema <- ema + (1 - decay) * (current - ema) for every tensor, in ``torch._foreach_*`` ops
    (as torch's own swa_utils EMA; there is no public multi-tensor op: one kernel for many
    tensors where their types agree, one a tensor otherwise), with ``decay`` a device tensor: no
    host sync (``_foreach_lerp_`` takes a tensor weight as a Python number, read from the device
    each step). As a difference, a tensor equal to its average stays so exactly (a frozen
    backbone's weights: decay * a + (1 - decay) * a rounded off them by about 1e-7, walkthrough
    165); ``current`` may be of a narrower type than ``ema`` (16-bit weights, a float32 average).
    One temporary the size of the average, as the product decay * current before."""
    step = torch._foreach_sub(list(current), list(ema))
    torch._foreach_mul_(step, 1.0 - decay)
    torch._foreach_add_(list(ema), step)


def ddp_wrapper_settings(strategy: Any) -> tuple[dict[str, Any], bool]:
    """A Lightning DDPStrategy's keyword arguments for DistributedDataParallel (its
    ``_ddp_kwargs``: find_unused_parameters, bucket_cap_mb, ...), and whether it was given a
    communication hook, its state or model averaging (``_ddp_comm_hook``, ``_ddp_comm_state``,
    ``_model_averaging_period``), which it applies to its one wrapper. Private: the strategy
    keeps them as given, with no public accessor."""
    hooked = any(
        getattr(strategy, name, None) is not None
        for name in ("_ddp_comm_hook", "_ddp_comm_state", "_model_averaging_period")
    )
    return dict(strategy._ddp_kwargs), hooked
