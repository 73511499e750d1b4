"""P1 per-step overhead: what litlab adds to every training step, piece by piece, against a
hand-written PyTorch loop doing the same work.

    python scripts/bench_overhead.py --net mlp              # tiny MLP, 3 epochs (CPU: ~4 min)
    python scripts/bench_overhead.py --net cnn              # SmallCNN, 200 steps
    python scripts/bench_overhead.py --net cnn --device cuda
    python scripts/bench_overhead.py --net mlp --pieces "+ progress bar" --repeats 9
                        # the default run alone against the raw loop, back to back

Both nets train on Fashion-MNIST (litlab's 54,000-image training split, batch 128, no
augmentation) from the same seed, and every variant must end on the same training loss
(checked to 5 decimals): the same work, with more or less framework around it.
- mlp: the net of a user's own module (scripts/tiny_mlp.py: 784-64-128-64-10 with BatchNorm),
  through the train task as users name it (`model/net=custom model.net._target_=tiny_mlp.TinyMLP`),
  Adam 1e-3, no schedule, 3 epochs;
- cnn: litlab's SmallCNN (model=cnn: width 32, AdamW, OneCycleLR per step), 200 steps (2,000 on
  CUDA, where `trainer=gpu trainer.deterministic=warn` on every side).
Variants, each adding one piece to the one before:
  raw loop            benchlib.raw_classifier: the DeviceLoader, the batch transform, the loop
  bare Lightning      a minimal LightningModule (loss only) on litlab's DataModule, a Trainer
                      without logger, callbacks, checkpoints, bar or summary
  + no-op profiler    the same with litlab's trainer.profiler (litlab.profiler.NoProfiler)
  + metrics           litlab's ImageClassifier with its logging calls removed
  + logging           litlab's ImageClassifier (self.log), still no logger
  + loggers           and litlab's CSV + W&B (offline) loggers: `logger=wandb
                      logger.wandb.mode=offline`; where wandb is not installed (the GPU
                      machine) CSV alone, `logger=csv`, and the row's label says so
  + callbacks         the train task: litlab's default callbacks without the progress bar
  + progress bar      the train task as `python train.py` runs it (litlab's default run);
                      these two with the loggers of "+ loggers"
and, for reference, not a piece:
  raw loop, torch's default optimizer
                      the raw loop with the optimizer as a hand-written loop builds it
                      (`torch.optim.Adam(params, lr)`: on a CPU a loop over the tensors, on CUDA
                      `foreach`), where every other variant has torch's fused implementation,
                      which litlab picks (litlab.models.optim.make_optimizer); the same update to
                      rounding, so its final loss may differ in the last digits
"loop s": the start of the first batch (its fetch done) to the end of the last step, device
synced, on every side (benchlib.LoopTimer; since 2026-12-04 not the train task's start and end
hooks: FLOP count, checkpoints at the end). Every round runs each variant once, in
alternating order; a short first round warms up and is not counted; medians of --repeats
rounds and "x raw paired", the median of the per-round ratios to the raw loop (robust to a
machine whose speed drifts). The table is printed after every round (a time limit leaves the
rounds done); final losses that differ are flagged under it, a line starting "MISMATCH".
WANDB_MODE, where set, decides W&B's mode (disabled: W&B is built but logs nothing; the label
says so). Results: docs/benchmarks.md, "P1 per-step overhead".
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchlib
import lightning as L
import torch
from benchlib import LoopTimer, Measure
from hydra.utils import instantiate
from omegaconf import DictConfig

from litlab.config import build
from litlab.models import ImageClassifier
from litlab.models.optim import build_optimizer
from litlab.profiler import NoProfiler

NO_BAR = ["callbacks.progress_bar=null", "+trainer.enable_progress_bar=false"]
MLP = [
    "model/net=custom",
    "model.net._target_=tiny_mlp.TinyMLP",
    "model.optimizer._target_=torch.optim.Adam",
    "model.optimizer.lr=0.001",
    "model.optimizer.weight_decay=0",
    "model.scheduler=null",
]


def wandb_mode() -> str | None:
    """The mode "+ loggers" runs W&B in (offline, unless WANDB_MODE says otherwise), or None
    where wandb is not installed: then the loggers are CSV alone."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return None
    from litlab.loggers import wandb_mode as resolved

    return resolved("offline")


def loggers_label(mode: str | None) -> str:
    if mode is None:
        return "+ loggers (CSV only: no wandb here)"
    return f"+ loggers (CSV + W&B {mode}{' by WANDB_MODE' if os.environ.get('WANDB_MODE') else ''})"


def overrides(
    args: argparse.Namespace, device: torch.device, warm: bool, mode: str | None
) -> list[str]:
    """The command line of the train task's variants, `python train.py <these>`: the loggers
    of "+ loggers" (CSV, and W&B where it is installed)."""
    # on a CPU the CPU (the raw loop's device), even on a machine with a GPU
    gpu = (
        ["trainer=gpu", "trainer.deterministic=warn"]
        if device.type == "cuda"
        else ["trainer.accelerator=cpu"]
    )
    if args.net == "mlp":
        length = ["trainer.max_steps=10"] if warm else ["trainer.max_epochs=3"]
    else:
        steps = 10 if warm else args.steps or (2000 if device.type == "cuda" else 200)
        length = [f"trainer.max_steps={steps}"]
    return [
        "data=fashion_mnist",
        *(MLP if args.net == "mlp" else ["model=cnn"]),
        *gpu,
        *(["logger=csv"] if mode is None else ["logger=wandb", "logger.wandb.mode=offline"]),
        *length,
        "+trainer.limit_val_batches=0",
        "test=false",
        "extras.print_config=false",
        *benchlib.data_dir_override(args.data_dir),
        *args.overrides,
    ]


PIECES = [
    "raw loop",
    "bare Lightning",
    "+ no-op profiler",
    "+ metrics",
    "+ logging",
    "+ loggers",
    "+ callbacks",
    "+ progress bar",
]
HAND_WRITTEN = "raw loop, torch's default optimizer"


class Bare(L.LightningModule):
    """The loss, the optimizer and schedule: nothing else."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.net = build(cfg.model.net, "model.net")
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.model.label_smoothing)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.criterion(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        schedule = instantiate(self.cfg.model.scheduler) if self.cfg.model.scheduler else None
        optimizer, scheduler = build_optimizer(
            instantiate(self.cfg.model.optimizer),
            self.parameters(),
            schedule,
            self.cfg.model.scheduler_interval,
            self.trainer,
        )
        return (
            optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": scheduler}
        )


class WithoutLogging(ImageClassifier):
    """litlab's classifier, its metrics updated but never handed to Lightning's logging."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        pass


def lightning_side(cfg: DictConfig, device: torch.device, piece: str, mode: str | None) -> Measure:
    """A Trainer built here around litlab's DataModule, for the pieces below the train task."""
    from litlab.loggers import CSVLogger, wandb_logger

    L.seed_everything(cfg.seed, workers=True)  # the task's order: seed, data, model
    datamodule = build(cfg.data, "data")
    if piece in ("bare Lightning", "+ no-op profiler"):
        model: L.LightningModule = Bare(cfg)
    else:
        kind = WithoutLogging if piece == "+ metrics" else ImageClassifier
        model = build(cfg.model, "model", _target_=f"{kind.__module__}.{kind.__qualname__}")
    scratch = tempfile.mkdtemp(prefix="litlab-bench-")
    loggers: list | bool = False
    if piece == "+ loggers":
        loggers = [CSVLogger(scratch, name="csv", version="")]
        if mode is not None:  # as the task's logger=wandb builds it, in the mode chosen
            loggers.append(wandb_logger(scratch, mode="offline"))
    trainer = L.Trainer(
        accelerator=device.type if device.type == "cuda" else "cpu",
        devices=1,
        precision=str(cfg.trainer.precision),
        deterministic=cfg.trainer.deterministic,
        max_epochs=cfg.trainer.max_epochs,
        max_steps=cfg.trainer.max_steps,
        log_every_n_steps=cfg.trainer.log_every_n_steps,  # the task's, for the same logging
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=loggers,
        callbacks=[LoopTimer()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=None if piece == "bare Lightning" else NoProfiler(),
    )
    seconds = benchlib.timed(lambda: trainer.fit(model, datamodule=datamodule))
    if loggers:
        from litlab.loggers import finish_loggers

        finish_loggers(trainer.loggers)
    shutil.rmtree(scratch, ignore_errors=True)
    loop = LoopTimer.last
    return {"run s": seconds, "loop s": loop["s"], "loss": loop["loss"], "steps": loop["batches"]}


def task_side(overrides: list[str]) -> Measure:
    seconds, _ = benchlib.litlab_run([*overrides, *benchlib.timer_override()])
    loop = LoopTimer.last
    return {"run s": seconds, "loop s": loop["s"], "loss": loop["loss"], "steps": loop["batches"]}


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=5)
    parser.add_argument("--net", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--steps", type=int, help="cnn: steps per run (200 CPU, 2,000 CUDA)")
    parser.add_argument(
        "--pieces",
        nargs="+",
        choices=[*PIECES, HAND_WRITTEN],
        default=[*PIECES, HAND_WRITTEN],
        help="variants to run (default: all); two run back to back, the closest pairing on a "
        "machine whose speed drifts",
    )
    parser.add_argument("overrides", nargs="*", help="more overrides for every variant")
    args = parser.parse_args()
    device = benchlib.start(args)
    sys.path.insert(0, str(Path(__file__).parent))  # tiny_mlp, the user's own module
    mode = wandb_mode()
    print(f"litlab: python train.py {' '.join(overrides(args, device, False, mode))}")
    print(f"loggers: {loggers_label(mode).removeprefix('+ loggers ')}")

    def composed(warm: bool) -> DictConfig:
        cfg = benchlib.compose(
            overrides(args, device, warm, mode), benchlib.REPO / "outputs" / "unused"
        )
        from litlab.hardware import resolve_precision

        resolve_precision(cfg.trainer)
        return cfg

    def variant(piece: str):
        def run(warm: bool) -> Measure:
            if piece in ("raw loop", HAND_WRITTEN):
                cfg = composed(warm)
                steps = cfg.trainer.max_steps if cfg.trainer.max_steps > 0 else None
                return benchlib.raw_classifier(
                    cfg, device, steps=steps, torch_default_optimizer=piece == HAND_WRITTEN
                )
            if piece in ("+ callbacks", "+ progress bar"):
                bar = NO_BAR if piece == "+ callbacks" else []
                return task_side([*overrides(args, device, warm, mode), *bar])
            return lightning_side(composed(warm), device, piece, mode)

        return run

    def report(results: dict[str, list[Measure]]) -> None:
        """The table of the rounds so far, and whether every round's variants agreed."""
        m = benchlib.medians(results)
        raw = m["raw loop"]
        rows = []
        previous = None
        for name, v in m.items():
            ms = v["loop s"] / v["steps"] * 1e3
            rows.append(
                [
                    loggers_label(mode) if name == "+ loggers" else name,
                    f"{ms:.3f}",
                    f"{ms - previous:+.3f}"
                    if previous is not None and name != HAND_WRITTEN
                    else "",
                    f"{benchlib.paired_ratio(results, name, 'raw loop', 'loop s'):.3f}",
                    f"{v['steps'] * 128 / v['loop s']:,.0f}",
                    f"{raw['loop s'] / v['loop s']:.2f}",
                    f"{v['loss']:.6f}",
                ]
            )
            previous = ms
        header = [
            "variant",
            "ms/step",
            "added",
            "x raw paired",
            "img/s",
            "of raw img/s",
            "final loss",
        ]
        steps = int(raw["steps"])
        print(f"\n{args.net}: {steps} steps of batch 128, {benchlib.rounds_caption(results)}")
        # The same work, with more or less framework around it: the same loss to 5 decimals.
        same = [name for name in results if name != HAND_WRITTEN]
        checks = [
            benchlib.loss_check({name: results[name][i]["loss"] for name in same}, 5e-6)
            + f" (round {i + 1})"
            for i in range(len(results["raw loop"]))
        ]
        benchlib.print_table(header, rows, checks)

    pieces = [
        "raw loop",
        *(p for p in [*PIECES, HAND_WRITTEN] if p in args.pieces and p != "raw loop"),
    ]
    benchlib.interleaved({p: variant(p) for p in pieces}, args.repeats, after_round=report)


if __name__ == "__main__":
    main()
