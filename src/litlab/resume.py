"""How a run continues: the one place for `resume=`, requeued cluster jobs and checkpoints.

- `python train.py resume=<run folder>` (``resume_argv``): Hydra has no notion of "continue
  that run", so the switch is turned into plain Hydra arguments before Hydra parses the command
  line: the folder's saved config as the primary config, the folder as the run dir (its .hydra
  files are left as they are), its newest checkpoint as ckpt_path, and its W&B run id; the
  overrides of earlier resumes that trained (.hydra/resume_overrides.yaml), then this one's.
- A requeued job (SLURM, submitit) runs the same command again: in a SLURM job the run folder is
  fixed per job (``run_dir``), and a run that starts in a folder holding its own checkpoints
  continues from the newest (``continue_in_place``) with the values its tuners found.
- Either way, ``check_resumable`` (litlab.resumable) refuses a checkpoint of another model,
  network, data or measure, or past the run's end.
What a checkpoint restores beyond Lightning's own state (every rank's random generators) and
the signals that write one are litlab.callbacks.preemption's.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from omegaconf import DictConfig, open_dict

from litlab.checkpoint import early_stopping_states, load_checkpoint, stored_config
from litlab.compat import forget_logged_after_checkpoint
from litlab.config import (
    DATA_PATH_KEYS,
    config_dir,
    group_of_sweep,
    local_path,
    study_folder,
)
from litlab.data.datamodule import part_of_a_split
from litlab.distributed import global_rank, rank0_dir
from litlab.distributed.launchers import as_launched, is_rank_scratch
from litlab.errors import AlreadyCompleted, ConfigError, fail
from litlab.files import CHECKPOINTS, in_progress, resumable_checkpoints, run_process, started_s
from litlab.loggers import wandb_folder
from litlab.overrides import RESUME_OVERRIDES, merged_overrides, override_key
from litlab.run import (
    COMPLETED,
    SPAWNED_FIT,
    TRAINED,
    Run,
    config_digest,
    read_summary,
)
from litlab.tune import take_tuned_values

log = logging.getLogger("litlab")


def newest_checkpoint(folder: Path) -> Path | None:
    """The most recently written of the run's resumable checkpoints: epoch end, periodic and
    signal (checkpoints/), and Lightning's SLURM auto-requeue saves (hpc_ckpt_<n>.ckpt)."""
    found = resumable_checkpoints(folder)
    if not found:
        refuse_sharded(folder)
    return max(found, key=written_at) if found else None


# When a checkpoint was written (time.time_ns()), inside it: a file's time is lost where its
# folder is copied without times (cp -r, rsync without -t), and resume= then took whichever file
# was copied last, step.ckpt many steps before last.ckpt. Not the global step: a run restarted
# from an earlier checkpoint (resume=<run> ckpt_path=<run>/checkpoints/best.ckpt) leaves an
# older step.ckpt of a higher step, which it has not yet written over.
SAVED_AT = "litlab_saved_at_ns"


def written_at(path: Path) -> int:
    """When a checkpoint was written: the time it holds (FitMilestones), else (written before
    litlab kept one, or unreadable: its loading then says why) its file's. Read with mmap."""
    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True).get(SAVED_AT)
    except Exception:  # torch.load fails in many ways on a foreign or truncated file
        saved = None
    return int(saved) if saved is not None else path.stat().st_mtime_ns


def refuse_sharded(folder: Path) -> None:
    """A run of trainer.strategy.state_dict_type=sharded (FSDP) leaves its checkpoints as
    folders of shards, which litlab cannot continue from: one clear line, where a requeued job
    would otherwise start afresh in the run's folder, over its checkpoints and metrics."""
    sharded = [
        folder / "checkpoints" / n for n in CHECKPOINTS if (folder / "checkpoints" / n).is_dir()
    ]
    if sharded:
        raise ConfigError(
            f"{folder} holds sharded FSDP checkpoints ({sharded[0].name}/), which litlab cannot "
            "continue from; consolidate one (python -m lightning.pytorch.utilities."
            f"consolidate_checkpoint {sharded[0]}) and start a new run from it with ckpt_path=, "
            "and train runs that may be requeued with trainer.strategy.state_dict_type=full"
        )


def wandb_run_id(folder: Path) -> str | None:
    """The id of the W&B run a run folder logged to, as the newest part's transaction log names
    it (wandb/<offline-run|run>-<date>-<id>[-<n>]/run-<id>.wandb), else its folder's name."""
    parts = wandb_folder(folder).glob("*run-*")
    newest = max(parts, key=lambda p: p.stat().st_mtime_ns, default=None)
    if newest is None:
        return None
    log_file = next(newest.glob("run-*.wandb"), None)  # none if killed while W&B started
    return log_file.stem.removeprefix("run-") if log_file else newest.name.rsplit("-", 1)[-1]


def _first_project(folder: Path, saved: dict[str, Any]) -> str | None:
    """The W&B project the run's first part logged to, where its saved W&B config (``saved``)
    reads it from the environment (WANDB_PROJECT): the resolved config beside the CSV logs
    says which."""
    resolved = folder / "csv" / "hparams.yaml"
    if "${" not in str(saved.get("project", "")) or not resolved.is_file():
        return None
    logged = yaml.safe_load(resolved.read_text()) or {}
    value = ((logged.get("logger") or {}).get("wandb") or {}).get("project")
    return str(value) if value and "'" not in str(value) else None


# The saved config.yaml stays the first command's; a later resume= applies RESUME_OVERRIDES first.
_PENDING = "LITLAB_RESUME_OVERRIDES"  # this process's resume: recorded with its first checkpoint
# What one command does with the run, never carried to the next resume= (ckpt_path=<best.ckpt>
# recorded made every later resume= start from best.ckpt again, losing what it trained since).
_RUN_CONTROL = ("ckpt_path", "train", "test")


def _carried(overrides: list[str]) -> list[str]:
    """``overrides`` without the run-control keys (_RUN_CONTROL)."""
    return [arg for arg in overrides if override_key(arg) not in _RUN_CONTROL]


def _recorded_overrides(folder: Path) -> list[str]:
    path = folder / ".hydra" / RESUME_OVERRIDES
    return _carried(list(yaml.safe_load(path.read_text()) or [])) if path.is_file() else []


def this_resume_overrides() -> list[str] | None:
    """The overrides this process's ``resume=`` command gave (not what earlier resumes of the
    run recorded, which its composed config holds too); None outside a resume= not yet
    recorded (record_resume_overrides)."""
    pending = os.environ.get(_PENDING)
    return None if pending is None else list(yaml.safe_load(pending)["overrides"])


def record_resume_overrides(run_dir: str | Path) -> None:
    """Once a `resume=` run writes its first checkpoint (not when it is refused or fails before),
    add its overrides to the run folder's record, so that the next `resume=` continues from
    that checkpoint with them (rank 0 writes)."""
    pending = os.environ.pop(_PENDING, None)
    if pending is None or global_rank() != 0:
        return
    resumed = yaml.safe_load(pending)
    folder = Path(resumed["folder"])
    if Path(run_dir).resolve() != folder or not resumed["overrides"]:
        return
    overrides = merged_overrides(_recorded_overrides(folder), resumed["overrides"])
    (folder / ".hydra" / RESUME_OVERRIDES).write_text(yaml.safe_dump(overrides))


def logged_steps_per_epoch(trainer: L.Trainer) -> int | None:
    """How many logging steps an epoch of this fit takes: Lightning's logging step counts the
    batches that stepped the optimizers (one in accumulate_grad_batches, and the last), per
    rank; None for an epoch of unknown length."""
    batches = trainer.num_training_batches
    if not math.isfinite(batches):
        return None
    return math.ceil(int(batches) / trainer.accumulate_grad_batches)


def trains_part_of_its_split(trainer: L.Trainer) -> bool:
    """Whether trainer.limit_train_batches leaves batches of the training split out of every
    epoch (a fraction below 1, or fewer batches than the split has on this rank)."""
    if not part_of_a_split(trainer.limit_train_batches):
        return False
    try:
        whole = len(trainer.train_dataloader)
    except (TypeError, NotImplementedError):  # a stream without a length: the limit says it
        return True
    return trainer.num_training_batches < whole


class FitMilestones(L.Callback):
    """Tells the run when its fit begins to train (its setup passed: Lightning's checks of the
    trainer's settings, the checkpoint restored): a finished run in the folder is no longer
    completed (.completed dropped), and when it first writes a checkpoint: its checkpoints are
    no longer those of .trained's record (dropped) and this `resume=`'s overrides are recorded.
    A resume that failed in the fit's setup (`+trainer.val_check_interval=1000` on a finished
    run: Lightning's ValueError) had un-finished the run and recorded the override, which every
    later plain `resume=` then failed on. Every checkpoint gets the time it is written
    (SAVED_AT, for newest_checkpoint)."""

    def __init__(self, run: Run) -> None:
        self.run, self.saved, self.trained = run, False, False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trained = True  # (its setup passed)
        self.run.training_began()
        self.run.fit_began_at(trainer.current_epoch, resumed=trainer.ckpt_path is not None)
        self.run.summary.pop("training_limit", None)
        if trains_part_of_its_split(trainer):  # train/* measure those batches (the report says)
            self.run.summary["training_limit"] = trainer.limit_train_batches
        # the report's epoch axis for a run stopped in its first epoch (its CSV holds no end)
        self.run.summary["steps_per_epoch"] = logged_steps_per_epoch(trainer)
        if trainer.ckpt_path is not None:  # resumed: the steps logged after the checkpoint go
            forget_logged_after_checkpoint(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.run.epoch_ended("trained", trainer.current_epoch + 1)
        # the steps: an epoch that trainer.max_steps or max_time cut counts as trained above
        self.run.summary["global_step"] = trainer.global_step

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """A fit stopped part way (a signal, Ctrl-C, an error): the steps it reached, not the
        last epoch end's (null in a first epoch: walkthrough 139); last_checkpoint says where
        it resumes."""
        if self.trained:
            self.run.summary["global_step"] = trainer.global_step

    def spawned_record(self, trainer: L.Trainer) -> dict[str, Any]:
        """In the started rank 0 of a fit or test in spawned processes (ddp_spawn), at its end:
        what this run's copy there recorded (its epochs, steps an epoch, the part of the split
        trained) and what the run's monitors and data say (litlab.train.performance_record),
        for the main process's Run, which saw none of it (its summary had no epochs, no rates,
        FLOPs null, data.splits missing: the report compared such runs apart)."""
        from litlab.train import performance_record  # (litlab.train imports this module)

        return {
            **{key: self.run.summary[key] for key in SPAWNED_FIT if key in self.run.summary},
            **performance_record(trainer),
        }

    def take_spawned_record(self, record: dict[str, Any]) -> None:
        """In the main process: a fit's or test's ``spawned_record``, into the run."""
        self.run.take_spawned_record(record)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.run.epoch_ended("validated", trainer.current_epoch + 1)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a SIGTERM until .trained is written: held (train.py). Not on_train_end: the LR and
        # batch-size finders run the fit loop (its on_train_end) before training
        self.run.defer_stop()

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[SAVED_AT] = time.time_ns()
        if not self.saved:
            self.saved = True
            self.run.checkpoints_change()
            record_resume_overrides(self.run.dir)


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite `resume=<folder>` into the Hydra arguments that continue that run: its saved
    config, with what earlier resumes of it changed, then this command's overrides."""
    picks = [arg for arg in argv[1:] if arg.startswith("resume=")]
    if not picks:
        return argv
    folder = Path(picks[-1].split("=", 1)[1]).expanduser().resolve()
    saved = folder / ".hydra" / "config.yaml"
    if not saved.is_file():
        run = next((p for p in folder.parents if (p / ".hydra" / "config.yaml").is_file()), None)
        if folder.is_file() and run is not None:  # a checkpoint in it (resume= takes the newest)
            fail(f"{folder} is a file of the run folder {run}; pass resume={run}")
        jobs = sorted(
            (p.parent.parent.name for p in folder.glob("*/.hydra/config.yaml")),
            key=lambda name: (not name.isdigit(), int(name) if name.isdigit() else 0, name),
        )
        if jobs and (folder / "multirun.yaml").is_file():  # a sweep: its jobs are run folders
            fail(
                f"{folder} is a sweep's folder; resume= takes one of its jobs' folders "
                f"(resume={folder / jobs[0]}; jobs: {', '.join(jobs[:10])}"
                f"{', ...' if len(jobs) > 10 else ''})"
                + (
                    f"; its Optuna study continues with its -m command and hydra.sweeper.storage="
                    f"sqlite:///{folder}/optuna.db (README, Resume a study)"
                    if (folder / "optuna.db").is_file()
                    else ""
                )
            )
        fail(
            f"{folder} is not a litlab run folder (no .hydra/config.yaml); pass resume=<run folder>"
        )
    if global_rank() == 0 and (pid := process_of_a_live_run(read_summary(folder / "summary.json"))):
        fail(in_progress(folder, pid, f"resume={folder}"))
    given = [arg for arg in argv[1:] if not arg.startswith("resume=")]
    if not given:
        tell_a_completed_trial(folder)
    try:
        checkpoint = newest_checkpoint(folder)
    except ConfigError as e:
        fail(str(e))
    if checkpoint is None:
        fail(
            f"{folder} has no checkpoint to resume from (checkpoints/last.ckpt); start a new run instead"
        )
    args = [
        f"--config-path={saved.parent}",
        "--config-name=config",
        f"hydra.run.dir={folder}",
        "hydra.output_subdir=null",
    ]
    stopped_testing = _stopped_while_testing(folder)
    if given or not stopped_testing:
        args.append(f"ckpt_path={checkpoint}")
    # else: trained to its end, stopped before its test completed (a signal while testing):
    # the run is tested again in its folder, training nothing, as a requeued job is
    # (continue_in_place), and its summary gets the test's figures
    config = yaml.safe_load(saved.read_text())
    hydra_file = folder / ".hydra" / "hydra.yaml"
    hydra = yaml.safe_load(hydra_file.read_text())["hydra"] if hydra_file.is_file() else {}
    args += data_paths_from(config, (hydra.get("runtime") or {}).get("cwd"))
    wandb = (config.get("logger") or {}).get("wandb")
    if wandb:
        run_id = wandb_run_id(folder)
        if run_id:
            args.append(f"+logger.wandb.id={run_id}")
        if project := _first_project(folder, wandb):  # not WANDB_PROJECT as it is now: the run's id
            args.append(f"logger.wandb.project='{project}'")  # in another project: a new run
        if hydra:  # keep the run's name: what the original command changed
            original = hydra["job"].get("override_dirname", "")
            args.append(f"logger.wandb.overrides='{original}'")
            # and a sweep job's group (its sweep folder holds the job's: hydra.sweep.subdir)
            grouped = wandb.get("group") == "${sweep_group:}"
            if grouped and hydra.get("mode") == "MULTIRUN":
                group = group_of_sweep(
                    hydra["job"]["name"], study_folder(folder.parent, hydra.get("sweeper"))
                )
                args.append(f"logger.wandb.group='{group}'")
    # not Hydra's own flags, nor the run's own config group choices restated
    chosen = hydra.get("runtime", {}).get("choices", {})
    overrides = _unchosen(chosen, [arg for arg in given if not arg.startswith("-")])
    os.environ[_PENDING] = yaml.safe_dump({"folder": str(folder), "overrides": _carried(overrides)})
    flags = [arg for arg in given if arg.startswith("-")]
    changed = merged_overrides(_recorded_overrides(folder), overrides)
    tags = ",".join(_carried(changed))
    if wandb and tags and "'" not in tags:
        # the run keeps its name; what its resumes changed is tagged (resumed:trainer.max_epochs=2)
        args.append(f"+logger.wandb.resumed='{tags}'")
    return [argv[0], *args, *flags, *changed]


def data_paths_from(config: dict[str, Any], cwd: str | None) -> list[str]:
    """Overrides giving the run's relative local data paths (`data.source.root=images`) from
    the folder the run was started in (Hydra's runtime.cwd), as its checkpoints record them:
    a resume from another working directory looked for images/ there. (Interpolations,
    absolute paths, ~ and URLs are as they are.)"""
    source = (config.get("data") or {}).get("source")
    if not cwd or not isinstance(source, dict):
        return []
    given = []
    for key in DATA_PATH_KEYS:
        value = source.get(key)
        if local_path(value) and not os.path.isabs(value):
            path = os.path.normpath(os.path.join(cwd, value))
            given.append(
                f"data.source.{key}={path}" if "'" in path else f"data.source.{key}='{path}'"
            )
    return given


def _stopped_while_testing(folder: Path) -> bool:
    """Whether the run in ``folder`` trained to its end and its last part was stopped before
    its test completed: the .trained mark, no .completed, and the mark written by that last
    part (after it started). A later part that was stopped before its first checkpoint (an
    extension, `resume= trainer.max_epochs=<more>`, killed in its first epoch) leaves the
    earlier fit's mark: that is not a test to do again (it would end the run "completed" as
    it was before the extension, saying it was stopped testing)."""
    if not (folder / TRAINED).is_file() or (folder / COMPLETED).is_file():
        return False
    started = started_s(read_summary(folder / "summary.json"))
    if started is None:
        return False
    return (folder / TRAINED).stat().st_mtime >= started - 1  # (started_at: whole seconds)


def process_of_a_live_run(summary: dict[str, Any] | None) -> int | None:
    """The process of the run a summary says is running, where it runs on this machine and is
    the one that started it (files.run_process); None otherwise: gone (a run killed hard also
    left "running") or on another machine, where nothing can be told."""
    state, pid = run_process(summary)
    return pid if state == "alive" else None


def tell_a_completed_trial(folder: Path) -> None:
    """`resume=<job folder>` of a sweep's job that completed but whose Optuna trial its study
    never learned (a signal or a kill ended the sweep before its sweeper told it; the telling
    failed, a locked database): the study is told, and that is all (nothing is left to train)."""
    summary = read_summary(folder / "summary.json")
    if not summary or not summary.get("optuna_trial") or not (folder / COMPLETED).is_file():
        return
    from litlab.sweep import tell_the_study

    if said := tell_the_study(summary, folder):
        print(f"litlab: {folder} had completed; {said}")
        sys.exit(0)


def _config_groups() -> set[str]:
    """The config groups of litlab's conf/ tree (``logger``, ``model/net``, ...)."""
    root = Path(config_dir())
    return {str(d.relative_to(root)) for d in root.rglob("*") if d.is_dir()}


def _unchosen(chosen: dict[str, Any], overrides: list[str]) -> list[str]:
    """``overrides`` without config group choices (``trainer=ddp``, ``model/net=custom``): a
    resumed run's primary config is its saved, composed config, in which the groups are chosen
    already; Hydra would read ``logger=csv`` as the value of the key ``logger`` (a traceback
    later). The run's own choice restated (its command repeated with ``resume=``) is left out;
    another one is refused in one line. ``chosen``: the run's choices (.hydra/hydra.yaml's
    hydra.runtime.choices)."""
    groups = _config_groups()
    kept, changed = [], []
    for arg in overrides:
        key = override_key(arg)
        if "=" not in arg or key not in groups or arg.startswith("~"):
            kept.append(arg)
            continue
        choice = arg.split("=", 1)[1].strip("'\"")
        had = chosen.get(key)
        if choice == "null":  # none chosen: the same, or as a value of the saved config
            if had is not None:  # (logger=null: no loggers, as before)
                kept.append(arg)
        elif str(had) != choice:
            changed.append(f"{key}={choice} (the run has {f'{key}={had}' if had else 'none'})")
    if changed:
        fail(
            f"resume= continues the run's saved config, whose config groups are chosen: "
            f"{', '.join(changed)}; set the keys to change instead (e.g. trainer.devices=2), "
            f"or start a new run with that choice"
        )
    return kept


def continue_in_place(cfg: DictConfig, run: Run | None = None) -> dict[str, Any] | None:
    """A training run that starts in a folder holding its own checkpoints continues from them.

    That is a requeued cluster job: SLURM (the run folder is fixed per job, see
    run_dir) or submitit (the sweep folder is fixed) starts the same
    command again after a preemption. The newest checkpoint and the folder's W&B run are
    picked up, as ``resume=<folder>`` would. Checkpoints of a run with another config are
    never trained over: that is one clear error. A run that completed there (its ``.completed``
    mark; a batch script's earlier command, requeued with the rest) is left as it is:
    AlreadyCompleted, which the run ends with nothing trained. One that trained to its end and
    was stopped after (its ``.trained`` mark alone: preempted while testing) is tested again,
    as the first part would have: ``train`` off, ``ckpt_path`` the checkpoint it chose, and the
    fit's record (metrics, checkpoints, best score: the objective) into ``run``'s summary.
    Returns the checkpoint it continues from, loaded (so that it is read once), or None.
    """
    if cfg.get("ckpt_path") or not cfg.get("train"):
        return None
    folder = checkpoint_folder(cfg.paths.output_dir, f"{cfg.paths.log_dir}/{cfg.task_name}")
    completed = (folder / COMPLETED).is_file()  # the same run, finished (a requeued script)
    trained = read_summary(folder / TRAINED)  # ... trained to its end, the rest not done
    done = _completed(folder)
    try:
        path = newest_checkpoint(folder)
    except ConfigError:  # sharded FSDP checkpoints: of a finished run, left as they are
        if completed or trained:
            raise done from None
        raise
    if path is None:
        if completed or trained:  # finished without a resumable checkpoint (last_checkpoint=null)
            raise done
        return None
    checkpoint = load_checkpoint(path)
    stored = stored_config(checkpoint, path)
    take_tuned_values(cfg, stored)
    then, now = str(stored.trainer.get("precision")), str(cfg.trainer.get("precision"))
    requested = (run.summary.get("precision") or {}).get("requested") if run else None
    if then != now and requested == "auto":
        # requeued on another kind of machine (a partition of mixed nodes): auto picks anew
        log.warning(
            "trainer.precision=auto: the run in %s trained at %s, this machine runs %s; "
            "continuing at %s",
            folder,
            then,
            now,
            now,
        )
        with open_dict(stored):
            stored.trainer.precision = now
    if config_digest(stored) != config_digest(cfg):  # where it writes, its loggers aside
        # (a completed run: its plain resume= is refused as trained to its end: walkthrough 186)
        further = " trainer.max_epochs=<more>" if completed else ""
        go_on = "train that run further" if completed else "continue that run"
        raise ConfigError(
            f"{folder} already holds checkpoints of a run with another config; {go_on} with: "
            f"{as_launched(f'python train.py resume={folder}{further}')}, or train in a new "
            "folder"
        )
    if completed:
        raise _completed(folder, checkpoint)
    wandb = (cfg.get("logger") or {}).get("wandb")
    run_id = wandb_run_id(folder)
    if wandb and run_id and not wandb.get("id"):
        with open_dict(wandb):
            wandb.id = run_id
    if trained is not None:
        tested = trained.get("best_checkpoint") or trained.get("last_checkpoint") or str(path)
        log.warning(
            "the run in %s trained to its end and was stopped before it completed: "
            "testing %s again, training nothing",
            folder,
            Path(tested).name,
        )
        cfg.train, cfg.ckpt_path = False, tested
        if run is not None:
            run.take_fit_record(trained)
        return checkpoint if Path(tested) == path else None
    log.warning("continuing the interrupted run in %s from %s", folder, path.name)
    cfg.ckpt_path = str(path)
    return checkpoint


def _completed(folder: Path, checkpoint: dict[str, Any] | None = None) -> AlreadyCompleted:
    """A completed run found again in its folder, with how to train it further: more epochs, or
    where early stopping ended it (its checkpoint says so) a resume, which waits its patience
    again (litlab.callbacks.EarlyStopping)."""
    further = "trainer.max_epochs=<more>"
    if checkpoint is not None and _stopped_by_patience(checkpoint):
        further = "(early stopping ended it: a resume waits its patience again)"
    return AlreadyCompleted(  # (under srun or torchrun, with its layout: walkthrough 184)
        f"{folder} holds a run that completed: nothing to train (train it further with: "
        f"{as_launched(f'python train.py resume={folder} {further}')})"
    )


def _stopped_by_patience(checkpoint: dict[str, Any]) -> bool:
    """Whether an EarlyStopping callback's state in ``checkpoint`` says it stopped the run in
    the checkpoint's epoch for want of improvement (Lightning's EarlyStoppingReason.
    PATIENCE_EXHAUSTED, 3; a reason restored from an earlier stop stays, with its epoch)."""
    for state in early_stopping_states(checkpoint):
        stopped = state.get("stopped_epoch")
        if state.get("stopping_reason", 3) == 3 and stopped == checkpoint.get("epoch") != 0:
            return True
    return False


# -- SLURM: a requeued job finds its run folder ------------------------------------------------


def slurm_job(step: bool = True) -> str | None:
    """This SLURM job's id (array jobs: <job>_<task>; srun steps: .<step> unless ``step`` is
    false, as scontrol names the job), None outside one.

    An allocation used by hand (job name "bash" or "interactive", as Lightning's SLURM
    detection has it) is not a job to requeue: None.
    """
    if "SLURM_JOB_ID" not in os.environ or os.environ.get("SLURM_JOB_NAME") in (
        "bash",
        "interactive",
    ):
        return None
    job = os.environ["SLURM_JOB_ID"]
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    step_id = os.environ.get("SLURM_STEP_ID") if step else None
    return f"{job}.{step_id}" if step_id else job


def slurm_attempt() -> int:
    """How many times SLURM has requeued this job (0 on its first run)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


_CLAIM = ".slurm-attempt"


def _claim_slurm_folder(base: str, job: str) -> str:
    """The folder of this run in the job: <job>, then <job>-1, <job>-2, ... for the second,
    third, ... run of the same job step (a batch script that trains several times), each
    marked with the attempt that took it. A requeued attempt takes them again in the same
    order, so every run of the script finds its own folder."""
    attempt, k = slurm_attempt(), 0
    while True:
        folder = Path(base, "slurm", job if k == 0 else f"{job}-{k}")
        claim = folder / _CLAIM
        taken = int(claim.read_text() or -1) if claim.is_file() else None
        if not folder.exists() or (taken is not None and taken < attempt):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                # one run per folder and attempt, also for runs started at once (`python
                # train.py ... &` twice in a script): creating this file is atomic
                os.close(os.open(folder / f"{_CLAIM}-{attempt}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:  # another run of this attempt took it a moment ago
                k += 1
                continue
            except OSError:  # unwritable: the output-folder check says so in one line
                return str(folder)
            claim.write_text(str(attempt))
            return str(folder)
        k += 1


def run_dir(base: str, stamp: str) -> str:
    """Hydra resolver for the folder of a single run: ``<base>/<stamp>`` (date/time) by default.

    In a SLURM job it is ``<base>/slurm/<job id>[.<step>]``: when SLURM requeues the job
    (preemption, time limit) the same command starts again in the same folder and continues
    from its checkpoints (litlab.resume.continue_in_place). Ranks other than 0 of an srun
    step write their Hydra files to a scratch folder, as under torchrun.
    """
    job = slurm_job()
    if job is not None and global_rank() == 0:
        return _claim_slurm_folder(base, job)
    return rank0_dir(f"{base}/{stamp}")


def checkpoint_folder(output_dir: str, base: str) -> Path:
    """The run folder as global rank 0 has it (where the run's checkpoints are).

    Ranks other than 0 of a requeued srun step whose run folder litlab chose (run_dir) have a
    scratch output folder; an srun step runs one command, so rank 0's folder is the step's
    first: <base>/slurm/<job>.<step>. Where every rank has the run folder itself (submitit's
    sweep job folder, a hydra.run.dir given), that is where the checkpoints are: redirected
    there, rank 1 of a requeued submitit job found none, started afresh beside rank 0's
    resumed run, and the two hung.
    """
    job = slurm_job()
    requeued_rank = job is not None and global_rank() != 0 and slurm_attempt() > 0
    if requeued_rank and is_rank_scratch(output_dir):
        return Path(base, "slurm", job)
    return Path(output_dir)
