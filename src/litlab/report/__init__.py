"""Offline comparison of runs: reads run folders only (summary.json, CSV logs, samples)."""


def main() -> None:  # replaced by the report implementation
    raise SystemExit("litlab.report is not implemented yet")
