"""Hydra callback that closes a sweep: which job won, with which overrides, where it lives."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from litlab.config import SQLITE, sqlite_file
from litlab.distributed.launchers import (
    check_local_tasks,
    global_rank,
    is_rank_scratch,
    launched_processes,
    rank_scratch,
)
from litlab.errors import ConfigError, fail, first_line
from litlab.files import resumable_checkpoints
from litlab.overrides import SEEDS, TUNED_KEYS, override_key
from litlab.report.runs import natural_key, objective_scale, run_overrides
from litlab.run import write_json

log = logging.getLogger("litlab.sweep")


class _FailedTrialLine(logging.Filter):
    """Hydra's Optuna sweeper's line for a trial whose job returned no value, which litlab's
    does for a job that failed or was stopped (said above it, and in its folder): "Failed
    experiment: Return value must be float-castable. Got 'None'." read as a bug of the
    objective. Said as what it is."""

    NO_VALUE = "Failed experiment: Return value must be float-castable. Got 'None'."

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == self.NO_VALUE:
            record.msg, record.args = (
                "the job gave no value (failed or stopped: said above): its trial is FAIL",
                (),
            )
        return True


logging.getLogger("hydra_plugins.hydra_optuna_sweeper._impl").addFilter(_FailedTrialLine())


def read_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """summary.json of every job below a sweep folder, with the job folder and its overrides,
    in the jobs' order (the first of jobs tied on the objective is the best, as in the report
    and Optuna)."""
    jobs = []
    for path in sorted(sweep_dir.rglob("summary.json"), key=natural_key):  # 0, 1, 2, ..., 10
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        summary["job_dir"] = str(path.parent)
        # as YAML (Hydra quotes some and folds long ones), with what a resume= changed since
        summary["overrides"] = run_overrides(path.parent)
        jobs.append(summary)
    return jobs


def scored_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The completed jobs with an objective value."""
    scored = []
    for job in jobs:
        value = (job.get("objective") or {}).get("value")
        if job.get("status") == "completed" and value is not None and not math.isnan(value):
            scored.append(job)
    return scored


def objective_of(job: dict[str, Any]) -> tuple[str, str, str]:
    """A job's objective metric, mode and scale (an FID's extractor and counts)."""
    objective = job.get("objective") or {}
    return objective.get("metric"), objective.get("mode"), objective_scale(job)


def best_job(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The completed job with the best objective value (max or min, as its objective says),
    among the jobs of the most common objective: values of another metric, or of an FID through
    another extractor or at other counts, do not compare (as in litlab.report)."""
    scored = scored_jobs(jobs)
    if not scored:
        return None
    common = Counter(map(objective_of, scored)).most_common(1)[0][0]
    same = [job for job in scored if objective_of(job) == common]
    sign = 1.0 if common[1] == "max" else -1.0
    return max(same, key=lambda job: sign * job["objective"]["value"])


TRIALS = "optuna_trials.json"  # in a sweep folder: which Optuna trial each job is


def study_url(storage: str) -> str:
    """A study storage that a run continued from another directory still finds (a relative
    SQLite path is relative to where the sweep started)."""
    database = sqlite_file(storage)
    return storage if database is None else SQLITE + str(database.resolve())


def record_asked_trials(
    sweep_dir: str, first_job: int, trials: list[Any], storage: str | None, study: str
) -> None:
    """Write down, before their jobs run, which trial of which study each job of a batch is
    (the jobs' numbers from ``first_job``): a job a signal stopped leaves its trial RUNNING in
    the study, and ``resume=`` of its folder then tells the study its value (tell_the_study).
    Nothing for a study held in memory (gone with the sweep), nor from ranks other than 0 (they
    ask a copy)."""
    if storage is None or global_rank() != 0:
        return
    path = Path(sweep_dir) / TRIALS
    jobs: dict[str, int] = {}
    if first_job > 0:  # a later batch of this sweep (the first starts the file afresh)
        with contextlib.suppress(OSError, ValueError, KeyError):
            jobs = json.loads(path.read_text())["jobs"]
    jobs.update({str(first_job + i): trial.number for i, trial in enumerate(trials)})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"storage": study_url(storage), "study_name": study, "jobs": jobs})


def asked_trial() -> dict[str, Any] | None:
    """In a job of litlab's Optuna sweeper: its trial (summary.json's "optuna_trial")."""
    from hydra.core.hydra_config import HydraConfig

    from litlab.config import in_sweep

    if not in_sweep():
        return None
    hydra = HydraConfig.get()
    if not str(hydra.sweeper.get("_target_", "")).endswith("LitlabOptunaSweeper"):
        return None
    try:
        known = json.loads((Path(hydra.sweep.dir) / TRIALS).read_text())
        number = known["jobs"].get(str(hydra.job.num))
    except (OSError, ValueError, KeyError):
        return None
    if number is None:
        return None
    return {"study_name": known["study_name"], "storage": known["storage"], "number": number}


def sweep_storage(storage: str, sweep_dir: Path) -> str:
    """The storage of a sweep's study: the one recorded when its jobs were asked, unless the
    sweep folder holds a study file of its own (optuna.db) that is another: the folder was
    copied or moved with its study, whose jobs then told the original study (or none)."""
    local = sweep_dir.resolve() / "optuna.db"
    recorded = sqlite_file(storage)
    if recorded is not None and local.is_file() and recorded.resolve() != local:
        return SQLITE + str(local)
    return storage


def tell_the_study(summary: dict[str, Any], job_dir: Path) -> str | None:
    """The result of a job of an Optuna sweep whose trial the sweeper never told (a signal
    stopped the sweep: the trial stayed RUNNING), told now as the sweeper would have: the
    objective of a completed run, FAIL for one completed without it. Only a run of the trial's
    own config (its job continued by ``resume=`` as it was: not trained further, nor only
    tested): another config's value is not the trial's, and the trial stays RUNNING (said so).
    A run that failed is not told (resume= it again), nor a trial the study holds as finished.
    Returns what the study was told, None when nothing was; never raises (the run is recorded
    all the same)."""
    trial = summary.get("optuna_trial")
    if not trial or summary.get("status") != "completed":
        return None
    try:
        storage = sweep_storage(str(trial["storage"]), job_dir.resolve().parent)
        name, number = trial["study_name"], trial["number"]
        database = sqlite_file(storage)
        if database is not None and not database.is_file():
            log.warning(
                "the Optuna study %s (%s) is gone: its trial %d is not told this run's result",
                name,
                storage,
                number,
            )
            return None
        import optuna

        study = study_running(storage, name, number)
        if study is None:
            return None
        # (said of a RUNNING trial only: a finished one was said to stay RUNNING; 146)
        if summary.get("config_digest") != trial.get("config_digest"):
            log.warning(
                "the Optuna study %s's trial %d is not told this run's result: the run's config "
                "is not its trial's (a resume with other settings); it stays RUNNING",
                name,
                number,
            )
            return None
        value = (summary.get("objective") or {}).get("value")
        if value is not None and not math.isnan(value):
            study.tell(number, float(value))
            said = f"{summary['objective']['metric']}={value:.6g}"
        else:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
            said = "failed (no objective)"
    except Exception as e:  # a study locked, moved, or optuna not installed
        other = summary.get("config_digest") != trial.get("config_digest")  # never told (149)
        log.warning(
            "the Optuna study of trial %s could not be read (%s)%s",
            trial.get("number"),
            first_line(e),
            ": this run's config is not its trial's, so it is not told this run's result"
            if other
            else "; resume= its folder again to tell it this run's result",
        )
        return None
    return f"the Optuna study {name} now holds its trial {number}: {said}"


def launches_in_process(config: DictConfig) -> bool:
    """Whether the sweep's jobs run in its own process (Hydra's basic launcher): when the sweep
    ends, none of them runs on. Under submitit (SLURM) or joblib a job may still run, or be
    requeued, after the sweep's process ended, and its trial is told when it completes."""
    return OmegaConf.select(config, "hydra.launcher._target_") == IN_PROCESS_LAUNCHER


def tell_stopped_batch(sweep_dir: str, trials: list[int], in_process: bool) -> None:
    """A sweep a signal stopped: the jobs of the stopped batch (its ``trials``: the sweeper
    told every batch before it) that completed (hydra.sweeper.n_jobs > 1) are told to the study
    now, as the sweeper would have told them. Jobs run in the sweep's process
    (``in_process``) that it stopped before their first checkpoint (Ctrl-C in the first epoch,
    or in the data's setup) are told FAIL: resume= has nothing to continue them from, and
    their trials stayed RUNNING for good. A job stopped later stays RUNNING until
    ``resume=<job folder>`` completes it (tell_the_study)."""
    for job in read_jobs(Path(sweep_dir)):
        trial = job.get("optuna_trial") or {}
        if trial.get("number") not in trials:
            continue
        if said := tell_the_study(job, Path(job["job_dir"])):
            log.info("%s", said)
            continue
        stopped = in_process and job.get("status") == "interrupted"
        if stopped and not resumable_checkpoints(Path(job["job_dir"])):
            tell_failed(trial, f"its job {job['job_dir']} stopped before its first checkpoint")


def study_running(storage: str, name: str, number: int) -> Any:
    """The Optuna study ``name`` where its trial ``number`` is still RUNNING (to be told);
    None where the study has it finished. Raises where the study cannot be loaded (a SQLite
    file gone is not made anew, empty)."""
    import optuna

    database = sqlite_file(storage)
    if database is not None and not database.is_file():
        raise FileNotFoundError(f"{database} is gone")
    study = optuna.load_study(study_name=name, storage=storage)
    (held,) = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    return study if held.state == optuna.trial.TrialState.RUNNING else None


def tell_failed(trial: dict[str, Any], why: str) -> None:
    """Tell an Optuna study that its RUNNING trial (a job's "optuna_trial") failed, and why."""
    try:
        import optuna

        study = study_running(trial["storage"], trial["study_name"], trial["number"])
        if study is None:
            return
        study.tell(trial["number"], state=optuna.trial.TrialState.FAIL)
    except Exception as e:  # a study locked or moved: the trial stays RUNNING
        log.warning("the Optuna study of trial %s was not told: %s", trial.get("number"), e)
        return
    log.warning(
        "the Optuna study %s holds trial %d as failed: %s",
        trial["study_name"],
        trial["number"],
        why,
    )


def fail_unrun_trials(
    sweep_dir: str, storage: str | None, study: str | None, trials: list[int], in_process: bool
) -> None:
    """A launch that failed itself (a job's config could not be composed: a typo in a search
    parameter, ``model.net.widht=choice(16,32)``): the batch's trials (``trials``) whose jobs
    completed are told as the sweeper would have told them; where the jobs ran in the sweep's
    process (``in_process``: none runs on), those still RUNNING are told FAIL. Left RUNNING,
    they stayed so for good (no job folder for resume= to tell them), and a continued study
    counted them as trials in flight. Under submitit or joblib the other jobs of the batch may
    still run (one job lost on the cluster raises here): their trials are left to them."""
    tell_stopped_batch(sweep_dir, trials, in_process)
    for number in trials if storage is not None and in_process else []:
        trial = {"study_name": study, "storage": storage, "number": number}
        tell_failed(trial, "the launch of its job failed")


def continued_sampler(
    sampler: Any, config: DictConfig, storage: str | None, study: str | None
) -> Any:
    """The sampler for a study continued from its storage (README: resume a study): seeded past
    the trials the study holds. Seeded as the first launch was, it would draw that launch's
    first trials again (TPE's random start-up trials: the same parameters, one more time)."""
    seed = config.get("seed")
    study_held = _held_study(storage, study) if seed is not None else None
    if study_held is None:  # (a new study)
        return sampler
    held = study_held.get_trials(deepcopy=False)
    # Left RUNNING before this process started: a sweep a signal stopped (or a crashed launch)
    started = _process_started()
    running = [t.number for t in held if _running_before(t, started)]
    if running and global_rank() == 0:
        log.info(
            "trial(s) %s of the study are RUNNING since before this sweep: in a sweep that runs "
            "now, or left so by one a signal stopped (the study learns it when its job is "
            "continued with resume=<job folder>)",
            ", ".join(map(str, running)),
        )
    # Finished ones and those: every rank counts alike (under torchrun or srun another rank's
    # trial may already be running in a shared study: rank_storage copies the same ones).
    # Counting the finished alone, a study stopped in its first trials drew them again.
    trials = sum(t.state.is_finished() for t in held) + len(running)
    if trials == 0:
        return sampler
    log.info("the study holds %d trials: its sampler's seed is %d + %d", trials, seed, trials)
    return instantiate(config, seed=seed + trials)


def rank_storage(storage: str | None, study: str | None) -> str | None:
    """The study storage this process asks and tells. Under torchrun or srun every rank runs
    the sweep in step; where they share a storage (a study continued from it, or
    hydra.sweep.dir given), global rank 0 uses it and every other rank a copy of its finished
    trials in its own scratch folder, so that the ranks draw the same trials and each is
    recorded once. Asking the shared study, every rank recorded every trial, and a rank that
    saw rank 0's running trial drew other parameters (ranks training different nets in one
    DDP job: a crash, or for a learning rate, silently different optimizers)."""
    if storage is None or launched_processes() <= 1:
        return storage
    database = sqlite_file(storage)
    if database is not None and is_rank_scratch(database):
        return storage  # this rank's own (the default, in its scratch sweep folder)
    import optuna

    try:
        shared = optuna.load_study(study_name=study, storage=storage)
    except KeyError:  # a new study: rank 0 makes it, every other rank its own
        shared = None
    trials = shared.get_trials(deepcopy=False) if shared is not None else []
    waiting = [t.number for t in trials if t.state == optuna.trial.TrialState.WAITING]
    if waiting:  # rank 0 would take them, the others draw (every rank checks before it asks)
        fail(
            f"the study in {storage} holds enqueued trials ({waiting}), which under torchrun or "
            "srun only rank 0 would run while the other ranks drew others; run them in one "
            "process (or with Lightning's launcher: trainer.devices=N), then continue the study"
        )
    if global_rank() == 0:
        return storage
    folder = rank_scratch()
    folder.mkdir(parents=True, exist_ok=True)
    local = SQLITE + str(Path(tempfile.mkdtemp(dir=folder, prefix="study-")) / "optuna.db")
    if shared is None:
        return local
    # Finished before this process started, as rank 0 saw them when it began (a trial rank 0
    # has run since, failed before its ranks met, would change this rank's history and seed).
    started = _process_started()
    before = [
        t
        for t in trials
        if (
            t.state.is_finished()
            and t.datetime_complete is not None
            and t.datetime_complete.timestamp() < started
        )
        or _running_before(t, started)
    ]
    copy = optuna.create_study(study_name=study, storage=local, directions=shared.directions)
    copy.add_trials(before)
    return local


def _running_before(trial: Any, started: float) -> bool:
    """Whether a trial was RUNNING already at ``started`` (this process's start: another
    launch's)."""
    import optuna

    if trial.state != optuna.trial.TrialState.RUNNING or trial.datetime_start is None:
        return False
    return trial.datetime_start.timestamp() < started


def refuse_a_search_space(error: ValueError) -> None:
    """One line where Optuna refused the study's search space before any trial ran (a range
    whose low is above its high: ``interval(0.01,0.001)``, ``range(64,16)``): the sweeper took
    its ValueError for a sweep whose trials all failed, and the sweep ended with status 0 and
    no reason (walkthrough 146)."""
    if "Record does not exist" in str(error):  # no trial at all (n_trials=0): not the space
        return
    fail(
        f"the Optuna study cannot search its parameters ({first_line(error)}); correct the "
        "search space (hydra.sweeper.params, or the command's interval(low,high), "
        "range(start,stop), choice(...))"
    )


def drop_empty_sweep_folder(sweep_dir: str) -> None:
    """A sweep refused before any trial: its folder (made for the study's SQLite file) goes
    where nothing was written into it, and its parent (the date's) where that is then empty;
    not a folder that was there before this process started (one the user made)."""
    release_the_sweep_folder(sweep_dir, remove=True)
    folder, started = Path(sweep_dir), _process_started()
    # By times (Hydra makes the sweep folder before any callback can look); the parent only
    # where it is the date folder of Hydra's default layout: its time changes as the sweep
    # folder is made in it, so any parent read as new (a test's tmp_path, a user's empty
    # folder were removed; one named like a date, made earlier, still goes: review 180)
    dated = re.fullmatch(r"\d{4}-\d{2}-\d{2}", folder.parent.name) is not None
    for empty in (folder, folder.parent) if dated else (folder,):
        try:
            if empty.stat().st_mtime < started:  # there before this process: the user's
                return
            empty.rmdir()  # only an empty folder
        except OSError:
            return


# Whether a sweep's study's SQLite file was there as the multirun began (SweepSummary.
# on_multirun_start): a refused sweep removes it only where it made it (a file's time changes
# as a study is added to it: a user's file of an empty study went, review 180)
_EXISTED: dict[Path, bool] = {}


def remember_what_exists(database: Path | None) -> None:
    if database is not None:
        _EXISTED[database.resolve()] = database.exists()


def made_here(path: Path) -> bool | None:
    """Whether this process's multirun made ``path``; None where it did not look."""
    existed = _EXISTED.get(path.resolve())
    return None if existed is None else not existed


def drop_an_unused_study(storage: str | None) -> None:
    """A study's SQLite file that this process made and no trial was written into (a search
    space refused before the first: walkthrough 176 found the sweep folder left holding
    optuna.db alone, which the report then called "no run folders"); a file there before, or
    holding any trial, stays."""
    import optuna

    database = sqlite_file(storage)
    try:
        made = None if database is None else made_here(database)
        if database is None or made is False:
            return
        if made is None and database.stat().st_mtime < _process_started():
            return
        studies = optuna.get_all_study_summaries(storage=storage)
        if all(summary.n_trials == 0 for summary in studies):
            database.unlink()
    except Exception:  # (unreadable: left as it is)
        return


def drop_rank_storage(storage: str | None, used: str | None) -> None:
    """Delete the copy rank_storage made (``used``, when not ``storage`` itself)."""
    copy = sqlite_file(used)
    if copy is not None and used != storage:
        shutil.rmtree(copy.parent, ignore_errors=True)


def refuse_an_unseeded_grid(sampler: Any) -> None:
    """Optuna's GridSampler picks its next point at random with Python's unseeded generator:
    under torchrun or srun, where every rank runs the sweep, the ranks would train other
    points in one DDP job."""
    if launched_processes() > 1 and "GridSampler" in str(sampler.get("_target_")):
        fail(
            "hydra/sweeper/sampler=grid draws its points unseeded, so under torchrun or srun "
            "each rank would train another one; for a grid use Hydra's own sweep (python "
            "train.py -m key=a,b,c), or the TPE or random sampler"
        )


def _process_started() -> float:
    """When this process started (epoch seconds, to 10 ms): Linux's /proc (its age: the
    system's uptime less the uptime at which it started; /proc/stat's boot time is whole
    seconds), else when this module loaded."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _LOADED


_LOADED = time.time()


# The sweep folders this process holds (claim_the_sweep_folder), each by its lock.
_CLAIMED: dict[Path, Any] = {}


def claim_the_sweep_folder(config: DictConfig) -> None:
    """One sweep at a time in a sweep folder: a lock on <sweep dir>/.sweep.lock, held by global
    rank 0's process while it runs its sweep, which the system lets go however the process
    ends (kill -9 too). Two sweeps started together into one hydra.sweep.dir each found it
    empty, and their jobs wrote into the same job folders (review 187: a job's config of one
    sweep beside the checkpoints of the other's, the best job named with the wrong overrides);
    the same grid run again while it ran continued its live jobs. Where the file system has
    no locks (NFS without lockd): said, and the sweep goes on without."""
    if global_rank() != 0:
        return
    from filelock import FileLock, Timeout

    folder = Path(config.hydra.sweep.dir).resolve()
    if folder in _CLAIMED:
        return
    path = folder / ".sweep.lock"
    lock = FileLock(str(path))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        fail(
            f"hydra.sweep.dir={folder} is in use by a sweep that runs now (another process "
            f"holds {path}); wait for it to end, or give this sweep another hydra.sweep.dir"
        )
    except OSError as e:
        log.warning(
            "%s: not locked (%s): a sweep started into it meanwhile is not refused", path, e
        )
        return
    _CLAIMED[folder] = lock


def release_the_sweep_folder(sweep_dir: str, remove: bool = False) -> None:
    """Let go of the sweep folder claim_the_sweep_folder took (the sweep ended); ``remove``:
    its lock file too (a sweep refused before any job: its folder goes if nothing else is in
    it)."""
    folder = Path(sweep_dir).resolve()
    lock = _CLAIMED.pop(folder, None)
    if lock is not None:
        lock.release()
        if remove:
            with contextlib.suppress(OSError):
                (folder / ".sweep.lock").unlink()


def refuse_a_used_sweep_folder(config: DictConfig) -> None:
    """One line where hydra.sweep.dir holds the jobs of another sweep (hydra.sweep.dir given
    again): Hydra numbers a sweep's jobs from 0 and writes each job's .hydra files into its
    folder before the job starts, so an earlier job's config and overrides were replaced, and
    the job then refused its checkpoints (another config's) while its summary.json stayed:
    the sweep named the earlier score best with the new overrides. The same grid sweep run
    again (a requeued SLURM job's command: the same overrides, jobs numbered as before) goes
    on, its jobs continuing in place; an Optuna study draws other trials, so it goes to a new
    folder (README: continue a study). Jobs are the earlier sweep's when written before this
    process started: every rank decides alike, also where ranks share the folder (torchrun or
    srun with hydra.sweep.dir given), whatever rank 0 has written since. A subdir other than
    the job number (override_dirname, a time) is the user's own scheme: left alone."""
    sweep = config.hydra.sweep
    subdir = OmegaConf.to_container(sweep, resolve=False).get("subdir")
    sweep_dir = Path(sweep.dir)
    if subdir != "${hydra.job.num}" or not sweep_dir.is_dir():
        return
    started = _process_started()
    earlier = sorted(
        p.parent.parent
        for p in sweep_dir.rglob(".hydra/overrides.yaml")
        if p.stat().st_mtime < started
    )
    if not earlier:
        return
    previous = sweep_dir / "multirun.yaml"
    if "BasicSweeper" in str(config.hydra.sweeper.get("_target_")) and previous.is_file():
        before = OmegaConf.load(previous).hydra.overrides.task
        if same_grid(list(before), list(config.hydra.overrides.task)):
            return
    fail(
        f"hydra.sweep.dir={sweep_dir} holds the jobs of another sweep ({len(earlier)}, e.g. "
        f"{earlier[0]}), which this one's would write over; choose a new folder (to continue "
        f"an Optuna study: hydra.sweeper.storage=sqlite:///<its folder>/optuna.db and a new "
        f"hydra.sweep.dir)"
    )


def same_grid(before: list[str], now: list[str]) -> bool:
    """Whether two grid sweeps' overrides launch the same jobs under the same numbers, as
    Hydra's basic sweeper expands them (a key given twice: its last value, at its first place;
    the jobs numbered in the order of the swept keys), each job's overrides in any order
    (walkthrough 146: the same grid, two fixed keys given in another order, was refused as
    another sweep; review 149: compared as strings, a repeated key passed for the same)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def jobs(overrides: list[str]) -> list[list[str]]:
        (batch,) = BasicSweeper.split_arguments(parser.parse_overrides(overrides), None)
        return [sorted(job) for job in batch]

    try:
        return jobs(before) == jobs(now)
    except Exception:  # a sweep Hydra's basic sweeper does not expand: not the same
        return False


def _searched(arguments: list[str], params: Any, prefixed: bool = False) -> list[tuple[str, str]]:
    """What an Optuna study searches: (key, as given) of each sweep on its command line, as
    Hydra's parser reads them (``seed=${oc.env:SEED,1}`` or ``seed=[1,2]`` are single values),
    then of each of its ``hydra.sweeper.params``; the keys without a leading + or ~, unless
    ``prefixed``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def name(key: Any) -> str:
        return str(key) if prefixed else str(key).lstrip("+~")

    swept = [
        (name(o.get_key_element()), o.input_line)
        for o in OverridesParser.create().parse_overrides(arguments)
        if o.is_sweep_override()
    ]
    return swept + [(name(k), f"hydra.sweeper.params.{k}={v}") for k, v in (params or {}).items()]


def _held_study(storage: str | None, study: str | None) -> Any:
    """The study ``study`` as its storage holds it; None for a new one (or no storage)."""
    if storage is None:
        return None
    import optuna

    try:
        return optuna.load_study(study_name=study, storage=storage)
    except (KeyError, ValueError):  # a new study
        return None


def config_dir_arguments(config: DictConfig) -> list[str]:
    """Where the sweep found configs of the user's own, as its command gave it: --config-dir
    (Hydra's command-line config source) and hydra.searchpath overrides; the job's own
    command lost them (walkthrough 173: "Could not find 'experiment/<theirs>'")."""
    given = [
        shlex.quote(str(o))
        for o in OmegaConf.select(config, "hydra.overrides.hydra", default=None) or []
        if str(o).lstrip("+").startswith("hydra.searchpath=")
    ]
    sources = OmegaConf.select(config, "hydra.runtime.config_sources", default=None) or []
    for source in sources:
        if source.get("provider") == "command-line" and source.get("schema") == "file":
            given.insert(0, f"--config-dir {shlex.quote(str(source.get('path')))}")
    name = OmegaConf.select(config, "hydra.job.config_name", default=None)
    if name and name != "train":  # a primary config of one's own (review 175)
        given.insert(0, f"--config-name {shlex.quote(str(name))}")
    return given


def run_again(overrides: list[str], where: list[str] | None = None) -> str:
    """The command that trains a sweep's job again, alone: its overrides but the search's
    (hparams_search, which makes a run a sweep again: pasted, a job's overrides started a new
    study of identical trials, walkthrough 163), with the config group choices the search's
    config made (dcgan_optuna: model=dcgan) that the overrides do not, and not Hydra's (hydra.*)."""
    chosen = {override_key(o) for o in overrides}
    kept: list[str] = []
    for o in overrides:
        key = override_key(o) or ""
        if key == "hparams_search":
            made = search_choices(o.split("=", 1)[1])
            kept += [c for c in made if override_key(c) not in chosen]
        elif not key.startswith("hydra."):
            kept.append(o)
    return " ".join(["python train.py", *(where or []), *kept])


def search_choices(option: str) -> list[str]:
    """The config group choices (``group=option``) an hparams_search option's defaults make
    besides its sweeper's: dcgan_optuna's ``override /model: dcgan``."""
    from litlab.config import config_dir

    path = Path(config_dir()) / "hparams_search" / f"{option}.yaml"
    defaults = OmegaConf.load(path).get("defaults") if path.is_file() else None
    choices = []
    for entry in defaults or []:
        for key, value in entry.items() if OmegaConf.is_dict(entry) else []:
            group = str(key).removeprefix("override").strip().lstrip("/")
            if not group.startswith("hydra/"):
                choices.append(f"{group}={value}")
    return choices


def refuse_a_tuned_seed(arguments: list[str], params: Any) -> None:
    """One line where an Optuna study would search over a seed (``-m hparams_search=...
    seed=1,2,3``: the Optuna sweeper turns a swept value into a parameter of the search, whose
    best trial is then a lucky seed, not a mean over seeds). Sweeps as Hydra's parser reads
    them (``seed=${oc.env:SEED,1}`` or ``seed=[1,2]`` are single values)."""
    swept = [given for key, given in _searched(arguments, params) if key in SEEDS]
    if swept:
        fail(
            f"the Optuna study would tune a seed ({', '.join(swept)}) and name a lucky one "
            f"best; give the study one seed, then repeat its best trial over seeds: the "
            f"command its sweep's last line gives to train it again, with -m seed=1,2,3"
        )


# What an objective value measures besides the model: the data it is validated on and how.
# An Optuna study searching over one of these ranks values of different measures as one.
# ("data" itself: the data group's choice; below it, the keys listed, but how images are
# prepared for the net, a setting to tune like any other: size, channels, normalization.)
# (trainer.limit_val_batches: a trial scored on part of the validation split was ranked with
# the others, and could be named the study's best: walkthrough 146)
_MEASURE_KEYS = ("objective", "data.source", "data.val_fraction", "data.num_classes")
_MEASURE_KEYS += ("data.eval_crop", "model.tta_flip", "callbacks.fid", "trainer.limit_val_batches")
_PREPARATION = frozenset({"data.image_shape", "data.mean", "data.std"})
_PREPARATION |= {"data.source.size", "data.source.channels"}
# what else the objective's value depends on, kept in the study with its metric and data
_MEASURED_BY = ("data.eval_crop", "model.tta_flip", "callbacks.fid", "trainer.limit_val_batches")


def _measures(key: str) -> bool:
    """Whether a config key (an override's, a search parameter's) changes what the objective
    measures: the data choice or a setting under it (not where its files are read from)."""
    from litlab.resumable import LOADING_ONLY

    key = key.lstrip("+~")
    if key.rsplit(".", 1)[-1] in LOADING_ONLY and key.startswith("data.source."):
        return False
    if key in _PREPARATION:
        return False
    return key == "data" or any(key == k or key.startswith(f"{k}.") for k in _MEASURE_KEYS)


def refuse_a_search_over_a_missing_key(config: Any, arguments: list[str], params: Any) -> None:
    """One line where an Optuna study searches a key its jobs' config does not have (a typo,
    ``model.net.widht=choice(16,32)``, or cnn_optuna's model.net.width under model/net=custom):
    each job's config failed to compose, in Hydra's advice to append it with ``+`` (what a
    misspelled key does not want), and the sweep ended with a failed trial and no summary.
    Keys appended (``+``) or deleted (``~``) are Hydra's to check; so is every key where the
    study also searches a config group (``'model=choice(resnet,cnn)'``, an experiment): the
    sweep's config, composed without its searched values, is not its jobs'. A key whose value
    is to be given (``???``) is there."""
    swept = _searched(arguments, params, prefixed=True)
    choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
    if any("/" in key or "@" in key or key in choices for key, _ in swept):
        return
    missing = [
        given
        for key, given in swept
        if not key.startswith(("+", "~")) and not _has_key(config, key)
    ]
    if not missing:
        return
    if all(given.startswith("hydra.sweeper.params.") for given in missing):
        preset = choices.get("hparams_search")
        copy = f"a copy of conf/hparams_search/{preset}.yaml" if preset else "a search space"
        leave_out = (
            f"leave it out of the search ({copy} without it, as conf/hparams_search/<name>.yaml, "
            "then hparams_search=<name>: Hydra cannot delete a search parameter on the command "
            "line)"
        )
    else:
        leave_out = "leave it out of the command"
    fail(
        f"the Optuna study searches what the config does not have ({', '.join(missing)}): "
        f"a misspelled key, or one of another net or data; correct it, or {leave_out}; a key "
        "your net takes that its config lacks is searched as +key=choice(...)"
    )


def _has_key(config: Any, key: str) -> bool:
    """Whether ``key`` (dotted) is in ``config``, whatever its value (``???`` too)."""
    parent, _, leaf = key.rpartition(".")
    node = config
    if parent:
        node = OmegaConf.select(
            config, parent, throw_on_missing=False, throw_on_resolution_failure=False
        )
    if isinstance(node, DictConfig):
        return leaf in node.keys()  # noqa: SIM118 (a ??? value is not "in" a DictConfig)
    if isinstance(node, ListConfig):
        return leaf.isdigit() and int(leaf) < len(node)
    return False


def refuse_a_tuned_measure(arguments: list[str], params: Any) -> None:
    """One line where an Optuna study would search over what its objective measures
    (``'data=choice(digits,fashion_mnist)'``, ``data.val_fraction``, the objective itself): its
    trials' values would be of other data or metrics, which the study ranks as one (litlab's
    summary and report keep them apart, and named another best). A grid sweep compares them
    apart: use one."""
    swept = [given for key, given in _searched(arguments, params) if _measures(key)]
    if swept:
        fail(
            f"the Optuna study would search over what its objective measures "
            f"({', '.join(swept)}): values of other data or metrics are not one ranking; run "
            "a study for each (or a grid sweep, whose summary compares like with like)"
        )


def study_measure(config: Any) -> dict[str, Any]:
    """What the objective values of a study's trials measure: the objective metric and the
    data settings (resumable's: not where the files are read from), kept in the study."""
    from litlab.resumable import data_settings

    settings = {}
    for key in _MEASURED_BY:
        value = OmegaConf.select(config, key, throw_on_resolution_failure=False)
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=False)
        settings[key] = value
    return {
        "metric": OmegaConf.select(config, "objective.metric"),
        "data": data_settings(config),
        "settings": settings,
    }


def refuse_another_measure(config: Any, storage: str | None, study: str | None) -> None:
    """One line where a study continued from its storage was made for another objective metric
    or other data than this sweep's (kept in the study by ``record_measure``; a study from
    before has none): their values would be ranked as one."""
    held = _held_study(storage, study)
    made = held.user_attrs.get("litlab_measure") if held is not None else None
    if not made:
        return
    from litlab.resumable import changed_data_settings

    now = study_measure(config)
    changes = [f"objective.metric: {made['metric']} -> {now['metric']}"]
    changes = changes if made["metric"] != now["metric"] else []
    changes += changed_data_settings(made["data"], now["data"], _PREPARATION)
    changes += [
        f"{key}: {value} -> {now['settings'].get(key)}"
        for key, value in (made.get("settings") or {}).items()
        if value != now["settings"].get(key)
    ]
    if changes:
        fail(
            f"the Optuna study {study} in {storage} holds values of another measure than this "
            f"sweep's ({'; '.join(changes)}): continue it as it was made, or start another "
            "study (hydra.sweeper.study_name=... or a new hydra.sweeper.storage)"
        )


def record_measure(trial: Any, config: Any) -> None:
    """Keep in the study what its values measure (refuse_another_measure), once."""
    held = trial.study
    if "litlab_measure" not in held.user_attrs:
        held.set_user_attr("litlab_measure", study_measure(config))


def refuse_a_found_value_searched(config: Any, arguments: list[str], params: Any) -> None:
    """One line where a finder (tune.lr, tune.batch_size) would replace a value the study
    searches: each trial would train with the value found, not the one the study asked and
    learns from (before: every trial failed on the finder's own refusal, in Hydra's noise)."""
    searched = {key for key, _ in _searched(arguments, params)}
    tune = config.get("tune") or {}
    for name, key in TUNED_KEYS.items():
        if tune.get(name) and key in searched:
            fail(
                f"tune.{name}=true finds {key}, which the Optuna study searches: each trial "
                f"would train with the value found, not the one the study asked; drop "
                f"tune.{name}, or {key} from the search (hydra.sweeper.params)"
            )


def refuse_what_every_trial_would(config: Any) -> None:
    """One line, before any trial, where every trial's job would be refused for a key of the
    command's own (``+hparams_search.n_trials=3``; ``objective.metric=test/acc``): each of
    ``n_trials`` jobs failed with it (walkthrough 163)."""
    from litlab.config import check_objective, check_top_level

    try:
        check_top_level(config, "train")
        check_objective(config)
    except ConfigError as e:
        fail(str(e))


def refuse_an_untrained_study(config: Any) -> None:
    """One line where an Optuna study's trials would not train (train=false): a trial's value
    is its validated objective, which nothing validates (every trial failed)."""
    if not config.get("train", True):
        fail(
            "an Optuna study scores each trial by the objective its training validates, and "
            "train=false trains none; test settings over a grid instead: python train.py -m "
            "train=false <key>=<a>,<b>"
        )


def directions(direction: Any) -> list[str]:
    """hydra.sweeper.direction as Optuna's words (minimize, maximize), one a direction: given
    as strings, or as the sweeper's Direction enum (its structured config's default, whose
    str() is "Direction.minimize")."""
    given = direction if OmegaConf.is_list(direction) else [direction]
    return [str(getattr(d, "name", d)).lower() for d in given]


def refuse_a_direction_against_the_objective(config: Any) -> None:
    """One line where hydra.sweeper.direction is given against the objective's mode (the
    presets derive it from objective.mode): Optuna maximized val/loss, named the worst trial
    its best and steered its sampler toward worse ones, and sweep_summary.json's best and
    study_best disagreed (walkthrough 146)."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    mode = OmegaConf.select(config, "objective.mode", default=None)
    if direction is None or mode not in ("min", "max"):
        return
    given = directions(direction)
    wanted = ["minimize" if mode == "min" else "maximize"]
    if given != wanted:
        metric = OmegaConf.select(config, "objective.metric")
        fail(
            f"hydra.sweeper.direction={','.join(given)} but the objective, {metric}, is "
            f"{'minimized' if mode == 'min' else 'maximized'} (objective.mode={mode}): the study "
            "would take the worst trial for the best; leave hydra.sweeper.direction out (it "
            "follows objective.mode), and choose the objective with objective=... instead"
        )


def refuse_another_direction(config: Any, storage: str | None, study: str | None) -> None:
    """One line where a study continued from its storage was made in the other direction (its
    objective another metric: before data=digits chose val/loss, its studies maximized
    val/acc). Optuna refuses it with a ValueError, which the sweeper took for a sweep whose
    trials all failed: no trial ran, and the sweep ended with status 0."""
    direction = config.hydra.sweeper.get("direction")
    held = _held_study(storage, study) if direction is not None else None
    if held is None:
        return
    wanted = directions(direction)
    have = [d.name.lower() for d in held.directions]
    if wanted != have:
        objective = config.get("objective") or {}
        # the study's own metric where it recorded it (record_measure); from before: a hint
        made = (held.user_attrs.get("litlab_measure") or {}).get("metric")
        if made:
            its = f"its objective, {made}"
            mode = "min" if have == ["minimize"] else "max"
            override = objective_override(made, mode)
            advice = f"continue it with the objective it was made with ({override})"
        else:
            its = "its objective"
            advice = (
                "continue it with the objective it was made with (e.g. objective=accuracy for "
                "val/acc, which data=digits studies had before it chose val/loss)"
            )
        fail(
            f"the Optuna study {study} in {storage} was made to {' and '.join(have)} {its}, "
            f"but this sweep's objective, {objective.get('metric')} "
            f"({objective.get('mode')}), would {' and '.join(wanted)}: {advice}, or start "
            "another study (hydra.sweeper.study_name=...)"
        )


def objective_override(metric: str, mode: str) -> str:
    """The command-line override that makes ``metric`` the objective (``mode``: min or max):
    its conf/objective preset where one measures it, else objective.metric= and its mode."""
    from litlab.config import config_dir

    for preset in sorted((Path(config_dir()) / "objective").glob("*.yaml")):
        if OmegaConf.load(preset).get("metric") == metric:
            return f"objective={preset.stem}"
    return f"objective.metric={metric} objective.mode={mode}"


def study_best(sweep_dir: Path) -> dict[str, Any] | None:
    """The Optuna study's best trial over all its launches: a study continued from its storage
    in a new folder holds trials that this launch's jobs are not (the "best of N jobs" is this
    launch's). Asked of the study itself (optuna_trials.json names it), as it is now: the
    sweeper's optimization_results.yaml, read otherwise, is of the sweep's end (none where a
    signal stopped it), and a trial told since by resume= of its job was not in it."""
    with contextlib.suppress(Exception):  # the study moved, locked, or none completed yet
        known = json.loads((sweep_dir / TRIALS).read_text())
        known["storage"] = sweep_storage(known["storage"], sweep_dir)
        database = sqlite_file(known["storage"])
        if database is not None and not database.is_file():  # (loading would make an empty one)
            raise FileNotFoundError(database)
        import optuna

        study = optuna.load_study(study_name=known["study_name"], storage=known["storage"])
        best = study.best_trial
        return {"value": best.value, "params": best.params}
    path = sweep_dir / "optimization_results.yaml"
    if not path.is_file():
        return None
    results = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(results, dict) or "best_value" not in results:
        return None
    return {"value": results["best_value"], "params": results.get("best_params") or {}}


def warn_of_a_new_study(storage: str, database: Path, study: str | None) -> None:
    """Say so where a storage given to continue a study does not hold it: Optuna would start a
    new study there without a word (a mistyped folder, or hydra.sweeper.study_name). Global rank
    0 alone looks (every rank of torchrun or srun runs the sweep); a storage it cannot read is
    said so too (Optuna then says why, or reads it)."""
    if global_rank() != 0:
        return
    if not database.is_file():
        log.warning(
            "hydra.sweeper.storage=%s holds no study yet: a new study starts there (to "
            "continue one, give the optuna.db in its first sweep folder)",
            storage,
        )
        return
    import optuna

    try:
        held = [s.study_name for s in optuna.get_all_study_summaries(storage=storage)]
    except Exception as e:  # not an Optuna database, another schema, locked
        log.warning("hydra.sweeper.storage=%s could not be read (%s)", storage, first_line(e))
        return
    if study not in held:
        named = (
            f"not {study}: a new study {study}"
            if study
            else "and no study_name is given: a new study"
        )
        log.warning(
            "hydra.sweeper.storage=%s holds the studies %s, %s starts there (to continue one, "
            "give its name: hydra.sweeper.study_name=...)",
            storage,
            ", ".join(held) or "(none)",
            named,
        )


# Hydra's launcher that runs a sweep's jobs one after another in its own process
IN_PROCESS_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def planned_jobs(config: DictConfig) -> list[list[str]] | None:
    """A grid sweep's jobs (Hydra's basic sweeper), in the order it runs them: each job's
    overrides, the command's own with one value of each sweep (``hydra.sweeper.params`` and the
    command's): what runs that job alone (the swept ones alone dropped the command's other
    overrides, trainer.max_epochs=2: a job run from them was another run; walkthrough 136);
    None for another sweeper (an Optuna study plans n_trials, not their values), or overrides
    Hydra's parser reads only with the config loader (``glob(...)`` of config groups)."""
    sweeper = config.hydra.sweeper
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        (batch,) = BasicSweeper.split_arguments(parsed, None)
    except Exception:
        return None
    # the overrides not swept as the command wrote them (Hydra writes its values again:
    # extras.print_config=False); on a key given twice the later wins, as Hydra takes it (a
    # sweep after a single value: the sweep's values, as Hydra writes them)
    written: dict[str, str] = {}
    for o in parsed:
        if o.is_sweep_override():
            written.pop(o.get_key_element(), None)
        else:
            written[o.get_key_element()] = o.input_line
    return [[written.get(o.split("=", 1)[0]) or o for o in job] for job in batch]


def _write_sweep_summary(
    sweep_dir: Path,
    stopped: bool,
    stopped_in: str | None = None,
    planned: list[list[str]] | None = None,
    plan: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Write <sweep dir>/sweep_summary.json from its jobs' summaries; return (jobs, best,
    failed, listed, other, study) for the sweep's closing lines. A stopped sweep's
    ``stopped_in``: the job a signal stopped it in (its last interrupted job); a stopped grid
    sweep's ``planned`` jobs: the ones after the jobs that ran never ran ("not_run"), or
    ``plan``, the "planned" and "not_run" an earlier summary of it recorded."""
    jobs = read_jobs(sweep_dir)
    best = best_job(jobs)
    failed = [j for j in jobs if j.get("status") != "completed"]
    # a job stopped by a signal continues with resume= (its error says how): apart
    listed: dict[str, list[dict[str, Any]]] = {"failed": [], "interrupted": []}
    for j in failed:
        kind = "interrupted" if j.get("status") == "interrupted" else "failed"
        listed[kind].append({"job_dir": j["job_dir"], "error": j.get("error")})
    summary = {
        "jobs": len(jobs),
        "completed": len(jobs) - len(failed),
        **listed,
        "best": None
        if best is None
        else {
            "job_dir": best["job_dir"],
            "objective": best["objective"],
            "overrides": best["overrides"],
            # what tune.batch_size / tune.lr found: the job trained with these values
            "tuned": best.get("tuned"),
            "best_checkpoint": best.get("best_checkpoint"),
        },
    }
    other = (
        []
        if best is None
        else [j for j in scored_jobs(jobs) if objective_of(j) != objective_of(best)]
    )
    if other:  # completed, but their objective is another metric or scale than the best's
        summary["not_compared"] = [j["job_dir"] for j in other]
    study = study_best(sweep_dir)
    if study is not None:
        summary["study_best"] = study
    if stopped:
        summary["stopped"] = True
        interrupted = listed["interrupted"]
        summary["stopped_in"] = stopped_in or (interrupted[-1]["job_dir"] if interrupted else None)
        if planned is not None:  # (a grid sweep's: every job in its order, 0, 1, 2, ...)
            not_run = [shlex.join(job) for job in planned[len(jobs) :]]
            plan = {"planned": len(planned), "not_run": not_run}
        summary.update(plan or {})
    write_json(sweep_dir / "sweep_summary.json", summary)
    return jobs, best, failed, listed, other, study


def refresh_sweep_summary(job_dir: Path) -> None:
    """A job of a sweep continued with resume= (after the sweep ended: a signal stopped it, or
    trained further): the sweep's sweep_summary.json written anew from its jobs (it still named
    the job interrupted and another best; the report read the jobs). Never raises."""
    path = job_dir.parent / "sweep_summary.json"
    try:
        if path.is_file():
            then = json.loads(path.read_text())
            stopped_in = then.get("stopped_in") or [None, *then.get("interrupted", [])][-1]
            if isinstance(stopped_in, dict):  # (a summary from before stopped_in was kept)
                stopped_in = stopped_in.get("job_dir")
            # a grid sweep's jobs that never ran are still those (a resume runs none of them)
            plan = {key: then[key] for key in ("planned", "not_run") if key in then}
            _write_sweep_summary(job_dir.parent, bool(then.get("stopped")), stopped_in, plan=plan)
    except Exception as e:  # a summary unreadable or a folder read-only: the run stands
        log.warning("%s was not brought up to date: %s", path, first_line(e))


class SweepSummary(Callback):
    """Around a multirun: make room for an SQLite study, then log the best job and write
    <sweep dir>/sweep_summary.json.

    Where the jobs run in the sweep's own process (Hydra's basic launcher), a signal that stops
    a job (SIGTERM, Ctrl-C) ends the whole sweep, and Hydra's end of the multirun never comes:
    the summary of the jobs run so far is then written as the process exits, marked
    ``"stopped": true`` (before: none was written)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        database = sqlite_file(str(config.hydra.sweeper.get("storage") or ""))
        remember_what_exists(database)
        try:
            check_local_tasks(config.hydra.get("launcher"))
        except ConfigError as e:
            fail(str(e))
        claim_the_sweep_folder(config)
        refuse_a_used_sweep_folder(config)
        atexit.register(self._stopped, config)
        # Optuna's SQLite storage (sqlite:///<sweep dir>/optuna.db) needs its folder to exist.
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        storage = str(config.hydra.sweeper.get("storage") or "")
        database = sqlite_file(storage)
        if database is not None:
            elsewhere = database.parent.resolve() != Path(config.hydra.sweep.dir).resolve()
            if elsewhere:  # given to continue a study: a typo in the path or the study's name?
                warn_of_a_new_study(storage, database, config.hydra.sweeper.get("study_name"))
            database.parent.mkdir(parents=True, exist_ok=True)

    def _stopped(self, config: DictConfig) -> None:
        """At the exit of a process whose sweep ended before Hydra's end of the multirun: where
        a job was stopped by a signal, or is still "running" (a job of submitit's launchers
        killed, or going on after the sweep's process: submitit's launchers raise when a job
        ends without a result, as one a signal stopped does, and no summary was written:
        review 187). An error outside the jobs, which Hydra raises after running them all,
        writes nothing, as before."""
        jobs = read_jobs(Path(config.hydra.sweep.dir))
        if any(j.get("status") in ("interrupted", "running") for j in jobs):
            self.on_multirun_end(config, stopped=True)

    def on_multirun_end(self, config: DictConfig, stopped: bool = False, **kwargs: Any) -> None:
        atexit.unregister(self._stopped)
        release_the_sweep_folder(config.hydra.sweep.dir)
        sweep_dir = Path(config.hydra.sweep.dir)
        if global_rank() != 0 and is_rank_scratch(sweep_dir):
            return  # a torchrun or srun rank's scratch copy: rank 0 sums up the sweep (153)
        planned = planned_jobs(config) if stopped else None
        jobs, best, failed, listed, other, study = _write_sweep_summary(
            sweep_dir, stopped, planned=planned
        )
        # it ended with status 0 and no word (walkthrough 146); rank 0's: under torchrun or
        # srun the other ranks' sweep folders are scratch ones, without summaries (review 148)
        if not jobs and not stopped and global_rank() == 0:
            fail(
                f"the sweep in {sweep_dir} launched no job: a swept value list is empty (a "
                "range whose start is past its stop, e.g. range(64,16)?); correct the sweep"
            )
        if stopped:
            from litlab.report.compare import jobs_not_run

            after = jobs_not_run()
            if planned is not None:
                after = jobs_not_run(len(planned) - len(jobs), len(planned))
            log.warning(
                "the sweep stopped in its job %s, %s; %s holds the jobs that ran%s",
                listed["interrupted"][-1]["job_dir"],
                after,
                sweep_dir / "sweep_summary.json",
                " and those that did not (not_run)" if planned is not None else "",
            )
        for job in failed:
            log.warning(
                "%s job %s: %s", job.get("status", "failed"), job["job_dir"], job.get("error")
            )
        this_launch = None if best is None else best["objective"]["value"]
        if study is not None and study["value"] != this_launch:
            log.info(
                "the Optuna study's best (its trials of every launch): %s with %s",
                study["value"],
                " ".join(f"{k}={v}" for k, v in study["params"].items()),
            )
        if best is None and failed and not stopped:
            fail(
                f"no job of the sweep in {sweep_dir} completed with an objective value "
                f"({len(failed)} failed or interrupted; their errors: "
                f"{sweep_dir / 'sweep_summary.json'})"
            )
        if best is None:  # e.g. a multirun of eval.py: its jobs have no objective
            log.warning("no job of the sweep in %s has an objective value", sweep_dir)
            return
        objective = best["objective"]
        if other:
            log.warning(
                "%d completed job(s) were not compared with the best: their objective is "
                "another metric or scale than %s [%s] (e.g. %s)",
                len(other),
                objective["metric"],
                objective_scale(best),
                other[0]["job_dir"],
            )
        log.info(
            "best of %d jobs (%d failed%s): %s=%.4g in %s; to train it again: %s",
            len(jobs),
            len(listed["failed"]),
            f", {len(listed['interrupted'])} interrupted" if listed["interrupted"] else "",
            objective["metric"],
            objective["value"],
            best["job_dir"],
            run_again(best["overrides"], config_dir_arguments(config)),
        )
        seeds = {o for job in jobs for o in job["overrides"] if override_key(o) in SEEDS}
        if len(seeds) > 1:  # repeats over seeds: the best job is one seed's
            log.info("the jobs repeat settings over seeds: the report gives each one's mean")
        folders = [str(sweep_dir)]
        database = sqlite_file(str(OmegaConf.select(config, "hydra.sweeper.storage") or ""))
        if database is not None and database.parent.resolve() != sweep_dir.resolve():
            folders.insert(0, str(database.parent))  # a continued study's first launch's folder
        log.info("compare the runs offline: python -m litlab.report %s", " ".join(folders))
