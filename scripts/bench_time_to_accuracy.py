"""P3 time to accuracy: wall time of a Fashion-MNIST recipe, training plus test, and the accuracy it reaches.

    python scripts/bench_time_to_accuracy.py                  # CPU: about 2.5 min on 2 cores
    python scripts/bench_time_to_accuracy.py --device cuda    # GPU (target 94%)
    python scripts/bench_time_to_accuracy.py --device cuda --experiment fashion_sprint --repeats 3

The recipe is an experiment config (default: experiment=fashion_fast). Both sides run it whole
from the same seed and report the official 10,000-image test set's accuracy:
- litlab: the train task on `experiment=<recipe> logger=none extras.print_config=false` (plus
  `trainer=gpu` on CUDA): data load, fit with its validation and checkpoints, test of the best
  checkpoint, summary.json;
- raw: `benchlib.raw_classifier` on the same composed config: data load, the same training as a
  plain PyTorch loop (no validation; weight-decay groups and gradient clipping as the recipe's),
  then the test set in eval mode. It has no test-time flip, erasing, mixing, EMA, gradient
  accumulation or plateau schedule: for recipes with any of them (P3': fashion_sprint,
  fashion_best) the raw side is left out, with a line naming them, and the table has litlab's
  rows alone.
Time to accuracy = the whole call's wall time, in this process (Python start-up and imports are
not counted: ``time python train.py experiment=fashion_fast logger=none`` shows them), when the
final test accuracy reaches --target; otherwise "not reached". Every round runs each side once,
in alternating order, after a warm-up round of --warm-up-batches batches; medians of --repeats.
Results: docs/benchmarks.md, "P3 time to accuracy".
"""

from __future__ import annotations

import argparse

import benchlib
import torch
from benchlib import Measure
from omegaconf import DictConfig


def overrides(args: argparse.Namespace, device: torch.device, warm: bool) -> list[str]:
    """The command line of the litlab side, `python train.py <these>`."""
    return [
        f"experiment={args.experiment}",
        # on a CPU the CPU (the raw loop's device), even on a machine with a GPU
        *(["trainer=gpu"] if device.type == "cuda" else ["trainer.accelerator=cpu"]),
        "logger=none",
        "extras.print_config=false",
        *benchlib.data_dir_override(args.data_dir),
        *(["trainer.max_epochs=1", f"+trainer.limit_train_batches={args.warm_up_batches}"] * warm),
        *args.overrides,
    ]


def raw_loop_lacks(cfg: DictConfig) -> list[str]:
    """What the recipe does that the raw loop does not (it has no test-time flip, erasing,
    mixing, EMA, gradient accumulation, nor a schedule stepped by validation, and trains whole
    epochs): empty where the two compute the same."""
    lacks = [f"model.{k}" for k in ("tta_flip", "erasing", "mix") if cfg.model.get(k)]
    if (cfg.get("callbacks") or {}).get("ema"):
        lacks.append("callbacks.ema")
    if int(cfg.trainer.get("accumulate_grad_batches") or 1) > 1:
        lacks.append("trainer.accumulate_grad_batches")
    if "ReduceLROnPlateau" in str((cfg.model.get("scheduler") or {}).get("_target_")):
        lacks.append("model/scheduler=plateau")
    # the raw loop trains whole epochs (benchlib.raw_classifier): a step budget or a part of
    # each epoch would time runs of different lengths
    if int(cfg.trainer.get("max_steps") or -1) >= 0:
        lacks.append("trainer.max_steps")
    limit = cfg.trainer.get("limit_train_batches")  # 1.0: all; the number 1: one batch
    if limit is not None and not (isinstance(limit, float) and limit == 1.0):
        lacks.append("trainer.limit_train_batches")
    return lacks


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=1)
    parser.add_argument("--experiment", default="fashion_fast", help="the recipe (conf/experiment)")
    parser.add_argument("--target", type=float, help="test accuracy (default 0.92 CPU, 0.94 CUDA)")
    parser.add_argument(
        "--warm-up-batches", type=int, default=20, help="training batches of the warm-up round"
    )
    parser.add_argument(
        "overrides", nargs="*", help="more overrides for both sides, e.g. trainer.max_epochs=2"
    )
    args = parser.parse_args()
    device = benchlib.start(args)
    target = args.target or (0.94 if device.type == "cuda" else 0.92)
    print("litlab: python train.py " + " ".join(overrides(args, device, warm=False)))

    def litlab(warm: bool) -> Measure:
        seconds, summary = benchlib.litlab_run(overrides(args, device, warm))
        durations = summary["durations_s"]
        return {
            "run s": seconds,
            "fit s": durations["fit"],
            "test s": durations["test"],
            "test acc": summary["metrics"]["test/acc"],
        }

    def raw(warm: bool) -> Measure:
        cfg = benchlib.compose(overrides(args, device, warm), benchlib.REPO / "outputs" / "unused")
        return benchlib.raw_classifier(cfg, device, steps=args.warm_up_batches if warm else None)

    sides = {"litlab": litlab, "raw loop": raw}
    composed = benchlib.compose(
        overrides(args, device, False), benchlib.REPO / "outputs" / "unused"
    )
    lacks = raw_loop_lacks(composed)
    if lacks:
        print(f"raw loop left out: it has no {', '.join(lacks)}, which the recipe uses")
        del sides["raw loop"]
    m = benchlib.medians(benchlib.interleaved(sides, args.repeats))
    rows = []
    for name, v in m.items():
        reached = v["test acc"] >= target
        rows.append(
            [
                name,
                f"{v['run s']:.1f}",
                f"{v['run s'] / m['raw loop']['run s']:.3f}" if "raw loop" in m else "-",
                f"{v['test acc']:.4f}",
                f"{v['run s']:.1f}" if reached else "not reached",
            ]
        )
    print()
    header = ["side", "train + test s", "x raw", "test acc", f"s to {target:.1%}"]
    print(benchlib.table(header, rows))
    litlab_m = m["litlab"]
    print(f"\nlitlab phases: fit {litlab_m['fit s']:.1f} s, test {litlab_m['test s']:.1f} s")


if __name__ == "__main__":
    main()
