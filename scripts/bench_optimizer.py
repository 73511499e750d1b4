"""P1 per-step cost of the optimizer: torch's fused implementation, which litlab picks for Adam,
AdamW and SGD (litlab.models.optim.make_optimizer), against torch's default one, which a
hand-written loop gets (on a CPU a loop over the tensors, on CUDA ``foreach``).

    python scripts/bench_optimizer.py                  # CPU, ~2 min
    python scripts/bench_optimizer.py --device cuda

One training step (zero_grad, forward, backward, step) of each net with its litlab optimizer,
batch 128, on random inputs: the tiny MLP (scripts/tiny_mlp.py, Adam 1e-3, as bench_overhead
--net mlp trains it), SmallCNN (model=cnn: AdamW), the small-image ResNet-18 (model=resnet:
SGD with Nesterov momentum) and DCGAN's generator and discriminator (model=dcgan: Adam). The two
implementations start from the same weights and train alternately, in rounds of up to --steps
steps (fewer for a net whose step is slow: a round lasts about --round-s seconds; the first
round warms up and is not counted); "ms/step" is the median of the rounds, "x default paired"
the median of the rounds' ratios. That the two make the same update is tested
(tests/test_train.py). Results: docs/benchmarks.md, P1.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import benchlib
import torch
from hydra.utils import instantiate
from torch import nn

from litlab.config import build
from litlab.models.optim import make_optimizer

BATCH = 128


def cases(device: torch.device) -> dict[str, tuple[Callable[[], nn.Module], Callable, Callable]]:
    """name -> (a new net, its optimizer's factory, a loss of a batch)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_mlp import TinyMLP

    gray = torch.rand(BATCH, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (BATCH,), device=device)
    color = torch.rand(BATCH, 3, 32, 32, device=device)
    out = benchlib.REPO / "outputs" / "unused"
    cnn = benchlib.compose(["data=fashion_mnist", "model=cnn"], out)
    resnet = benchlib.compose(["data=cifar10", "model=resnet"], out)
    gan = benchlib.compose(["data=fashion_mnist", "model=dcgan"], out)
    noise = torch.randn(BATCH, int(gan.model.generator.latent_dim), device=device)

    def classify(images: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
        return lambda net: nn.functional.cross_entropy(net(images), labels)

    return {
        "tiny MLP, Adam": (
            TinyMLP,
            functools.partial(torch.optim.Adam, lr=1e-3),
            classify(gray),
        ),
        "SmallCNN, AdamW": (
            lambda: build(cnn.model.net, "model.net"),
            instantiate(cnn.model.optimizer),
            classify(gray),
        ),
        "ResNet-18 (32 px), SGD": (
            lambda: build(resnet.model.net, "model.net"),
            instantiate(resnet.model.optimizer),
            classify(color),
        ),
        "DCGAN generator, Adam": (
            lambda: build(gan.model.generator, "model.generator"),
            instantiate(gan.model.g_optimizer),
            lambda net: net(noise).square().mean(),
        ),
        "DCGAN discriminator, Adam": (
            lambda: build(gan.model.discriminator, "model.discriminator"),
            instantiate(gan.model.d_optimizer),
            lambda net: net(gray).square().mean(),
        ),
    }


def timed_steps(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_of: Callable,
    n: int,
    device: torch.device,
) -> float:
    """Milliseconds a training step, over ``n`` steps."""
    benchlib.sync(device)
    start = time.perf_counter()
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        loss_of(net).backward()
        optimizer.step()
    benchlib.sync(device)
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=7, data_dir=False)
    parser.add_argument("--steps", type=int, default=50, help="most steps a round (default 50)")
    parser.add_argument(
        "--round-s", type=float, default=0.5, help="seconds a round, about (default 0.5)"
    )
    args = parser.parse_args()
    device = benchlib.start(args)
    rows = []
    for name, (make_net, factory, loss_of) in cases(device).items():
        torch.manual_seed(0)
        nets = {"fused": make_net().to(device).train()}
        nets["default"] = make_net().to(device).train()
        nets["default"].load_state_dict(nets["fused"].state_dict())
        optimizers = {
            "fused": make_optimizer(factory, nets["fused"].parameters()),
            # an implementation named (None: torch's default) is what make_optimizer builds
            "default": make_optimizer(
                functools.partial(factory, fused=None), nets["default"].parameters()
            ),
        }
        assert optimizers["fused"].defaults["fused"] and not optimizers["default"].defaults["fused"]

        times: dict[str, list[float]] = {"fused": [], "default": []}
        for side in nets:  # first steps (allocation, kernels' first calls), then a step's time
            timed_steps(nets[side], optimizers[side], loss_of, 2, device)
        warm = {
            side: timed_steps(nets[side], optimizers[side], loss_of, 3, device) for side in nets
        }
        steps = max(3, min(args.steps, round(args.round_s * 1e3 / max(warm.values()))))
        for round_ in range(args.repeats + 1):
            for side in ("fused", "default") if round_ % 2 else ("default", "fused"):
                ms = timed_steps(nets[side], optimizers[side], loss_of, steps, device)
                if round_:
                    times[side].append(ms)
        results = {side: [{"ms": ms} for ms in runs] for side, runs in times.items()}
        medians = benchlib.medians(results)
        rows.append(
            [
                name,
                f"{medians['default']['ms']:.3f}",
                f"{medians['fused']['ms']:.3f}",
                f"{benchlib.paired_ratio(results, 'fused', 'default', 'ms'):.3f}",
                str(steps),
            ]
        )
        print(f"{name}: done", flush=True)
    print(f"\nbatch {BATCH}, {args.repeats} rounds after a warm-up round, medians")
    header = ["net, optimizer", "default ms/step", "fused ms/step", "x default paired"]
    benchlib.print_table([*header, "steps a round"], rows, [])


if __name__ == "__main__":
    main()
