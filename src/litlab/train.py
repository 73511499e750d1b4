"""The train task: compose -> validate -> seed -> data, model, callbacks, loggers, trainer -> fit -> test."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, Timer
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from litlab import compat
from litlab.callbacks import PeakMemory, Throughput
from litlab.callbacks.gan import give_checkpoint_state
from litlab.callbacks.preemption import hand_over_preemption, stop_for_a_signal_left
from litlab.checkpoint import checkpoint_step, early_stopping_states, load_checkpoint
from litlab.config import (
    absolute_data_paths,
    build,
    build_model,
    check_all,
    check_augmentation,
    check_device_stats,
    check_ema,
    check_manual_optimization,
    check_objective,
    check_plateau_mode,
    check_precision,
    check_pretrained_normalization,
    check_top_level,
    config_dir,
    in_sweep,
    objective_not_logged,
)
from litlab.data.datamodule import part_of_a_split
from litlab.distributed import (
    adopt_launcher_layout,
    ranks_run_this_job,
    strategy_for,
    unused_parameters_explained,
)
from litlab.distributed.agree import OnePrecision
from litlab.distributed.launchers import as_launched, check_command_line, check_submitit_local
from litlab.errors import ConfigError, TrainingDiverged, fail
from litlab.hardware import check_hardware, on_gpu, resolve_precision
from litlab.loggers import check_forked_wandb, finish_loggers
from litlab.models.optim import schedules_left_unfinished
from litlab.nets.torchvision_net import weights_from_checkpoint
from litlab.resumable import check_processes, check_resumable
from litlab.resume import FitMilestones, continue_in_place, resume_argv
from litlab.run import (
    HoldStopAfterTest,
    Run,
    build_list,
    ended_as,
    freeze_the_imports,
    print_config_tree,
)
from litlab.tune import log_lr_plot, out_of_memory_explained, tune

log = logging.getLogger("litlab")

CONFIG_ORDER = ("data", "model", "objective", "trainer", "callbacks", "logger", "paths", "extras")


def setup_extras(cfg: DictConfig) -> None:
    """Optional conveniences before anything starts: the warnings filter."""
    if (cfg.get("extras") or {}).get("ignore_warnings"):
        warnings.filterwarnings("ignore")


def say_another_precision(checkpoint: dict[str, Any], cfg: DictConfig) -> None:
    """A fit continued at another trainer.precision than its checkpoint's run trained at (a
    resume= with another one, or auto on another kind of machine): said once (walkthrough 178:
    switched without a word, summary.json then naming the new one alone)."""
    then = ((checkpoint.get("hyper_parameters") or {}).get("trainer") or {}).get("precision")
    now = cfg.trainer.get("precision")
    if then is not None and str(then) != str(now) and rank_zero_only.rank == 0:
        log.warning(
            "the run trained at trainer.precision=%s up to global step %s and continues at %s: "
            "its later steps round otherwise (trainer.precision=%s keeps it)",
            then,
            checkpoint.get("global_step"),
            now,
            then,
        )


def show_config(cfg: DictConfig) -> None:
    """The config tree (extras.print_config), as the run uses it: after the finders (tune.*)
    wrote their values in (it showed data.batch_size 64 of a run that trained at 256)."""
    if (cfg.get("extras") or {}).get("print_config") and rank_zero_only.rank == 0:
        print_config_tree(cfg, CONFIG_ORDER)


def train(cfg: DictConfig, run: Run) -> dict[str, Any]:
    """Train and test one model as the config says; return the final metrics."""
    # Under torchrun or srun: the processes' layout into the config first, so that the run's
    # config and checkpoints say how many trained it (and a requeued job's config matches).
    adopt_launcher_layout(cfg.trainer)
    check(cfg, run)
    continued = continue_in_place(cfg, run)  # a requeued cluster job picks up its checkpoints
    setup_extras(cfg)
    tuned = tune(cfg, run.dir)  # batch size and LR finders write what they find into cfg
    if tuned:
        run.summary["tuned"] = tuned
    show_config(cfg)
    L.seed_everything(cfg.seed, workers=True)

    datamodule = build(cfg.data, "data")
    # a checkpoint's weights replace a pretrained net's: those are not downloaded (offline)
    with weights_from_checkpoint() if cfg.get("ckpt_path") else contextlib.nullcontext():
        model = build_model(cfg.model, datamodule)
    checkpoint = None
    if cfg.get("ckpt_path"):  # one clear line for a missing, corrupt or foreign checkpoint
        checkpoint = continued or load_checkpoint(cfg.ckpt_path)
        check_resumable(checkpoint, cfg)
        if cfg.get("train") and hasattr(model, "continues"):  # (its optimizer: as it was)
            model.continues(checkpoint)
        if cfg.get("train") and hasattr(datamodule, "continues"):  # (Lightning's key for it)
            datamodule.continues(checkpoint.get(type(datamodule).__qualname__) or {})
        run.summary["resumed_from"] = str(cfg.ckpt_path)
        if cfg.get("train") and rank_zero_only.rank == 0:  # (in train.log: walkthrough 168)
            log.info(
                "continuing from %s, written in epoch %d at global step %s",
                cfg.ckpt_path,
                int(checkpoint.get("epoch") or 0) + 1,
                checkpoint.get("global_step"),
            )
        if cfg.get("train") and continued is None:  # (a requeued job's: continue_in_place's)
            say_another_precision(checkpoint, cfg)
    # The resolved config travels in every checkpoint and goes to every logger as hparams.
    model.save_hyperparameters(resolved_config(cfg))
    trainer = build_trainer(cfg, model, tuned)
    if checkpoint is not None:
        check_processes(checkpoint, trainer.world_size, cfg)
        give_checkpoint_state(trainer.callbacks, checkpoint)
    del checkpoint, continued  # Lightning reads the file again (its weights onto the device)
    run.summary["world_size"] = trainer.world_size

    ended: BaseException | None = None  # what ended the run early, if anything did
    recorded = False  # the fit's checkpoints in the summary
    try:
        with ranks_run_this_job(cfg, trainer):
            if cfg.get("train"):
                # the folder's marks and resume overrides change with its first checkpoint
                # first: its on_fit_end holds a SIGTERM before the other callbacks' run
                trainer.callbacks.insert(0, FitMilestones(run))
                trainer.callbacks.append(CoarseAccuracy(cfg.objective.metric))
                if cfg.get("test") and hasattr(datamodule, "refuse_a_test_split_too_small"):
                    datamodule.refuse_a_test_split_too_small(trainer.world_size)
                with (
                    run.phase("fit"),
                    out_of_memory_explained(cfg.data.batch_size, trainer),
                    unused_parameters_explained(cfg.trainer.get("strategy")),
                ):
                    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
                record_stage(trainer, datamodule, run, "val")
                say_a_loss_far_above_chance(trainer, run)
                record_checkpoints(trainer, run, cfg.objective.metric)
                recorded = True
                say_the_time_cut_the_schedule(trainer, cfg)
                say_early_stopping_ended_it(trainer, run)
                restore_spawned_progress(trainer, run)
                run.mark_trained()
                if cfg.get("test"):  # a signal that came as the fit ended stops the run here
                    stop_for_a_signal_left(trainer)
                run.stop_if_asked()  # a SIGTERM held since the fit's end stops the run now
            if cfg.get("test"):
                # The best checkpoint of this fit (none kept: the last); without a fit, the
                # checkpoint given (none: the untrained model, e.g. a GAN's untrained FID)
                tested = cfg.ckpt_path
                if cfg.get("train"):
                    tested = run.summary.get("best_checkpoint") or run.summary.get(
                        "last_checkpoint"
                    )
                if cfg.get("train") and wraps_in_place(trainer):
                    if tested is None:  # no checkpoint kept: the trained weights, for the test
                        tested = trainer.strategy.broadcast(  # rank 0's run folder
                            os.path.join(cfg.paths.output_dir, "checkpoints", "tested.ckpt")
                        )
                        trainer.save_checkpoint(tested)
                    with weights_from_checkpoint():  # wrapped afresh for the test
                        model = build_model(cfg.model, datamodule)
                    model.save_hyperparameters(resolved_config(cfg))
                run.summary["tested_checkpoint"] = tested
                if not cfg.get("train"):  # a run tested again (its fit record taken, a
                    restore_fit_progress(trainer, run)  # stop in its test): where its fit ended
                trainer.callbacks.append(HoldStopAfterTest(run))
                with run.phase("test"):
                    trainer.test(model, datamodule=datamodule, ckpt_path=tested, weights_only=True)
                run.summary["tested_checkpoint_step"] = checkpoint_step(tested)
                record_stage(trainer, datamodule, run, "test")
        # before the loggers close: a NaN or missing objective fails the W&B run too
        # (a sweep of test-only jobs, train=false, validates nothing: no objective to require)
        objective_value(cfg, run, required=in_sweep() and bool(cfg.get("train")))
        run.say_results()
    except BaseException as e:
        ended = e
        raise
    finally:
        if ended is not None and not run.summary["metrics"]:  # stopped or failed in the fit:
            with contextlib.suppress(Exception):  # (a device in error: its values unreadable)
                run.record_metrics(trainer.callback_metrics)  # the values it logged last
        if ended is not None and cfg.get("train") and not recorded:  # its best.ckpt so far too
            with contextlib.suppress(Exception):  # (walkthrough 157: last_checkpoint alone)
                record_checkpoints(trainer, run, cfg.objective.metric)
        record_performance(trainer, datamodule, run)
        status, _ = ended_as(ended, run.dir)
        finish_loggers(trainer.loggers, ended, run_facts(run, status))
        if isinstance(ended, SIGTERMException):  # checkpoint saved, loggers closed: a cluster
            hand_over_preemption(trainer)  # scheduler may requeue now
    return run.summary["metrics"]


# A classifier's evaluation loss this many times a guess's (ln of the classes) or more: its
# predictions are confidently wrong, diverged without a NaN (an overfit model's stays within a
# few times the guess's)
FAR_ABOVE_CHANCE = 10


def say_a_loss_far_above_chance(trainer: L.Trainer, run: Run) -> None:
    """A classifier whose last val/loss is FAR_ABOVE_CHANCE times a uniform guess's or more:
    diverged, though finite, so the divergence guard (NaN, infinity) let it finish "completed"
    (walkthrough 157: val/loss 7.2e5 on 3 classes, test/acc at chance, not a word)."""
    classes = getattr(trainer.lightning_module, "num_classes", None)
    loss = run.summary["metrics"].get("val/loss")
    if not isinstance(classes, int) or classes < 2 or loss is None or not trainer.is_global_zero:
        return
    guess = math.log(classes)
    if loss >= FAR_ABOVE_CHANCE * guess:
        # in summary.json too: the report and a sweep's summary showed a completed run, the
        # warning in its log alone (walkthrough 163)
        run.summary["loss_far_above_chance"] = round(loss / guess, 1)
        log.warning(
            "val/loss %.4g is %.0f times a uniform guess's (ln %d = %.3g): the model's "
            "predictions are confidently wrong, diverged without a NaN (or overfit to "
            "certainty); lower model.optimizer.lr (a rate for a larger batch, data.batch_size "
            "x processes?) or clip gradients (trainer.gradient_clip_val)",
            loss,
            loss / guess,
            classes,
            guess,
        )


def say_the_time_cut_the_schedule(trainer: L.Trainer, cfg: DictConfig) -> None:
    """trainer.max_time ended the fit before its LR schedule's end: a schedule is sized by the
    run's epochs or steps, so the weights validated and tested were trained at a learning rate
    not yet annealed (a one-cycle near its peak; found by review). Said once, where it ran."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    left = timer.time_remaining() if timer is not None else None
    if left is None or left > 0 or not trainer.is_global_zero:
        return
    if unfinished := schedules_left_unfinished(trainer):
        log.warning(
            "trainer.max_time=%s ended the fit before its LR schedule's end (%s, as "
            "trainer.max_epochs/max_steps size it): the weights validated and tested trained "
            "at a learning rate not annealed; size the run to the time with trainer.max_epochs "
            "or trainer.max_steps instead",
            cfg.trainer.get("max_time"),
            "; ".join(unfinished),
        )


def say_early_stopping_ended_it(trainer: L.Trainer, run: Run) -> None:
    """Early stopping ended the fit before trainer.max_epochs: said, with why (Lightning's
    reason) and the LR schedule it left unfinished, and recorded (summary.json
    ``early_stopped``) (walkthrough 160: a run stopped at epoch 7 of 40, before its one-cycle
    warm-up's peak, read as a normal finish). A fit in spawned processes (ddp_spawn): from its
    last checkpoint, which the spawned callback wrote its state into (review 161)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    stopper = trainer.early_stopping_callback
    if stopper is None:
        return
    state = stopper.state_dict()
    last = run.summary.get("last_checkpoint")
    if isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher) and last:
        state = next(iter(early_stopping_states(load_checkpoint(last))), state)
    epoch, planned = state.get("stopped_epoch", 0) + 1, trainer.max_epochs
    if not state.get("stopping_reason") or (planned is not None and 0 <= planned <= epoch):
        return  # not stopped, or stopped at the end it had anyway
    reason = str(state.get("stopping_reason_message") or "").strip().removesuffix(".")
    run.summary["early_stopped"] = {"epoch": epoch, "max_epochs": planned, "why": reason}
    if trainer.is_global_zero:
        unfinished = schedules_left_unfinished(trainer)
        log.warning(
            "early stopping ended the fit after epoch %d of trainer.max_epochs=%s (%s)%s; to "
            "train further: %s (it waits callbacks.early_stopping.patience validations again)",
            epoch,
            planned,
            reason.removesuffix(". Signaling Trainer to stop") or stopper.monitor,
            f"; the LR schedule left unfinished ({'; '.join(unfinished)}), its rate not annealed"
            if unfinished
            else "",
            as_launched(f"python train.py resume={run.dir}"),
        )


# Fewer validation images than this: an accuracy objective moves in steps of 0.2% or more.
COARSE_ACCURACY_IMAGES = 500


class CoarseAccuracy(L.Callback):
    """Says, once the splits are set up, where the objective is an accuracy on so few
    validation images that epochs and sweep jobs tie (digits' 144 reached 1.0 within a few
    epochs: data=digits chooses val/loss; a user's small folder may do the same): the best
    checkpoint is then the first epoch of a tie, and a sweep cannot rank its jobs."""

    def __init__(self, metric: str) -> None:
        self.metric = metric

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Also: a classifier's objective its validation does not log (a typo, val/los) is
        refused after the sanity check's batches, not by Lightning's checkpoint after a whole
        epoch in a traceback (a GAN's val/fid is measured at an epoch's end only: not here).
        litlab's own classifier is refused before (config.check_objective); this serves a
        module of one's own built on it, which may log more."""
        from litlab.models import ImageClassifier

        logged = sorted(k for k in trainer.callback_metrics if k.startswith("val/"))
        # (litlab's classifier: its val/acc_best comes after the sanity check; a module of
        # one's own may log others so too)
        if not isinstance(pl_module, ImageClassifier) or self.metric.endswith("_best"):
            return
        if logged and self.metric.startswith("val/") and self.metric not in logged:
            raise objective_not_logged(self.metric, logged)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if not self.metric.startswith("val/acc") or not hasattr(datamodule, "split_size"):
            return
        images = datamodule.split_size("val")
        # trainer.limit_val_batches: the objective measures those batches' images alone
        limit, batch = trainer.limit_val_batches, getattr(datamodule, "eval_batch_size", None)
        if isinstance(limit, int) and batch:
            images = min(images, limit * batch * trainer.world_size)
        elif isinstance(limit, float) and limit < 1:
            images = int(images * limit)
        if trainer.is_global_zero and 0 < images < COARSE_ACCURACY_IMAGES:
            log.warning(
                "the objective %s on %d validation images moves in steps of %.2g%%: epochs and "
                "sweep jobs tie, and the best checkpoint is the first epoch of a tie; "
                "objective=loss ranks by val/loss instead (or %s)",
                self.metric,
                images,
                100 / images,
                getattr(datamodule, "more_validation", "raise data.val_fraction"),
            )


def run_facts(run: Run, status: str) -> dict[str, Any]:
    """summary.json's verdict on the run, for the loggers' run summaries (W&B's table and
    parallel-coordinates views read them; a metric's own entry there is its last value, not
    the objective's best)."""
    keys = (
        "objective",
        "best_score",
        "best_checkpoint",
        "last_checkpoint",
        "tested_checkpoint",
        "tested_checkpoint_step",
    )
    facts = {key: run.summary[key] for key in keys if key in run.summary}
    return {**facts, "status": status, "config_digest": run.config_digest()}


def check(cfg: DictConfig, run: Run) -> None:
    """Everything that can be refused before anything starts, in one line each; and
    trainer.precision=auto resolved for this machine."""
    check_top_level(cfg, "train")
    check_something_to_train(cfg)
    say_one_cpu_process(cfg)
    run.summary["precision"] = resolve_precision(cfg.trainer)
    check_all(cfg)
    check_ema(cfg)
    check_pretrained_normalization(cfg)
    if check_hardware(cfg.trainer) and cfg.trainer.get("sync_batchnorm"):
        # trainer=ddp turns it on for GPUs; torch's SyncBatchNorm has no CPU implementation
        log.info(
            "trainer.sync_batchnorm=false: SyncBatchNorm needs CUDA GPUs; each CPU process "
            "keeps its own BatchNorm statistics"
        )
        cfg.trainer.sync_batchnorm = False
    check_eval_only_data(cfg)
    check_forked_wandb(cfg)
    check_objective(cfg)
    check_plateau_mode(cfg)
    check_augmentation(cfg)
    check_precision(cfg)
    check_device_stats(cfg)
    limits = evaluation_limits(cfg)
    if limits:
        run.summary["evaluation_limits"] = limits


def say_one_cpu_process(cfg: DictConfig) -> None:
    """trainer=ddp (or fsdp) with accelerator=cpu and devices=auto: Lightning's auto is one
    process on a CPU, and the run trained in one, silently (walkthrough 132)."""
    trainer = cfg.trainer
    strategy = str(trainer.get("strategy"))
    spread = strategy.startswith(("ddp", "fsdp"))
    if spread and trainer.get("devices") == "auto" and not on_gpu(str(trainer.get("accelerator"))):
        log.warning(
            "trainer.strategy=%s on the CPU with trainer.devices=auto trains in one process "
            "(Lightning's auto on a CPU); give the number of processes, e.g. trainer.devices=2",
            strategy,
        )


def check_something_to_train(cfg: DictConfig) -> None:
    """trainer.max_epochs=0 trained nothing (whatever max_steps says: Lightning stops at the
    first of the two) and tested the initial weights, and the run read "completed"."""
    if cfg.get("train") and cfg.trainer.get("max_epochs") == 0:
        raise ConfigError(
            "trainer.max_epochs=0 trains nothing; set it to 1 or more (to test a trained "
            "checkpoint: python eval.py ckpt_path=<checkpoint>)"
        )


# An image folder's settings that eval.py gives another folder it tests; a run trains on its
# class folders and splits, and would leave checks out (every class's training images).
EVAL_ONLY_SOURCE = ("classes", "test_all")


def check_eval_only_data(cfg: DictConfig) -> None:
    """Refuse eval.py's settings of a source (EVAL_ONLY_SOURCE) in a training run."""
    source = OmegaConf.select(cfg, "data.source") or {}
    given = [key for key in EVAL_ONLY_SOURCE if source.get(key) not in (None, False)]
    if given:
        raise ConfigError(
            f"data.source.{given[0]} is for eval.py (testing another folder); a training run "
            "learns from its class folders and splits as they are: remove it"
        )


def evaluation_limits(cfg: DictConfig, splits: Sequence[str] = ("val", "test")) -> dict[str, Any]:
    """trainer.limit_val_batches / limit_test_batches that evaluate part of a split (a fraction
    or a number of batches; 0, off, is not part): what they are, for summary.json, and one
    warning. val/* (the objective) and test/* then measure those batches only, while
    summary.json's data.splits counts the whole splits. eval.py: the test split only."""
    limits = {}
    for split in splits:
        limit = cfg.trainer.get(f"limit_{split}_batches")
        if part_of_a_split(limit):
            limits[split] = limit
    if limits:
        log.warning(
            "%s: %s measure only these batches of their splits",
            ", ".join(f"trainer.limit_{split}_batches={limit}" for split, limit in limits.items()),
            " and ".join(
                f"{split}/*" + (" (the objective too)" if split == "val" else "")
                for split in limits
            ),
        )
    return limits


def settle_evaluation_limit(trainer: L.Trainer, run: Run, split: str) -> None:
    """Once the split was evaluated: a limit_{split}_batches that covered all of its batches
    (a number at or above them; this process's share under DDP) measured the whole split, and
    is no longer recorded as a part (the report would tag its values as measured on a sample
    and rank them apart from the same run without the limit)."""
    limits = run.summary.get("evaluation_limits") or {}
    loaders = trainer.val_dataloaders if split == "val" else trainer.test_dataloaders
    measured = trainer.num_val_batches if split == "val" else trainer.num_test_batches
    if split not in limits or loaders is None or not measured:
        return
    try:
        whole = len(loaders)
    except TypeError:  # a stream without a length: its part stays recorded
        return
    if measured[0] >= whole:
        log.info(
            "trainer.limit_%s_batches=%s covered every batch of the %s split (%d): %s/* "
            "measured all of it",
            split,
            limits[split],
            split,
            whole,
            split,
        )
        del limits[split]
        if not limits:
            del run.summary["evaluation_limits"]


def wraps_in_place(trainer: L.Trainer) -> bool:
    """Whether the fit's strategy wrapped the net's blocks inside the LightningModule itself:
    FSDP's units replace its blocks, and the test after the fit (Lightning wraps a module
    holding FSDP units no further) loaded the full checkpoint's tensors into those flat shards:
    "size mismatch for net.stem.0.weight", every multi-GPU FSDP run ended failed. The test then
    takes a model built afresh and a checkpoint (tested.ckpt where the run kept none: a fresh
    model alone would score initial weights)."""
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(trainer.strategy, FSDPStrategy)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    hparams = OmegaConf.to_container(cfg, resolve=True)
    hparams.pop("hydra", None)
    return absolute_data_paths(hparams)


def build_trainer(cfg: DictConfig, model: L.LightningModule, tuned: dict[str, Any]) -> L.Trainer:
    """Callbacks, loggers and the Trainer, with the strategy the model needs (cfg.trainer holds
    the devices and nodes an external launcher laid out: adopt_launcher_layout)."""
    check_manual_optimization(cfg, model)
    callbacks = [*build_list(cfg.get("callbacks"), "callbacks"), OnePrecision()]
    loggers = build_list(cfg.get("logger"), "logger")
    if not loggers and any(isinstance(c, LearningRateMonitor) for c in callbacks):
        # it has nowhere to log (Lightning refuses it without a logger)
        log.info("no logger: callbacks.lr_monitor is left out")
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    log_lr_plot(loggers, tuned)
    devices, num_nodes = cfg.trainer.devices, cfg.trainer.num_nodes
    accelerator = cfg.trainer.get("accelerator", "auto")
    strategy = strategy_for(model, cfg.trainer.strategy, devices, num_nodes, accelerator)
    extra = {"enable_progress_bar": False} if no_progress_bar(cfg) else {}
    trainer = build(
        cfg.trainer, "trainer", callbacks=callbacks, logger=loggers, strategy=strategy, **extra
    )
    check_submitit_local(trainer)
    compat.skip_batch_hooks_left_to_the_base_class(trainer)
    return compat.restart_finished_epochs_as_epoch_based(trainer)


def no_progress_bar(cfg: DictConfig) -> bool:
    """``callbacks.progress_bar=null`` (batch jobs, benchmarks) means no bar: without it,
    Lightning put its own in litlab's place, one that reads the metrics (a device sync) and
    redraws at every batch. ``callbacks=none`` keeps Lightning's defaults, its bar included;
    ``trainer.enable_progress_bar`` given decides."""
    callbacks = cfg.get("callbacks") or {}
    asked = "enable_progress_bar" in cfg.trainer
    return "progress_bar" in callbacks and callbacks.progress_bar is None and not asked


def record_checkpoints(trainer: L.Trainer, run: Run, metric: str) -> None:
    """Best/last checkpoint paths and best score, read right after fit (testing a checkpoint
    restores the checkpoint callback's state as it was when that file was written). The best
    is only the one kept by the objective's metric (none with callbacks.model_checkpoint=null:
    not the last checkpoint's callback, whose "best" is its newest file)."""
    if trainer.checkpoint_callback is None:
        return
    best = next((c for c in trainer.checkpoint_callbacks if c.monitor == metric), None)
    run.summary["best_checkpoint"] = (best.best_model_path or None) if best else None
    last = Path((best or trainer.checkpoint_callback).dirpath or "") / "last.ckpt"
    run.summary["last_checkpoint"] = str(last) if last.is_file() else None
    if best is not None and best.best_model_score is not None:
        run.summary["best_score"] = float(best.best_model_score)
    elif best is not None and best.best_model_path:  # fit in spawned processes (ddp_spawn)
        run.summary["best_score"] = saved_best_score(best)


def restore_spawned_progress(trainer: L.Trainer, run: Run) -> None:
    """A fit in spawned processes (trainer.strategy=ddp_spawn): Lightning's launcher brings
    back the weights and metrics but not the loops' counters, so the test after it logged at
    step 0, epoch 0 (the CSV's test row, W&B's summary epoch). They are restored from the
    fit's last checkpoint (last.ckpt, written at every epoch's end)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    if isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher):
        restore_fit_progress(trainer, run)


def restore_fit_progress(trainer: L.Trainer, run: Run) -> None:
    """The loops' counters of the run's fit, from its last checkpoint, into a trainer that did
    not run it (a spawned fit; a run tested again after a stop while testing, whose test row
    read epoch 0, step 0: walkthrough 135), so that its test is logged where the fit ended."""
    last = run.summary.get("last_checkpoint")
    if not last or compat.logging_step(trainer):
        return
    state = load_checkpoint(last).get("loops", {}).get("fit_loop")
    if state:
        trainer.fit_loop.load_state_dict(state)
        # written at an epoch's end, before the loop counted it completed (as the fit did next)
        progress = trainer.fit_loop.epoch_progress
        progress.current.completed = progress.current.processed
        progress.total.completed = progress.total.processed


def saved_best_score(callback: Any) -> float | None:
    """The best score that a ModelCheckpoint's best file holds in its own state. Lightning's
    spawn launcher (trainer.strategy=ddp_spawn) brings the best file's path back to the main
    process but not its score: the objective then fell back to the last validation's value
    (epochs 0.29 then 0.08: the objective 0.08, best.ckpt the 0.29 epoch's)."""
    state = load_checkpoint(callback.best_model_path).get("callbacks", {}).get(callback.state_key)
    score = (state or {}).get("best_model_score")
    return None if score is None else float(score)


def record_stage(
    trainer: L.Trainer, datamodule: L.LightningDataModule, run: Run, split: str
) -> None:
    """After a fit (``split`` "val", what it validated) or a test that ended, on every rank:
    every rank's unreadable files (read as they go) into each rank's count for summary.json (a
    collective), the evaluation limit settled, and the final logged values recorded."""
    if hasattr(datamodule, "gather_unreadable"):
        datamodule.gather_unreadable()
    settle_evaluation_limit(trainer, run, split)
    run.record_metrics(trainer.callback_metrics)
    if split == "test":
        record_per_class(trainer, datamodule, run)


def record_per_class(trainer: L.Trainer, datamodule: L.LightningDataModule, run: Run) -> None:
    """A classifier's test, class by class, into summary.json (``test_per_class``: images,
    accuracy, how often predicted), by the data's class names; classes of the test that the
    model never predicted are said (walkthrough 157: test/acc 0.976 with one class never
    predicted, not a word)."""
    counts = getattr(trainer.lightning_module, "test_per_class", None)
    if not counts:
        return
    images, correct, predicted = (counts[k].tolist() for k in ("images", "correct", "predicted"))
    names = getattr(datamodule, "class_names", None)
    if not names or len(names) != len(images):
        names = [str(label) for label in range(len(images))]
    run.summary["test_per_class"] = {
        name: {"images": n, "accuracy": right / n if n else None, "predicted": guessed}
        for name, n, right, guessed in zip(names, images, correct, predicted, strict=True)
    }
    classes = run.summary["test_per_class"].items()
    never = [f"{name} ({c['images']})" for name, c in classes if c["images"] and not c["predicted"]]
    if never and trainer.is_global_zero:
        log.warning(
            "the test never predicted class(es) %s (their test images in brackets): each of "
            "their images was counted wrong; test/acc_macro (the classes' accuracies averaged) "
            "and summary.json test_per_class show each class",
            ", ".join(never[:10]) + (f" and {len(never) - 10} more" if len(never) > 10 else ""),
        )


def record_performance(trainer: L.Trainer, datamodule: L.LightningDataModule, run: Run) -> None:
    """The throughput and memory monitors' run totals and what the data was (images, files
    skipped), also when training failed (out of memory). A fit or test in spawned processes
    (ddp_spawn): what their rank 0 measured and set up (Run.take_spawned_record)."""
    run.summary.update(performance_record(trainer, datamodule))
    run.summary.update(run.spawned_performance())


def performance_record(
    trainer: L.Trainer, datamodule: L.LightningDataModule | None = None
) -> dict[str, Any]:
    """The monitors' totals ("perf", "memory") and the data's account ("data") of this
    process's trainer."""
    found: dict[str, Any] = {}
    for callback in trainer.callbacks:
        if isinstance(callback, Throughput | PeakMemory):
            found.update(callback.summary())
    datamodule = datamodule if datamodule is not None else trainer.datamodule
    if hasattr(datamodule, "report"):
        found["data"] = datamodule.report()
    return found


def objective_value(cfg: DictConfig, run: Run, required: bool) -> None:
    """Record the number a sweeper optimizes: the best checkpoint's score; with no best
    checkpoint kept, the final value (of the last checkpoint, which the test then measures)."""
    metric = cfg.objective.metric
    value = run.summary.get("best_score")
    if value is None:
        value = run.summary["metrics"].get(metric)
    run.summary["objective"] = {"metric": metric, "mode": cfg.objective.mode, "value": value}
    # NaN: the best score, or a final value (summary.json holds a logged NaN as null)
    nan = value is None and metric in run.summary["metrics"]
    if nan or (value is not None and math.isnan(value)):
        raise TrainingDiverged(f"the objective {metric} is NaN: training diverged")
    if value is not None and math.isinf(value):  # Lightning ranks a NaN score as the worst, ±inf
        raise TrainingDiverged(
            f"the objective {metric} is infinite (NaN or infinite at every validation): "
            "training diverged"
        )
    if value is None:
        message = f"the objective {metric} was never logged; check objective.metric"
        split = metric.split("/", 1)[0]
        if not any(name.startswith(f"{split}/") for name in run.summary["metrics"]):
            message = (  # (a recipe's check_val_every_n_epoch above a shortened max_epochs)
                f"the objective {metric} was never logged: no {split} step ran (see "
                "trainer.check_val_every_n_epoch, trainer.max_epochs and limit_val_batches)"
            )
        if required:
            raise ConfigError(message)
        # with train=false nothing validates: no objective is expected; said once, not by each rank
        if cfg.get("train") and rank_zero_only.rank == 0:
            log.warning(message)


def train_task(cfg: DictConfig) -> float | None:
    """Everything `python train.py` does once Hydra has composed the config.

    Returns the objective for sweepers; in a sweep a failed job is recorded and returns None.
    """
    sweep = in_sweep()
    with Run(cfg, "train", keep_going=sweep) as run:
        train(cfg, run)
    return run.objective


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    return train_task(cfg)


def main() -> None:
    """`python train.py ...`: Hydra's command line, plus `resume=<run folder>`."""
    freeze_the_imports()
    check_argv()
    sys.argv = resume_argv(sys.argv)
    hydra_main()


def check_argv() -> None:
    """The scripts' command line checked before Hydra starts (check_command_line): a refusal
    is one line and exit status 2."""
    try:
        check_command_line(sys.argv)
    except ConfigError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
