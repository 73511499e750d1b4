"""Figures for the report, drawn with matplotlib's Agg canvas (no pyplot state) into PNG bytes."""

from __future__ import annotations

import io
import math

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from litlab.report.compare import Comparison
from litlab.report.runs import RunFolder, number

CURVE_METRICS = ("val/acc", "val/fid", "val/loss", "train/loss_step", "g/loss", "d/loss")
MARKERS_UP_TO = 30  # points per line; denser lines are drawn without markers
LEGEND_COLUMNS = 3  # legend entries per row, under the plot; one fewer for wide labels
WIDE_LABEL = 32  # characters
LOG_SPAN = 20  # a positive parameter spanning more than this factor gets a log axis


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (without the matplotlib URL in the PNG metadata)."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def style(index: int, count: int) -> dict:
    """RunFolder index's colour (line style too past 20 runs) among count runs, the same in every plot."""
    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return {
        "color": palette(index % palette.N),
        "linestyle": ("-", "--", ":")[index // palette.N % 3],
    }


def finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels and a light grid."""
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def curve_metrics(comparison: Comparison) -> list[str]:
    """Metrics worth a learning-curve plot: the objective first, then the usual ones logged."""
    wanted = dict.fromkeys([m for m in (comparison.metric,) if m] + list(CURVE_METRICS))
    return [m for m in wanted if any(m in run.curves for run in comparison.runs)]


def curve_plot(comparison: Comparison, metric: str) -> bytes:
    """One metric against the epochs trained, one line per run, on shared axes."""
    drawn = [(i, run) for i, run in enumerate(comparison.runs) if metric in run.curves]
    labels = [curve_label(comparison, run, metric) for _, run in drawn]
    wide = max(len(label) for label in labels) > WIDE_LABEL
    columns = min(LEGEND_COLUMNS - wide, len(drawn))
    legend_rows = math.ceil(len(drawn) / columns)
    fig = Figure(figsize=(7.5, 3.8 + 0.2 * legend_rows), layout="constrained")
    ax = fig.subplots()
    for (index, run), label in zip(drawn, labels, strict=True):
        steps, values = run.curves[metric]
        marker = "o" if len(steps) <= MARKERS_UP_TO else None
        ax.plot(
            steps,
            values,
            marker=marker,
            markersize=4,
            label=label,
            **style(index, len(comparison.runs)),
        )
    finish(ax, metric, "epochs trained", metric)
    fig.legend(loc="outside lower center", ncols=columns, fontsize=8, frameon=False)
    return png(fig)


def curve_label(comparison: Comparison, run: RunFolder, metric: str) -> str:
    """A run's legend label; on its objective's curve, measured on another scale than the
    report's (another FID extractor or N, an accuracy on other data), that scale: the table
    never ranks such values together, and one axis showed them alike."""
    label = comparison.label(run)
    if metric == run.objective[0] and run.objective_scale != comparison.scale:
        label += f" [{run.objective_scale or 'scale not recorded'}]"
    return label


def sweep_points(comparison: Comparison, key: str) -> list[tuple[float, float, RunFolder]]:
    """(parameter value, objective value, run) for runs comparable on the objective."""
    points = []
    for run in comparison.runs:
        x = number(run.setting(key))
        if x is not None and comparison.comparable(run):
            points.append((x, run.objective[2], run))
    return points


def sweep_plot(comparison: Comparison, key: str) -> bytes | None:
    """The objective against one swept parameter (None unless it takes two values to show)."""
    points = sweep_points(comparison, key)
    if len({x for x, _, _ in points}) < 2:
        return None
    fig = Figure(figsize=(5.5, 4.0), layout="constrained")
    ax = fig.subplots()
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.scatter(xs, ys, s=40, color="tab:blue", zorder=3, label="runs")
    best = [(x, y) for x, y, run in points if run is comparison.best]
    if best:
        ax.scatter(
            *zip(*best, strict=True), s=220, marker="*", color="tab:orange", zorder=4, label="best"
        )
    if min(xs) > 0 and max(xs) / min(xs) > LOG_SPAN:
        ax.set_xscale("log")
    direction = "higher is better" if comparison.mode == "max" else "lower is better"
    finish(ax, f"{comparison.metric} vs {key}", key, f"{comparison.metric} ({direction})")
    ax.legend(fontsize=8)
    return png(fig)
