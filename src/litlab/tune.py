"""Before a run: find the largest batch size that fits and a learning rate that works (Lightning's
Tuner), and write them into the run's config so that the config alone reproduces the run. During
a run: an out-of-memory error becomes one line saying which switches help."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.tuner import Tuner
from lightning.pytorch.utilities.memory import garbage_collection_cuda, is_oom_error
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.monitor import GB, rss_gb
from litlab.checkpoint import load_checkpoint, stored_config
from litlab.config import build, build_model
from litlab.distributed import launched_processes
from litlab.errors import ConfigError, OutOfMemory
from litlab.overrides import TUNED_KEYS, override_key
from litlab.profiler import NoProfiler

log = logging.getLogger("litlab")


class _NotLightningsSize(logging.Filter):
    """Lightning's "will continue with full run using batch size N" is its search's answer
    before litlab's own checks (the cap at the training split, binsearch's margin): on digits
    it said 2048 beside litlab's 1294. litlab's "tune.batch_size found" line says the size the
    run trains with."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Finished batch size finder")


logging.getLogger("lightning.pytorch.tuner.batch_size_scaling").addFilter(_NotLightningsSize())

LR_PLOT = "lr_find.png"
# Arguments of the Tuner methods that the task supplies, not the config.
_SUPPLIED = {
    "self",
    "model",
    "datamodule",
    "method",
    "update_attr",
    "train_dataloaders",
    "val_dataloaders",
    "dataloaders",
}
_MODES = {"batch_size_finder": ("power", "binsearch"), "lr_finder": ("exponential", "linear")}


def finder_options(cfg: DictConfig, key: str) -> dict[str, Any]:
    """tune.<key> as keyword arguments of Lightning's Tuner method, checked."""
    method = Tuner.scale_batch_size if key == "batch_size_finder" else Tuner.lr_find
    options = OmegaConf.to_container(cfg.tune.get(key) or {}, resolve=True)
    known = [p for p in inspect.signature(method).parameters if p not in _SUPPLIED]
    for name, value in options.items():
        if name not in known:
            raise ConfigError(
                f"tune.{key}.{name} is not an option of Tuner.{method.__name__}; "
                f"known options: {', '.join(known)}"
            )
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ConfigError(f"tune.{key}.{name} must be at least 1, got {value}")
    if options.get("mode", _MODES[key][0]) not in _MODES[key]:
        raise ConfigError(
            f"tune.{key}.mode must be {' or '.join(_MODES[key])}, got {options['mode']!r}"
        )
    if key == "lr_finder" and not 0 < options.get("min_lr", 1e-8) < options.get("max_lr", 1.0):
        raise ConfigError("tune.lr_finder needs 0 < min_lr < max_lr")
    return options


ONE_DEVICE = (
    "tune.batch_size/tune.lr run on one device: tune with trainer.devices=1 trainer.strategy=auto "
    "in one process (without torchrun or srun), then start the multi-device run with the values "
    "found"
)


def tune(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the finders that ``tune.batch_size`` / ``tune.lr`` switch on, on throwaway copies of
    the data, model and trainer; write the found values into ``cfg`` and the saved config. A
    resumed run (``ckpt_path``) takes its checkpoint's values instead.

    The finders run eagerly, with no callbacks or loggers (Speed's compile would compile each
    trial's batch size anew). The written config has the finders off, so that a rerun or a
    resume uses the same values without searching again. Returns what was found (empty when
    nothing was tuned), for summary.json.
    """
    switches = cfg.get("tune") or {}
    if not cfg.get("train") or not (switches.get("batch_size") or switches.get("lr")):
        return {}
    check_not_also_given(switches)
    if cfg.get("ckpt_path"):  # a resumed run keeps the values it trained with: no search
        path = str(cfg.ckpt_path)
        taken = take_tuned_values(cfg, stored_config(load_checkpoint(path), path))
        for name, value in taken.items():
            log.info(
                "tune.%s: %s=%s, as the checkpoint %s trained", name, TUNED_KEYS[name], value, path
            )
        return {**taken, "source": path} if taken else {}
    if launched_processes() > 1:  # torchrun's or srun's processes would each tune on their own
        raise ConfigError(ONE_DEVICE)
    batch_options = finder_options(cfg, "batch_size_finder")
    lr_options = finder_options(cfg, "lr_finder")
    n_critic = int(OmegaConf.select(cfg, "model.n_critic", default=None) or 1)
    if n_critic > 1:  # G steps once every n_critic batches: a shorter trial may never measure G
        steps = int(batch_options.get("steps_per_trial", 3))
        batch_options["steps_per_trial"] = max(steps, n_critic + 1)
    # A finite max_steps keeps step-based schedules (OneCycleLR) constructible; they are built
    # once for it and the batch-size search's trials all step them (the LR range test puts its
    # own schedule in place), so it covers every trial too.
    steps = int(lr_options.get("num_training", 100))
    if switches.get("batch_size"):
        trials = int(batch_options.get("max_trials", 25)) + 2  # binsearch's last bisection
        steps = max(steps, int(batch_options.get("steps_per_trial", 3)) * trials)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    model = build_model(cfg.model, datamodule)
    if switches.get("lr"):
        check_lr_tunable(cfg, model)
    trainer = throwaway_trainer(cfg, max_steps=steps)
    if isinstance(trainer.strategy, ParallelStrategy):
        raise ConfigError(ONE_DEVICE)
    found: dict[str, Any] = {}
    if switches.get("batch_size"):
        found["batch_size"] = find_batch_size(cfg, trainer, model, datamodule, batch_options)
    if switches.get("lr"):
        found.update(find_lr(cfg, trainer, model, datamodule, lr_options, run_dir))
    del trainer, model, datamodule
    garbage_collection_cuda()  # the throwaway model's memory goes back before the real one
    updates = {"tune.batch_size": False, "tune.lr": False}
    updates.update({TUNED_KEYS[name]: found[name] for name in TUNED_KEYS if name in found})
    write_tuned(cfg, updates)
    return found


def throwaway_trainer(cfg: DictConfig, **kwargs: Any) -> L.Trainer:
    """The run's Trainer without what a run keeps: callbacks, loggers, checkpoints, profiler
    (debug=profile's trace and table are the run's, not the finders')."""
    return build(
        cfg.trainer,
        "trainer",
        callbacks=[],
        logger=False,
        profiler=NoProfiler(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        max_epochs=-1,  # unbounded, so that the LR range test gets all its steps
        **kwargs,
    )


def check_not_also_given(switches: Any) -> None:
    """A finder replaces its key's value: one also given on the command line (or by a sweep's
    sampler) would be trained with the value found, while the run's overrides, the report and
    the sweeper's record (Optuna learning from it) named the one given."""
    if not HydraConfig.initialized():
        return
    given = {override_key(o): o for o in HydraConfig.get().overrides.task if "=" in o}
    for name, key in TUNED_KEYS.items():
        if switches.get(name) and key in given:
            raise ConfigError(
                f"tune.{name}=true finds {key}, which is also given ({given[key]}) and would not "
                f"be the value trained with: drop {key} from the command line or the sweep, or "
                f"tune.{name}"
            )


def check_lr_tunable(cfg: DictConfig, model: L.LightningModule) -> None:
    """The LR range test needs one optimizer under automatic optimization and an lr to write."""
    if not model.automatic_optimization:
        raise ConfigError(
            "tune.lr finds one learning rate for one optimizer, but this model trains with manual "
            "optimization (a GAN steps G and D itself): set model.g_optimizer.lr and "
            "model.d_optimizer.lr instead"
        )
    if OmegaConf.select(cfg, "model.optimizer.lr") is None:
        raise ConfigError("tune.lr writes the learning rate found to model.optimizer.lr; set one")


def find_batch_size(
    cfg: DictConfig,
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    options: dict[str, Any],
) -> int:
    """The largest batch size (power of two, or the cap) that trains without running out of
    memory."""
    if trainer.strategy.root_device.type == "cpu":
        log.warning(
            "tune.batch_size on CPU: memory never runs out there, so the search stops at "
            "tune.batch_size_finder.max_val or the size of the training split"
        )
    datamodule.setup("fit")
    # Lightning cannot see the length of the device-resident loader and would double past
    # the data; a batch never holds more than the training split.
    fit_images = len(datamodule.datasets["fit"])
    cap = min(int(options.get("max_val", 8192)), most_per_batch(fit_images, trainer))
    options["max_val"] = cap
    # Lightning builds the first trial's loader before it sets init_val: that trial ran at
    # data.batch_size.
    init_val = int(options.get("init_val", 2))
    datamodule.batch_size = init_val
    datamodule.batch_cap = cap
    try:
        size = Tuner(trainer).scale_batch_size(model, datamodule=datamodule, **options)
    finally:
        datamodule.batch_cap = None
    if size is None:  # fast_dev_run: Lightning skips the search
        log.warning(
            "tune.batch_size: no search under fast_dev_run; keeping %s", cfg.data.batch_size
        )
        return int(cfg.data.batch_size)
    size = int(size)
    binsearch = options.get("mode", "power") == "binsearch"
    margin = float(options.get("margin", 0.05)) if binsearch else 0.0

    def less_margin(n: int) -> int:  # binsearch's safety buffer below a size that fitted
        return max(1, int(n * (1 - margin)))

    # The doubling stops when it reaches the cap, which Lightning returns without trying it.
    if size >= cap or (binsearch and size == less_margin(cap)):
        steps = int(options.get("steps_per_trial", 3))
        below = [init_val * 2**k for k in range(cap.bit_length()) if init_val * 2**k < cap]
        if trains(cfg, model, datamodule, cap, steps):
            size = less_margin(cap)
        elif below:  # every doubling below the cap trained
            fits = below[-1]
            if binsearch:  # bisect up to the cap, as Lightning's binsearch does below it
                high = cap
                while high - fits > 1:
                    middle = (fits + high) // 2
                    fits, high = (
                        (middle, high)
                        if trains(cfg, model, datamodule, middle, steps)
                        else (fits, middle)
                    )
            log.info("tune.batch_size: %d ran out of memory, %d trained", cap, fits)
            size = less_margin(fits)
        else:
            raise OutOfMemory(
                f"tune.batch_size: {cap}, the only size tried (init_val={init_val} reaches the "
                "cap), ran out of memory; lower tune.batch_size_finder.init_val"
            )
    datamodule.batch_size = size
    steps = max(1, fit_images // size)  # (the training loader drops a last partial batch)
    limit = trainer.limit_train_batches  # (as Lightning counts an epoch's batches)
    steps = max(1, int(steps * limit)) if isinstance(limit, float) else min(steps, limit)
    log.info(
        "tune.batch_size found data.batch_size=%d: %d batch(es) an epoch of the %d training images",
        size,
        steps,
        fit_images,
    )
    if steps < FEW_BATCHES:  # (walkthrough 160: the whole split, one step an epoch, unsaid)
        log.warning(
            "tune.batch_size: data.batch_size=%d leaves %d batch(es) an epoch: an epoch's "
            "counts (trainer.max_epochs, early stopping's patience, a per-epoch schedule) are "
            "that few optimizer steps; cap the search with tune.batch_size_finder.max_val",
            size,
            steps,
        )
    return size


# Fewer training batches an epoch than this after the batch-size search: said
FEW_BATCHES = 10


def most_per_batch(images: int, trainer: L.Trainer) -> int:
    """The largest batch that leaves the run's epoch a batch at least: a fraction of an epoch
    (``trainer.limit_train_batches=0.5``) of fewer than one batch is refused by Lightning, so
    the split's size itself was a cap that the search returned and the run could not use."""
    limit = trainer.limit_train_batches
    if not isinstance(limit, float) or not 0 < limit < 1:
        return images
    batches = math.ceil(1 / limit)
    while int(batches * limit) < 1:  # as Lightning counts: int(batches * limit)
        batches += 1
    return max(1, images // batches)


def trains(
    cfg: DictConfig,
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    batch_size: int,
    steps: int,
) -> bool:
    """Whether ``steps`` optimizer steps at ``batch_size`` train without running out of memory,
    on a throwaway trainer; the model's weights are put back (the LR range test starts from
    them)."""
    weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    datamodule.batch_size = batch_size
    garbage_collection_cuda()
    try:
        throwaway_trainer(cfg, max_steps=steps, limit_val_batches=0).fit(model, datamodule)
    except RuntimeError as e:
        if not is_out_of_memory(e):
            raise
        return False
    finally:
        model.load_state_dict(weights)
        garbage_collection_cuda()
    return True


def find_lr(
    cfg: DictConfig,
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    options: dict[str, Any],
    run_dir: Path,
) -> dict[str, Any]:
    """Lightning's LR range test; its suggestion (``valley``) marked on its plot."""
    finder = Tuner(trainer).lr_find(model, datamodule=datamodule, update_attr=False, **options)
    fall = longest_fall(finder.results["loss"]) if finder is not None else None
    if fall is None:
        log.warning(
            "tune.lr: no suggestion (fast_dev_run or too few steps); keeping model.optimizer.lr=%s",
            cfg.model.optimizer.lr,
        )
        return {}
    losses, rates = finder.results["loss"], finder.results["lr"]
    if losses[fall[-1]] > (1 - LEAST_FALL) * losses[fall[0]]:  # nothing learned at any rate
        log.warning(
            "tune.lr: the range test's loss never fell by %.0f%% at any rate from %.3g to %.3g "
            "(its longest fall: %.4g to %.4g): no rate to suggest; keeping "
            "model.optimizer.lr=%s (a wider range or a longer test: tune.lr_finder.max_lr, "
            "tune.lr_finder.num_training; or check that the labels fit the images)",
            100 * LEAST_FALL,
            rates[0],
            rates[-1],
            losses[fall[0]],
            losses[fall[-1]],
            cfg.model.optimizer.lr,
        )
        return {}
    index = valley(fall)
    import matplotlib.pyplot as plt

    lr, loss = rates[index], losses[index]
    figure = finder.plot(suggest=False)  # (suggest=True marks Lightning's own suggestion)
    figure.axes[0].plot(lr, loss, markersize=10, marker="o", color="red")
    figure.savefig(run_dir / LR_PLOT, dpi=100)
    plt.close(figure)
    log.info("tune.lr found model.optimizer.lr=%.3g (plot: %s)", lr, run_dir / LR_PLOT)
    return {"lr": float(lr), "lr_plot": str(run_dir / LR_PLOT)}


# The least fall of the range test's smoothed loss along its longest fall (a fraction of the
# fall's start) for a suggestion: a loss that never fell (too narrow a range, labels unrelated to
# the images) still has a longest falling run, of noise (walkthrough 160; the default CNN on
# digits falls 35% along it, at rates up to 1e-6 0.2%).
LEAST_FALL = 0.02


def longest_fall(losses: list[float]) -> list[int] | None:
    """The range test's (smoothed) losses' longest run of falling loss (their longest decreasing
    subsequence), the positions from its start to its end; fastai's "valley" suggestion is the
    point half way along it. Lightning's ``suggestion()`` takes the steepest slope against the
    learning rate itself, whose steps grow tenfold a decade: it picks the smallest rates, where
    the smoothed loss of the first steps still wanders (the default CNN on digits: 3.6e-6, which
    trains at chance; the steepest slope per decade, 0.076, is near where the loss blows up: 52%
    after 2 epochs; the valley's 2e-3 to 1e-2 train as well as the default 3e-3)."""
    points = [i for i, loss in enumerate(losses) if math.isfinite(loss)]
    if len(points) < 3:
        log.error("tune.lr: too few finite points to suggest a learning rate")
        return None
    run = [1] * len(points)  # run[i]: the longest decreasing subsequence ending at point i
    end = 0
    for i in range(1, len(points)):
        for j in range(i):
            if losses[points[i]] < losses[points[j]]:
                run[i] = max(run[i], run[j] + 1)
        if run[i] > run[end]:
            end = i
    return points[end - run[end] + 1 : end + 1]


def valley(fall: list[int]) -> int:
    """fastai's "valley" suggestion: the point half way along the loss's longest fall."""
    return fall[(len(fall) - 1) // 2]


def take_tuned_values(cfg: DictConfig, stored: DictConfig) -> dict[str, Any]:
    """A run continued from a checkpoint uses the values its finders found, without searching
    again: the switches that are on take their values from the checkpoint's config, in ``cfg``
    and in the run's saved config (Hydra wrote the command's there again when a requeued job
    started: a later ``resume=`` would have trained on with the values before the search).
    Returns the values taken, by switch."""
    switches = cfg.get("tune") or {}
    updates: dict[str, Any] = {}
    taken: dict[str, Any] = {}
    for switch, key in TUNED_KEYS.items():
        if switches.get(switch):
            updates[key] = taken[switch] = OmegaConf.select(stored, key)
            updates[f"tune.{switch}"] = False
    if updates:
        write_tuned(cfg, updates)
    return taken


def write_tuned(cfg: DictConfig, updates: dict[str, Any]) -> None:
    """Tuned values (and the finders' switches off) into ``cfg`` and the run's saved config."""
    for key, value in updates.items():
        OmegaConf.update(cfg, key, value, merge=False)
    save_tuned_config(updates)


def save_tuned_config(updates: dict[str, Any]) -> None:
    """Write the found values into the run's saved Hydra config (written before the task ran),
    so that ``resume=<run folder>`` and reruns from it use them."""
    if not HydraConfig.initialized() or not HydraConfig.get().output_subdir:
        return
    hydra_cfg = HydraConfig.get()
    path = Path(hydra_cfg.runtime.output_dir) / hydra_cfg.output_subdir / "config.yaml"
    if not path.is_file():
        return
    saved = OmegaConf.load(path)
    for key, value in updates.items():
        OmegaConf.update(saved, key, value, merge=False)
    OmegaConf.save(saved, path)


def log_lr_plot(loggers: list[Logger], tuned: dict[str, Any]) -> None:
    """Show the LR range test's plot next to the run's metrics in W&B and TensorBoard."""
    if "lr_plot" not in tuned:
        return
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key="tune/lr_find", images=[tuned["lr_plot"]], step=0)  # before step 1
        elif isinstance(logger, TensorBoardLogger):
            from PIL import Image

            image = np.asarray(Image.open(tuned["lr_plot"]).convert("RGB"))
            logger.experiment.add_image("tune/lr_find", image, 0, dataformats="HWC")


def oom_message(batch_size: int, peak_gb: float, total_gb: float | None, precision: str) -> str:
    """The one line an out-of-memory error becomes: what ran, how full, which switches help."""
    full = f"peak {peak_gb:.1f} GB allocated" + (f" of {total_gb:.1f} GB" if total_gb else "")
    lower = (
        "a lower precision (trainer.precision=bf16-mixed)"
        if precision.startswith(("32", "64"))
        else f"a smaller data.batch_size (trainer.precision is already {precision})"
    )
    return (
        f"out of memory while training with data.batch_size={batch_size} ({full}); "
        f"try tune.batch_size=true or {lower}"
    )


def is_out_of_memory(error: RuntimeError) -> bool:
    """CUDA's, cuDNN's or the CPU allocator's out-of-memory error (as Lightning's finder sees it)."""
    return isinstance(error, torch.OutOfMemoryError) or is_oom_error(error)


@contextmanager
def out_of_memory_explained(batch_size: int, trainer: L.Trainer) -> Iterator[None]:
    """Re-raise an out-of-memory error inside the block as OutOfMemory with one clear line."""
    try:
        yield
    except RuntimeError as e:
        if not is_out_of_memory(e):
            raise
        device = trainer.strategy.root_device
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) / GB
            total = torch.cuda.get_device_properties(device).total_memory / GB
        else:
            peak, total = rss_gb(), None
        raise OutOfMemory(oom_message(batch_size, peak, total, str(trainer.precision))) from e
