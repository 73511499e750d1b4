"""Offline comparison of runs: reads run folders only (summary.json, CSV logs, samples).

python -m litlab.report <sweep or run folders...> [--out DIR] writes report.html (self-contained:
table, learning curves, sweep plots, GAN samples) and report.md (the same table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from litlab.report.compare import Comparison, compare, jobs_not_run
from litlab.report.runs import ReportError, default_report_folder, find_runs

PROG = "litlab-report"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: folders to compare and where to write."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compare runs offline: a table, learning curves, sweep plots and GAN samples.",
        epilog="Example: litlab-report outputs/train/multirun/2026-01-31/12-00-00-000000",
    )
    parser.add_argument(
        "folders", nargs="+", type=Path, help="sweep or run folders (searched for summary.json)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for report.html and report.md (default: the folder given; for several, "
        "report-<their names> beside them)",
    )
    return parser.parse_args(argv)


def write_report(comparison: Comparison, folders: list[Path], out: Path) -> tuple[Path, Path]:
    """Write out/report.html and out/report.md; returns their paths."""
    # matplotlib loads only once the input is known to be good
    from litlab.report.markdown import render_markdown
    from litlab.report.page import render_html

    out.mkdir(parents=True, exist_ok=True)
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(render_html(comparison, folders), encoding="utf-8")
    md_path.write_text(render_markdown(comparison, folders), encoding="utf-8")
    return html_path, md_path


def stopped_in(folders: list[Path]) -> list[str]:
    """Where each of these sweep folders was stopped by a signal (its sweep_summary.json says
    "stopped": the local launcher's sweep ends with the job; the jobs after it never ran): the
    job, and of a grid sweep how many of its planned jobs did not run (their overrides are its
    "not_run")."""
    stops = []
    for folder in folders:
        try:
            summary = json.loads((Path(folder) / "sweep_summary.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(summary, dict) or not summary.get("stopped"):
            continue
        if summary.get("stopped_in"):  # (kept when a resumed job wrote the summary anew)
            job = str(summary["stopped_in"])
        elif summary.get("interrupted"):  # a summary from before it was kept
            job = str(summary["interrupted"][-1]["job_dir"])
        else:
            continue
        after = jobs_not_run()
        not_run, planned = summary.get("not_run"), summary.get("planned")
        if isinstance(not_run, list) and isinstance(planned, int):
            after = (
                f"{jobs_not_run(len(not_run), planned)} (their overrides: not_run in "
                f"{Path(folder) / 'sweep_summary.json'})"
            )
        stops.append(f"the sweep stopped in its job {job}; {after}")
    return stops


def fail(message: str) -> NoReturn:
    """One line on stderr saying what to do, exit status 2, no traceback."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    """Entry point of litlab-report: compare the runs under the given folders."""
    args = parse_args(argv)
    try:
        runs = find_runs(args.folders)
    except ReportError as exc:
        fail(str(exc))
    out = args.out or default_report_folder(args.folders)
    comparison = compare(runs)
    comparison.stopped_in = stopped_in(args.folders)
    try:
        paths = write_report(comparison, args.folders, out)
    except OSError as exc:
        fail(f"cannot write the report to {out} ({exc.strerror or exc}); choose another --out DIR")
    print(*paths, sep="\n")
