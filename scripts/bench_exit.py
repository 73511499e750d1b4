"""A command's exit: the time from its last statement to the end of its process, with and
without litlab's ``freeze_the_imports`` (train.py and eval.py call it first).

    python scripts/bench_exit.py --repeats 7

Each round starts two fresh interpreters, in alternating order, that import what train.py
imports (``litlab.train``), record the time, and end; the parent waits for each one's end. The
interpreters differ only in the call (``--import`` picks another module). Medians and the
median of the per-round ratios ("paired"). Results: docs/benchmarks.md, "A command's exit".
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHILD = """
import sys, time, {module}
if {frozen}:
    from litlab.run import freeze_the_imports
    freeze_the_imports()
print(time.time(), flush=True)
"""


def exit_s(module: str, frozen: bool) -> float:
    """Seconds from the child's last statement to its end as its parent sees it."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(module=module, frozen=frozen)], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    last = float(child.stdout.readline())
    child.wait()
    ended = time.time()
    if child.returncode != 0:
        sys.exit(f"the interpreter importing {module} failed (exit {child.returncode})")
    return ended - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--import", dest="module", default="litlab.train")
    args = parser.parse_args()
    rows: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.repeats):
        for frozen in (r % 2 == 0, r % 2 == 1):  # alternating order
            rows[frozen].append(exit_s(args.module, frozen))
        print(f"round {r + 1}: default {rows[False][-1]:.2f} s, frozen {rows[True][-1]:.2f} s")
    paired = statistics.median(d / f for d, f in zip(rows[False], rows[True], strict=True))
    print(f"\nexit after importing {args.module}, median of {args.repeats} rounds:")
    print(f"  interpreter's default: {statistics.median(rows[False]):.2f} s")
    print(f"  freeze_the_imports: {statistics.median(rows[True]):.2f} s")
    print(f"  default / frozen, paired: {paired:.2f}x")


if __name__ == "__main__":
    main()
