"""The Markdown twin of the HTML page: the header facts and the same runs table."""

from __future__ import annotations

from pathlib import Path

from litlab.report.compare import Comparison, facts
from litlab.report.runs import folders_title


def md_cell(text: str) -> str:
    """Text safe inside a pipe-table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def table_md(comparison: Comparison) -> str:
    """The runs table as a GitHub pipe table, numbers right-aligned, the best run starred."""
    numeric = comparison.numeric_columns
    head = "| " + " | ".join(md_cell(c) for c in comparison.columns) + " |"
    rule = "|" + "|".join("---:" if c in numeric else "---" for c in comparison.columns) + "|"
    lines = [head, rule]
    for rank, run in enumerate(comparison.runs, 1):
        cells = [md_cell(text) for text in comparison.cells(rank, run)]
        cells[1] = f"`{cells[1]}`" + (" ★ best" if run is comparison.best else "")
        cells[2] = " ".join(f"`{md_cell(o)}`" for o in comparison.shown_overrides(run))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_markdown(comparison: Comparison, folders: list[Path]) -> str:
    """The whole Markdown file."""
    title = f"litlab report: {folders_title(folders)}"
    items = "\n".join(f"- **{label}:** {md_cell(text)}" for label, text in facts(comparison))
    return (
        f"# {title}\n\n{items}\n\n## Runs\n\n{table_md(comparison)}\n\n{errors_md(comparison)}"
        "Learning curves, sweep plots and GAN samples are in report.html.\n"
    )


def errors_md(comparison: Comparison) -> str:
    """Each run's error or end in full (the table's cell is cut short: a lost run's resume=
    line, the one thing to do, was cut to "…"; report.html has it on hovering: walkthrough
    182), by run."""
    ended = [
        f"- `{md_cell(run.name)}` ({run.status}): {md_cell(run.error)}"
        for run in comparison.runs
        if run.error
    ]
    return "## How runs ended\n\n" + "\n".join(ended) + "\n\n" if ended else ""
