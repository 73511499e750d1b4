"""What a checkpoint needs beyond Lightning's own state (every rank's random generators), and
checkpoints on preemption signals; how a run then continues is litlab.resume's."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, LearningRateFinder
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.callbacks.checkpoint import inside_an_accumulation
from litlab.compat import (
    count_steps_as_saved_in_validation,
    stop_at_batch_end,
    stops_when_asked,
    take_stop_mark,
)
from litlab.distributed.agree import AnyRank, largest_on_any_rank, rank_and_world
from litlab.errors import Requeued
from litlab.loggers import end_wandb_service
from litlab.rng import mixed_seed, seed_rank
from litlab.run import ask_a_requeue, hold_a_stop, hold_sigterm, stop_requeues

log = logging.getLogger(__name__)


def _capture() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # the rank's own GPU's (every GPU of the node is visible to each DDP rank: a state for
        # each did not restore where fewer are, and put cuda:1's state on cuda:0 where one is)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    saved = state.get("cuda")
    if saved is None or not torch.cuda.is_available():
        return
    if isinstance(saved, list | tuple):  # written before 2026-12-05: one per visible GPU
        here = torch.cuda.current_device()
        if here >= len(saved):
            return
        saved = saved[here]
    torch.cuda.set_rng_state(saved)


class RNGState(Callback):
    """Every rank's own global random generators: distinct per rank, saved and restored with
    the checkpoint (Lightning does neither), so that augmentation and dropout differ between
    ranks and continue exactly where an interrupted run stopped.

    At the start of a multi-process fit, litlab's models reseed ranks > 0 from (seed, rank)
    (litlab.rng.RankSeeded). A checkpoint holds one state per rank, gathered from all ranks
    when it is written (Lightning writes checkpoints from every rank together). Resumed on
    another number of processes, rank 0 continues its stream and the others start fresh ones,
    with a warning.
    """

    @property
    def state_key(self) -> str:
        return "RNGState"

    def state_dict(self) -> dict[str, Any]:
        own = _capture()
        _, world = rank_and_world()
        if world == 1:
            return {"ranks": [own]}
        states: list[Any] = [None] * world
        torch.distributed.all_gather_object(states, own)
        return {"ranks": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get("ranks", [state])  # older checkpoints hold one state, rank 0's
        rank, world = rank_and_world()
        if len(ranks) == world:
            _restore(ranks[rank])
            return
        if rank == 0:
            _restore(ranks[0])
            log.warning(
                "the checkpoint holds the random state of %d process(es) and this run has %d: "
                "ranks other than 0 start fresh random streams (not bit-identical to the "
                "interrupted run)",
                len(ranks),
                world,
            )
        else:
            seed_rank(mixed_seed(int(os.environ.get("PL_GLOBAL_SEED", 0)), world), rank)


def fit_ends_after_this_batch(trainer: L.Trainer) -> bool:
    """Whether the fit ends after the current training batch: its last epoch's last batch,
    trainer.max_steps reached, or a stop asked for in the step (a GAN's model.max_g_steps sets
    ``trainer.should_stop``; Lightning honours it once min_epochs/min_steps are met). The same
    answer on every rank."""
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return True
    if trainer.should_stop and stops_when_asked(trainer):
        return True
    epochs = trainer.max_epochs
    return (
        bool(trainer.is_last_batch)
        and epochs not in (None, -1)
        and trainer.current_epoch + 1 >= epochs
    )


def _submitit_signal() -> signal.Signals | None:
    """The signal submitit sends before a preemption or time limit, inside a submitit job."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def _slurm_requeues() -> bool:
    """Whether this is a SLURM job that litlab requeues itself (submitit's requeue their own)."""
    return SLURMEnvironment.detect() and not os.environ.get("SUBMITIT_EXECUTOR")


def requeue_slurm_job() -> bool:
    """``scontrol requeue`` this SLURM job, as Lightning's SLURM handler does; whether SLURM
    took it (it refuses a job submitted without ``--requeue``), said in one line if not."""
    from litlab.resume import slurm_job  # (resume imports the run machinery)

    job = slurm_job(step=False)
    try:
        done = subprocess.run(
            ["scontrol", "requeue", str(job)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("could not requeue SLURM job %s (%s)", job, e)
        return False
    if done.returncode:
        log.warning(
            "SLURM did not requeue job %s (scontrol: %s); submit it with --requeue",
            job,
            done.stderr.strip() or f"exit status {done.returncode}",
        )
        return False
    log.warning("requeued SLURM job %s: it continues in this run folder", job)
    return True


class Preemption(Callback):
    """On SIGTERM and SIGUSR1 finish the current batch, save ``last.ckpt`` in the checkpoint
    folder, and stop; ``python train.py resume=<run folder>`` continues.

    The signal only marks the run; under DDP the ranks then agree whether any of them was
    signalled and all stop after the same batch, raising Lightning's SIGTERMException, and
    write the checkpoint together. The agreement is an all-reduce started at each batch's end
    and read at the next one's (litlab.distributed.agree.AnyRank: no host sync in the step), so
    a signal stops the run one batch later than in a single process; at an epoch's last batch
    it is read at once, so that a stop marked there waits for that epoch's validation as in a
    single process. (Lightning's own SIGTERM handler broadcasts from inside the handler and
    stops the signalled rank alone: under DDP the ranks then wait on different collectives
    forever.)

    In a SLURM job, SIGUSR1 (``--signal=SIGUSR1@<seconds>``, before the time limit) also
    requeues the job with ``scontrol requeue`` from global rank 0, once ``last.ckpt`` is saved
    and the loggers closed (``slurm_requeue``); the requeued job continues in the same folder
    (litlab.resume.continue_in_place). This replaces Lightning's SLURM auto-requeue handler,
    which saves its hpc checkpoint from inside the signal handler: under DDP its collectives (a
    barrier, the ranks' generators gathered) met other collectives on ranks the signal reached
    elsewhere in the step, and the job hung until its time limit instead of being requeued.
    Inside a submitit job (Hydra's submitit launcher) submitit's preemption signal (USR2) is
    routed the same way, and :meth:`hand_over` then lets submitit's own handler requeue the job.

    With gradient accumulation a stop waits for the batch whose optimizer step takes the
    accumulated gradients (they are in no checkpoint). A signal during the fit's last batch or
    its last validation stops no training (a stopped fit would have nothing left to train,
    which resume= refuses): the fit ends as planned, and where a test follows, the run stops
    once it has recorded the fit (its .trained mark; ``stop_for_a_signal_left``), before the
    test, which resume= or the requeued job runs. Outside training litlab.run takes SIGUSR1.

    The handlers are set when training starts, after Lightning has taken its snapshot of the
    signal handlers, so that Lightning's teardown puts the originals back.
    """

    def __init__(self, dirpath: str, filename: str = "last", slurm_requeue: bool = True) -> None:
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self.slurm_requeue = slurm_requeue
        self._taken: dict[signal.Signals, Any] = {}  # signal -> the handler it had before
        self._received: signal.Signals | None = None
        self._scheduler: Any = None  # submitit's handler, once a preemption was checkpointed
        self._held = False  # a stop marked before validation, set again after it
        self._agreed: AnyRank | None = None  # under DDP: whether any rank was signalled
        self._validated_at: int | None = None  # the training batch a validation last followed
        self._saving_after_validation = False  # the stop's checkpoint, after one inside an epoch
        self._armed = False  # training started: a stop saves where the fit is
        # a signal the fit could no longer stop for (its last batch, its last validation), and
        # the handler it had before this callback's
        self._left: tuple[signal.Signals, Any] | None = None

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Under DDP from the sanity check on (Lightning's handlers are set by then): Lightning's
        # stopped the signalled rank alone inside the check, broadcasting from the handler, and
        # the ranks waited on different collectives forever (ddp_spawn, ddp_fork: hung). A
        # signal now stops the fit after its first batch, with the checkpoint.
        if trainer.world_size > 1:
            self._received = None
            self._take_signals()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._scheduler = self._agreed = self._validated_at = self._left = None
        self._armed = True
        if not self._taken:  # (taken in the sanity check: a signal there is kept)
            self._received = None
            self._take_signals()

    def _take_signals(self) -> None:
        signals = {signal.SIGTERM, signal.SIGUSR1, _submitit_signal()}
        for signum in signals - {None}:
            with contextlib.suppress(ValueError):  # not in the main thread: leave signals alone
                self._taken[signum] = signal.signal(signum, self._mark)

    def _mark(self, signum: int, frame: Any) -> None:
        if self._received is None:  # the first signal says why (submitit's decides a requeue)
            self._received = signal.Signals(signum)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        *_: Any,
    ) -> None:
        if inside_an_accumulation(trainer, batch_idx):
            return  # a stop waits for the step of the gradients accumulated (not in checkpoints)
        last = fit_ends_after_this_batch(trainer)
        stop = self._received is not None
        if trainer.world_size > 1:  # every rank stops after the same batch
            if self._agreed is None:
                self._agreed = AnyRank(trainer.strategy.root_device)
            stop = (self._agreed.now if trainer.is_last_batch or last else self._agreed.later)(stop)
        if stop and last:  # a stop now would leave a run whose resume has nothing left to train
            if trainer.is_global_zero:
                log.warning("a signal came at the last training batch: the fit ends as planned")
        elif stop:
            stop_at_batch_end(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A stop marked at an epoch's last training batch waits for the validation that follows:
        # Lightning's evaluation loop acts on the mark after any batch but a rank's last, and the
        # ranks' numbers of validation batches can differ (each image is evaluated once), so
        # one rank would stop inside validation while the other waits in its metrics' sync.
        self._held = take_stop_mark(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._validated_at = trainer.fit_loop.epoch_loop.total_batch_idx
        if self._held:  # Lightning stops right after validation, on every rank
            self._held = False
            stop_at_batch_end(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._agreed is not None:  # a fit that ended within an epoch (max_steps)
            self._agreed.settle()
        self._agreed = None
        self._armed = False
        self._agree_on_the_signal(trainer)  # one came in the last batch or validation?
        taken = self._restore()
        if self._received is not None:
            self._left = (self._received, taken.get(self._received))
        finding = any(
            isinstance(c, LearningRateFinder | BatchSizeFinder) for c in trainer.callbacks
        )
        if trainer.world_size > 1 and signal.SIGTERM in taken and not finding:
            # Under DDP a SIGTERM from here to the run's .trained mark is held for the run,
            # which stops after it (interrupted; resume= tests): Lightning's handler, put back
            # above until its teardown, broadcasts from inside itself, and a rank whose peer
            # had ended failed there, the run "failed" without its .trained mark and its
            # resume= refused as trained to its end (walkthrough 184)
            signal.signal(signal.SIGTERM, hold_sigterm)

    def stop_for_a_signal_left(self, trainer: L.Trainer) -> None:
        """Once the fit is recorded (its .trained mark), before its test: a signal that came as
        the fit ended (its last batch or validation), which stopped no training, stops the run
        now (litlab.run.hold_a_stop: interrupted, the test left to resume= or the requeued job),
        as it would have during the test. It was swallowed: the run went on to test and
        completed, a SLURM job's warning signal with no requeue (then killed at its time limit,
        part way through a long test, nobody requeued it)."""
        left, self._left = self._left, None
        if left is None:
            return
        received, previous = left
        if received == _submitit_signal():  # submitit's handler requeues (hand_over)
            self._scheduler = previous if callable(previous) else None
        hold_a_stop(requeue=received == signal.SIGUSR1)
        if trainer.is_global_zero:
            log.warning(
                "%s came as the fit ended (its last batch or validation): the run stops before "
                "its test",
                received.name,
            )

    def _restore(self) -> dict[signal.Signals, Any]:
        taken, self._taken = self._taken, {}
        for signum, previous in taken.items():
            signal.signal(signum, previous)
        return taken

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # the handlers stay this callback's until the stop's checkpoint is written: a second
        # signal during the save only marks (Lightning's would end the save half way)
        try:
            self._save_on_stop(trainer, exception)
        finally:
            self._restore()

    def _save_on_stop(self, trainer: L.Trainer, exception: BaseException) -> None:
        self._agreed = None  # a flag still being handed over is left (a rank may be gone)
        armed, self._armed = self._armed, False
        # a SIGTERM before training started (the fit's setup: litlab.run's handler) saves
        # nothing: the model is not yet the checkpoint it continues, whose last.ckpt it would
        # overwrite, and nothing was trained
        if not (isinstance(exception, SIGTERMException) and trainer.state.fn == "fit" and armed):
            return
        self._agree_on_the_signal(trainer)
        previous = self._taken.get(self._received)
        self._saving_after_validation = (
            not trainer.is_last_batch
            and self._validated_at == trainer.fit_loop.epoch_loop.total_batch_idx
        )
        try:
            trainer.save_checkpoint(self.path, weights_only=False)  # a whole one, to resume from
        finally:
            self._saving_after_validation = False
        if trainer.is_global_zero:  # (every rank of ddp_spawn's logs to the console)
            log.warning("stopped by a signal; saved %s to resume from", self.path)
        if self._received is not None and self._received == _submitit_signal():
            self._scheduler = previous if callable(previous) else None
        elif self._received == signal.SIGUSR1:
            ask_a_requeue()  # (litlab.run's record of a stop's kind: hand_over reads it)

    def _agree_on_the_signal(self, trainer: L.Trainer) -> None:
        """Under DDP, the signal every rank acts on, where any received one: a preemption's
        (submitit's, then SLURM's SIGUSR1), else SIGTERM. The ranks agreed to stop but each
        kept its own: SIGUSR1 on rank 1 alone stopped the job without the requeue, which
        rank 0 decides (review 184). A collective: every rank stops here together."""
        if trainer.world_size == 1:
            return
        kinds = [s for s in (signal.SIGTERM, signal.SIGUSR1, _submitit_signal()) if s]
        mine = kinds.index(self._received) + 1 if self._received in kinds else 0
        agreed = largest_on_any_rank(mine)
        if agreed:
            self._received = kinds[agreed - 1]

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._saving_after_validation:  # or the resumed run logs every row one step late
            count_steps_as_saved_in_validation(checkpoint)

    def hand_over(self, trainer: L.Trainer) -> None:
        """After a checkpointed preemption inside a submitit job: submitit requeues the job
        (from global rank 0) and exits, as litlab.errors.Requeued. After SIGUSR1 in a SLURM
        job: global rank 0 requeues it and exits the same way; SLURM ends every rank with
        SIGTERM then, which they now ignore (their part is saved). Otherwise nothing."""
        scheduler, self._scheduler = self._scheduler, None
        # SIGUSR1 in training (_save_on_stop), outside it (litlab.run's handler) or as the fit
        # ended (stop_for_a_signal_left)
        requeue = self.slurm_requeue and stop_requeues() and _slurm_requeues()
        if scheduler is not None or requeue:
            end_wandb_service()
        if scheduler is not None:
            try:
                scheduler(self._received, None)
            except SystemExit as e:
                raise Requeued(e.code) from e
        elif requeue:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the run's summary be written
            if trainer.is_global_zero and requeue_slurm_job():
                raise Requeued(143)  # 128 + SIGTERM, as an interrupted run


def stop_for_a_signal_left(trainer: L.Trainer) -> None:
    """See Preemption.stop_for_a_signal_left."""
    for callback in trainer.callbacks:
        if isinstance(callback, Preemption):
            callback.stop_for_a_signal_left(trainer)


def hand_over_preemption(trainer: L.Trainer) -> None:
    """Let the cluster scheduler requeue a run that stopped for a preemption (see Preemption)."""
    for callback in trainer.callbacks:
        if isinstance(callback, Preemption):
            callback.hand_over(trainer)
