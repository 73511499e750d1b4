"""What the benchmark scripts share: the machine line, A/B interleaved rounds with medians, tables,
and litlab runs composed as `python train.py <overrides>` composes them.

The scripts import litlab from the environment or from PYTHONPATH=src (no install needed) and
this module from their own folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig
from torch.utils.data import DataLoader, TensorDataset

from litlab.callbacks.preemption import fit_ends_after_this_batch
from litlab.data import Synthetic

REPO = Path(__file__).resolve().parents[1]

Measure = dict[str, float]


def arguments(
    doc: str | None,
    repeats: int | None = 3,
    device_help: str = "cpu or cuda",
    data_dir: bool = True,
) -> argparse.ArgumentParser:
    """The options every benchmark takes: --device, --repeats and (Fashion-MNIST ones) --data-dir."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--device", default="cpu", help=device_help)
    default = f"default {repeats}" if repeats else "default: 3 CUDA, 1 CPU"
    parser.add_argument(
        "--repeats", type=int, default=repeats, help=f"timed rounds, median reported ({default})"
    )
    if data_dir:
        parser.add_argument("--data-dir", help="Fashion-MNIST folder (default: data/, then system)")
    return parser


def start(args: argparse.Namespace) -> torch.device:
    """The chosen device, checked; output kept quiet; the machine line printed first."""
    device = device_arg(args.device)
    quiet()
    print(machine(device))
    return device


def device_arg(name: str) -> torch.device:
    """The --device choice; one line and exit status 1 when this machine has no such device."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {name}: this machine has no CUDA GPU (torch {torch.__version__})")
    if device.type not in ("cpu", "cuda"):
        sys.exit(f"--device must be cpu or cuda, got {name}")
    return device


def quiet() -> None:
    """Keep the output to the script's own lines: no warnings, no Lightning banners."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "litlab"):
        logging.getLogger(name).setLevel(logging.ERROR)


def torchvision_loader(
    dataset: torch.utils.data.Dataset, batch: int, workers: int, device: torch.device
) -> DataLoader:
    """The torchvision side's DataLoader: shuffled, whole batches, pinned on CUDA as litlab's
    loaders are, workers kept between epochs."""
    return DataLoader(
        dataset,
        batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.processor()


def machine(device: torch.device) -> str:
    """One line naming the hardware and the versions, for the table's caption."""
    import torchvision

    from litlab.hardware import BF16_CPU_FLAGS, cpu_flags, cpu_has_native_bf16

    gpu = f"{torch.cuda.get_device_name(device)}, " if device.type == "cuda" else ""
    has = sorted(set(BF16_CPU_FLAGS) & set(cpu_flags() or ()))  # which (it read as both)
    bf16 = (
        ("native bf16: " + ", ".join(has or ["torch's probe"]))
        if cpu_has_native_bf16()
        else ("no native bf16")
    )
    return (
        f"{gpu}{cpu_model()} ({bf16}), {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads; "
        f"torch {torch.__version__}, lightning {L.__version__}, torchvision "
        f"{torchvision.__version__}, python {platform.python_version()}"
    )


def interleaved(
    variants: dict[str, Callable[[bool], Measure]],
    repeats: int,
    warm_up: bool = True,
    after_round: Callable[[dict[str, list[Measure]]], None] | None = None,
) -> dict[str, list[Measure]]:
    """Run every variant once per round, in alternating order (A B, B A, ...), and collect
    each one's measurements; the warm-up round (called with True) is printed, not kept.
    ``after_round`` sees the rounds so far after each timed one (a table that a time limit
    cannot take away)."""
    rounds = f"{repeats} timed rounds: medians" if repeats > 1 else "1 timed round: single runs"
    print(f"{rounds}{', after a warm-up round' if warm_up else ', no warm-up round'}", flush=True)
    results: dict[str, list[Measure]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(0 if warm_up else 1, repeats + 1):
        order = names if round_ % 2 else names[::-1]
        for name in order:
            measure = variants[name](round_ == 0)
            if round_:
                results[name].append(measure)
            shown = ", ".join(
                f"{k} {v:,.0f}" if v >= 1000 else f"{k} {v:.6g}" for k, v in measure.items()
            )
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(f"{label}: {name}: {shown}", flush=True)
        if round_ and after_round is not None:
            after_round(results)
    return results


def rounds_caption(results: dict[str, list[Measure]]) -> str:
    """What a table's figures are: single runs, or medians of how many rounds."""
    n = len(next(iter(results.values())))
    return "single runs (1 round), not medians" if n == 1 else f"medians of {n} rounds"


def loss_check(losses: dict[str, float], tolerance: float, relative: bool = False) -> str:
    """One line on whether sides that did the same work ended on the same training loss;
    a line starting "MISMATCH" when they did not (flagged, not fatal: the figures still print)."""
    spread = max(losses.values()) - min(losses.values())
    if relative:
        spread /= max(abs(v) for v in losses.values()) or 1.0
    shown = ", ".join(f"{name} {loss:.6f}" for name, loss in losses.items())
    kind = "relative " if relative else ""
    if spread <= tolerance:
        return f"final losses agree ({kind}spread {spread:.2g} <= {tolerance:g}): {shown}"
    return (
        f"MISMATCH: final losses differ ({kind}spread {spread:.2g} > {tolerance:g}): {shown}; "
        "the sides may not have done the same work"
    )


def medians(results: dict[str, list[Measure]]) -> dict[str, Measure]:
    return {
        name: {key: statistics.median(m[key] for m in runs) for key in runs[0]}
        for name, runs in results.items()
    }


def paired_ratio(results: dict[str, list[Measure]], name: str, baseline: str, key: str) -> float:
    """The median over rounds of name/baseline within each round: the sides of a round ran
    back to back, so a machine that speeds up or slows down between rounds cancels out."""
    return statistics.median(
        a[key] / b[key] for a, b in zip(results[name], results[baseline], strict=True)
    )


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; the first column left-aligned, the others right-aligned."""
    lines = [
        "| " + " | ".join(header) + " |",
        "| --- | " + " | ".join("---:" for _ in header[1:]) + " |",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], checks: Sequence[str]
) -> None:
    """The table between its loss checks: those that agree above, mismatches below it, last,
    where a log's tail (gpu_check.sh's summary line) shows them."""
    for line in [c for c in checks if not c.startswith("MISMATCH")]:
        print(line)
    print(table(header, rows))
    for line in [c for c in checks if c.startswith("MISMATCH")]:
        print(line)
    sys.stdout.flush()


def compose(overrides: Sequence[str], run_dir: Path) -> DictConfig:
    """The config `python train.py <overrides>` runs, with its run folder at ``run_dir``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from litlab.config import config_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.runtime.cwd = str(REPO)
        cfg.hydra.job.num = 0
        cfg.paths.log_dir = str(run_dir.parent)
    HydraConfig.instance().set_config(cfg)
    return cfg


def data_dir_override(data_dir: str | None) -> list[str]:
    """--data-dir as an override; without it litlab searches as usual (data/, then the system copy)."""
    return [f"paths.data_dir={Path(data_dir).resolve()}"] if data_dir else []


class LoopTimer(Callback):
    """Seconds and batches of the fit loop, device synced, over the window that the raw loops
    (raw_classifier, bench_throughput.raw_dcgan) time: from the start of batch ``skip`` (its
    fetch done) to the end of the last batch (before the epoch's and the fit's end hooks:
    checkpoints, summaries). ``skip=None``: from the fit loop's start, first fetch included
    (bench_folder); not the loader workers' start-up, which Lightning runs before it (the fit
    loop's setup_data, before on_train_start). The task builds this
    callback from the config, so the reading is kept on the class."""

    last: ClassVar[Measure] = {}

    def __init__(self, skip: int | None = 0) -> None:
        self.skip = skip
        self.t0: float | None = None
        self.end: tuple[float, int] | None = None

    @staticmethod
    def _done(trainer: L.Trainer) -> int:
        return trainer.fit_loop.epoch_loop.batch_progress.total.completed

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        LoopTimer.last, self.t0, self.end = {}, None, None
        if self.skip is None:
            self._start(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.t0 is None and self._done(trainer) == self.skip:
            self._start(trainer, pl_module)

    def _start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sync(pl_module.device)
        self.t0, self.done0 = time.perf_counter(), self._done(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *_: Any
    ) -> None:
        # a GAN's step returns {"d/loss": ..., "g/loss": ...}: the first. No sync but at the end.
        self.loss = next(iter(outputs.values())) if isinstance(outputs, dict) else outputs
        if fit_ends_after_this_batch(trainer):
            sync(pl_module.device)
            self.end = time.perf_counter(), self._done(trainer) + 1  # completed counts it after

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.end is None:  # stopped early (a guard, a signal)
            sync(pl_module.device)
            self.end = time.perf_counter(), self._done(trainer)
        seconds, done = self.end
        LoopTimer.last = {
            "s": seconds - self.t0,
            "batches": done - self.done0,
            "loss": float(self.loss),
        }


def timed(call: Callable[[], Any]) -> float:
    """Seconds that a call takes."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def timer_override(skip: int = 0) -> list[str]:
    """Overrides that add LoopTimer to a run's callbacks, as a user adds any callback."""
    return [
        f"+callbacks.loop_timer._target_={__name__}.LoopTimer",
        f"+callbacks.loop_timer.skip={skip}",
    ]


def litlab_run(overrides: Sequence[str]) -> tuple[float, dict[str, Any]]:
    """Run the train task on these overrides in a scratch folder: (seconds, summary.json)."""
    import json

    from litlab.train import train_task

    with tempfile.TemporaryDirectory(prefix="litlab-bench-") as scratch:
        cfg = compose(overrides, Path(scratch) / "run")
        start = time.perf_counter()
        train_task(cfg)
        seconds = time.perf_counter() - start
        summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    if summary["status"] != "completed":
        sys.exit(f"litlab run failed: {summary['error']}")
    return seconds, summary


def bare_trainer(device: torch.device, **kwargs: Any) -> L.Trainer:
    """A Trainer with the loop alone, as benchmarks time it: one device in trainer=gpu's
    precision there (32-true on CPU); no validation, logger, checkpoints, bar or summary."""
    return L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if device.type == "cuda" else "32-true",
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def trainer_flags(cfg: DictConfig) -> None:
    """Set torch's determinism and cuDNN flags as the config's Trainer sets them: a raw loop
    run after a litlab run in the same process would otherwise inherit that run's."""
    deterministic = cfg.trainer.deterministic
    torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
    torch.backends.cudnn.benchmark = bool(cfg.trainer.get("benchmark")) and not deterministic
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


class SyntheticOnce(Synthetic):
    """litlab's Synthetic source, each split drawn once per process and then handed out again:
    the draw (int64 noise, seconds for a few thousand 224 px images) is no part of what a
    benchmark times, and every run of it would repeat it. A run names it as a user names any
    class: `data.source._target_=benchlib.SyntheticOnce`."""

    drawn: ClassVar[dict[tuple, TensorDataset]] = {}

    def load(self, split: str) -> TensorDataset:  # type: ignore[override]
        key = (self.image_shape, self.num_classes, self.sizes[split], self.seed, split)
        if key not in SyntheticOnce.drawn:
            SyntheticOnce.drawn[key] = super().load(split)  # type: ignore[arg-type]
        return SyntheticOnce.drawn[key]


def autocast(cfg: DictConfig, device: torch.device) -> torch.autocast:
    """The autocast the config's trainer.precision runs under (32-true: off; auto: as litlab
    resolves it on this machine)."""
    from litlab.hardware import fastest_precision

    precision = str(cfg.trainer.precision)
    if precision == "auto":
        precision = fastest_precision(device.type)[0]
    if precision not in ("32-true", "32", "bf16-mixed"):
        sys.exit(f"the raw loop runs 32-true or bf16-mixed, not trainer.precision={precision}")
    # cache_enabled=False as Lightning's MixedPrecision: with torch's weight cache a net used
    # twice in a step (a GAN's D on real and fake images) casts its weights once, and its
    # gradients come out (slightly) different from litlab's
    return torch.autocast(
        device.type, torch.bfloat16, enabled=precision == "bf16-mixed", cache_enabled=False
    )


def raw_classifier(
    cfg: DictConfig,
    device: torch.device,
    steps: int | None = None,
    skip: int = 0,
    torch_default_optimizer: bool = False,
) -> Measure:
    """The config's classifier trained (and tested, when cfg.test) by a plain PyTorch loop.

    Same data path (DeviceLoader + the DataModule's batch transform), net, optimizer, schedule,
    seed, precision and Speed switches (channels_last, compile) as the train task, in the task's
    order (seed, data, net), so that the two runs compute the same numbers. Validation is not
    run. ``torch_default_optimizer``: the optimizer in torch's default implementation, as a
    hand-written loop builds it (``torch.optim.Adam(params, lr)``), not the fused one litlab picks
    (litlab.models.optim.make_optimizer): the same update to rounding. Returns seconds of the
    whole call ("run s"), of the loop from batch ``skip`` on ("loop s"), the final training loss,
    and the test accuracy.
    """
    import functools
    from types import SimpleNamespace

    from hydra.utils import instantiate
    from torch import nn

    from litlab.config import build
    from litlab.data import DeviceLoader
    from litlab.models.optim import build_optimizer, optimized_parameters

    start = time.perf_counter()
    trainer_flags(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    speed = cfg.callbacks.get("speed") or {}
    memory_format = torch.channels_last if speed.get("channels_last") else torch.contiguous_format
    net = build(cfg.model.net, "model.net").to(device, memory_format=memory_format).train()
    if speed.get("compile"):
        net.compile()
    images, labels = datamodule.arrays("fit")
    loader = DeviceLoader(
        images, labels, cfg.data.batch_size, True, True, seed=cfg.seed, device=device
    )
    epochs = int(cfg.trainer.max_epochs)
    total = steps or epochs * len(loader)
    schedule = instantiate(cfg.model.scheduler) if cfg.model.get("scheduler") else None
    factory = instantiate(cfg.model.optimizer)
    clip = cfg.trainer.get("gradient_clip_val")
    clip_by_value = cfg.trainer.get("gradient_clip_algorithm") == "value"
    if torch_default_optimizer:  # an implementation chosen (None: torch's default) is kept
        factory = functools.partial(factory, fused=None)
    optimizer, scheduler = build_optimizer(
        factory,
        optimized_parameters(net.named_parameters(), cfg.model.get("decay_norm_and_bias", True)),
        schedule,
        cfg.model.scheduler_interval,
        SimpleNamespace(
            estimated_stepping_batches=total, max_epochs=epochs, gradient_clip_val=clip
        ),
    )
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.model.label_smoothing)
    step, loop_start = 0, time.perf_counter()
    while step < total:
        for images, labels in loader:
            if step == skip:
                sync(device)
                loop_start = time.perf_counter()
            inputs = datamodule.transform(images, train=True).contiguous(
                memory_format=memory_format
            )
            with autocast(cfg, device):
                loss = criterion(net(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip and clip_by_value:
                nn.utils.clip_grad_value_(net.parameters(), clip)
            elif clip:
                nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
            step += 1
            if scheduler and scheduler["interval"] == "step":
                scheduler["scheduler"].step()
            if step == total:
                break
        if scheduler and scheduler["interval"] == "epoch":
            scheduler["scheduler"].step()
    sync(device)
    result = {"loop s": time.perf_counter() - loop_start, "loss": loss.item(), "steps": step}
    if cfg.get("test"):
        result["test acc"] = raw_accuracy(cfg, datamodule, net, device, memory_format)
    result["run s"] = time.perf_counter() - start
    return result


@torch.no_grad()
def raw_accuracy(
    cfg: DictConfig,
    datamodule: Any,
    net: torch.nn.Module,
    device: torch.device,
    memory_format: torch.memory_format,
) -> float:
    """Top-1 accuracy on the test split, in eval mode, batches of data.eval_batch_size."""
    net.eval()
    images, labels = datamodule.arrays("test")
    images, labels = images.to(device), labels.to(device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    size = datamodule.eval_batch_size
    for i in range(0, len(labels), size):
        inputs = datamodule.transform(images[i : i + size], train=False)
        with autocast(cfg, device):
            logits = net(inputs.contiguous(memory_format=memory_format))
        correct += (logits.argmax(1) == labels[i : i + size]).sum()
    return correct.item() / len(labels)


def count_all_reduced(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int]:
    """Count the gradient elements that each DDP wrapper of this fit all-reduces from now on:
    Lightning's one around the whole module ("module"), or litlab's one per net of a GAN (by
    the net's name, litlab.distributed.ddp_net), through a communication hook that then
    all-reduces as DDP's own does (torch's allreduce_hook). The returned dict fills as the fit
    runs."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from litlab.distributed import ddp_net

    elements: dict[str, int] = {}
    wrappers = {"module": trainer.strategy.model}
    wrappers |= {name: ddp_net(pl_module, name) for name in getattr(pl_module, "ddp_nets", ())}
    for name, wrapper in wrappers.items():
        if isinstance(wrapper, DistributedDataParallel):
            elements[name] = 0

            def hook(state, bucket, name=name):  # type: ignore[no-untyped-def]
                # (no annotations: DDP checks them, and this module's are strings)
                elements[name] += bucket.buffer().numel()
                return allreduce_hook(None, bucket)

            wrapper.register_comm_hook(None, hook)
    return elements


class DDPProbe(LoopTimer):
    """LoopTimer in a run of several processes (train.py started as a subprocess): global rank
    0 writes its reading to the JSON file ``out``, with ``count=True`` also the number of
    gradient elements that each DDP wrapper all-reduced (count_all_reduced)."""

    def __init__(self, out: str, skip: int = 0, count: bool = False) -> None:
        super().__init__(skip)
        self.out, self.count = Path(out), count
        self.elements: dict[str, int] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self.count:
            self.elements = count_all_reduced(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import json

        super().on_train_end(trainer, pl_module)
        if trainer.global_rank == 0:
            reading = {**LoopTimer.last, "elements": self.elements}
            reading["g_steps"] = getattr(pl_module, "g_steps", 0)
            self.out.write_text(json.dumps(reading))
