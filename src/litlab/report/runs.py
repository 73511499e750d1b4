"""Read run folders (summary.json, .hydra/overrides.yaml, csv/metrics.csv, samples/) into Runs."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from litlab.files import resumable_checkpoints, run_process
from litlab.overrides import (
    RESUME_OVERRIDES,
    SEEDS,
    TUNED_KEYS,
    merged_overrides,
    override_key,
)

SUMMARY = "summary.json"
OVERRIDES = Path(".hydra") / "overrides.yaml"
FAILED = ("failed", "unreadable")
# A setting no override names: the processes that trained a run (torchrun's or srun's, which
# the saved config does not record; data.batch_size is each one's, walkthrough 153)
PROCESSES = "processes"

Curve = tuple[list[float], list[float]]


def saved_config(run_dir: Path, name: str = "config.yaml") -> Any:
    """A run's composed config as Hydra saved it (.hydra/config.yaml; hydra.yaml: Hydra's own,
    with the config groups' choices); None if missing or bad."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(run_dir / ".hydra" / name)
    except Exception:  # missing, unreadable, not YAML
        return None


def same_text(value: Any) -> str:
    """A setting's value as text that is equal where the values are: numbers by value (3e-3,
    0.003 and 0.0030; 1, 1.0), booleans, null, lists and dicts as JSON (an override's
    ``[1,2]`` and a config's [1, 2]); other text as it is."""
    if isinstance(value, str):
        if value.strip().lstrip("+-").isdigit():  # exactly (a seed beyond a float's 53 bits)
            value = int(value)
        elif number(value) is not None:
            value = number(value)
        else:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                return value
            if not (parsed is None or isinstance(parsed, bool | list | dict)):
                return value
            value = parsed
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def config_value(config: Any, key: str) -> Any:
    """``key``'s value in a saved config, its interpolations resolved (noise_seed: ${seed});
    None where the config, the key or a resolver is missing."""
    from omegaconf import OmegaConf

    if config is None:
        return None
    try:
        return OmegaConf.select(config, key, default=None, throw_on_missing=False)
    except Exception:  # an interpolation to a resolver only a run registers
        return None


class ReportError(Exception):
    """Bad input for the report: the message says what to do."""


def number(value: object) -> float | None:
    """A float from a JSON value or CSV/override text; None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def objective_scale(summary: dict) -> str:
    """What a summary's objective value compares under besides its name (metric_scale)."""
    objective = summary.get("objective")
    metric = objective.get("metric") if isinstance(objective, dict) else None
    return metric_scale(summary, metric) if isinstance(metric, str) else ""


def metric_scale(summary: dict, metric: str) -> str:
    """What a summary's value of ``metric`` compares under besides its name: the data it was
    measured on (the source, and the images of the split: val=144, and the part of it measured
    where trainer.limit_val_batches limited it; an accuracy on digits and one on Fashion-MNIST,
    or on another validation share, are other numbers), and for an FID (and its floor)
    its extractor, its sample count N and the real statistics' count N_real (the same
    generator has another FID through another extractor or at other counts). "" where the
    summary says none of it (summaries of runs before 2026-12-04 name no source)."""
    metrics = summary.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    data = summary.get("data") if isinstance(summary.get("data"), dict) else {}
    split, _, name = metric.partition("/")
    fid = name in ("fid", "fid_floor")
    tags = [data["source"]] if isinstance(data.get("source"), str) else []
    if tags and not fid:  # an FID measures no split's images: its N and N_real below
        images = (data.get("splits") or {}).get(split)
        tags += [f"{split}={images}"] if images is not None else []
        # measured on part of the split (trainer.limit_val_batches, limit_train_batches):
        # another sample of it
        limit = (summary.get("evaluation_limits") or {}).get(split)
        limit = summary.get("training_limit") if split == "train" else limit
        tags += [f"limit_{split}_batches={limit}"] if limit is not None else []
    if not fid:
        return ", ".join(tags)
    fid_metric = f"{split}/fid"
    kinds = [k[len(fid_metric) + 1 :] for k in metrics if k.startswith(f"{fid_metric}_")]
    tags += sorted(k for k in kinds if k not in ("g", "floor", "samples", "real_samples"))
    counts = {"N": f"{fid_metric}_samples", "N_real": f"{fid_metric}_real_samples"}
    counts = {name: number(metrics.get(key)) for name, key in counts.items()}
    return ", ".join(tags + [f"{name}={n:g}" for name, n in counts.items() if n is not None])


def folders_title(folders: list[Path]) -> str:
    """What a report of these folders is titled by: their names (three at most)."""
    names = list(dict.fromkeys(f.resolve().name for f in folders))
    shown = names if len(names) <= 3 else [*names[:2], f"{len(names) - 2} more"]
    return " + ".join(shown)


def default_report_folder(folders: list[Path]) -> Path:
    """Where a report goes without --out: the folder given, or for several a folder of their
    own beside them (report-<names>, in their common parent): written into the first, the
    comparison replaced that folder's own report."""
    if len(folders) == 1:
        return folders[0]
    common = Path(os.path.commonpath([f.resolve() for f in folders]))
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", folders_title(folders).replace(" + ", "+"))
    return common / f"report-{name[:120]}"


@dataclass
class RunFolder:
    """One run folder: its summary, its overrides and the files the report shows."""

    name: str
    path: Path
    summary: dict
    overrides: list[str]

    @cached_property
    def status(self) -> str:
        """completed, failed, interrupted, running (or unreadable when summary.json is broken);
        lost: "running", but its process, on this machine, is gone (killed hard: SIGKILL, out
        of memory; it could write no end), where a run on another machine stays "running"."""
        status = str(self.summary.get("status") or "unknown")
        return "lost" if run_process(self.summary)[0] == "gone" else status

    @property
    def error(self) -> str | None:
        """The recorded error message, if any; a lost run's: what became of it; a completed
        classifier's whose loss ended far above a uniform guess's: that."""
        if self.status == "lost":
            # as it was started (torchrun, srun: its layout; older runs recorded none)
            launcher = str(self.summary.get("launched_as") or "python")
            again = (
                "run eval.py again"
                if self.evaluation
                else f"{launcher} train.py resume={self.path} continues it from its newest "
                "checkpoint"
                if resumable_checkpoints(self.path)
                else "it wrote no checkpoint to continue from: start it again"
            )
            return (
                f"its process {self.summary.get('pid')} on this machine ended without a word "
                f"(killed: out of memory, SIGKILL?); {again}"
            )
        error = self.summary.get("error")
        far = self.summary.get("loss_far_above_chance")
        if not error and far and self.status == "completed":  # finite, so not failed
            return (
                f"its val/loss ended {far:g} times a uniform guess's: diverged without a NaN "
                "(or overfit to certainty); its train.log says what to lower"
            )
        return str(error) if error else None

    @property
    def failed(self) -> bool:
        """Failed runs sort last and never count as the best."""
        return self.status in FAILED

    @property
    def metrics(self) -> dict:
        """Final metrics from summary.json ({} when absent)."""
        metrics = self.summary.get("metrics")
        return metrics if isinstance(metrics, dict) else {}

    def metric(self, name: str) -> float | None:
        """One final metric as a float, None when missing."""
        return number(self.metrics.get(name))

    @property
    def epochs(self) -> tuple[int | None, int | None]:
        """(epochs trained, the epoch of the last validation) that the summary's train/* and
        val/* values are of (Run.epoch_ended); None where it says nothing (runs before
        2026-12-06, a ddp_spawn fit)."""
        epochs = self.summary.get("epochs")
        epochs = epochs if isinstance(epochs, dict) else {}
        trained, validated = epochs.get("trained"), epochs.get("validated")
        return tuple(n if isinstance(n, int) and not isinstance(n, bool) else None
                     for n in (trained, validated))  # fmt: skip

    @property
    def objective(self) -> tuple[str | None, str, float | None]:
        """(metric, mode, value) of the run's objective; value is None unless finite."""
        objective = self.summary.get("objective")
        objective = objective if isinstance(objective, dict) else {}
        value = number(objective.get("value"))
        metric = objective.get("metric")
        mode = "min" if objective.get("mode") == "min" else "max"
        return metric, mode, value if value is not None and math.isfinite(value) else None

    @property
    def objective_scale(self) -> str:
        """What the objective's value compares under besides its name (objective_scale)."""
        return objective_scale(self.summary)

    def scale(self, metric: str) -> str:
        """What the run's value of ``metric`` compares under besides its name (metric_scale)."""
        return metric_scale(self.summary, metric)

    @property
    def evaluation(self) -> bool:
        """An eval.py run: a test of a checkpoint, not a training run."""
        return self.summary.get("task") == "eval"

    @property
    def tested(self) -> str:
        """Which weights the run's test/* metrics measure: its best checkpoint, its last (no
        best kept), a checkpoint it was given (train=false; eval.py), the final weights, or the
        untrained ones (train=false without a checkpoint: a test and no fit in its durations)."""
        best = self.summary.get("best_checkpoint")
        tested = self.summary.get("tested_checkpoint", best)  # older summaries: the best one
        tested = tested or self.summary.get("checkpoint")  # eval.py's
        if tested and tested == best:
            return "best checkpoint"
        if tested and tested == self.summary.get("last_checkpoint"):
            return "last checkpoint"
        if tested:
            return "given checkpoint"
        durations = self.summary.get("durations_s")
        untrained = isinstance(durations, dict) and "test" in durations and "fit" not in durations
        return "untrained weights" if untrained else "final weights"  # train=false, no ckpt

    @property
    def duration_s(self) -> float | None:
        """Total wall time of the run in seconds, the parts before its resumes included."""
        durations = self.summary.get("durations_s")
        total = number(durations.get("total")) if isinstance(durations, dict) else None
        return None if total is None else total + (number(durations.get("earlier")) or 0.0)

    @property
    def best_checkpoint(self) -> str | None:
        """The best checkpoint, relocated under this folder when the run folder was moved."""
        path = self.summary.get("best_checkpoint")
        if not path:
            return None
        run_dir = self.summary.get("run_dir")
        if run_dir and Path(path).is_relative_to(run_dir):
            return str(self.path / Path(path).relative_to(run_dir))
        return str(path)

    @property
    def params(self) -> dict[str, str]:
        """Overrides as key -> value text (a leading + or ++ dropped), and the values that the
        finders chose (``tuned`` in summary.json: tune.batch_size=true trained at the batch
        size found, which no override gives)."""
        params = {override_key(o): o.split("=", 1)[1] for o in self.overrides if "=" in o}
        tuned = self.summary.get("tuned")
        for name, key in TUNED_KEYS.items():
            if isinstance(tuned, dict) and tuned.get(name) is not None:
                # a resume's own value (resume=<run> data.batch_size=64) trained later parts
                params.setdefault(key, str(tuned[name]))
        return params

    @cached_property
    def seeds(self) -> tuple[str | None, ...]:
        """The run's seeds (overrides.SEEDS) as it drew them (``setting``): a run at the
        default seed and one given that seed are one draw (as overrides alone, two seeds: "±
        0 (n=2)"). None where neither its overrides nor its saved config say."""
        return tuple(self.setting(key) for key in SEEDS)

    def setting(self, key: str) -> str | None:
        """What the run had for an override's key, as comparable text (``same_text``): its
        override's value (or a finder's, ``params``), else its saved config's (a default: one
        sweep's ``model.optimizer.lr=3e-3`` and another's default 0.003 are one setting), a
        config group's choice from Hydra's record; None where none of them says."""
        if key == PROCESSES:  # not a config key: how many processes trained it (summary.json)
            world = self.summary.get("world_size")
            return same_text(world) if isinstance(world, int) else None
        if key in self.params:
            return same_text(self.params[key])
        choices = config_value(self._hydra_record, "hydra.runtime.choices") or {}
        if key in choices:
            return same_text(choices[key])
        value = config_value(self._config, key)
        if value is None:
            return None
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            # as written: its interpolations may name resolvers only a run has (${hydra:...}:
            # review 154), or resolve to this process's values, not the run's
            value = OmegaConf.to_container(value, resolve=False)
        return same_text(value)

    @cached_property
    def _config(self) -> Any:
        """The run's saved config (.hydra/config.yaml), read once; None if unreadable."""
        return saved_config(self.path)

    @cached_property
    def _hydra_record(self) -> Any:
        """Hydra's record of the run (.hydra/hydra.yaml: its config groups' choices)."""
        return saved_config(self.path, "hydra.yaml")

    @cached_property
    def curves(self) -> dict[str, Curve]:
        """Logged metrics against the epochs trained, read from csv/metrics.csv."""
        return read_curves(self.path / "csv" / "metrics.csv", self.summary.get("steps_per_epoch"))

    @property
    def sample_grid(self) -> Path | None:
        """The GAN sample grid to show: test.png, of the weights the run tested (its best
        checkpoint's: those its objective ranks; a generator that collapsed after its best
        epoch drew collapsed final samples beside a good FID), else final.png, else the newest
        g_step_*.png (a run stopped before its test)."""
        samples = self.path / "samples"
        newest_first = sorted(samples.glob("g_step_*.png"), reverse=True)
        grids = [samples / "test.png", samples / "final.png", *newest_first]
        return next((grid for grid in grids if grid.is_file()), None)

    @property
    def sample_grid_of(self) -> str:
        """Which weights ``sample_grid`` drew: the tested ones (as ``tested`` says), the final
        ones, or the generator at a step."""
        grid = self.sample_grid
        if grid is None or grid.stem == "test":
            return self.tested
        return "final weights" if grid.stem == "final" else f"G step {int(grid.stem[7:])}"

    @property
    def is_gan(self) -> bool:
        """GAN runs report FID or write sample grids."""
        return "val/fid" in self.metrics or (self.path / "samples").is_dir()


def read_overrides(path: Path) -> list[str]:
    """The overrides in one of a run's .hydra/*overrides.yaml ([] when missing or bad)."""
    try:
        overrides = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return []
    return [str(o) for o in overrides] if isinstance(overrides, list) else []


def run_overrides(run_dir: Path) -> list[str]:
    """The command's overrides, then what each ``resume=`` of the run that trained changed
    (``trainer.max_epochs=50``): the settings the run has now."""
    return merged_overrides(
        read_overrides(run_dir / OVERRIDES), read_overrides(run_dir / ".hydra" / RESUME_OVERRIDES)
    )


def read_curves(path: Path, steps_per_epoch: Any = None) -> dict[str, Curve]:
    """Per metric, its (epochs, values) from a sparse CSVLogger file, in step order; {} when
    there is none. The x axis is the epochs trained (``epoch_axis``), so that runs of other
    batch sizes, process counts or GAN step counts (D's and G's steps) line up. A step logged
    twice keeps its later value: a run killed without a checkpoint at that point (SIGKILL, out
    of memory) logs the steps since its newest checkpoint again after resume=, and its curve
    would fold back on itself."""
    points: dict[str, dict[float, float]] = {}
    ends: dict[int, float] = {}  # the last step logged in each epoch (not by the test)
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                step, epoch = number(row.get("step")), number(row.get("epoch"))
                if step is None:
                    continue
                values = {
                    name: value
                    for name, cell in row.items()
                    if isinstance(name, str)
                    and name not in ("step", "epoch")
                    and (value := number(cell)) is not None
                }
                for name, value in values.items():
                    points.setdefault(name, {})[step] = value
                if epoch is not None and not any(n.startswith("test/") for n in values):
                    ends[int(epoch)] = max(ends.get(int(epoch), step), step)
    except (OSError, UnicodeDecodeError, csv.Error):
        pass  # a missing or truncated log shows no (or fewer) curves
    curves: dict[str, Curve] = {}
    for name, by_step in points.items():
        steps = sorted(by_step)
        curves[name] = (epoch_axis(steps, ends, steps_per_epoch), [by_step[s] for s in steps])
    return curves


def epoch_axis(
    steps: list[float], ends: dict[int, float], steps_per_epoch: Any = None
) -> list[float]:
    """Each step as epochs trained: the k-th of an epoch's n steps at e + k/n, the values
    logged at its end (validation, epoch means) at e + 1. An epoch's steps are counted from the
    last step logged in it; the last epoch's (a run stopped part-way through its last epoch
    logged only part of it) are the run's steps_per_epoch (summary.json), else as many as the
    one before's (a run stopped in its first epoch, of unknown length, ends at 1). Without
    epochs logged: the steps."""
    if not ends:
        return list(steps)
    # (epoch, the step before its first, steps in it): Lightning logs the k-th batch of a run
    # at step k - 1, so the first epoch's steps start after step -1
    bounds, previous = [], -1.0
    for epoch, end in sorted(ends.items()):
        bounds.append((epoch, previous, end - previous))
        previous = end
    epoch, first, length = bounds[-1]
    if isinstance(steps_per_epoch, int) and steps_per_epoch >= length:  # the last epoch's
        bounds[-1] = (epoch, first, float(steps_per_epoch))
    elif len(bounds) > 1:  # at least as long as the one before
        bounds[-1] = (epoch, first, max(length, bounds[-2][2]))
    axis = []
    last, last_first, last_length = bounds[-1]
    beyond = (last + 1, last_first + last_length, last_length)  # at the last epoch's pace
    for step in steps:
        epoch, first, length = next((b for b in bounds if step <= b[1] + b[2]), beyond)
        axis.append(epoch + (step - first) / length if length > 0 else epoch + 1.0)
    return axis


def read_summary(run_dir: Path) -> dict:
    """summary.json as a dict; a broken one becomes an 'unreadable' run with the reason."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError) as exc:
        return {"status": "unreadable", "error": f"summary.json: {exc}"}
    if not isinstance(summary, dict):
        return {"status": "unreadable", "error": "summary.json is not a JSON object"}
    return summary


def natural_key(path: Path) -> list:
    """Sort job folders 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    parts = re.split(r"(\d+)", path.as_posix())
    return [int(p) if i % 2 else p for i, p in enumerate(parts)]


def run_name(folder: Path, run_dir: Path, prefix: bool) -> str:
    """The run folder relative to the given folder (prefixed by it when several were given)."""
    relative = run_dir.relative_to(folder).as_posix()
    name = folder.resolve().name if relative == "." else relative
    return f"{folder.resolve().name}/{relative}" if prefix and relative != "." else name


def find_runs(folders: list[Path]) -> list[RunFolder]:
    """Every run folder (one holding summary.json) in or under the given folders, once each."""
    for folder in folders:
        if not folder.exists():
            raise ReportError(f"no such folder: {folder} (pass sweep or run folders from outputs/)")
        if not folder.is_dir():
            raise ReportError(f"not a folder: {folder} (pass the run folder, not a file in it)")
    runs, seen = [], set()
    for folder in folders:
        run_dirs = sorted((s.parent for s in folder.rglob(SUMMARY)), key=natural_key)
        for run_dir in run_dirs:
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            name = run_name(folder, run_dir, prefix=len(folders) > 1)
            runs.append(RunFolder(name, run_dir, read_summary(run_dir), run_overrides(run_dir)))
    if not runs:
        given = " ".join(str(f) for f in folders)
        raise ReportError(
            f"no run folders (with {SUMMARY}) under {given}; pass a sweep or run folder, "
            "e.g. outputs/train/multirun/<date>/<time>"
        )
    return runs
