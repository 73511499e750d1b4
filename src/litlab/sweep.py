"""Hydra callback that closes a sweep: which job won, with which overrides, where it lives."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig

from litlab.errors import fail
from litlab.run import write_json

log = logging.getLogger("litlab.sweep")


def read_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """summary.json of every job below a sweep folder, with the job folder and its overrides."""
    jobs = []
    for path in sorted(sweep_dir.rglob("summary.json")):
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        overrides_file = path.parent / ".hydra" / "overrides.yaml"
        overrides = overrides_file.read_text().splitlines() if overrides_file.is_file() else []
        summary["job_dir"] = str(path.parent)
        summary["overrides"] = [
            line.removeprefix("- ").strip() for line in overrides if line.strip()
        ]
        jobs.append(summary)
    return jobs


def best_job(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The completed job with the best objective value (max or min, as its objective says)."""
    scored = []
    for job in jobs:
        objective = job.get("objective") or {}
        value = objective.get("value")
        if job.get("status") == "completed" and value is not None and not math.isnan(value):
            scored.append((value if objective.get("mode") == "max" else -value, job))
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def continued_sampler(
    sampler: Any, config: DictConfig, storage: str | None, study: str | None
) -> Any:
    """The sampler for a study continued from its storage (README: resume a study): seeded past
    the trials the study holds. Seeded as the first launch was, it would draw that launch's
    first trials again (TPE's random start-up trials: the same parameters, one more time)."""
    seed = config.get("seed")
    if storage is None or seed is None:
        return sampler
    import optuna

    try:
        trials = len(optuna.load_study(study_name=study, storage=storage).trials)
    except (KeyError, ValueError):  # a new study
        return sampler
    if trials == 0:
        return sampler
    log.info("the study holds %d trials: its sampler's seed is %d + %d", trials, seed, trials)
    return instantiate(config, seed=seed + trials)


class SweepSummary(Callback):
    """Around a multirun: make room for an SQLite study, then log the best job and write
    <sweep dir>/sweep_summary.json."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Optuna's SQLite storage (sqlite:///<sweep dir>/optuna.db) needs its folder to exist.
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        storage = str(config.hydra.sweeper.get("storage") or "")
        if storage.startswith("sqlite:///"):
            Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep_dir)
        best = best_job(jobs)
        failed = [j for j in jobs if j.get("status") != "completed"]
        summary = {
            "jobs": len(jobs),
            "completed": len(jobs) - len(failed),
            "failed": [{"job_dir": j["job_dir"], "error": j.get("error")} for j in failed],
            "best": None
            if best is None
            else {
                "job_dir": best["job_dir"],
                "objective": best["objective"],
                "overrides": best["overrides"],
                "best_checkpoint": best.get("best_checkpoint"),
            },
        }
        write_json(sweep_dir / "sweep_summary.json", summary)
        for job in failed:
            log.warning("failed job %s: %s", job["job_dir"], job.get("error"))
        if best is None and failed:
            fail(
                f"no job of the sweep in {sweep_dir} completed with an objective value "
                f"({len(failed)} failed; their errors: {sweep_dir / 'sweep_summary.json'})"
            )
        if best is None:  # e.g. a multirun of eval.py: its jobs have no objective
            log.warning("no job of the sweep in %s has an objective value", sweep_dir)
            return
        objective = best["objective"]
        log.info(
            "best of %d jobs (%d failed): %s=%s in %s with %s",
            len(jobs),
            len(failed),
            objective["metric"],
            objective["value"],
            best["job_dir"],
            " ".join(best["overrides"]),
        )
        log.info("compare the runs offline: python -m litlab.report %s", sweep_dir)
