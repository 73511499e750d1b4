"""P1 attribution inside the default run: microseconds a training step in each callback's hooks,
in the loggers' calls and in LightningModule.log, timed where they run (not by difference of
whole runs, whose rounds differ by as much as the pieces on a small VM).

    python scripts/bench_hooks.py                 # tiny MLP, 3 epochs, 3 runs (CPU: ~1 min)
    python scripts/bench_hooks.py --repeats 5 --top 30

The run is bench_overhead.py's "+ progress bar" (litlab's default run: CSV + W&B offline, every
default callback) on its tiny MLP. Each callback's hook methods and each logger's log_metrics and
save are wrapped with a perf_counter timer; "Lightning's dispatch" is the time of Lightning's
`_call_callback_hooks` (a private function, read not patched in behaviour) minus the callbacks' own.
The timers cost about 1 us a call themselves. Medians over --repeats runs; "calls/step" and
"us/call" tell a per-step cost from a rare one. Results: docs/benchmarks.md, "P1 per-step overhead".
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_overhead
import benchlib
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.trainer import call

from litlab import compat

HOOKS = (*compat.TRAINING_STEP_HOOKS, "on_train_epoch_start", "on_train_epoch_end")
spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(function: Any, label: str) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            calls[label] += 1

    return wrapper


def instrument() -> None:
    """Timers around the loggers, LightningModule.log and Lightning's callback dispatch; each
    callback's hooks are wrapped when the dispatch first sees it."""
    import lightning as L

    for cls, name in ((WandbLogger, "log_metrics"), (CSVLogger, "log_metrics")):
        setattr(cls, name, timed(getattr(cls, name), f"{cls.__name__}.{name}"))
    for cls in (WandbLogger, CSVLogger):
        cls.save = timed(cls.save, f"{cls.__name__}.save")
    L.LightningModule.log = timed(L.LightningModule.log, "LightningModule.log")
    dispatch = call._call_callback_hooks
    timed_dispatch = {hook: timed(dispatch, f"dispatch.{hook}") for hook in HOOKS}

    def wrapped_dispatch(trainer: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
        for callback in trainer.callbacks:
            if not getattr(callback, "_bench_timed", False):
                callback._bench_timed = True
                for name in HOOKS:
                    method = getattr(callback, name)
                    if callable(method):  # None: skipped by the dispatch (litlab.compat)
                        label = f"{type(callback).__name__}.{name}"
                        setattr(callback, name, timed(method, label))
        return timed_dispatch.get(hook, dispatch)(trainer, hook, *args, **kwargs)

    call._call_callback_hooks = wrapped_dispatch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=20, help="rows shown")
    parser.add_argument("--data-dir", help="where fashion_mnist's files are (else litlab searches)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # tiny_mlp, the user's own module
    device = torch.device("cpu")
    instrument()
    mode = bench_overhead.wandb_mode()
    options = argparse.Namespace(net="mlp", steps=None, data_dir=args.data_dir, overrides=[])
    runs: list[dict[str, tuple[float, float]]] = []
    steps_ms = []
    for i in range(args.repeats + 1):  # the first run warms up, not counted
        spent.clear()
        calls.clear()
        measure = bench_overhead.task_side(bench_overhead.overrides(options, device, False, mode))
        steps = measure["steps"]
        if i == 0:
            continue
        steps_ms.append(measure["loop s"] / steps * 1e3)
        run = {k: (v / steps * 1e6, calls[k] / steps) for k, v in spent.items()}
        for hook in HOOKS:  # the dispatch's own share: its time less the callbacks' hooks'
            if f"dispatch.{hook}" not in run:
                continue
            total, per = run.pop(f"dispatch.{hook}")
            own = sum(us for k, (us, _) in run.items() if k.endswith(f".{hook}"))
            run[f"Lightning's dispatch of {hook}"] = (total - own, per)
        runs.append(run)
    print(
        f"\ndefault run, tiny MLP: {statistics.median(steps_ms):.3f} ms/step (median of "
        f"{args.repeats} runs; {benchlib.__name__}'s loop window), {mode} W&B"
    )
    keys = set().union(*runs)
    median = {
        k: (
            statistics.median(r.get(k, (0.0, 0.0))[0] for r in runs),
            statistics.median(r.get(k, (0.0, 0.0))[1] for r in runs),
        )
        for k in keys
    }
    rows = sorted(median.items(), key=lambda kv: -kv[1][0])[: args.top]
    benchlib.print_table(
        ["where", "us/step", "calls/step", "us/call"],
        [[k, f"{us:.1f}", f"{per:.3f}", f"{us / per:.1f}" if per else ""] for k, (us, per) in rows],
        [],
    )


if __name__ == "__main__":
    main()
