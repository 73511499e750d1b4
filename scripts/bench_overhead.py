"""P1 framework overhead: a litlab training run against a hand-written PyTorch loop doing the same work.

    python scripts/bench_overhead.py                   # CPU: about 2.5 min on 2 cores
    python scripts/bench_overhead.py --device cuda     # GPU

Both sides train litlab's SmallCNN (model=cnn: width 32, AdamW, OneCycleLR stepped per batch) on
Fashion-MNIST (litlab's 54,000-image training split, batch 128, no augmentation) for --steps
steps from the same seed, and must end on the same training loss (checked to 5 decimals).
- litlab: the train task on `data=fashion_mnist model=cnn logger=none trainer.max_steps=N
  +trainer.limit_val_batches=0 test=false extras.print_config=false` (plus `trainer=gpu
  trainer.deterministic=warn` on CUDA: deterministic kernels where CUDA has them, so that both
  sides compute the same numbers; AdaptiveMaxPool2d(1)'s backward has none but writes each
  gradient to one place, so it is deterministic anyway), default callbacks included; "no bar" adds
  `callbacks.progress_bar=null +trainer.enable_progress_bar=false`.
- raw: `benchlib.raw_classifier` on the same composed config: seed, the DataModule's split in a
  DeviceLoader and its batch transform, the net, optimizer and schedule built from the config,
  then a plain loop (bf16 autocast and deterministic kernels on CUDA, as the trainer there).
Times: "run" = the whole task call (data load, build, fit, checkpoints) or the whole raw function;
"loop" = first batch to last step. Validation is off on both sides: the same work is training.
Every round runs each variant once, in alternating order; a short first round warms up and is
not counted; medians of --repeats rounds, and "x raw paired": the median of the per-round loop
ratios (robust to a machine whose speed drifts between rounds). Results: docs/benchmarks.md,
"P1 framework overhead".
"""

from __future__ import annotations

import argparse
import sys

import benchlib
import torch
from benchlib import Measure

NO_BAR = ["callbacks.progress_bar=null", "+trainer.enable_progress_bar=false"]


def overrides(args: argparse.Namespace, device: torch.device, steps: int) -> list[str]:
    """The command line of the litlab side, `python train.py <these>`."""
    gpu = ["trainer=gpu", "trainer.deterministic=warn"] if device.type == "cuda" else []
    return [
        "data=fashion_mnist",
        "model=cnn",
        *gpu,
        "logger=none",
        f"trainer.max_steps={steps}",
        "+trainer.limit_val_batches=0",
        "test=false",
        "extras.print_config=false",
        *benchlib.data_dir_override(args.data_dir),
        *args.overrides,
    ]


def litlab_side(overrides: list[str]) -> Measure:
    seconds, summary = benchlib.litlab_run([*overrides, *benchlib.timer_override()])
    loop = benchlib.LoopTimer.last
    return {"run s": seconds, "loop s": loop["s"], "loss": summary["metrics"]["train/loss_step"]}


def main() -> None:
    parser = benchlib.arguments(__doc__)
    parser.add_argument(
        "--steps", type=int, help="training steps per run (default: 200 on CPU, 2,000 on CUDA)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="more overrides for both sides, e.g. callbacks.speed.compile=true",
    )
    args = parser.parse_args()
    device = benchlib.start(args)
    steps = args.steps or (2000 if device.type == "cuda" else 200)
    print(f"litlab: python train.py {' '.join(overrides(args, device, steps))}")
    print(f"{steps} steps of batch 128; warm-up round: 10 steps")

    def litlab(warm: bool) -> Measure:
        return litlab_side(overrides(args, device, 10 if warm else steps))

    def litlab_no_bar(warm: bool) -> Measure:
        return litlab_side(overrides(args, device, 10 if warm else steps) + NO_BAR)

    def raw(warm: bool) -> Measure:
        n = 10 if warm else steps
        cfg = benchlib.compose(overrides(args, device, n), benchlib.REPO / "outputs" / "unused")
        return benchlib.raw_classifier(cfg, device, steps=n)

    results = benchlib.interleaved(
        {"litlab": litlab, "litlab, no bar": litlab_no_bar, "raw loop": raw}, args.repeats
    )
    for runs in zip(*results.values(), strict=True):
        losses = [m["loss"] for m in runs]
        if max(losses) - min(losses) >= 5e-6:
            sys.exit(f"the final losses differ: {losses}; the sides did not do the same work")
    m = benchlib.medians(results)
    raw_m = m["raw loop"]
    rows = [
        [
            name,
            f"{v['run s']:.2f}",
            f"{v['run s'] / raw_m['run s']:.3f}",
            f"{v['loop s']:.2f}",
            f"{v['loop s'] / raw_m['loop s']:.3f}",
            f"{benchlib.paired_ratio(results, name, 'raw loop', 'loop s'):.3f}",
            f"{(v['loop s'] - raw_m['loop s']) / steps * 1e3:+.2f}",
            f"{steps * 128 / v['loop s']:,.0f}",
            f"{v['loss']:.6f}",
        ]
        for name, v in m.items()
    ]
    header = [
        "variant",
        "run s",
        "x raw",
        "loop s",
        "x raw",
        "x raw paired",
        "ms/step vs raw",
        "loop img/s",
        "final loss",
    ]
    print()
    print(benchlib.table(header, rows))


if __name__ == "__main__":
    main()
