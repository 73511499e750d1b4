"""Callbacks that evaluate a GAN: FID with an offline extractor, and sample grids."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from torchmetrics.image.fid import FrechetInceptionDistance
from torchvision.transforms.functional import to_pil_image
from torchvision.utils import make_grid

from litlab import rng
from litlab.compat import logging_step
from litlab.distributed import log_job_value
from litlab.errors import CheckpointError, ConfigError, LitlabError, TrainingDiverged, first_line
from litlab.metrics.fid import (
    ClassifierFeatures,
    InceptionFeatures,
    class_histogram,
    classifier_from_checkpoint,
    domain_classifier,
    domain_features,
    entropy,
)

log = logging.getLogger(__name__)

# The latents of FID's generated images: the "fid" stream at step 0 for every validation (FIDs
# of two epochs then differ by the generator alone), at step 1 for the test, so that test/fid is
# not the val/fid its checkpoint was selected by, measured again.
LATENT_SETS = {"val": 0, "test": 1}


def require_gan(pl_module: L.LightningModule, what: str, instead: str) -> None:
    """Refuse ``what`` for a model that is not a GAN, saying the setting that leaves it out."""
    if not hasattr(pl_module, "sample") or not hasattr(pl_module, "fixed_noise"):
        raise ConfigError(f"{what} works with GAN models only; set {instead} for this model")


class FID(Callback):
    """Fréchet distance between generated and real images, at every validation and test.

    ``extractor``: "auto" (a small classifier trained once on the run's real training split
    and cached by a hash of the data; InceptionV3 when the data has one class, which leaves a
    classifier nothing to learn), "inception" (InceptionV3; ``inception_weights`` or the torch
    hub cache, else a download), or the path of a litlab classifier checkpoint.
    Logged: ``<stage>/fid`` (EMA generator; the objective), ``<stage>/fid_g`` (raw generator),
    ``<stage>/fid_<extractor tag>``, ``<stage>/fid_floor`` (real test vs real train images),
    ``<stage>/fid_samples`` (N, the images compared), ``<stage>/fid_real_samples`` (the real
    statistics' images), ``<stage>/class_entropy``. The extractor is never part of the GAN's
    checkpoint.

    Sample counts: the real statistics come from ``num_real`` training images, a seeded
    class-stratified subset (of streamed data too: its conversion recorded the labels in stream
    order; one made before they were gives a uniform subset, with a warning), framed as the
    models see them (the centre ``data.eval_crop`` at
    ``data.image_shape``, not the stored frame, which may be larger: an image folder's). FID
    is biased by the number N of images compared, so the generated side and the floor's real
    test side use the same N: ``num_samples``, or the test split's size when that is smaller.
    Under DDP each rank generates its share of the N images from its own noise (the same
    latents at every validation, another set at the test), and the statistics are summed over
    ranks.
    """

    used_in_eval = True
    reads_test_split = True  # in the fit too (N and the floor): DataModule loads it for the fit

    def __init__(
        self,
        extractor: str = "auto",
        num_samples: int = 2048,
        num_real: int = 10000,
        batch_size: int = 512,
        cache_dir: str = ".cache/litlab",
        inception_weights: str | None = None,
        settings_prefix: str = "callbacks.fid.",
    ) -> None:
        if num_samples < 2 or num_real < 2 or batch_size < 1:
            raise ConfigError("num_samples and num_real must be at least 2, batch_size at least 1")
        self.extractor_spec, self.num_samples, self.num_real = extractor, num_samples, num_real
        self.batch_size, self.cache_dir, self.inception_weights = (
            batch_size,
            cache_dir,
            inception_weights,
        )
        # how the user sets this callback's keys, in its messages: eval.py's are fid_extractor
        # and fid_inception_weights (walkthrough 168: told to set callbacks.fid.*, refused there)
        self.settings_prefix = settings_prefix
        self.metric: FrechetInceptionDistance | None = None
        self.tag = ""
        self._floor: float | None = None
        self._real_count = 0  # images in the real statistics (num_real, or the smaller split)
        self._restored: dict[str, Any] | None = None  # a checkpoint's state given before setup
        self._said_few: set[str] = set()  # stages whose N at or below the features was said

    def _build_extractor(self, trainer: L.Trainer) -> torch.nn.Module:
        dm = trainer.datamodule
        spec, key = self.extractor_spec, f"{self.settings_prefix}extractor"
        weights = (self.inception_weights, f"{self.settings_prefix}inception_weights")
        if spec == "inception":
            # auto trains on the whole training split, which a stream does not hold in memory
            alternative = (
                f"set {key}=<a litlab classifier checkpoint trained on this data>"
                if dm.streamed()
                else f"use {key}=auto"
            )
            return InceptionFeatures(weights[0], alternative, weights[1])
        if spec == "auto" and dm.num_classes < 2:
            # A classifier of one class learns nothing (its cross-entropy is 0 whatever its
            # weights): FID through its features would be FID through random convolutions.
            log.info("FID extractor: the data has one class, nothing for a classifier to learn")
            return InceptionFeatures(
                weights[0],
                alternative=f"set {key}=<a litlab classifier checkpoint> (auto uses InceptionV3 "
                "when the data has one class)",
                weights_key=weights[1],
            )
        if spec == "auto":
            mean, std = dm.transform.mean.flatten().tolist(), dm.transform.std.flatten().tolist()
            if restored := self._restored_classifier(dm, mean, std):
                return restored
            device = trainer.strategy.root_device
            # Rank 0 trains it on the training split (or reads its cache) and hands its weights
            # to every rank: ranks on other nodes may not share the cache folder, and a net
            # trained twice on a GPU differs (each rank would measure its shard through its own
            # extractor). The other ranks do not read the split.
            with torch.inference_mode(False):
                extractor, trained = None, None
                if trainer.is_global_zero:
                    try:
                        images, labels = dm.eval_arrays("train", device=device)
                        extractor = domain_classifier(
                            images, labels, mean, std, self.cache_dir, device=device
                        )
                        trained = (extractor.net.state_dict(), int(labels.max()) + 1)
                    except Exception as error:  # every rank ends with it, none waits for rank 0
                        failed = error
                        if not isinstance(error, LitlabError):
                            error = RuntimeError(
                                f"rank 0 could not build the FID extractor: {first_line(error)}"
                            )
                        trained = error
                trained = trainer.strategy.broadcast(trained, src=0)
                if isinstance(trained, Exception):
                    raise failed if trainer.is_global_zero else trained
                weights, classes = trained
                if extractor is None:  # (dm.image_shape: the frames eval_arrays gives rank 0)
                    extractor = domain_features(weights, classes, mean, std, dm.image_shape)
                return extractor
        if not Path(spec).is_file():
            raise ConfigError(
                f"{key}={spec!r} is neither auto, inception nor an existing checkpoint file"
            )
        return classifier_from_checkpoint(spec)

    def _restored_classifier(
        self, dm: L.LightningDataModule, mean: list[float], std: list[float]
    ) -> ClassifierFeatures | None:
        """extractor=auto's classifier from the checkpoint's state given before setup (a
        resumed run, eval.py, a test of a checkpoint): the run's own, neither trained again
        (minutes on a CPU) nor read from a cache, only for the checkpoint's to replace it."""
        weights = (self._restored or {}).get("weights")
        if weights is None:
            return None
        shape = tuple(self._restored.get("image_shape", dm.image_shape))  # setup compares
        classes = self._restored.get("num_classes", dm.num_classes)
        try:
            extractor = domain_features(weights, classes, mean, std, shape)
        except RuntimeError as error:
            raise CheckpointError(
                f"the checkpoint's FID extractor does not fit this data's {list(shape)} images "
                f"and {dm.num_classes} classes ({first_line(error)}): test a GAN on the images "
                "it was trained on"
            ) from None
        log.info("FID extractor: the run's own, from its checkpoint")
        return extractor

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require_gan(pl_module, "FID", "callbacks.fid=null")
        if self.metric is not None:
            return
        extractor = self._build_extractor(trainer)
        shape = tuple(trainer.datamodule.image_shape)
        if isinstance(extractor, ClassifierFeatures) and extractor.image_shape != shape:
            # (auto on one class is InceptionV3, which downloads its weights: walkthrough 145)
            auto = "auto" if trainer.datamodule.num_classes > 1 else "inception (auto, one class)"
            raise ConfigError(
                f"the FID extractor was trained on {list(extractor.image_shape)} images but this data "
                f"is {list(shape)}; use a classifier trained on this data or "
                f"{self.settings_prefix}extractor={auto}"
            )
        self.tag = extractor.tag
        self.metric = FrechetInceptionDistance(feature=extractor, reset_real_features=False)
        if self._restored is not None:
            self.load_state_dict(self._restored)
            self._restored = None
        log.info("FID extractor: %s", self.tag)

    def state_dict(self) -> dict[str, Any]:
        """A classifier extractor's weights (a small net) travel with the checkpoint: a run
        resumed where its cached classifier is gone (another node; ``extractor=auto``) trained
        another (on a GPU its weights differ) and measured val/fid through it from then on,
        against a best chosen through the first."""
        extractor = self.metric.inception if self.metric is not None else None
        if not isinstance(extractor, ClassifierFeatures):
            return {}
        return {
            "tag": self.tag,
            "weights": extractor.net.state_dict(),
            "num_classes": extractor.num_classes,
            "image_shape": list(extractor.image_shape),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The checkpoint's extractor weights into this run's extractor (built at setup: given
        before, as eval.py gives them, they wait for it)."""
        if self.metric is None:
            self._restored = state_dict
            return
        extractor = self.metric.inception
        weights = state_dict.get("weights")
        if weights is None or not isinstance(extractor, ClassifierFeatures):
            return
        if state_dict["tag"] != self.tag:
            log.info("FID extractor: the run's own, %s, from its checkpoint", state_dict["tag"])
            extractor.net.load_state_dict(weights)
            self.tag = extractor.tag = state_dict["tag"]

    def sample_count(self, trainer: L.Trainer) -> int:
        """N, the number of images on the generated side (and the floor's test side)."""
        return min(self.num_samples, trainer.datamodule.split_size("test"))

    def _feed_real(self, trainer: L.Trainer, split: str, count: int, real: bool) -> int:
        """Add this rank's shard of ``count`` real images of a split (a seeded subset, as
        DataModule.arrays draws it, framed as the models see them; each rank reads only its
        own) to the real (or generated-side) statistics; returns how many images all ranks fed
        (fewer than ``count`` in a smaller split, or where files did not decode)."""
        device = self.metric.device
        shard = (trainer.global_rank, trainer.world_size)
        images, _ = trainer.datamodule.eval_arrays(split, count, device=device, shard=shard)
        for start in range(0, len(images), self.batch_size):
            batch = images[start : start + self.batch_size].to(device).float() / 255
            self.metric.update(batch, real=real)
        fed = torch.tensor(len(images), device=device)
        return int(trainer.strategy.reduce(fed, reduce_op="sum"))

    def _feed_generated(
        self, trainer: L.Trainer, pl_module: L.LightningModule, total: int, ema: bool, stage: str
    ) -> torch.Tensor | None:
        """This rank's share of ``total`` generated images, from the stage's latents (the same
        at every evaluation, for G_ema and G; ``fid_latents``). Returns the extractor's class
        logits of them where it is a classifier, else None. A generator whose images are not
        finite ends the run on every rank (its FID crashed the process in torch's eigvals)."""
        rank, world = trainer.global_rank, trainer.world_size
        latents = fid_latents(pl_module, total, stage, rank, world).to(pl_module.device)
        extractor = self.metric.inception
        classifies = isinstance(extractor, ClassifierFeatures)
        # (a rank with no images, where N < ranks, has an empty histogram to sum all the same)
        logits = (
            [torch.empty(0, extractor.num_classes, device=pl_module.device)] if classifies else []
        )
        broken = torch.zeros((), device=pl_module.device)
        for start in range(0, len(latents), self.batch_size):
            images = pl_module.sample(latents[start : start + self.batch_size], ema=ema)
            broken += (~torch.isfinite(images)).sum()
            self.metric.update(images, real=False)
            if classifies:
                logits.append(extractor.features_and_logits(images)[1])
        if trainer.strategy.reduce(broken, reduce_op="sum") > 0:  # on every rank: a collective
            which = "averaged generator" if ema else "generator"
            raise TrainingDiverged(
                f"training diverged: the {which}'s images became NaN or infinite by step "
                f"{trainer.global_step} ({stage} FID); lower the learning rates, add "
                "model.gradient_clip_val, or try another loss"
            )
        return torch.cat(logits) if classifies else None

    @torch.no_grad()
    def evaluate(
        self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str
    ) -> dict[str, float]:
        metric = self.metric.to(pl_module.device)
        total = self.sample_count(trainer)
        if self._real_count == 0:  # the job's count, the same on every rank (a rank's own may be 0)
            self._real_count = self._feed_real(trainer, "train", self.num_real, real=True)
        values: dict[str, float] = {}
        # eval.py on another folder tests every image of it: the real statistics come from those
        # images too, and a floor of them against themselves would read too low
        test_all = getattr(getattr(trainer.datamodule, "source", None), "test_all", False)
        if test_all and trainer.is_global_zero:
            log.info("no %s/fid_floor: the real statistics hold the folder's test images", stage)
        if self._floor is None and not test_all:
            if total < self.num_samples and trainer.is_global_zero:
                log.info(
                    "FID compares %d generated images (callbacks.fid.num_samples=%d), the test "
                    "split's size, so that the floor is measured at the same N",
                    total,
                    self.num_samples,
                )
            fed = self._feed_real(trainer, "test", total, real=False)
            if fed < total and trainer.is_global_zero:
                log.warning(
                    "%s/fid_floor compares %d real test images, not N=%d (%d did not decode): "
                    "a floor at fewer images reads higher",
                    stage,
                    fed,
                    total,
                    total - fed,
                )
            self._floor = float(metric.compute())
            metric.reset()
        if self._floor is not None:
            values[f"{stage}/fid_floor"] = self._floor
        self._say_few_images(trainer, stage, total)
        values[f"{stage}/fid_samples"] = float(total)  # N: FIDs compare only at the same N
        values[f"{stage}/fid_real_samples"] = float(self._real_count)  # and the same N_real
        has_ema = getattr(pl_module, "generator_ema", None) is not None
        for ema in (True, False) if has_ema else (False,):
            logits = self._feed_generated(trainer, pl_module, total, ema, stage)
            fid = float(metric.compute())
            metric.reset()
            if ema or not has_ema:
                values[f"{stage}/fid"] = values[f"{stage}/fid_{self.tag}"] = fid
                if logits is not None:  # on every rank: the sum is a collective
                    counts = class_histogram(logits)
                    counts = trainer.strategy.reduce(counts, reduce_op="sum")
                    values[f"{stage}/class_entropy"] = entropy(counts)
            if not ema:
                values[f"{stage}/fid_g"] = fid
        for name, value in values.items():  # the same on every rank (statistics summed over ranks)
            log_job_value(pl_module, name, value)
        # the generator-iteration axis in FID's rows too (W&B plots a metric against another
        # logged in the same row: val/fid, the objective, against g/step); a test's is the
        # tested checkpoint's, test/g_step, not the run's g/step (where training ended)
        if (g_steps := getattr(pl_module, "g_steps", None)) is not None:
            log_job_value(pl_module, "g/step" if stage == "val" else "test/g_step", float(g_steps))
        return values

    def _say_few_images(self, trainer: L.Trainer, stage: str, total: int) -> None:
        """Once a stage: FID on no more images than the extractor has features, where both
        covariances are rank-deficient and the value is mostly the estimator's bias (a folder
        of 120 images: N=26 against 128 features, reported as any FID; walkthrough 145)."""
        features = self.metric.real_features_sum.numel()
        fewest = min(total, self._real_count)
        if fewest > features or stage in self._said_few or not trainer.is_global_zero:
            return
        self._said_few.add(stage)
        floor = f" ({stage}/fid_floor shows how much)" if self._floor is not None else ""
        log.warning(
            "%s/fid compares %d generated and %d real images, no more than the extractor's %d "
            "features: their covariances are rank-deficient and the value is mostly the "
            "estimator's bias%s; compare it only with FIDs at the same N, or give FID more "
            "images (callbacks.fid.num_samples, num_real, a larger test split)",
            stage,
            total,
            self._real_count,
            features,
            floor,
        )

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.evaluate(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.evaluate(trainer, pl_module, "test")


def give_checkpoint_state(callbacks: list[Callback], checkpoint: dict[str, Any]) -> None:
    """The checkpoint's state to its FID callbacks before the trainer sets them up (Lightning
    restores callbacks after setup): they build the run's own extractor from it at setup."""
    for fid in (c for c in callbacks if isinstance(c, FID)):
        if saved := checkpoint.get("callbacks", {}).get(fid.state_key):
            fid.load_state_dict(saved)


def fid_latents(
    pl_module: L.LightningModule, total: int, stage: str, rank: int, world: int
) -> torch.Tensor:
    """This rank's consecutive share of the stage's ``total`` FID latents, drawn on the CPU
    from one stream of the job: the same N latents on any number of ranks and any device (each
    rank drew from a stream of its own, on its device, so eval.py on one process tested another
    set than the run on several, and a resume on another number of ranks changed the set)."""
    latents = job_latents(pl_module, total, "fid", LATENT_SETS[stage])
    return torch.tensor_split(latents, world)[rank]  # the first total % world one longer


def job_latents(pl_module: L.LightningModule, n: int, name: str, step: int = 0) -> torch.Tensor:
    """``n`` latent vectors of the job's stream ``name`` at ``step``, drawn on the CPU: the same
    whichever rank draws them, on any device."""
    generator = rng.stream(pl_module.noise_seed, 0, name, step)
    return torch.randn(n, pl_module.latent_dim, generator=generator)


class SampleGrid(Callback):
    """Grids of the fixed noise through the EMA generator: every N generator steps, at the end of
    training and when testing. PNGs go to <run>/samples/; W&B and TensorBoard get them too."""

    used_in_eval = True

    def __init__(self, every_n_g_steps: int = 500, nrow: int = 8, dirname: str = "samples") -> None:
        if every_n_g_steps < 1:
            raise ConfigError(f"every_n_g_steps must be at least 1, got {every_n_g_steps}")
        self.every_n_g_steps, self.nrow, self.dirname = every_n_g_steps, nrow, dirname
        self._last_saved = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require_gan(pl_module, "a sample grid", "callbacks.samples=null")

    def save(
        self, trainer: L.Trainer, pl_module: L.LightningModule, name: str, ema: bool = True
    ) -> Path | None:
        images = pl_module.sample(pl_module.fixed_noise, ema=ema)
        if not trainer.is_global_zero:
            return None
        grid = make_grid(images.cpu(), nrow=self.nrow, padding=2, pad_value=1.0)
        path = Path(trainer.default_root_dir) / self.dirname / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        # The PNG's very pixels for every logger: W&B casts float images to uint8 as they
        # are, which made a [0, 1] grid black and white padding.
        pixels = png_pixels(grid)
        to_pil_image(pixels).save(path)
        # The EMA generator's grids in one panel, the raw generator's in another, at the step
        # the scalars are logged at (without one, W&B took its previous row's step).
        key = "samples" if ema else "samples_raw_g"
        step = logging_step(trainer)
        caption = f"{name} (g/step {pl_module.g_steps})"
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key=key, images=[pixels], caption=[caption], step=step)
            elif isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(key, pixels, global_step=step)
        return path

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run made the grid of the generator step it restarts at (the batches before
        # its next G step are D's alone): not again.
        self._last_saved = pl_module.g_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.g_steps
        if step != self._last_saved and step % self.every_n_g_steps == 0 and step > 0:
            self._last_saved = step
            self.save(trainer, pl_module, f"g_step_{step:07d}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer, pl_module, "final")
        if getattr(pl_module, "generator_ema", None) is not None:
            self.save(trainer, pl_module, "final_raw_g", ema=False)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer, pl_module, "test")


@torch.no_grad()
def save_generated_images(
    pl_module: L.LightningModule, count: int, folder: Path, batch_size: int = 256
) -> int:
    """Write ``count`` images from the EMA generator as PNG files 000000.png, 000001.png, ...,
    from the job's "generate" latents drawn on the CPU: the same images whichever rank and
    device write them (eval.py writes them once, on rank 0; each rank drew from its own stream
    on its device, and under DDP all wrote different images to the same names)."""
    require_gan(pl_module, "generate=N", "generate=0")
    folder.mkdir(parents=True, exist_ok=True)
    latents = job_latents(pl_module, count, "generate")
    written = 0
    for start in range(0, count, batch_size):
        images = pl_module.sample(latents[start : start + batch_size].to(pl_module.device))
        # in the images' own channels (save_image makes a grid, which turns one channel into
        # three: grey digits were written as RGB files)
        for image in png_pixels(images).cpu():
            to_pil_image(image).save(folder / f"{written:06d}.png")
            written += 1
    return written


def png_pixels(images: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] as the uint8 pixels their PNG files hold, rounded as torchvision's
    save_image rounds."""
    return images.mul(255).add_(0.5).clamp_(0, 255).to(torch.uint8)
