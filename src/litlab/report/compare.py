"""Rank runs by their objective and lay out the comparison table shared by HTML and Markdown."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from litlab.overrides import SEEDS, compared, override_key
from litlab.report.runs import PROCESSES, RunFolder, number

KEY_METRICS = (
    "test/acc",
    "test/acc_macro",  # (each class counted alike: an unbalanced test's other measure)
    "val/acc",
    "test/fid",
    "val/fid",
    "val/fid_floor",
    "train/loss",
    "g/loss",
    "d/loss",
)
# a GAN's curves (models/curves.py): each value one batch's, at the steps Lightning writes
STEP_CURVES = ("d/", "g/")
ERROR_CHARS = 90
STATUS_ORDER = ("completed", "failed", "interrupted", "lost", "running")


def jobs_not_run(left: int | None = None, planned: int | None = None) -> str:
    """What a stopped sweep did not run: "the 1 of 3 jobs after it did not run" (a grid sweep
    knows its plan), or without a plan, "the jobs after it did not run"."""
    if left is None or planned is None:
        return "the jobs after it did not run"
    return f"the {left} of {planned} jobs after it did not run"


def shown_metrics(objective: str | None) -> list[str]:
    """The metric columns in order: an objective's own metric on the test split and its last
    validation first (val/loss: test/loss, which the accuracy columns left out), then
    KEY_METRICS."""
    own = []
    if objective and objective.startswith("val/") and not objective.endswith("_best"):
        own = [f"test/{objective[4:]}", objective]
    return [*own, *(m for m in KEY_METRICS if m not in own)]


@dataclass
class Comparison:
    """Runs ranked best first, with what the header and the table need to know about them."""

    runs: list[RunFolder]
    metric: str | None
    mode: str
    scale: str  # what else the objective's values must share (an FID's extractor and N)
    best: RunFolder | None
    metric_columns: list[str]
    varied: list[str]
    # each metric column's scale: the most common among the runs with a value there
    column_scales: dict[str, str]
    # sweeps that a signal stopped (sweep_summary.json "stopped"): where, and what did not run
    stopped_in: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """Table column titles, in order."""
        objective = "objective"
        if self.metric:
            objective = f"objective ({scaled(self.metric, self.scale)}, {self.mode})"
        return [
            "#",
            "run",
            "overrides",
            "status",
            objective,
            *self.metric_titles,
            "duration",
            "best checkpoint",
        ]

    @property
    def metric_titles(self) -> list[str]:
        """The metric columns' titles, saying which weights each value is of: summary.json
        keeps the last epoch's validation and training values, and test values of the weights
        the run tested (the objective column is the best epoch's). val/* values are of the
        last validation, which need not be the last epoch's (trainer.check_val_every_n_epoch):
        such a run's cell names its epoch."""
        titles = []
        for name in self.metric_columns:
            title = scaled(name, self.column_scales[name])
            if name.startswith("test/"):
                kinds = sorted({run.tested for run in self.runs if run.metric(name) is not None})
                titles.append(f"{title} ({' or '.join(kinds)})")
            elif name.startswith("val/"):
                titles.append(f"{title} (last validation)")
            elif name.startswith(STEP_CURVES):  # one batch's value, not an epoch's mean
                titles.append(f"{title} (last logged step)")
            else:
                titles.append(f"{title} (last epoch)")
        return titles

    @property
    def numeric_columns(self) -> set[str]:
        """Titles of the columns to right-align."""
        return {"#", self.columns[4], *self.metric_titles, "duration"}

    def comparable(self, run: RunFolder) -> bool:
        """Whether the run has a value for the report's objective (and did not fail)."""
        return comparable(run, self.metric, self.scale, self.mode)

    def cells(self, rank: int, run: RunFolder) -> list[str]:
        """The plain-text table cells of one run, in column order; its rank only where it is
        ranked (the others, after the ranked runs, are numbered by none)."""
        return [
            str(rank) if self.comparable(run) else "",
            f"{run.name} (eval)" if run.evaluation else run.name,
            " ".join(self.shown_overrides(run)),
            status_text(run),
            self.objective_text(run),
            *(self.metric_text(run, m) for m in self.metric_columns),
            human_duration(run.duration_s),
            run.best_checkpoint or "",
        ]

    def metric_text(self, run: RunFolder, metric: str) -> str:
        """A metric column's value; one on another scale than the column's (another FID N,
        extractor, data or split) names its own, as the objective column does; a val/* value
        of a validation before the run's last trained epoch names its epoch."""
        value = run.metric(metric)
        if value is None:
            return fmt(value)
        notes = []
        scale = run.scale(metric)
        if scale != self.column_scales[metric]:
            notes.append(scale or "scale not recorded")
        trained, validated = run.epochs
        if metric.startswith("val/") and validated is not None and trained is not None:
            notes += [f"epoch {validated} of {trained}"] if validated < trained else []
        return " ".join([fmt(value), *(f"[{note}]" for note in notes)])

    def objective_text(self, run: RunFolder) -> str:
        """The objective value; runs judged by another metric (or the same one on another scale:
        another FID extractor or N) name it."""
        metric, _, value = run.objective
        if value is None or (metric, run.objective_scale) == (self.metric, self.scale):
            return fmt(value)
        return f"{scaled(metric, run.objective_scale)}={fmt(value)}"

    def shown_overrides(self, run: RunFolder) -> list[str]:
        """The run's overrides, and its processes where runs differ in them."""
        world = run.setting(PROCESSES) if PROCESSES in self.varied else None
        return [*run.overrides, f"{PROCESSES}={world}"] if world is not None else run.overrides

    def varied_overrides(self, run: RunFolder) -> list[str]:
        """The run's overrides whose key takes different values across runs (and its
        processes, where those differ: no override says them under torchrun or srun)."""
        return [o for o in self.shown_overrides(run) if override_key(o) in self.varied]

    def label(self, run: RunFolder) -> str:
        """A legend label: the run name and the overrides that set it apart."""
        varied = " ".join(self.varied_overrides(run))
        label = f"{run.name}: {varied}" if varied else run.name
        label = shorten(label, 72)
        return label if run.status == "completed" else f"{label} ({run.status})"


def compare(runs: list[RunFolder]) -> Comparison:
    """Rank runs: by the objective most common among runs with a value for it (each run's
    mode) on the same scale (an FID's extractor and N); the others, valueless, then failed
    last."""

    def counted(scored: bool) -> Counter:  # the runs that can be ranked say first
        return Counter(
            (r.objective[0], r.objective[1], r.objective_scale)
            for r in runs
            if r.objective[0] and (not scored or (not r.failed and r.objective[2] is not None))
        )

    objectives = counted(scored=True) or counted(scored=False)
    metric, mode, scale = objectives.most_common(1)[0][0] if objectives else (None, "max", "")

    def order(run: RunFolder) -> tuple[int, str, float]:
        run_metric, run_mode, value = run.objective
        if run.failed or value is None:
            return 2 + run.failed, "", 0.0
        signed = -value if run_mode == "max" else value
        if not comparable(run, metric, scale, mode):  # after the ranked: each measure's best
            return 1, f"{run_metric} [{run.objective_scale}] {run_mode}", signed  # first
        return 0, "", signed

    ranked = sorted(runs, key=order)
    best = ranked[0] if comparable(ranked[0], metric, scale, mode) else None
    metric_columns = [
        m for m in shown_metrics(metric) if any(r.metric(m) is not None for r in runs)
    ]
    column_scales = {
        m: Counter(r.scale(m) for r in ranked if r.metric(m) is not None).most_common(1)[0][0]
        for m in metric_columns
    }
    varied = varied_params(runs)
    return Comparison(ranked, metric, mode, scale, best, metric_columns, varied, column_scales)


def scaled(metric: str, scale: str) -> str:
    """A metric's name with its scale, when it has one: ``val/fid [domain-6c73f971, N=2048]``."""
    return f"{metric} [{scale}]" if scale else metric


def comparable(run: RunFolder, metric: str | None, scale: str = "", mode: str = "max") -> bool:
    """Whether a run that did not fail has a value for the given objective metric and scale,
    ranked in the same direction (a run that maximized val/loss is no rival of one that
    minimized it: review 152)."""
    run_metric, run_mode, value = run.objective
    same = run_metric == metric and run.objective_scale == scale and run_mode == mode
    return not run.failed and value is not None and same


def varied_params(runs: list[RunFolder]) -> list[str]:
    """Override keys whose runs had different values (RunFolder.setting: the override's, else
    the saved config's), in order of first appearance. A key given in some runs only, at the
    value the others had by default, is not varied (review 152: it split one setting in two).
    Among training runs alone where there are any: an eval.py run's settings are its task's
    (ckpt_path, data=...), none of the training's (walkthrough 157: with one beside two runs of
    two learning rates, 12 keys "varied", each run's every override)."""
    trained = [run for run in runs if not run.evaluation]
    evaluated = [run for run in runs if run.evaluation]
    varied = _varied_among(trained or evaluated)
    if trained and evaluated:  # and what sets the eval runs apart, among them (review 161)
        varied += [k for k in _varied_among(evaluated) if k not in varied]
    return varied


def _varied_among(runs: list[RunFolder]) -> list[str]:
    keys = dict.fromkeys(key for run in runs for key in run.params if compared(key))
    varied = [k for k in keys if len({run.setting(k) for run in runs}) > 1]
    # the processes that trained them (each step data.batch_size x processes): where known
    known = {world for run in runs if (world := run.setting(PROCESSES)) is not None}
    return [*varied, PROCESSES] if len(known) > 1 else varied


def over_seeds(comparison: Comparison) -> list[tuple[str, float, float, int, int, int]]:
    """Where settings were repeated over seeds: each setting (the varied overrides but the
    seeds, in key order) with the mean, standard deviation and count of its ranked seeds'
    objective values, the count of its runs without one (failed, interrupted; not those
    with a value on another scale, which are not ranked here), and the count of ranked runs
    that repeated a seed already counted; settings with two or more ranked seeds first, by
    mean, then the others, then those without any value. [] where no setting has two ranked
    seeds (nothing was repeated over seeds). A seed run twice (the same settings in two
    sweeps) is one draw, counted once with its runs' mean: as two, it read "± 0 (n=2)". The
    best single run of repeats is a lucky draw."""
    if not any(key in SEEDS for key in comparison.varied):
        return []
    values: dict[str, dict[tuple, list[float]]] = {}
    missing: Counter = Counter()
    for run in comparison.runs:
        if run.evaluation:
            continue
        setting = seeds_setting(comparison, run)
        if comparison.comparable(run):
            values.setdefault(setting, {}).setdefault(run.seeds, []).append(run.objective[2])
        elif run.failed or run.objective[2] is None:  # not one on another scale: not ranked
            missing[setting] += 1
    if all(len(seeds) < 2 for seeds in values.values()):
        return []
    sign = -1.0 if comparison.mode == "max" else 1.0
    rows = []
    for setting in {**values, **missing}:  # settings with values first, as the runs ranked
        seeds = values.get(setting, {})
        v = [statistics.fmean(runs) for runs in seeds.values()]
        mean = statistics.fmean(v) if v else math.nan
        std = statistics.stdev(v) if len(v) > 1 else math.nan
        repeats = sum(len(runs) - 1 for runs in seeds.values())
        rows.append((setting, mean, std, len(v), missing[setting], repeats))
    return sorted(rows, key=lambda row: (row[3] < 2, row[3] == 0, sign * row[1] if row[3] else 0))


def seeds_setting(comparison: Comparison, run: RunFolder) -> str:
    """A run's setting apart from its seed: the varied overrides but the seeds, in key order."""
    setting = sorted(
        (key, value)
        for key in comparison.varied
        if key not in SEEDS and (value := run.setting(key)) is not None
    )
    return " ".join(f"{key}={value}" for key, value in setting) or "(the same settings)"


def seeds_text(config: str, mean: float, std: float, n: int, missing: int, repeats: int = 0) -> str:
    """One setting's line of "Over seeds": mean ± std (n=...), its seeds without a value, and
    its runs of a seed run before (each seed's runs count once, by their mean)."""
    if n == 0:
        return f"{config}: no value (its {missing} seed(s) failed or have none)"
    text = f"{config}: mean {fmt(mean)} ± {fmt(std)}" if n > 1 else f"{config}: {fmt(mean)}"
    if missing:
        text = f"{text} (n={n} of {n + missing}: {missing} failed or without a value)"
    else:
        text = f"{text} (n={n})"
    if repeats:
        text += f" ({repeats} more run(s) of a seed already counted: one value a seed)"
    return text


def numeric_params(runs: list[RunFolder], varied: list[str]) -> list[str]:
    """Varied keys whose values are all finite numbers, with at least two distinct values;
    not the seeds (no plot of a metric against a seed)."""
    numeric = []
    for key in varied:
        if key in SEEDS:
            continue
        parsed = [number(v) for run in runs if (v := run.setting(key)) is not None]
        if all(p is not None and math.isfinite(p) for p in parsed) and len(set(parsed)) > 1:
            numeric.append(key)
    return numeric


def fmt(value: float | None) -> str:
    """A number to 4 significant digits; empty when missing."""
    return "" if value is None else f"{value:.4g}"


def human_duration(seconds: float | None) -> str:
    """12.3 s, 4 min 05 s, 2 h 07 min."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def shorten(text: str, limit: int) -> str:
    """Whitespace collapsed, cut to limit characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_text(run: RunFolder) -> str:
    """The status, followed by the (shortened) error when there is one."""
    return f"{run.status}: {shorten(run.error, ERROR_CHARS)}" if run.error else run.status


def facts(comparison: Comparison) -> list[tuple[str, str]]:
    """The header lines, (label, text), shared by the HTML page and the Markdown file."""
    counts = Counter(run.status for run in comparison.runs)
    statuses = sorted(counts, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 9)
    by_status = ", ".join(f"{counts[status]} {status}" for status in statuses)
    lines = [("Runs", f"{len(comparison.runs)} ({by_status})")]
    if comparison.metric:
        better = "higher" if comparison.mode == "max" else "lower"
        objective = scaled(comparison.metric, comparison.scale)
        lines.append(("Objective", f"{objective}, {comparison.mode} ({better} is better)"))
    else:
        lines.append(("Objective", "none recorded in summary.json"))
    best = comparison.best
    if best:
        overrides = " ".join(best.overrides) or "(no overrides)"
        value = fmt(best.objective[2])
        text = f"{best.name}: {comparison.metric} = {value}; {overrides}"
        tied = [
            run.name
            for run in comparison.runs
            if run is not best
            and comparison.comparable(run)
            and run.objective[2] == best.objective[2]
        ]
        if tied:  # the first of equal values in the order given (review 152: unsaid)
            shown = ", ".join(tied[:5]) + (", ..." if len(tied) > 5 else "")
            text += f" (tied with {len(tied)} other run(s): {shown}; the first given is named)"
        lines.append(("Best run", text))
    else:
        lines.append(("Best run", "none: no run that did not fail has an objective value"))
    groups = over_seeds(comparison)
    if best and groups:
        best_setting = next(
            (row for row in groups if row[0] == seeds_setting(comparison, best)), None
        )
        lucky = " (one seed's"
        if best_setting is not None and best_setting[4]:
            lucky += f"; its setting has {best_setting[4]} seed(s) that failed or have no value"
        lines[-1] = (lines[-1][0], f"{lines[-1][1]}{lucky})")
        lines.append(
            (
                "Over seeds",
                "; ".join(seeds_text(*row) for row in groups)
                + " (settings run over seeds first, best mean first; ± one standard deviation)",
            )
        )
    if comparison.varied:
        lines.append(("Varied", ", ".join(comparison.varied)))
    runs = comparison.runs
    commits = Counter(str(r.summary["git_commit"]) for r in runs if r.summary.get("git_commit"))
    dirty = [r.name for r in runs if r.summary.get("git_dirty")]
    if len(commits) > 1 or dirty:  # the same overrides may have meant other defaults or code
        counted = ", ".join(f"{commit[:8]} ({n})" for commit, n in commits.most_common())
        code = f"the runs come from {len(commits)} commits: {counted}" if len(commits) > 1 else ""
        if dirty:
            shown = ", ".join(dirty[:5]) + (", ..." if len(dirty) > 5 else "")
            code += "; " if code else ""
            code += f"{len(dirty)} run(s) with uncommitted changes to the code: {shown}"
        lines.append(("Code", code))
    for stop in comparison.stopped_in:
        lines.append(("Stopped", stop))
    return lines
