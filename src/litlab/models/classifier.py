"""Image classification: the science of training a net on labelled images."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassStatScores

from litlab.compat import (
    CheapHookName,
    batches_done_this_epoch,
    epoch_ran_to_its_end,
)
from litlab.data.decode import all_unreadable
from litlab.distributed import broadcast_buffers, log_job_value
from litlab.errors import ConfigError, first_line
from litlab.metrics.aggregation import Max, Mean
from litlab.models.curves import StepCurves
from litlab.models.optim import (
    DECAY_GROUPING,
    Interval,
    build_optimizer,
    fit_schedules_to_run,
    optimized_parameters,
    parameter_ndims,
    spared_by_name,
)
from litlab.rng import RankSeeded

log = logging.getLogger("litlab")


def place_hits(logits: Tensor, labels: Tensor, k: int) -> Tensor:
    """How many of a batch's labels are the logits' largest, second largest, ... k-th largest
    (``max(k, 1)`` places; int64, on the logits' device): top-1 hits are the first place's,
    top-k hits the sum (an image's label holds one place at most)."""
    return (logits.topk(max(k, 1), dim=1).indices == labels[:, None]).sum(0)


def accuracy_names(num_classes: int | None) -> list[str]:
    """The accuracies logged for ``num_classes`` classes: top-1, and top-5 where there are more
    than 5 classes (both where the number is not known yet)."""
    return ["acc"] if num_classes is not None and num_classes <= 5 else ["acc", "acc_top5"]


def validation_metrics(num_classes: int | None) -> list[str]:
    """What the classifier's validation logs (val/acc_best from the first whole validation)."""
    return ["val/loss", *(f"val/{name}" for name in accuracy_names(num_classes)), "val/acc_best"]


def accuracy_metrics(num_classes: int, prefix: str) -> MetricCollection:
    """Top-1 accuracy, and top-5 where there are more than 5 classes (``accuracy_names``).

    ``validate_args=False``: torchmetrics' input checks copy values to the host at every update
    (a device sync per training step); the loss already refuses labels out of range.
    """
    metrics = {"acc": MulticlassAccuracy(num_classes, average="micro", validate_args=False)}
    if "acc_top5" in accuracy_names(num_classes):
        metrics["acc_top5"] = MulticlassAccuracy(
            num_classes, top_k=5, average="micro", validate_args=False
        )
    return MetricCollection(metrics, prefix=prefix)


def own_copy(tensor: Tensor) -> Tensor:
    """A tensor in memory shared with other processes (sent through torch.multiprocessing)
    copied into this process's own; any other as it is."""
    return tensor.clone() if tensor.is_shared() else tensor


class ImageClassifier(CheapHookName, RankSeeded, StepCurves, L.LightningModule):
    """Cross-entropy training of any net mapping images to class logits."""

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., Optimizer],
        num_classes: int,
        scheduler: Callable[..., Any] | None = None,
        scheduler_interval: Interval = "step",
        label_smoothing: float = 0.0,
        scheduler_monitor: str | None = None,
        scheduler_mode: Literal["min", "max"] = "max",
        tta_flip: bool = False,
        erasing: Callable[[Tensor], Tensor] | None = None,
        mix: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
        decay_norm_and_bias: bool = True,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ConfigError(f"num_classes must be at least 2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        # False: the optimizer's weight decay on weight matrices and kernels only, none on the
        # normalization layers' scales and shifts and the biases (optim.weight_decay_groups).
        self.decay_norm_and_bias = decay_norm_and_bias
        # which those are, by name, before a strategy wraps the net (FSDP flattens them all)
        self.parameter_ndims = parameter_ndims(self.named_parameters())
        self.decay_grouping = DECAY_GROUPING  # a resumed run's: its checkpoint's (continues)
        # What ReduceLROnPlateau watches, and in which direction (the configs: the objective).
        self.scheduler_monitor, self.scheduler_mode = scheduler_monitor, scheduler_mode
        # Accepts class indices and, from mixing, class probabilities (smoothed alike).
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # Test-time flip: validation, test and predictions average the logits of each image and
        # its mirror. Training-batch augmentation after the DataModule's per-image transform:
        # erasing (litlab.models.augment.RandomErasing, per image), then mix (torchvision's
        # MixUp/CutMix, one draw per batch).
        self.tta_flip, self.erasing, self.mix = tta_flip, erasing, mix
        self.num_classes = num_classes
        self.top_k = 5 if "acc_top5" in accuracy_names(num_classes) else 0
        # The training epoch's sums: loss x images and the hits at each top-k place on the
        # device, the images on the host. Seven small tensor ops a step (torchmetrics' update and
        # Lightning's self.log cost more than a small net's step: docs/benchmarks.md, P1);
        # reduced over ranks once, at the epoch's end; saved with checkpoints, so that a run
        # resumed mid-epoch reports the whole epoch. Not buffers: DDP copies rank 0's buffers to
        # every rank at each forward, which would make every rank's sums rank 0's.
        self._loss_sum = torch.zeros((), dtype=torch.float64)
        self._place_sums = torch.zeros(max(self.top_k, 1), dtype=torch.float64)
        self._images = 0
        self.val_metrics = accuracy_metrics(num_classes, "val/")
        self.test_metrics = accuracy_metrics(num_classes, "test/")
        # Evaluation losses: the mean cross-entropy over every image (torchmetrics sums values
        # and counts over ranks; Lightning's own mean of a logged value averages the ranks'
        # image counts as integers, off by one part in the count when the ranks' counts differ).
        # (float32 sums also under 16-true and bf16-true: litlab.metrics.aggregation)
        self.val_loss, self.test_loss = Mean(), Mean()
        # Each class's test images, hits and predictions (true and false positives, false
        # negatives, support: synced over ranks): test/acc_macro, the mean of the classes'
        # accuracies, and the run's summary.json (test_per_class). Accuracy counts images, so a
        # large class decides it: a model that never predicts a class of 6 images in 170 read
        # 0.976 (walkthrough 157).
        self.test_classes = MulticlassStatScores(num_classes, average=None, validate_args=False)
        self.test_per_class: dict[str, Tensor] | None = None  # after a test, on every rank
        self.val_acc_best = Max()
        self.val_acc_best.persistent(True)  # part of the checkpoint: a resumed run keeps its best
        self._validated = False  # a validation since the last plateau step (checkpointed)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Each process its own sums and metric states: ddp_spawn on a CPU hands its processes
        # the module in shared memory and Lightning unshares only parameters and buffers, so
        # every rank added into one copy (train/acc 1.85 on 2 ranks where ddp gave 0.92; the
        # evaluation means' states too, each rank's updates racing the other's).
        self._apply(own_copy)  # torchmetrics' states with the module's tensors
        self._loss_sum, self._place_sums = own_copy(self._loss_sum), own_copy(self._place_sums)

    def _sums_here(self) -> tuple[Tensor, Tensor]:
        """The device's sums (loss x images; hits per top-k place), on the module's device."""
        if self._loss_sum.device != self.device:
            # float64 where the device has it; Apple's MPS has none (float32: counts exact to
            # 2^24 images an epoch a rank)
            dtype = torch.float32 if self.device.type == "mps" else torch.float64
            self._loss_sum = self._loss_sum.to(self.device, dtype)
            self._place_sums = self._place_sums.to(self.device, dtype)
        return self._loss_sum, self._place_sums

    def epoch_sums(self) -> Tensor:
        """This rank's sums of the training epoch so far, on the module's device (float64; MPS:
        float32):
        loss x images, top-1 hits, top-k hits, images."""
        loss, places = self._sums_here()
        return torch.stack([loss, places[0], places.sum(), loss.new_full((), self._images)])

    def _reset_sums(self, sums: Tensor | None = None) -> None:
        """Zero the epoch's sums, or set them to ``sums`` (as ``epoch_sums`` gives them)."""
        loss, places = self._sums_here()
        places.zero_()
        if sums is None:
            loss.zero_()
            self._images = 0
            return
        sums = sums.to(loss)
        loss.copy_(sums[0])
        places[0] = sums[1]
        places[-1] += sums[2] - sums[1]  # top-k hits beyond the first place (k = 0: none)
        self._images = int(sums[3])

    def example_input_shapes(self, image_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """One example's input to the net (litlab.callbacks.ModelSummary's FLOPs)."""
        return {"net": (1, *image_shape)}

    # A net of one's own that cannot take the data's images fails deep in torch at its first
    # batch; said in one line there (walkthrough 173: "mat1 and mat2 shapes cannot be
    # multiplied" with a traceback). Only these shape errors, only before a batch went through.
    # Compiled (callbacks.speed.compile=true), torch's error is inside Dynamo's message, a
    # matrix product's in its own words: 470 lines of traceback.
    _SHAPE_ERRORS = ("cannot be multiplied", "size mismatch", "expected input")
    _SHAPE_ERRORS += ("Calculated padded input size", "Output size is too small")
    _SHAPE_ERRORS += ("must have same reduction dim",)
    _took_a_batch = False

    def forward(self, images: Tensor) -> Tensor:
        try:
            logits = self.net(images)
        except RuntimeError as e:
            traced = re.search(r"got RuntimeError\((['\"])(.*?)\1\)", str(e))
            said = traced[2] if traced else str(e)
            # a convolution's own input named: the images' only (an inner layer's mistake is
            # the net's: its traceback names the layer; review 174)
            inner = re.search(r"input\[([\d, ]+)\]", said)
            if (
                self._took_a_batch
                or not any(error in said for error in self._SHAPE_ERRORS)
                or (inner and [int(n) for n in inner[1].split(",")] != list(images.shape))
            ):
                raise
            raise ConfigError(
                f"{type(self.net).__name__} fails on this data's images, a batch shaped "
                f"{tuple(images.shape)} ({first_line(said, 120)}): a net sized for other "
                f"inputs? size its input for data.image_shape={list(images.shape[1:])} "
                "(model.net), or give the data the shape the net takes"
            ) from None
        if not self._took_a_batch:
            self._took_a_batch = True
        if not isinstance(logits, Tensor):  # (logits, features): an AttributeError on .ndim
            raise ConfigError(
                f"{type(self.net).__name__} returns a {type(logits).__name__}, not a tensor of "
                "logits: return the logits alone from its forward"
            )
        if logits.ndim != 2 or len(logits) != len(images):  # shapes: no device sync
            raise ConfigError(
                f"{type(self.net).__name__} gives outputs shaped {tuple(logits.shape)} for a "
                f"batch of {len(images)} images: give [images, data.num_classes] "
                f"({len(images)}, {self.num_classes})"
            )
        if logits.shape[1] != self.num_classes:
            raise ConfigError(
                f"{type(self.net).__name__} gives outputs shaped {tuple(logits.shape[1:])} per "
                f"image, but data.num_classes={self.num_classes}: give the net "
                f"{self.num_classes} outputs (model.net.num_classes, or your net's last layer)"
            )
        return logits

    def evaluate(self, images: Tensor) -> Tensor:
        """The logits an evaluation uses: the net's, or with tta_flip the mean over each image
        and its left-right mirror (one forward pass of both)."""
        if not self.tta_flip:
            return self(images)
        both = self(torch.cat([images, images.flip(3)]))
        # the class count named: -1 cannot be inferred from an empty batch's no elements
        return both.view(2, len(images), both.shape[-1]).mean(dim=0)

    def _step(
        self,
        batch: tuple[Tensor, Tensor],
        metrics: MetricCollection,
        loss: MeanMetric,
        classes: MulticlassStatScores | None = None,
    ) -> None:
        """An evaluation batch into the stage's metrics. The loss is the plain cross-entropy,
        without the training's label smoothing: val/loss compares across recipes and sweeps."""
        images, labels = batch
        # an empty batch (every file unreadable) too: under FSDP each forward is a collective
        logits = self.evaluate(images)
        if len(labels):  # else nothing to count (torchmetrics refuses no samples)
            metrics.update(logits, labels)
            loss.update(F.cross_entropy(logits.float(), labels, reduction="none"))
            if classes is not None:
                classes.update(logits, labels)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor | None:
        images, labels = batch
        if all_unreadable(labels, self.trainer):
            return None  # Lightning skips the step
        targets = labels
        if self.erasing is not None:
            images = self.erasing(images)
        if self.mix is not None:
            # One mixing weight (and CutMix box) per batch, partner = the batch rolled by one
            # (random partners: training batches are shuffled):
            # torchvision's v2 transforms draw once per call (torchvision issue #8484), which for
            # mixup/cutmix is the standard (timm's default, mode="batch"). The draw is from the
            # global CPU generator: no device sync, and RNGState resumes it exactly.
            images, targets = self.mix(images, labels)
            if targets.ndim == 2:  # mixed (RandomApply may leave a batch as it is)
                # train/acc then counts hits on the label holding the larger share of an image.
                labels = targets.argmax(dim=1)
        logits = self(images)
        loss = self.criterion(logits, targets)
        with torch.no_grad():  # device ops only: no host sync, no tensor from the host
            loss_sum, place_sums = self._sums_here()
            place_sums.add_(place_hits(logits, labels, self.top_k))
            loss_sum.add_(loss.detach(), alpha=len(labels))  # in float64
            self._images += len(labels)
        # The step curve: every trainer.log_every_n_steps (when Lightning writes it), and at an
        # epoch's last batch, so that the run ends with its last value. Not prog_bar=True:
        # Lightning copies a progress-bar value to the host after every later batch too (a
        # device sync per step); litlab's ProgressBar shows it when it redraws.
        self.log_step_curves({"train/loss_step": loss.detach()})
        return loss

    def on_train_epoch_end(self) -> None:
        # The epoch's means over every rank's images: one collective; the values are then the
        # same on every rank.
        sums = self.trainer.strategy.reduce(self.epoch_sums(), reduce_op="sum")
        if epoch_ran_to_its_end(self.trainer):
            self._reset_sums()
        # else (trainer.max_steps, or a stop, inside the epoch) the sums stay for the run's
        # checkpoint: resumed, the epoch is reopened (compat.reopen_an_epoch_cut_short) and its
        # end then logs the whole epoch's means, not those of the batches after the cut
        means = {}
        if sums[3] > 0:  # else no batch this epoch (a resumed run that stopped at its end)
            totals = {"train/loss": sums[0], "train/acc": sums[1]}
            if self.top_k:
                totals["train/acc_top5"] = sums[2]
            means = {name: (total / sums[3]).float() for name, total in totals.items()}
            for name, mean in means.items():
                log_job_value(self, name, mean)
        self._step_plateau_schedules(means)

    def _step_plateau_schedules(self, logged: dict[str, Tensor]) -> None:
        """ReduceLROnPlateau's step for the epoch, here rather than where Lightning takes it:
        Lightning steps it after the epoch's checkpoints are written (last.ckpt then holds the
        schedule before that step) and not at all at the end of an epoch a run resumed in, so
        every resume lost one step. This hook runs before the checkpoint callbacks' own; the
        conditions are Lightning's (the epoch ran to its end, every ``frequency`` epochs, the
        watched metric logged: by validation, or ``logged`` just now)."""
        trainer = self.trainer
        for config in trainer.lr_scheduler_configs:
            if not isinstance(config.scheduler, ReduceLROnPlateau):
                continue
            if not epoch_ran_to_its_end(trainer) or (self.current_epoch + 1) % config.frequency:
                continue
            watches_validation = config.monitor.startswith("val/")
            if watches_validation and not self._validated and trainer.enable_validation:
                # validation every trainer.val_check_interval steps, none since the last step:
                # the next epoch end after one steps (the same in a resumed run: the mark is
                # in the checkpoint, the last validation's values are not)
                continue
            value = logged.get(config.monitor, trainer.callback_metrics.get(config.monitor))
            if value is None:
                raise ConfigError(
                    f"ReduceLROnPlateau watches {config.monitor}, which this run does not log "
                    f"(logged: {sorted(trainer.callback_metrics)}); set model.scheduler_monitor"
                )
            config.scheduler.step(value)
            self._validated = self._validated and not watches_validation

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if isinstance(scheduler, ReduceLROnPlateau):
            return  # stepped by on_train_epoch_end, before the epoch's checkpoints
        super().lr_scheduler_step(scheduler, metric)

    def on_validation_epoch_start(self) -> None:
        broadcast_buffers(self)  # every rank evaluates rank 0's BatchNorm statistics

    def on_test_epoch_start(self) -> None:
        broadcast_buffers(self)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, self.val_metrics, self.val_loss)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log_dict(self.val_metrics, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # torchmetrics syncs across ranks in compute(); Lightning reuses the cached value. The
        # sanity check's partial pass does not count towards the best.
        if not self.trainer.sanity_checking:
            self.val_acc_best.update(self.val_metrics["acc"].compute())  # synced over ranks
            log_job_value(self, "val/acc_best", self.val_acc_best.compute())
            self._validated = True  # a plateau schedule on val/* may step at the epoch's end

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, self.test_metrics, self.test_loss, self.test_classes)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)
        self.log_dict(self.test_metrics, on_step=False, on_epoch=True)

    def on_test_epoch_end(self) -> None:
        """test/acc_macro: each class's accuracy (its images predicted as it), averaged over the
        classes the test holds (as scikit-learn's balanced accuracy; torchmetrics' macro average
        also counts a class absent from the test but predicted, at 0)."""
        scores = self.test_classes.compute()  # [classes, 5]: tp, fp, tn, fn, support (synced)
        self.test_classes.reset()
        hits, predicted, images = scores[:, 0], scores[:, 0] + scores[:, 1], scores[:, 4]
        held = images > 0
        self.test_per_class = {
            "images": images.cpu(),
            "correct": hits.cpu(),
            "predicted": predicted.cpu(),
        }
        if held.any():
            log_job_value(self, "test/acc_macro", (hits[held] / images[held]).float().mean())

    def spawned_record(self) -> dict[str, Any]:
        """What a spawned rank 0 hands the main process (ddp_spawn: the run's summary is written
        there, where no test ran): the test class by class, as lists (Lightning's launcher
        sends its results as bytes, not shared tensors)."""
        counts = self.test_per_class
        return {"test_per_class": {k: v.tolist() for k, v in counts.items()} if counts else None}

    def take_spawned_record(self, record: dict[str, Any]) -> None:
        counts = record.get("test_per_class")
        self.test_per_class = {k: torch.tensor(v) for k, v in counts.items()} if counts else None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The job's sums so far (every rank writes a checkpoint together: one collective). A
        # resumed run hands them to its rank 0 alone, so that the epoch's reduce counts every
        # image once, on any number of ranks.
        total = self.trainer.strategy.reduce(self.epoch_sums(), reduce_op="sum")
        checkpoint["classifier"] = {
            "train_sums": total.cpu(),
            "validated": self._validated,
            "decay_grouping": self.decay_grouping,
        }

    def continues(self, checkpoint: dict[str, Any]) -> None:
        """A fit resumed from ``checkpoint`` (before the trainer builds the optimizer): its
        weight-decay groups are laid out as the checkpoint's run laid them out (its optimizer
        state is in those groups). Checkpoints before litlab spared a vision transformer's
        embeddings from weight decay (no record) go on decaying them, said once."""
        self.decay_grouping = checkpoint.get("classifier", {}).get("decay_grouping", 1)
        moved = [name for name in self.parameter_ndims if spared_by_name(name)]
        if self.decay_grouping < DECAY_GROUPING and moved and not self.decay_norm_and_bias:
            log.warning(
                "this run's checkpoint was written before litlab spared a vision transformer's "
                "embeddings from weight decay (%s): the resumed run decays them as it did; a new "
                "run spares them",
                ", ".join(moved[:3]) + (", ..." if len(moved) > 3 else ""),
            )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # (older checkpoints: at an epoch's end, where a plateau step had just used it)
        self._validated = checkpoint.get("classifier", {}).get("validated", False)
        saved = checkpoint.get("classifier", {}).get("train_sums")
        if saved is not None:
            self._reset_sums(saved.to(torch.float64) if self.global_rank == 0 else None)

    def on_train_start(self) -> None:  # after Lightning restored a resumed run's schedule
        fit_schedules_to_run(self.trainer)  # which then ends at this run's end
        if not batches_done_this_epoch(self.trainer):  # the sums restored belong to an epoch
            self._reset_sums()  # that Lightning counts as done (a save on its last batch)

    def configure_optimizers(self) -> Any:
        optimizer, scheduler = build_optimizer(
            self.optimizer_factory,
            optimized_parameters(
                self.named_parameters(),
                self.decay_norm_and_bias,
                self.parameter_ndims,
                self.decay_grouping,
            ),
            self.scheduler_factory,
            self.scheduler_interval,
            self.trainer,
            self.scheduler_monitor,
            self.scheduler_mode,
        )
        return (
            optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": scheduler}
        )

    @torch.no_grad()
    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.evaluate(batch[0]).argmax(dim=1)
