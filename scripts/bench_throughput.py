"""P4/P5 training throughput: ResNet-50 eager vs compile, and DCGAN, litlab vs a raw PyTorch loop.

    python scripts/bench_throughput.py --device cuda     # GPU: ResNet-50 224 px batch 256, DCGAN 64 px batch 128
    python scripts/bench_throughput.py                   # CPU smoke: ResNet-50 64 px batch 4, 3 steps

P4: torchvision ResNet-50 (1,000 classes, SGD) on synthetic images, precision auto (bf16-mixed on
GPUs and AVX512-BF16/AMX CPUs, else 32-true) + channels_last,
without and with torch.compile. litlab: the train task on `model=torchvision
model.net.name=resnet50 model.scheduler=null data=synthetic data.image_shape=[3,S,S]
data.num_classes=1000 data.batch_size=B trainer.precision=auto callbacks.speed.channels_last=true
callbacks.speed.compile=<false|true> trainer.max_steps=W+N` (plus trainer=gpu on CUDA); raw:
`benchlib.raw_classifier` on the same config. MFU = model FLOPs per image (forward + backward,
counted by torch.utils.flop_counter) x images/s / the device's dense bf16 peak: the same count
and peak table (litlab.callbacks.monitor) as the Throughput callback's perf/mfu.
P5: DCGAN (width 64, batch 128) on synthetic 64 px images (--gan-size/--gan-channels/--gan-width:
the digits recipe's 1x28x28 at width 32), precision auto; litlab: `model=dcgan
data=synthetic data.image_shape=[3,64,64] callbacks.fid=null callbacks.samples=null` (evaluation
callbacks off), one epoch as long as the run (an epoch's end once, not every few steps); raw:
the same G and D steps (litlab's loss functions), Adam as litlab builds it (fused), EMA
(litlab's AveragedCopy, on the device) and requires_grad toggling by hand. P5 runs first.
Both: `logger=none extras.print_config=false +trainer.limit_val_batches=0 test=false
callbacks.last_checkpoint=null`, each run one epoch (an epoch's end once), the synthetic set
drawn once per process (`data.source._target_=benchlib.SyntheticOnce`).
Images/s are steady state: the first W steps of every run (CUDA warm-up, compilation)
are not timed. Every round runs each variant once, in alternating order, after a warm-up round
(--no-warm-up-round: none); dynamo is reset before each compiled run, so each compiles as a fresh
process would (with warm caches). Medians of --repeats rounds. The two sides of a pair do the
same work and end on the same final loss (ResNet-50's, D's for the DCGAN): each round's are
compared, a difference flagged under the table ("MISMATCH"; on a GPU up to 2e-3 relative is
allowed for its non-deterministic kernels). Results: docs/benchmarks.md, "P4/P5 throughput".
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import benchlib
import lightning as L
import torch
from benchlib import Measure
from hydra.utils import instantiate
from omegaconf import DictConfig

from litlab import rng
from litlab.callbacks.monitor import peak_flops, training_flops_per_image
from litlab.config import build
from litlab.data import DeviceLoader
from litlab.models.gan import AveragedCopy, d_loss_fn, ema_with_warmup, g_loss_fn
from litlab.models.optim import make_optimizer
from litlab.nets import TorchvisionNet


def resnet_flops(size: int) -> float:
    """Forward + backward FLOPs of ResNet-50 per image, counted as the Throughput callback counts."""
    net = TorchvisionNet("resnet50", in_channels=3, num_classes=1000)
    return training_flops_per_image(net, torch.empty(2, 3, size, size))


def common(device: torch.device, batch: int, batches_per_epoch: int) -> list[str]:
    """Overrides both benchmarks share: the device, no evaluation, no logging, no checkpoints,
    and a synthetic set of ``batches_per_epoch`` training batches (after the 10% validation
    split), drawn once per process (benchlib.SyntheticOnce) for every run of either side."""
    return [
        *(["trainer=gpu"] if device.type == "cuda" else ["trainer=cpu"]),
        # bf16-mixed where the hardware has it (GPUs, AVX512-BF16/AMX CPUs), else 32-true
        "trainer.precision=auto",
        "data=synthetic",
        "data.source._target_=benchlib.SyntheticOnce",
        f"data.batch_size={batch}",
        f"data.source.train_size={math.ceil(batch * batches_per_epoch / 0.9)}",
        "data.source.test_size=16",
        "logger=none",
        "extras.print_config=false",
        "+trainer.limit_val_batches=0",
        "test=false",
        "callbacks.last_checkpoint=null",
    ]


def resnet_overrides(
    args: argparse.Namespace, device: torch.device, compile_: bool, steps: int
) -> list[str]:
    return [
        "model=torchvision",
        "model.net.name=resnet50",
        f"data.image_shape=[3,{args.image_size},{args.image_size}]",
        "data.num_classes=1000",
        "model.scheduler=null",  # a few steps are too short for OneCycleLR; throughput only
        # One epoch as long as the run, as for DCGAN: an epoch's end (the Throughput callback's
        # device sync, which drains the queue while the host does the epoch's end) once, not
        # every 8 steps as until 2026-12-04 (2.5 GB of 224 px images at batch 256 and 65 steps)
        *common(device, args.batch, args.warm_steps + args.steps),
        "callbacks.speed.channels_last=true",
        f"callbacks.speed.compile={str(compile_).lower()}",
        f"trainer.max_steps={steps}",
    ]


def dcgan_overrides(args: argparse.Namespace, device: torch.device, steps: int) -> list[str]:
    # One epoch as long as the longest run: an epoch's end (the Throughput callback's device
    # sync, the DeviceLoader's reshuffle) comes once, not every few steps (64 px images are small).
    epoch = args.warm_steps + args.steps
    return [
        "model=dcgan",
        f"data.image_shape=[{args.gan_channels},{args.gan_size},{args.gan_size}]",
        f"model.generator.width={args.gan_width}",
        f"model.discriminator.width={args.gan_width}",
        *common(device, args.gan_batch, epoch),
        "callbacks.fid=null",
        "callbacks.samples=null",
        f"trainer.max_steps={2 * steps}",  # Lightning counts the D and the G step of every batch
    ]


def raw_dcgan(cfg: DictConfig, device: torch.device, steps: int, skip: int) -> Measure:
    """litlab's GAN training step (bce loss, one D and one G step per batch, EMA of G) by hand."""
    benchlib.trainer_flags(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    generator = build(cfg.model.generator, "model.generator").to(device)
    discriminator = build(cfg.model.discriminator, "model.discriminator").to(device)
    # litlab's GAN keeps its EMA in AveragedCopy, the count on the device and on the host (no
    # sync an update); torch's AveragedModel without device= would keep it on the CPU
    ema = AveragedCopy(
        generator,
        device=device,
        multi_avg_fn=ema_with_warmup(cfg.model.ema_decay),
        use_buffers=True,
    ).requires_grad_(False)
    # the implementation litlab's GAN builds (fused where torch has one): the same arithmetic
    g_opt = make_optimizer(instantiate(cfg.model.g_optimizer), generator.parameters())
    d_opt = make_optimizer(instantiate(cfg.model.d_optimizer), discriminator.parameters())
    transform = datamodule.transform
    scale, shift = 2 * transform.std.to(device), 2 * transform.mean.to(device) - 1
    latent = generator.latent_dim
    images, labels = datamodule.arrays("train")
    loader = DeviceLoader(
        images, labels, cfg.data.batch_size, True, True, seed=cfg.seed, device=device
    )
    step, loop_start = 0, time.perf_counter()
    while step < steps:
        for images, _ in loader:
            if step == skip:
                benchlib.sync(device)
                loop_start = time.perf_counter()
            real = transform(images, train=True) * scale + shift
            n = real.shape[0]
            # the batch's noise stream, as litlab's GAN draws it (litlab.rng: seed, rank, step)
            noise = rng.stream(cfg.model.noise_seed, 0, "train", step, device)
            with benchlib.autocast(cfg, device):
                generator.requires_grad_(False)  # as Lightning's toggled_optimizer does
                fake = generator(torch.randn(n, latent, device=device, generator=noise)).detach()
                # litlab's loss functions: the logits' means in float32, as its GAN takes them
                d_loss = d_loss_fn(cfg.model.loss, discriminator(real), discriminator(fake))
                d_opt.zero_grad(set_to_none=True)
                d_loss.backward()
                d_opt.step()
                generator.requires_grad_(True)
                discriminator.requires_grad_(False)
                fake = generator(torch.randn(n, latent, device=device, generator=noise))
                g_loss = g_loss_fn(cfg.model.loss, discriminator(fake))
                g_opt.zero_grad(set_to_none=True)
                g_loss.backward()
                g_opt.step()
                discriminator.requires_grad_(True)
                ema.update_parameters(generator)
            step += 1
            if step == steps:
                break
    benchlib.sync(device)
    return {"loop s": time.perf_counter() - loop_start, "loss": d_loss.item()}


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=None, data_dir=False)
    parser.add_argument("--bench", choices=["resnet50", "dcgan", "all"], default="all")
    parser.add_argument("--batch", type=int, help="ResNet-50 batch (default: 256 CUDA, 4 CPU)")
    parser.add_argument("--gan-batch", type=int, help="DCGAN batch (default: 128 CUDA, 8 CPU)")
    parser.add_argument(
        "--image-size", type=int, help="ResNet-50 pixels (default: 224 CUDA, 64 CPU)"
    )
    parser.add_argument("--gan-size", type=int, default=64, help="DCGAN pixels (digits: 28)")
    parser.add_argument("--gan-channels", type=int, default=3, help="DCGAN channels (digits: 1)")
    parser.add_argument("--gan-width", type=int, default=64, help="DCGAN widths (digits_dcgan: 32)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: 50 CUDA, 3 CPU)")
    parser.add_argument(
        "--warm-steps", type=int, help="untimed steps starting every run (default: 15 CUDA, 2 CPU)"
    )
    parser.add_argument(
        "--no-warm-up-round",
        action="store_true",
        help="no untimed first round (each run's first --warm-steps are untimed anyway, its "
        "compilation included): saves ResNet-50's extra compilations where time is short",
    )
    args = parser.parse_args()
    device = benchlib.start(args)
    cuda = device.type == "cuda"
    for name, on_cuda, on_cpu in (
        ("repeats", 3, 1),
        ("batch", 256, 4),
        ("gan_batch", 128, 8),
        ("image_size", 224, 64),
        ("steps", 50, 3),
        ("warm_steps", 15, 2),
    ):
        if getattr(args, name) is None:
            setattr(args, name, on_cuda if cuda else on_cpu)
    warm, steps = args.warm_steps, args.warm_steps + args.steps
    print(f"{args.steps} timed steps after {warm} untimed ones; warm-up round: {warm + 1} steps")
    # Where the two sides do the same work, they end on the same loss (on a GPU up to its
    # non-deterministic kernels): a relative spread beyond this is flagged.
    tolerance = 2e-3 if cuda else 1e-5

    def litlab(make: Callable[[int], list[str]], batch: int) -> Callable[[bool], Measure]:
        def measure(warm_up: bool) -> Measure:
            torch._dynamo.reset()
            benchlib.litlab_run(
                [*make(warm + 1 if warm_up else steps), *benchlib.timer_override(warm)]
            )
            loop = benchlib.LoopTimer.last
            return {"img/s": loop["batches"] * batch / loop["s"], "loss": loop["loss"]}

        return measure

    def raw(make: Callable[[int], list[str]], batch: int, gan: bool) -> Callable[[bool], Measure]:
        def measure(warm_up: bool) -> Measure:
            torch._dynamo.reset()
            n = warm + 1 if warm_up else steps
            cfg = benchlib.compose(make(n), benchlib.REPO / "outputs" / "unused")
            run = raw_dcgan if gan else benchlib.raw_classifier
            loop = run(cfg, device, steps=n, skip=warm)
            return {"img/s": (n - warm) * batch / loop["loop s"], "loss": loop["loss"]}

        return measure

    def rounds(variants: dict[str, Callable[[bool], Measure]]) -> dict[str, list[Measure]]:
        return benchlib.interleaved(variants, args.repeats, warm_up=not args.no_warm_up_round)

    def checks(results: dict[str, list[Measure]], pairs: list[tuple[str, str]]) -> list[str]:
        """Each round's final losses of the two sides that did the same work."""
        return [
            benchlib.loss_check({a: x["loss"], b: y["loss"]}, tolerance, relative=True)
            + f" (round {i + 1})"
            for a, b in pairs
            for i, (x, y) in enumerate(zip(results[a], results[b], strict=True))
        ]

    # DCGAN first: short, and never yet measured on a GPU; ResNet-50's compilation is long.
    if args.bench in ("dcgan", "all"):

        def make_gan(n: int) -> list[str]:
            return dcgan_overrides(args, device, n)

        variants = {
            "litlab": litlab(make_gan, args.gan_batch),
            "raw": raw(make_gan, args.gan_batch, gan=True),
        }
        print(
            f"\nP5 DCGAN, {args.gan_channels}x{args.gan_size}x{args.gan_size}, "
            f"width {args.gan_width}, batch {args.gan_batch}"
        )
        results = rounds(variants)
        m = benchlib.medians(results)
        rows = [
            [
                n,
                f"{v['img/s']:,.0f}",
                f"{v['img/s'] / m['raw']['img/s']:.3f}",
                f"{benchlib.paired_ratio(results, n, 'raw', 'img/s'):.3f}",
                f"{v['loss']:.6f}",
            ]
            for n, v in m.items()
        ]
        print(f"\nP5, {benchlib.rounds_caption(results)}:")
        header = ["variant", "img/s", "x raw", "x raw paired", "final D loss"]
        benchlib.print_table(header, rows, checks(results, [("litlab", "raw")]))

    if args.bench in ("resnet50", "all"):
        variants = {}
        for compile_ in (False, True):
            mode = "compile" if compile_ else "eager"

            def make(n: int, compile_: bool = compile_) -> list[str]:
                return resnet_overrides(args, device, compile_, n)

            variants[f"litlab, {mode}"] = litlab(make, args.batch)
            variants[f"raw, {mode}"] = raw(make, args.batch, gan=False)
        print(f"\nP4 ResNet-50, {args.image_size} px, batch {args.batch}")
        results = rounds(variants)
        m = benchlib.medians(results)
        flops = resnet_flops(args.image_size)
        peak = peak_flops(torch.cuda.get_device_name(device), "bf16") if cuda else None
        print(f"\n{flops / 1e9:.1f} GFLOPs per image (fwd+bwd); peak {peak or 'unknown'} FLOP/s")
        rows = [
            [
                name,
                f"{v['img/s']:,.0f}",
                f"{flops * v['img/s'] / peak:.1%}" if peak else "n/a",
                f"{v['img/s'] / m['raw, ' + name.split(', ')[1]]['img/s']:.3f}",
                f"{benchlib.paired_ratio(results, name, 'raw, ' + name.split(', ')[1], 'img/s'):.3f}",
                f"{v['img/s'] / m[name.split(', ')[0] + ', eager']['img/s']:.2f}",
                f"{v['loss']:.6f}",
            ]
            for name, v in m.items()
        ]
        print(f"P4, {benchlib.rounds_caption(results)}:")
        header = ["variant", "img/s", "MFU", "x raw", "x raw paired", "x eager", "final loss"]
        pairs = [("litlab, eager", "raw, eager"), ("litlab, compile", "raw, compile")]
        benchlib.print_table(header, rows, checks(results, pairs))


if __name__ == "__main__":
    main()
