"""How fast and how full: images/s, batches/s and MFU per epoch, and peak memory."""

from __future__ import annotations

import logging
import math
import re
import resource
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch import callbacks
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.data import extract_batch_size
from torch import nn

from litlab.callbacks.summary import meta_copy
from litlab.distributed import log_job_value
from litlab.errors import ConfigError

log = logging.getLogger(__name__)

GB = 1e9

# Dense (no sparsity) peak FLOP/s of one GPU by precision, from NVIDIA's datasheets; the first
# model name found in torch.cuda.get_device_name() wins (a letter may follow it, A10G, not a
# digit), so longer names come first.
# Lightning's table (lightning.fabric.utilities.throughput) is not used: it lists the H200 only
# under names CUDA does not report ("h200 sxm1"), gives sparse peaks for H200 and H100 NVL,
# reads an L40S as an L4, and has no A10 and no TF32 for A100/H100.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("gh200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("h200 nvl", {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("h200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("h100 nvl", {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("h100 pcie", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12}),
    ("h100", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("a100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    # AWS publishes no tensor-core figure for the A10G: the A10's, as Lightning's table does.
    ("a10", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    ("l40s", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("l40", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    ("l4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("v100s", {"fp16": 130e12, "fp32": 16.4e12}),
    ("v100-sxm2", {"fp16": 125e12, "fp32": 15.7e12}),
    ("v100-sxm3", {"fp16": 125e12, "fp32": 15.7e12}),
    ("v100", {"fp16": 112e12, "fp32": 14e12}),
    ("t4", {"fp16": 65e12, "fp32": 8.1e12}),
    # GeForce: tensor cores with float32 accumulation (what autocast uses) run at half rate.
    ("rtx 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12}),
    ("rtx 3090", {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12}),
)


def compute_precision(precision: str, device: torch.device) -> str | None:
    """The arithmetic a Trainer precision runs convolutions and matmuls in: bf16/fp16/tf32/fp32."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if not precision.startswith("32"):
        return None
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return "fp32"  # TF32: Ampere and newer
    try:
        # cuDNN runs float32 convolutions in TF32 by default (allow_tf32).
        tf32 = torch.backends.cudnn.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:
        # torch refuses to read its legacy flags once its per-backend ones (fp32_precision) set
        # them apart: read those
        backends = (torch.backends.cudnn.conv, torch.backends.cuda.matmul)
        tf32 = any(backend.fp32_precision == "tf32" for backend in backends)
    return "tf32" if tf32 else "fp32"


def peak_flops(device_name: str, arithmetic: str | None) -> float | None:
    """Dense peak FLOP/s of a GPU (by its CUDA name) in that arithmetic; None when not listed,
    and for a MIG slice (the table's peaks are whole GPUs')."""
    name = device_name.lower()
    if re.search(r"\bmig\b", name):
        return None
    for fragment, peaks in PEAK_FLOPS:
        # a whole model name: "a100" in "A100-SXM4-80GB", not in "RTX A1000"
        if re.search(rf"(?<![a-z0-9]){re.escape(fragment)}(?![0-9])", name):
            return peaks.get(arithmetic or "")
    return None


def training_flops_per_image(net: nn.Module, images: torch.Tensor) -> float:
    """FLOPs of one training step per image: forward plus backward, counted by
    torch.utils.flop_counter on a meta-device copy (no memory, no change to the real net)."""
    meta = meta_copy(net)
    x = torch.empty_like(images, dtype=torch.float32, device="meta")
    # .forward, not __call__: a net compiled in place (Speed) would compile again for meta.
    flops = measure_flops(meta, lambda: meta.forward(x), loss_fn=lambda y: y.float().sum())
    return flops / images.shape[0]


def mfu(flops_per_image: float, images_per_s: float, peak: float) -> float:
    """Model FLOPs utilization of one device: achieved training FLOP/s over the device's peak."""
    return flops_per_image * images_per_s / peak


def _compile_warmup(pl_module: L.LightningModule) -> int:
    """1 where a net of ``pl_module`` is compiled in place (callbacks.speed.compile): an
    evaluation's first batch may compile (the test's, in evaluation mode; a fit's training
    warm-up covers training alone), so it is not timed, and an evaluation of one batch has no
    rate rather than its compilation's; else 0."""
    return int(
        any(getattr(c, "_compiled_call_impl", None) is not None for c in pl_module.children())
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def over_ranks(trainer: L.Trainer, values: list[float], op: str) -> list[float]:
    """The sum or max ("sum", "max") of a few numbers over all ranks: one collective."""
    if trainer.world_size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
    return trainer.strategy.reduce(tensor, reduce_op=op).tolist()


class _Clock:
    """Seconds, samples and batches of one stage; it runs only while that stage works."""

    def __init__(self) -> None:
        self.seconds, self.samples, self.batches = 0.0, 0, 0
        self._t0: float | None = None

    @property
    def running(self) -> bool:
        return self._t0 is not None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    def add(self, other: _Clock) -> None:
        self.seconds += other.seconds
        self.samples += other.samples
        self.batches += other.batches


def images_in(batch: Any) -> int:
    """Lightning's ``extract_batch_size`` (the first tensor's length), without its walk over the
    whole batch for the usual (images, labels) pair: it ran at every batch's end."""
    first = batch[0] if isinstance(batch, list | tuple) and batch else None
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return first.shape[0]
    return extract_batch_size(batch)


class Throughput(Callback):
    """Images/s (train, val, test) and batches/s (train) per epoch; training FLOPs per image and
    MFU for classifiers on GPUs listed in ``PEAK_FLOPS``.

    No per-step host sync: ``time.perf_counter()`` around the work, CUDA synchronized only where
    the clock stops, samples counted from batch shapes (Lightning's ThroughputMonitor
    synchronizes after every batch). The training clock runs from a training batch's start and
    stops for whatever is not training: validation (a GAN's FID with it), checkpoint writes, the
    epoch's end; it restarts at the next training batch. The first ``warmup_batches`` of a fit
    are not timed (CUDA context, cuDNN and allocator warm-up, compilation).

    Figures are the job's: images/s are summed over ranks (each rank's own rate, one collective
    per epoch); batches/s are the job's training batches a second (the mean over ranks: the ranks'
    batches of a step are one batch of the job, as the progress bar's it/s; an optimizer step is
    trainer.accumulate_grad_batches of them); MFU is per device.
    FLOPs are counted once, for ``pl_module.net`` (GANs report images/s only).
    """

    def __init__(self, warmup_batches: int = 3) -> None:
        if warmup_batches < 0:
            raise ConfigError(f"warmup_batches must be >= 0, got {warmup_batches}")
        self.warmup_batches = warmup_batches
        self.flops_per_image: float | None = None
        self.peak: float | None = None
        self.totals: dict[str, _Clock] = {}
        self.job: dict[str, float] = {}  # run-level rates summed over ranks, for summary.json
        self._clocks: dict[str, _Clock] = {}
        self._net: nn.Module | None = None
        self._warmup = 0
        self._eval_warmup = 0  # an evaluation's untimed first batch (a compiled net's)
        self._world = 1
        self._device = torch.device("cpu")
        self._labels: dict[str, str] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._device, self._world = trainer.strategy.root_device, trainer.world_size
        arithmetic = compute_precision(str(trainer.precision), self._device)
        name = torch.cuda.get_device_name(self._device) if self._device.type == "cuda" else "cpu"
        self.peak = peak_flops(name, arithmetic) if self._device.type == "cuda" else None
        self._labels = {"device": name, "precision": str(trainer.precision)}
        if stage != "fit":
            return
        self._warmup = self.warmup_batches
        net = getattr(pl_module, "net", None)
        # Copied to meta before the strategy wraps or shards it (FSDP); counted at the first batch.
        if isinstance(net, nn.Module) and self.flops_per_image is None:
            self._net = meta_copy(net)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Under several processes, what one batch of the job is: data.batch_size is each
        process's, so N processes train on N times its images a step, in 1/N of the steps an
        epoch (the LR schedule's steps too). And where whole batches leave out much of each
        epoch (a small folder: 94 of 222 images at batch 128, not a word; walkthrough 150)."""
        per_process = getattr(trainer.datamodule, "batch_size", None)
        if not trainer.is_global_zero or not isinstance(per_process, int):
            return
        self._say_images_left_out(trainer, per_process)
        if trainer.world_size < 2:
            return
        accumulate = trainer.accumulate_grad_batches
        batches = trainer.num_training_batches
        said = "%d processes x data.batch_size=%d: %d images a batch of the job"
        values: list[Any] = [trainer.world_size, per_process, trainer.world_size * per_process]
        if batches != float("inf"):  # (a loader without a length: not known)
            said += ", %d batches an epoch"
            values.append(batches)
        if accumulate > 1:
            said += " (x accumulate_grad_batches=%d: %d images, %d optimizer steps an epoch)"
            values += [accumulate, values[2] * accumulate, math.ceil(batches / accumulate)]
        log.info(said, *values)

    @staticmethod
    def _say_images_left_out(trainer: L.Trainer, per_process: int) -> None:
        """Each training epoch takes whole batches, in a new order: the images that do not fill
        one (fewer than ranks x data.batch_size) are left out of that epoch, other ones each
        epoch. Said where they are more than a tenth of the training split."""
        datamodule, batches = trainer.datamodule, trainer.num_training_batches
        limit = trainer.limit_train_batches  # (an int 1 is one batch: not the whole epoch)
        whole = isinstance(limit, float) and limit == 1.0 and not trainer.overfit_batches
        if batches == float("inf") or not whole:
            return  # (a loader without a length; part of each epoch on purpose)
        try:
            images = datamodule.split_size("fit")
        except (AttributeError, KeyError):  # a DataModule of one's own
            return
        left = images - batches * per_process * trainer.world_size
        if images > 0 and left > images / 10:
            log.warning(
                "data.batch_size=%d%s on %d training images: %d batch(es) an epoch, %d images "
                "(%.0f%%) left out of each epoch (other ones each epoch); a smaller "
                "data.batch_size trains on more of them",
                per_process,
                f" x {trainer.world_size} processes" if trainer.world_size > 1 else "",
                images,
                batches,
                left,
                100 * left / images,
            )

    def _begin(self, stage: str) -> None:
        _sync(self._device)
        self._clocks[stage] = _Clock()
        self._clocks[stage].start()

    def _pause(self, stage: str) -> None:
        clock = self._clocks.get(stage)
        if clock is not None and clock.running:
            _sync(self._device)  # the work queued so far belongs to this stage
            clock.stop()

    def _count(self, stage: str, batch: Any) -> None:
        clock = self._clocks.get(stage)
        if clock is not None and clock.running:
            clock.samples += images_in(batch)
            clock.batches += 1

    def _finish(
        self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str
    ) -> list[float] | None:
        """End a stage's epoch: log the job's images/s; return the job's [epoch images/s (summed
        over ranks), epoch batches/s (their mean)], or None when nothing was timed."""
        self._pause(stage)
        clock = self._clocks.pop(stage, None) or _Clock()
        total = self.totals.setdefault(stage, _Clock())
        total.add(clock)
        # Every rank takes part in the sum, timed or not (a collective must not be skipped).
        rates = [
            clock.samples / clock.seconds if clock.seconds > 0 else 0.0,
            clock.batches / clock.seconds if clock.seconds > 0 else 0.0,
            total.samples / total.seconds if total.seconds > 0 else 0.0,
            total.batches / total.seconds if total.seconds > 0 else 0.0,
        ]
        epoch_images, epoch_batches, run_images, run_batches = over_ranks(trainer, rates, "sum")
        epoch_batches, run_batches = epoch_batches / self._world, run_batches / self._world
        self.job[f"{stage}_images_per_s"] = run_images
        if stage == "train":
            self.job["train_batches_per_s"] = run_batches
        if clock.batches == 0 or epoch_images <= 0:
            return None
        log_job_value(pl_module, f"perf/{stage}_images_per_s", epoch_images)
        return [epoch_images, epoch_batches]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_epoch(trainer.num_training_batches)

    def _start_epoch(self, batches: float) -> None:
        """A training epoch's clock, for its ``batches`` left (inf: not known); an epoch no
        longer than the warm-up is timed whole."""
        if batches != float("inf"):
            self._warmup = min(self._warmup, max(int(batches) - 1, 0))
        self._clocks["train"] = _Clock()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        if self._net is not None and len(images):  # not a batch of unreadable files only
            try:
                self.flops_per_image = training_flops_per_image(self._net, images)
            except (RuntimeError, NotImplementedError, TypeError) as e:
                # A metric must never stop a run: without a count there is no MFU, only images/s.
                log.warning("could not count the net's FLOPs (%s); MFU is not reported", e)
            self._net = None
        # an epoch a resumed fit goes on with part way has no on_train_epoch_start (Lightning
        # calls none on a restart mid-epoch): timed from here (it went untimed, and a run
        # resumed into its last epoch had no training rate at all: review 170)
        if "train" not in self._clocks:
            self._start_epoch(trainer.num_training_batches - batch_idx)
        clock = self._clocks["train"]
        if not clock.running and not self._warmup:
            _sync(self._device)  # what ran before (warm-up, validation) is not this clock's
            clock.start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        if self._warmup:
            self._warmup -= 1
        else:
            self._count("train", batch)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._pause("train")  # writing a checkpoint is not training

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        job = self._finish(trainer, pl_module, "train")
        if job is None:
            return
        log_job_value(pl_module, "perf/train_batches_per_s", job[1])
        if self.flops_per_image is not None:
            log_job_value(pl_module, "perf/flops_per_image", self.flops_per_image)
            if self.peak:
                per_device = job[0] / trainer.world_size
                log_job_value(
                    pl_module, "perf/mfu", mfu(self.flops_per_image, per_device, self.peak)
                )

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._pause("train")  # validation inside a training epoch
        self._begin("val")
        self._eval_warmup = _compile_warmup(pl_module)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        if not trainer.sanity_checking:
            self._count_evaluated("val", batch)

    def _count_evaluated(self, stage: str, batch: Any) -> None:
        """An evaluation batch counted, or (a compiled net's first: its compilation, 10-20x the
        rest on a CPU, walkthrough 142) the clock started anew after it."""
        if self._eval_warmup:
            self._eval_warmup = 0
            self._begin(stage)
        else:
            self._count(stage, batch)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The FID callback evaluates at this hook too, after this one (callbacks/gan.yaml lists
        # it after the default callbacks): its time counts neither as validation nor training.
        if not trainer.sanity_checking:
            self._finish(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._begin("test")
        self._eval_warmup = _compile_warmup(pl_module)

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        self._count_evaluated("test", batch)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish(trainer, pl_module, "test")

    def summary(self) -> dict[str, Any]:
        """The run's rates over every timed epoch, summed over ranks, for summary.json."""
        perf: dict[str, Any] = {**self._labels, **{k: v for k, v in self.job.items() if v > 0}}
        perf.update(flops_per_image=self.flops_per_image, peak_flops=self.peak, mfu=None)
        train = self.totals.get("train")
        if train is not None and self.job.get("train_images_per_s") and self.flops_per_image:
            per_device = self.job["train_images_per_s"] / self._world
            perf["mfu"] = mfu(self.flops_per_image, per_device, self.peak) if self.peak else None
        return {"perf": perf}


def rss_gb() -> float:
    """Peak resident memory of this process so far, or since reset_rss_peak (getrusage: KiB on
    Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GB if sys.platform == "darwin" else peak * 1024 / GB


def reset_rss_peak() -> bool:
    """Start the process's peak RSS again from its current RSS (Linux: "5" written to
    /proc/self/clear_refs), so that each job of a sweep run in one process reports its own
    peak, not the largest of the jobs before it; False where the OS does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def reset_cuda_peaks() -> None:
    """Start this process's CUDA peak counters again (each job of a sweep run in one process
    reports its own peaks). Where CUDA is not initialized there is nothing to forget, and it
    stays so (a process that starts ranks by forking must not initialize it)."""
    if torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(device)


class PeakMemory(Callback):
    """Peak CUDA memory per training epoch (its validation and checkpoint writes included: what
    must fit) and per test epoch, allocated by tensors and reserved by the caching allocator,
    and the process's peak RSS since the run began (litlab.run.Run resets it where Linux allows;
    else since the process started), of the fullest rank; no device sync (allocator counters).
    The run's peaks (summary.json) are since the run began, its CUDA ones too (Run resets
    them): what came before an epoch's reset (the fit's setup and sanity check, a test's
    setup) is kept in them, not in the epoch's mem/* values."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self._device = torch.device("cpu")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device

    def current(self) -> dict[str, float]:
        """CUDA peaks since the last epoch start (before the first: since the run began), the
        RSS peak since the run began; GB."""
        values = {"rss_gb": rss_gb()}
        if self._device.type == "cuda":
            values["peak_allocated_gb"] = torch.cuda.max_memory_allocated(self._device) / GB
            values["peak_reserved_gb"] = torch.cuda.max_memory_reserved(self._device) / GB
        return values

    def _fullest(self, trainer: L.Trainer) -> dict[str, float]:
        """The current peaks of the fullest rank (max over ranks: what must fit)."""
        current = self.current()
        names = sorted(current)
        fullest = over_ranks(trainer, [current[n] for n in names], "max")
        return dict(zip(names, fullest, strict=True))

    def _keep(self, peaks: dict[str, float]) -> None:
        for name, value in peaks.items():
            self.peaks[name] = max(self.peaks.get(name, 0.0), value)

    def _reset(self, trainer: L.Trainer) -> None:
        """Count the next epoch's CUDA peaks from now, the peaks so far kept in the run's."""
        if self._device.type == "cuda":
            self._keep(self._fullest(trainer))
            torch.cuda.reset_peak_memory_stats(self._device)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the epoch's peaks of the fullest rank, kept in the run's."""
        peaks = self._fullest(trainer)
        self._keep(peaks)
        for name, value in peaks.items():
            log_job_value(pl_module, f"mem/{name}", value)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(trainer)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    def summary(self) -> dict[str, Any]:
        """The run's peaks (the fullest rank's at each epoch's start and end; this rank's since,
        also for an epoch cut short by an error), for summary.json."""
        now = self.current()
        return {"memory": {k: max(self.peaks.get(k, 0.0), v) for k, v in now.items()}}


class LearningRateMonitor(callbacks.LearningRateMonitor):
    """Lightning's LearningRateMonitor, with the rates of an epoch that a resumed fit goes on
    with part way. A per-epoch schedule's rates are logged at an epoch's start, which Lightning
    does not run again on a restart mid-epoch: a run resumed into its last epoch ended without
    them (summary.json had no lr-*, lr/generator: review 181). Here they are read at its first
    batch into the trainer's metrics (what summary.json records), not logged again: the
    loggers hold them from the earlier part (the CSV log is written out at each checkpoint)."""

    _epoch_began = False

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        super().on_train_start(trainer, *args, **kwargs)
        self._epoch_began = False

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._epoch_began = True
        super().on_train_epoch_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if not self._epoch_began:  # (a restart mid-epoch)
            self._epoch_began = True
            if self.logging_interval != "step":  # per-epoch schedules' alone: a per-step
                # one's rate here is not the epoch's first (logging_interval=epoch: review 183)
                self._extract_stats(trainer, "epoch")
        super().on_train_batch_start(trainer, *args, **kwargs)
