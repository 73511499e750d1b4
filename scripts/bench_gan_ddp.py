"""A GAN under DDP: one DDP wrapper around the whole module against litlab's wrapper per net.

    python scripts/bench_gan_ddp.py                          # 2 CPU processes (gloo)
    python scripts/bench_gan_ddp.py --model dcgan_wgangp --steps 8
    python scripts/bench_gan_ddp.py --device cuda --devices 2

Both sides run `python train.py` (DDP needs processes of its own) on the same GAN, data and
seed, P5's settings (`model=dcgan data=synthetic callbacks.fid=null callbacks.samples=null`, no
logger, no evaluation), on --devices processes, with
trainer.strategy=ddp_find_unused_parameters_true (Lightning's one wrapper: every backward
all-reduces both nets' gradients, zeros for the net not stepping, after a search of the graph for
unused parameters) or trainer.strategy=ddp (a GAN's default: litlab.distributed.
SeparateNetsDDPStrategy, one wrapper per net). The warm-up round counts the gradient elements each
wrapper all-reduced (a communication hook that all-reduces as DDP's own), per generator step;
the timed rounds run without the hook: ms per generator step (its n_critic D steps and its G
step) over the window after --warm-steps generator steps, global rank 0's clock (the ranks wait
for each other in every all-reduce), in alternating order, medians and the paired ratio. Both
sides do the same arithmetic: their final D losses are compared (equal to the bit on a CPU).
Results: docs/benchmarks.md, "A GAN under DDP".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib
import torch
from bench_throughput import common
from benchlib import Measure

VARIANTS = {
    "one wrapper (ddp_find_unused_parameters_true)": "ddp_find_unused_parameters_true",
    "a wrapper per net (ddp)": "ddp",
}


def overrides(args, strategy: str, steps: int, out: Path, count: bool) -> list[str]:
    """The run: P5's settings (bench_throughput.common: no evaluation, logging or checkpoints,
    synthetic images drawn once) for the GAN on --devices processes, one epoch of ``steps``
    batches per process."""
    return [
        f"model={args.model}",
        f"data.image_shape=[{args.gan_channels},{args.gan_size},{args.gan_size}]",
        f"model.generator.width={args.gan_width}",
        f"model.discriminator.width={args.gan_width}",
        *common(torch.device(args.device), args.gan_batch, steps * args.devices),
        f"trainer.devices={args.devices}",
        f"trainer.strategy={strategy}",
        "callbacks.progress_bar=null",
        "callbacks.fid=null",
        "callbacks.samples=null",
        # Lightning counts every D and G step: one G step every n_critic batches
        f"trainer.max_steps={steps + steps // critic(args)}",
        "+callbacks.ddp_probe._target_=benchlib.DDPProbe",
        f"+callbacks.ddp_probe.out={out}",
        f"+callbacks.ddp_probe.skip={args.warm_steps * critic(args)}",
        f"+callbacks.ddp_probe.count={count}",
    ]


def critic(args) -> int:
    """Batches (D steps) a generator step."""
    return 5 if args.model == "dcgan_wgangp" else 1


def run(args, strategy: str, steps: int, count: bool) -> dict:
    """One `python train.py` run on --devices processes: rank 0's DDPProbe reading."""
    scripts = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(scripts), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="litlab-bench-") as scratch:
        out = Path(scratch) / "probe.json"
        command = [
            sys.executable,
            str(benchlib.REPO / "train.py"),
            *overrides(args, strategy, steps, out, count),
            f"paths.log_dir={scratch}",
        ]
        done = subprocess.run(command, cwd=benchlib.REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            sys.exit(f"{strategy}: train.py failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=3, data_dir=False)
    parser.add_argument("--devices", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--model",
        choices=["dcgan", "dcgan_wgangp"],
        default="dcgan",
        help="dcgan_wgangp: five critic steps a generator step, a gradient penalty",
    )
    parser.add_argument("--gan-batch", type=int, default=32, help="batch per process (default 32)")
    parser.add_argument("--gan-size", type=int, default=32, help="pixels (default 32)")
    parser.add_argument("--gan-channels", type=int, default=3, help="channels (default 3)")
    parser.add_argument("--gan-width", type=int, default=64, help="DCGAN widths (default 64)")
    parser.add_argument("--steps", type=int, default=20, help="timed generator steps (default 20)")
    parser.add_argument("--warm-steps", type=int, default=3, help="untimed steps first (default 3)")
    args = parser.parse_args()
    benchlib.start(args)
    steps = (args.warm_steps + args.steps) * critic(args)  # batches
    counted: dict[str, dict] = {}

    def variant(name: str, strategy: str):
        def measure(warm_up: bool) -> Measure:
            reading = run(args, strategy, steps, count=warm_up)
            if warm_up:
                counted[name] = reading
            g_steps = reading["batches"] / critic(args)  # n_critic D steps, one G step
            return {"ms/G step": 1000 * reading["s"] / g_steps, "loss": reading["loss"]}

        return measure

    print(
        f"{args.model} {args.gan_channels}x{args.gan_size}x{args.gan_size}, widths {args.gan_width}, "
        f"batch {args.gan_batch} per process, {args.devices} processes; {args.steps} timed "
        f"steps after {args.warm_steps}"
    )
    results = benchlib.interleaved(
        {name: variant(name, strategy) for name, strategy in VARIANTS.items()}, args.repeats
    )
    one, per_net = VARIANTS
    table = benchlib.medians(results)
    rows = []
    for name in VARIANTS:
        reading = counted[name]
        elements = sum(reading["elements"].values()) / reading["g_steps"]
        ratio = benchlib.paired_ratio(results, name, one, "ms/G step")
        rows.append([name, f"{elements:,.0f}", f"{table[name]['ms/G step']:.1f}", f"{ratio:.3f}"])
    checks = [
        benchlib.loss_check({a: x["loss"], b: y["loss"]}, 1e-5, relative=True) + f" (round {i + 1})"
        for i, (x, y) in enumerate(zip(results[one], results[per_net], strict=True))
        for a, b in [(one, per_net)]
    ]
    print(benchlib.rounds_caption(results))
    benchlib.print_table(
        [
            "strategy",
            "gradient elements all-reduced per G step",
            "ms per G step",
            "x one wrapper, paired",
        ],
        rows,
        checks,
    )


if __name__ == "__main__":
    main()
