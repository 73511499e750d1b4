"""litlab.compat: each touch of a framework's private parts still works with the versions here.

An upgrade of Lightning, torch, OmegaConf or W&B that changes one of them fails a test in this
file, named after what litlab needs, instead of a user's run.
"""

from __future__ import annotations

import csv
import os
import pickle
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import bare_trainer
from litlab import compat


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny_fit(callbacks: list, max_epochs: int = 1) -> L.Trainer:
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    trainer = bare_trainer(max_epochs=max_epochs, callbacks=callbacks)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    return trainer


def test_stop_at_batch_end_raises_lightnings_sigterm_exception_after_that_batch():
    class StopAt(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 2:
                compat.stop_at_batch_end(trainer)

    seen = []

    class Record(L.Callback):
        def on_exception(self, trainer, pl_module, exception):
            seen.append(
                (type(exception), trainer.fit_loop.epoch_loop.batch_progress.total.completed)
            )

    with pytest.raises(SIGTERMException):
        tiny_fit([StopAt(), Record()])
    assert seen == [(SIGTERMException, 3)]  # the batch finished, its bookkeeping done


def test_rank_watchers_with_grace_replace_lightnings_observer_for_the_block():
    import lightning.pytorch.strategies.launchers.subprocess_script as launcher
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    original = launcher._launch_process_observer
    assert callable(original)
    for method in ("_run", "_terminate_all"):
        assert callable(getattr(_ChildProcessObserver, method))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with compat.rank_watchers_with_grace(grace_s=0.01) as started:
            assert launcher._launch_process_observer is not original
            launcher._launch_process_observer([child])  # as Lightning's launcher calls it
            (observer,) = started
            assert observer._run() is False  # a rank still runs: keep watching
        assert launcher._launch_process_observer is original
        assert observer._run() is True  # the job is over: the watch ends, nothing is killed
    finally:
        child.kill()


def test_flat_hyperparameters_as_lightnings_loggers_make_them():
    flat = compat.flat_hyperparameters({"model": {"optimizer": {"lr": 0.1}}, "seed": 3})
    assert flat == {"model.optimizer.lr": 0.1, "seed": 3}


def test_the_csv_logger_appends_to_an_existing_history(tmp_path):
    logger_class = compat.AppendingCSVLogger
    assert pickle.loads(pickle.dumps(logger_class(tmp_path))).root_dir  # ddp_spawn pickles it
    first = logger_class(tmp_path, name="csv", version="")
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    again = logger_class(tmp_path, name="csv", version="")
    again.log_metrics({"loss": 0.5}, step=1)
    again.save()
    with open(tmp_path / "csv" / "metrics.csv") as f:
        assert [row["loss"] for row in csv.DictReader(f)] == ["1.0", "0.5"]


def test_logging_step_is_the_step_lightning_stamps_a_batchs_metrics_with(tmp_path):
    """compat.logging_step, read inside a step (SampleGrid's images, a resume's CSV cut), is the
    step of the row that step's metrics land in; then forget_from(k) leaves the rows before k."""

    class LogsItsStep(Tiny):
        def training_step(self, batch, batch_idx):
            self.log("seen", float(compat.logging_step(self.trainer)))
            return super().training_step(batch, batch_idx)

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    logger = compat.AppendingCSVLogger(tmp_path, name="csv", version="")
    trainer = bare_trainer(max_epochs=2, logger=logger, log_every_n_steps=1)
    trainer.fit(LogsItsStep(), DataLoader(data, batch_size=4))

    def rows() -> list[dict[str, str]]:
        with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))

    assert [float(r["seen"]) for r in rows()] == [float(r["step"]) for r in rows()]
    assert [int(r["step"]) for r in rows()] == list(range(16))
    # the test after the fit, logged at its last step: resumed from that step (a finished run
    # trained further) it stays (it was dropped, "logged again": untrue); resumed from an
    # older checkpoint it goes, as that fit tests at that step again
    logger.log_metrics({"test/acc": 0.5, "mem/rss_gb": 1.0}, step=15)
    logger.save()
    assert logger.forget_from(15) == 1  # the fit's own row at 15 (its last)
    assert [int(r["step"]) for r in rows()] == [*range(15), 15]
    assert rows()[-1]["test/acc"] == "0.5"
    assert logger.forget_from(10) == 6
    assert [int(r["step"]) for r in rows()] == list(range(10))


def test_wandb_init_arguments_and_start_are_readable_without_starting_a_run(tmp_path):
    from litlab.loggers import wandb_logger

    logger = wandb_logger(str(tmp_path), mode="offline")
    arguments = compat.wandb_init_arguments(logger)
    assert arguments["mode"] == "offline" and "anonymous" not in arguments
    assert not compat.wandb_started(logger)
    logger.experiment  # noqa: B018 - starts the run
    assert compat.wandb_started(logger)
    logger.experiment.finish()


def test_config_nodes_without_resolving():
    cfg = OmegaConf.create({"a": "${missing}", "b": None, "c": {"d": 1}})
    node = compat.config_node(cfg, "a")
    assert node._value() == "${missing}"  # read, not resolved (resolving would fail)
    assert compat.is_none_node(compat.config_node(cfg, "b"))
    assert not compat.is_none_node(compat.config_node(cfg, "c"))


def test_one_cycle_phases_hold_their_end_steps():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=100)
    phases = compat.one_cycle_phases(schedule)
    assert [phase["end_step"] for phase in phases] == [29.0, 99]  # pct_start 0.3


def test_torchs_cpu_bf16_probe_answers():
    assert isinstance(compat.cpu_probe_bf16(), bool)


def test_ema_update_is_the_weighted_average_without_a_host_sync():
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = []

    class CountHostReads(TorchDispatchMode):  # what .item() runs: on a GPU, a wait
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append(func)
            return func(*args, **(kwargs or {}))

    ema, current = [torch.ones(3), torch.zeros(2)], [torch.zeros(3), torch.ones(2)]
    with CountHostReads():  # (review 166: _foreach_lerp_ read a tensor weight back)
        compat.ema_update(ema, current, torch.tensor(0.75))
    assert reads == []
    assert torch.allclose(ema[0], torch.full((3,), 0.75))
    assert torch.allclose(ema[1], torch.full((2,), 0.25))
    # 16-bit weights into a float32 average (callbacks=ema under bf16-true: review 166)
    compat.ema_update(ema, [t.bfloat16() for t in current], torch.tensor(0.75))
    assert ema[0].dtype == torch.float32 and torch.allclose(ema[0], torch.full((3,), 0.5625))
    # a tensor equal to its average stays so to the bit (frozen weights under callbacks=ema)
    kept = torch.randn(1000)
    average = [kept.clone()]
    compat.ema_update(average, [kept], torch.tensor(0.999))
    assert torch.equal(average[0], kept)


class PositionLoader:
    """Batches with a position that Lightning saves in checkpoints and gives back on resume."""

    def __init__(self) -> None:
        self.position, self.loaded = 0, []

    def __len__(self) -> int:
        return 8

    def __iter__(self):
        for i in range(self.position, len(self)):
            self.position = i + 1
            yield torch.randn(4, 4), torch.randint(0, 2, (4,))
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append(state)
        self.position = state["position"]


def test_stepping_batches_leave_the_checkpoints_loader_state_to_the_resumed_fit(tmp_path):
    class StepScheduled(Tiny):
        def configure_optimizers(self):
            self.steps = compat.stepping_batches(self.trainer)
            return super().configure_optimizers()

    class StopAndSave(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 2:
                compat.stop_at_batch_end(trainer)

        def on_exception(self, trainer, pl_module, exception):
            trainer.save_checkpoint(tmp_path / "mid.ckpt")

    model = StepScheduled()
    with pytest.raises(SIGTERMException):
        bare_trainer(max_epochs=2, callbacks=[StopAndSave()]).fit(model, PositionLoader())
    assert model.steps == 16
    resumed, loader = StepScheduled(), PositionLoader()
    bare_trainer(max_epochs=2).fit(resumed, loader, ckpt_path=tmp_path / "mid.ckpt")
    assert resumed.steps == 16
    assert loader.loaded == [{"position": 3}]  # the rest of the epoch, not all of it again


def test_stepping_batches_leave_the_global_random_state_as_it_was():
    """Counting the steps makes Lightning iterate a shuffled torch DataLoader, which draws a
    seed from the global generator; asked after a resumed run restored it, that draw would
    shift the run's data order, augmentation and dropout."""
    states = []

    class StepScheduled(Tiny):
        def configure_optimizers(self):
            before = torch.get_rng_state()
            self.steps = compat.stepping_batches(self.trainer)
            states.append((before, torch.get_rng_state()))
            return super().configure_optimizers()

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    model = StepScheduled()
    bare_trainer(max_epochs=1).fit(model, DataLoader(data, batch_size=4, shuffle=True))
    ((before, after),) = states
    assert model.steps == 8 and torch.equal(before, after)


def test_cheap_hook_name_is_what_lightning_sets_reads_and_logs_by():
    class Cheap(compat.CheapHookName, Tiny):
        def training_step(self, batch, batch_idx):
            assert self._current_fx_name == "training_step"  # Lightning's, for self.log's checks
            loss = super().training_step(batch, batch_idx)
            self.log("train/loss", loss, on_step=False, on_epoch=True)
            return loss

    seen = set()

    class Look(L.Callback):
        def on_before_backward(self, trainer, pl_module, loss):
            seen.add(pl_module._current_fx_name)

    model = Cheap()
    trainer = bare_trainer(max_epochs=1, callbacks=[Look()])
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(16, 4), torch.zeros(16).long())))
    assert seen == {"on_before_backward"}
    assert "_current_fx_name" in model.__dict__  # where nn.Module.__setattr__ keeps a string
    assert "train/loss" in trainer.callback_metrics  # logging, which checks the name, works
    model.extra = nn.Parameter(torch.zeros(1))  # anything else goes through nn.Module's checks
    assert "extra" in dict(model.named_parameters())


def test_model_checkpoint_state_key_is_lightnings_and_follows_its_settings(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint as Lightnings

    from litlab.callbacks import ModelCheckpoint

    for kwargs in (
        dict(monitor="val/acc", mode="max"),
        dict(every_n_train_steps=1000),
        dict(every_n_epochs=1, save_on_train_epoch_end=True),
    ):
        assert ModelCheckpoint(**kwargs).state_key == Lightnings(**kwargs).state_key
    ours = ModelCheckpoint(monitor="val/acc", mode="max")
    assert ours.state_key is ours.state_key  # kept, not made again (Lightning: a new string)
    ours.monitor = "val/loss"
    assert ours.state_key == Lightnings(monitor="val/loss", mode="max").state_key
    # A checkpoint names the callback's state by that key: Lightning's class resumes it.
    trainer = bare_trainer(
        max_epochs=1,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(tmp_path, "last", every_n_epochs=1)],
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(8, 4), torch.zeros(8).long())))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]
    assert list(saved) == [Lightnings(tmp_path, "last", every_n_epochs=1).state_key]


@pytest.mark.parametrize("validation", [True, False])
def test_a_finished_epoch_is_not_restarted_when_max_steps_is_set(tmp_path, validation):
    """A checkpoint written at an epoch's end (with or without validation in that epoch), resumed
    with max_steps set: every later epoch trains all its batches (Lightning alone: none, or one)."""

    class Validated(Tiny):
        def validation_step(self, batch, batch_idx):
            return self.training_step(batch, batch_idx)

    class EpochStarts(L.Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_train_epoch_start(self, trainer, pl_module):
            self.steps.append(trainer.global_step)

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loaders = [DataLoader(data, batch_size=8)] * (2 if validation else 1)
    model = Validated() if validation else Tiny()
    first = bare_trainer(max_epochs=2, max_steps=100)
    first.fit(model, *loaders)
    first.save_checkpoint(tmp_path / "end.ckpt")
    starts = EpochStarts()
    resumed = compat.restart_finished_epochs_as_epoch_based(
        bare_trainer(max_epochs=4, max_steps=100, callbacks=[starts])
    )
    resumed.fit(model, *loaders, ckpt_path=tmp_path / "end.ckpt")
    assert starts.steps == [8, 12] and resumed.global_step == 16


def test_periodic_saves_of_a_module_stepping_two_optimizers(tmp_path):
    """every_n_train_steps (compat.every_n_train_steps) and ModelCheckpoint's own periodic save
    (compat.save_periodic_checkpoint), for a module whose global_step moves by two a batch."""
    from litlab.callbacks import ModelCheckpoint

    class TwoSteps(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            for opt, net in zip(self.optimizers(), (self.a, self.b), strict=True):
                loss = nn.functional.cross_entropy(net(batch[0]), batch[1])
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.a.parameters(), 0.1), torch.optim.SGD(
                self.b.parameters(), 0.1
            )

    class Saves(L.Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            self.steps.append(checkpoint["global_step"])

    every = ModelCheckpoint(dirpath=tmp_path, filename="step", every_n_train_steps=3)
    assert compat.every_n_train_steps(every) == 3
    saves = Saves()
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    trainer = bare_trainer(max_epochs=1, callbacks=[saves, every], enable_checkpointing=True)
    trainer.fit(TwoSteps(), DataLoader(data, batch_size=8))  # global_step 2, 4, .., 16
    assert saves.steps == [
        4,
        6,
        10,
        12,
    ]  # each multiple of 3 reached or passed (not the last batch)


def test_only_a_checkpoint_with_a_step_or_time_trigger_looks_at_batch_ends(tmp_path):
    """litlab's ModelCheckpoint returns at once from a batch's end unless it saves there
    (compat.saves_at_batch_ends); one with a train_time_interval still saves there."""
    from datetime import timedelta

    from litlab.callbacks import ModelCheckpoint

    assert not compat.saves_at_batch_ends(ModelCheckpoint(monitor="val/acc", mode="max"))
    assert not compat.saves_at_batch_ends(ModelCheckpoint(every_n_epochs=1))
    assert compat.saves_at_batch_ends(ModelCheckpoint(every_n_train_steps=5))
    timed = ModelCheckpoint(tmp_path, "{step}", train_time_interval=timedelta(0), save_top_k=-1)
    assert compat.saves_at_batch_ends(timed)
    data = TensorDataset(torch.randn(32, 4), torch.zeros(32).long())
    trainer = bare_trainer(max_epochs=1, callbacks=[timed], enable_checkpointing=True)
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    assert {p.name for p in tmp_path.glob("*.ckpt")} >= {"step=1.ckpt", "step=2.ckpt"}


@pytest.mark.parametrize("validated", [False, True])
@pytest.mark.parametrize("saved", ["epoch_end", "after_fit"])
@pytest.mark.parametrize("max_steps", [-1, 100])
def test_an_epoch_cut_short_by_max_steps_trains_its_other_batches_when_resumed(
    tmp_path, saved, max_steps, validated
):
    """Stopped by max_steps in the middle of an epoch (Lightning closes that epoch's counters as
    if it had ended), resumed without max_steps or with a larger one: the rest of that epoch
    trains first, then every later epoch up to max_epochs. Before: without max_steps the rest
    of the epoch was skipped; with a larger one it was trained as the next epoch, and the last
    epoch never ran. The checkpoint is last.ckpt written at the cut epoch's end, or one saved
    after the fit; it has trained one epoch to its end (resume.py refused max_epochs=2). With a
    validation after the cut batch (val_check_interval), the loggers' step count ends where an
    uninterrupted run's does (before: one ahead, every later row one step late)."""
    from litlab.callbacks import ModelCheckpoint

    class Batches(L.Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, int, int]] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.seen.append((trainer.current_epoch, batch_idx, trainer.global_step))

    class Validated(Tiny):
        def validation_step(self, batch, batch_idx):
            return None

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loaders = [DataLoader(data, batch_size=8)] * (2 if validated else 1)
    checks = dict(val_check_interval=0.5, num_sanity_val_steps=0) if validated else {}
    model = Validated() if validated else Tiny()
    last = ModelCheckpoint(tmp_path, save_last=True, save_top_k=0, save_on_train_epoch_end=True)
    first = bare_trainer(
        max_epochs=3, max_steps=6, enable_checkpointing=True, callbacks=[last], **checks
    )  # 4 batches an epoch: stops after batch 1 of epoch 1 (validated after it)
    first.fit(model, *loaders)
    if saved == "after_fit":
        first.save_checkpoint(tmp_path / "last.ckpt")
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert compat.epochs_trained(checkpoint) == 1  # epoch 0 only: max_epochs=2 trains on
    batches = Batches()
    resumed = compat.restart_finished_epochs_as_epoch_based(
        bare_trainer(max_epochs=3, max_steps=max_steps, callbacks=[batches], **checks)
    )
    resumed.fit(model, *loaders, ckpt_path=tmp_path / "last.ckpt")
    assert batches.seen[:3] == [(1, 2, 6), (1, 3, 7), (2, 0, 8)]
    assert len(batches.seen) == 6 and resumed.global_step == 12
    assert resumed.current_epoch == 3
    uninterrupted = bare_trainer(max_epochs=3, **checks)
    uninterrupted.fit(Validated() if validated else Tiny(), *loaders)
    steps = resumed.fit_loop.epoch_loop._batches_that_stepped
    assert steps == uninterrupted.fit_loop.epoch_loop._batches_that_stepped == 12


def test_steps_counted_as_in_a_checkpoint_written_at_a_validation_inside_the_epoch():
    """Lightning's checkpoint written at on_validation_end inside an epoch holds the loggers'
    step count from before that batch (it counts the batch when it resumes); the stop's
    checkpoint, written once the batch was counted, is given the same count."""

    class Validated(Tiny):
        def validation_step(self, batch, batch_idx):
            return None

    def steps(checkpoint: dict) -> int:
        return checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"]

    counts = {}

    class Save(L.Callback):
        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking and not counts:
                counts["validation"] = steps(trainer._checkpoint_connector.dump_checkpoint())
                compat.stop_at_batch_end(trainer)

        def on_exception(self, trainer, pl_module, exception):
            checkpoint = trainer._checkpoint_connector.dump_checkpoint()
            counts["stop"] = steps(checkpoint)
            compat.count_steps_as_saved_in_validation(checkpoint)
            counts["given"] = steps(checkpoint)

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    trainer = bare_trainer(max_epochs=1, callbacks=[Save()], val_check_interval=0.5)
    with pytest.raises(SIGTERMException):
        trainer.fit(Validated(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    assert counts == {"validation": 3, "stop": 4, "given": 3}  # validation after batch 3 of 8


def test_training_batches_counts_an_epoch_before_the_fit_built_its_loader():
    """Asked in configure_optimizers with max_epochs=-1 (where Lightning's own estimate does
    not build the loader): 6 batches an epoch; the fit then builds its loader and trains all
    of its max_steps from the first batch."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    seen = []

    class Counting(BoringModel):
        def configure_optimizers(self):
            seen.append(compat.training_batches(self.trainer))
            return super().configure_optimizers()

        def training_step(self, batch, batch_idx):
            seen.append(batch_idx)
            return super().training_step(batch[0], batch_idx)

    data = DataLoader(TensorDataset(torch.randn(24, 32)), batch_size=4)
    bare_trainer(max_epochs=-1, max_steps=8).fit(Counting(), data)
    assert seen == [6, 0, 1, 2, 3, 4, 5, 0, 1]


def test_a_litdata_profile_on_a_parallel_filesystem_keeps_its_in_place_reads_not_its_shuffle():
    pytest.importorskip("litdata")
    from types import SimpleNamespace

    from litdata.streaming.posix_fast import PosixFastProfile

    dataset = SimpleNamespace(posix_fast=PosixFastProfile(kind="lustre"))
    assert dataset.posix_fast.window_shuffle
    compat.shuffle_as_on_a_local_disk(dataset)
    assert not dataset.posix_fast.window_shuffle and dataset.posix_fast.in_place
    local = SimpleNamespace(posix_fast=None)  # a local disk or an object store: as it was
    compat.shuffle_as_on_a_local_disk(local)
    assert local.posix_fast is None


def test_cuda_is_checked_without_nvml_only_where_nvml_finds_no_gpu(monkeypatch):
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported; where NVML finds no GPU
    (or is not there) every optimizer step paid a failed NVML load for it. There it is undone,
    and torch.cuda.is_available() gives the same answer; where NVML counts GPUs it stays."""
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    available = torch.cuda.is_available()
    gpus = torch.cuda._device_count_nvml()
    undone = compat.cuda_checks_without_nvml_where_it_finds_no_gpu()
    assert undone == (gpus <= 0)
    assert ("PYTORCH_NVML_BASED_CUDA_CHECK" in os.environ) == (gpus > 0)
    assert torch.cuda.is_available() == available
    assert not compat.cuda_checks_without_nvml_where_it_finds_no_gpu()  # once is enough


class CountsBatchEnds(L.Callback):
    def __init__(self) -> None:
        self.batch_ends = 0

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.batch_ends += 1


class CountsEveryHook(L.Callback):
    """Records every batch hook Lightning calls on it, set as the instance's own attributes."""

    def __init__(self) -> None:
        self.called: list[str] = []
        for name in compat.BATCH_HOOKS:
            setattr(self, name, lambda *a, name=name, **k: self.called.append(name))


class Evaluates(Tiny):
    def validation_step(self, batch, batch_idx):
        return None

    def test_step(self, batch, batch_idx):
        return None

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])


def test_batch_hooks_left_to_the_base_class_are_skipped_and_the_others_called():
    """compat.skip_batch_hooks_left_to_the_base_class: Lightning's dispatch still skips a hook
    that is not callable, calls each hook a class overrides or an instance sets at every batch,
    and every name in BATCH_HOOKS is one it calls (a renamed hook fails here)."""
    counts, base, spy = CountsBatchEnds(), L.Callback(), CountsEveryHook()
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    trainer = bare_trainer(max_epochs=1, callbacks=[counts, base, spy])
    compat.skip_batch_hooks_left_to_the_base_class(trainer)
    assert all(getattr(base, name) is None for name in compat.BATCH_HOOKS)
    assert counts.on_train_batch_end.__func__ is CountsBatchEnds.on_train_batch_end
    assert counts.on_train_batch_start is None
    assert all(callable(getattr(spy, name)) for name in compat.BATCH_HOOKS)  # its own
    loader = DataLoader(data, batch_size=4)
    trainer.fit(Evaluates(), loader, loader)
    trainer.test(Evaluates(), loader, verbose=False)
    trainer.predict(Evaluates(), loader)
    assert counts.batch_ends == 8
    assert set(spy.called) == set(compat.BATCH_HOOKS)
    assert spy.called.count("on_before_backward") == 8


def test_ddp_wrapper_settings_are_what_the_strategy_was_given():
    from lightning.pytorch.strategies import DDPStrategy
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import litlab.distributed  # noqa: F401  (registers litlab's strategy names)

    plain = DDPStrategy(find_unused_parameters=True, bucket_cap_mb=5)
    assert compat.ddp_wrapper_settings(plain) == (
        {"find_unused_parameters": True, "bucket_cap_mb": 5},
        False,
    )
    hooked = DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)
    assert compat.ddp_wrapper_settings(hooked) == ({}, True)
    registered = bare_trainer(accelerator="cpu", devices=2, strategy="ddp_separate_nets").strategy
    assert compat.ddp_wrapper_settings(registered) == ({}, False)
