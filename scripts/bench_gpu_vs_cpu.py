"""P0 GPU vs CPU: one litlab training epoch on all of the machine's CPU cores and on its GPU.

    python scripts/bench_gpu_vs_cpu.py --device cuda --data-dir .data   # GPU machine: both sides
    python scripts/bench_gpu_vs_cpu.py                                  # CPU side only, 20 batches

Two experiments, each one training epoch of Fashion-MNIST (litlab's 54,000-image split, 28 px,
batch 128) through the train task, validation and test off:
- cnn: `data=fashion_mnist model=cnn` (SmallCNN, width 32, AdamW);
- dcgan: `data=fashion_mnist model=dcgan callbacks.fid=null callbacks.samples=null` (DCGAN G and
  D of width 64, one D and one G step per batch; FID and sample grids are evaluation, not training).
Each with `logger=none extras.print_config=false trainer.max_epochs=1 +trainer.limit_val_batches=0
test=false trainer.precision=<--precision>` and `trainer=cpu` (every core: torch's default thread
count) or `trainer=gpu`. The same precision on both sides: 32-true by default, as published
CPU/GPU comparisons run. Timed: the fit loop, from its start to its end, device synced.
Every round runs each side once, in alternating order, after a warm-up round of 5 batches;
medians of --repeats rounds. Results: docs/benchmarks.md, "P0 GPU vs CPU".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import benchlib
from benchlib import Measure

EXPERIMENTS = {
    "cnn": ["data=fashion_mnist", "model=cnn"],
    "dcgan": ["data=fashion_mnist", "model=dcgan", "callbacks.fid=null", "callbacks.samples=null"],
}
SIDES = {"CPU": "trainer=cpu", "GPU": "trainer=gpu"}


def overrides(
    experiment: str, side: str, args: argparse.Namespace, batches: int | None
) -> list[str]:
    """The command line of one run, `python train.py <these>`."""
    return [
        *EXPERIMENTS[experiment],
        SIDES[side],
        f"trainer.precision={args.precision}",
        "logger=none",
        "extras.print_config=false",
        "trainer.max_epochs=1",
        "+trainer.limit_val_batches=0",
        "test=false",
        *([f"+trainer.limit_train_batches={batches}"] if batches else []),
        *benchlib.data_dir_override(args.data_dir),
        *benchlib.timer_override(),
    ]


def main() -> None:
    parser = benchlib.arguments(__doc__, device_help="cuda: CPU vs GPU; cpu: the CPU side only")
    parser.add_argument(
        "--max-batches", type=int, help="batches per epoch (default: all with cuda, 20 with cpu)"
    )
    parser.add_argument("--precision", default="32-true", help="trainer.precision of both sides")
    args = parser.parse_args()
    device = benchlib.start(args)
    sides = list(SIDES) if device.type == "cuda" else ["CPU"]
    batches = args.max_batches or (None if device.type == "cuda" else 20)
    print(f"batches per epoch: {batches or 'all'}; warm-up round: 5 batches")

    def run(experiment: str, side: str) -> Callable[[bool], Measure]:
        def measure(warm: bool) -> Measure:
            benchlib.litlab_run(overrides(experiment, side, args, 5 if warm else batches))
            loop = benchlib.LoopTimer.last
            return {"epoch s": loop["s"], "img/s": loop["batches"] * 128 / loop["s"]}

        return measure

    variants = {f"{e}, {s}": run(e, s) for e in EXPERIMENTS for s in sides}
    m = benchlib.medians(benchlib.interleaved(variants, args.repeats))
    rows = []
    for e in EXPERIMENTS:
        cpu, gpu = m[f"{e}, CPU"], m.get(f"{e}, GPU")
        rows.append(
            [
                e,
                f"{cpu['epoch s']:.2f}",
                f"{cpu['img/s']:,.0f}",
                f"{gpu['epoch s']:.2f}" if gpu else "not run",
                f"{gpu['img/s']:,.0f}" if gpu else "not run",
                f"{gpu['img/s'] / cpu['img/s']:.1f}" if gpu else "not run",
            ]
        )
    header = ["experiment", "CPU s", "CPU img/s", "GPU s", "GPU img/s", "GPU / CPU"]
    print()
    print(benchlib.table(header, rows))


if __name__ == "__main__":
    main()
