"""ddp_spawn's processes close their process group before their interpreter shuts down: a gloo
group left to the shutdown aborted them now and then after training ("terminate called without
an active exception", SIGABRT), which failed the fit (litlab.distributed.ClosingDDPStrategy);
and they end a run stopped by a signal as Lightning's own processes do (litlab.compat.
HandlingLauncher)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from conftest import bare_trainer
from litlab.callbacks.preemption import Preemption
from litlab.checkpoint import load_checkpoint
from litlab.distributed.strategy import STARTED_DDP, ClosingDDPStrategy

EXIT_RECORD: list[Path] = []  # where a spawned process writes what it had at exit


def record_exit() -> None:
    """Write whether this process still has a process group (an atexit handler)."""
    for path in EXIT_RECORD:
        path.write_text(json.dumps({"group": torch.distributed.is_initialized()}))


# Registered when a spawned process imports this module (unpickling the model), before the
# strategy registers its own at the fit's end: atexit runs the last registered first, so this
# one sees what the process has left when its interpreter shuts down
atexit.register(record_exit)


class Regression(L.LightningModule):
    """A linear fit that notes, in each spawned process, where to record its exit."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.layer = torch.nn.Linear(4, 1)

    def setup(self, stage: str) -> None:
        EXIT_RECORD.append(self.folder / f"rank{self.global_rank}.json")

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def test_lightnings_spawned_and_forked_ddp_names_keep_their_parameters():
    assert {"ddp_spawn", "ddp_fork_find_unused_parameters_true"} <= set(STARTED_DDP)
    for name, params in STARTED_DDP.items():
        strategy = bare_trainer(accelerator="cpu", devices=2, strategy=name).strategy
        assert type(strategy) is ClosingDDPStrategy, name
        assert strategy._start_method == params["start_method"] == name.split("_")[1], name
        found = strategy._ddp_kwargs.get("find_unused_parameters")
        assert found == params.get("find_unused_parameters"), name


@pytest.mark.dist
@pytest.mark.slow
def test_spawned_processes_close_their_group_after_sending_back_the_results(tmp_path):
    model = Regression(str(tmp_path))
    before = model.layer.weight.detach().clone()
    trainer = bare_trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2)
    trainer.fit(model)
    # rank 0's results came back: the trained weights, the state, the logged metrics
    assert trainer.state.finished and "train/loss" in trainer.callback_metrics
    assert not torch.equal(model.layer.weight, before)
    exits = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert exits == [{"group": False}] * 2  # Lightning's DDPStrategy: still there, True


class SignalOnce(L.Callback):
    """SIGTERM to global rank 0's own process at a training batch (``kill <pid>``, a scheduler's
    signal); every rank notes what ended its fit, at which step, in on_exception."""

    def __init__(self, folder: str, batch: int, main: bool = False, times: int = 1) -> None:
        self.folder, self.batch, self.main, self.times = Path(folder), batch, main, times

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.batch and trainer.is_global_zero:
            # ``main``: to the main process alone, which passes it on (litlab.run's handler)
            for _ in range(self.times):
                os.kill(os.getppid() if self.main else os.getpid(), signal.SIGTERM)
                time.sleep(0.05)

    def on_exception(self, trainer, pl_module, exception) -> None:
        ended = {"exception": type(exception).__name__, "step": trainer.global_step}
        name = f"ended{trainer.global_rank}.{os.getpid()}.json"  # the main process's too
        (self.folder / name).write_text(json.dumps(ended))


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail what takes longer (a main process waiting forever for its processes' result)."""

    def late(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def run_handler():
    """litlab.run's SIGTERM handler in this process, as a Run sets it (and put back after)."""
    from litlab import run

    state = dict(run._SIGTERM)
    run._SIGTERM["owner"] = os.getpid()
    previous = signal.signal(signal.SIGTERM, run._stop_on_sigterm)
    yield
    signal.signal(signal.SIGTERM, previous)
    run._SIGTERM.update(state)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("to_main", [False, True], ids=["to a rank", "to the main process"])
def test_a_signal_to_a_spawned_rank_saves_the_stop_checkpoint_and_ends_the_fit(
    tmp_path, run_handler, to_main
):
    """SIGTERM to one spawned rank: every rank stops after the same batch and writes the stop's
    checkpoint (litlab's Preemption, in on_exception), and the fit ends with Lightning's
    SIGTERMException in the main process. Lightning handled no exception in its spawned
    processes: no checkpoint, and the processes ended with status 0 and no result, for which
    the main process waited forever. To the main process (a job's SIGTERM reaches every process;
    litlab.run's handler passes it on to the ranks): the fit ends once the ranks have written the
    checkpoint (the run was recorded at once, "before its first checkpoint, nothing to resume",
    while they wrote one); a second SIGTERM soon after only passes it on again (it too ended
    the wait, and the run was recorded before the ranks' checkpoint)."""
    model = Regression(str(tmp_path))
    signal_at = SignalOnce(str(tmp_path), batch=2, main=to_main, times=2 if to_main else 1)
    callbacks = [Preemption(str(tmp_path / "checkpoints")), signal_at]
    trainer = bare_trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=3, callbacks=callbacks
    )
    with within(120), pytest.raises(SIGTERMException) as stopped:
        trainer.fit(model)
    assert type(stopped.value) is SIGTERMException  # the ranks', not the handler's Terminated
    main_record = tmp_path / f"ended0.{os.getpid()}.json"
    main = json.loads(main_record.read_text())
    assert main["exception"] == "SIGTERMException"
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert main_record.stat().st_mtime_ns >= checkpoint.stat().st_mtime_ns  # after the ranks
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("ended*.json"))]
    ranks.remove(main)
    assert len(ranks) == 2 and ranks[0] == ranks[1]  # both stopped after the same batch
    assert ranks[0]["exception"] == "SIGTERMException"
    assert 3 <= ranks[0]["step"] < 12  # after the signal's batch, before the fit's end
    saved = load_checkpoint(checkpoint)
    assert saved["global_step"] == ranks[0]["step"]


@pytest.mark.dist
@pytest.mark.slow
def test_a_signal_to_the_main_process_at_the_fits_last_batch_lets_the_fit_end(
    tmp_path, run_handler
):
    """A SIGTERM at the fit's last batch stops nothing in the ranks (Preemption: the run would
    have nothing left to train): the fit ends as planned, with its results, and the stop is
    held for the run to act on once it has recorded the fit (Run.stop_if_asked). The main
    process raised at once: a stop recorded as resumable that resume= refused ("already
    trained 3 epochs"), and no test."""
    from litlab import run

    model = Regression(str(tmp_path))
    callbacks = [Preemption(str(tmp_path / "checkpoints")), SignalOnce(str(tmp_path), 11, True)]
    trainer = bare_trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=3, callbacks=callbacks
    )
    with within(120):
        trainer.fit(model)
    # rank 0's results came back (the fit's end): before, Terminated at once, none
    assert trainer.state.finished and "train/loss" in trainer.callback_metrics
    assert run.sigterm_pending()
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()  # no stop was saved


class EvaluatedRegression(Regression):
    """Validated and tested on its training data."""

    def _evaluate(self, batch: tuple[Tensor, Tensor], split: str) -> None:
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log(f"{split}/loss", loss, sync_dist=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def val_dataloader(self) -> DataLoader:
        return self.train_dataloader()

    def test_dataloader(self) -> DataLoader:
        return self.train_dataloader()


class SignalInTest(L.Callback):
    """SIGTERM to global rank 0's own process at the test's first batch (``kill <pid>``)."""

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGTERM)


class NoRun:
    """What HoldStopAfterTest asks of a Run in a started rank (its hold is the main's)."""

    def defer_stop(self) -> None:
        pass


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn"])
def test_a_signal_to_a_rank_in_the_test_lets_the_test_end_on_every_rank(tmp_path, strategy):
    """Under DDP a SIGTERM in the test is held until the test ends (litlab.run.
    HoldStopAfterTest): Lightning's handler stopped the signalled rank alone and broadcast from
    inside the handler, and the other rank waited in a collective forever (ddp_spawn: hung;
    ddp_fork after a fit: an AssertionError first, its ranks inheriting the fit's processes)."""
    from litlab.run import HoldStopAfterTest

    model = EvaluatedRegression(str(tmp_path))
    trainer = bare_trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        callbacks=[SignalInTest(), HoldStopAfterTest(NoRun())],
    )
    with within(120):
        trainer.fit(model)
        (tested,) = trainer.test(model)
    assert trainer.state.finished and "test/loss" in tested


class SignalInSanityCheck(L.Callback):
    """SIGTERM to global rank 0's own process at the sanity check's first batch."""

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking and batch_idx == 0 and trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInSetup(L.Callback):
    """SIGTERM to global rank 1's own process in the fit's setup (before Lightning's handlers)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.dist
@pytest.mark.slow
def test_a_signal_to_a_spawned_rank_in_the_sanity_check_stops_after_the_first_batch(tmp_path):
    """Under DDP Preemption marks a signal from the sanity check on: the fit stops after its
    first batch on every rank, with the stop's checkpoint. Lightning's handler, in force until
    training started, broadcast from inside itself and stopped the signalled rank alone: hung."""
    trainer = bare_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=3,
        num_sanity_val_steps=2,
        callbacks=[Preemption(str(tmp_path / "checkpoints")), SignalInSanityCheck()],
    )
    with within(120), pytest.raises(SIGTERMException):
        trainer.fit(EvaluatedRegression(str(tmp_path)))
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert 1 <= saved["global_step"] <= 2  # the batch after the agreement (DDP: one later)


@pytest.mark.dist
def test_a_spawned_rank_a_signal_ended_in_its_setup_ends_the_fit_as_stopped(tmp_path):
    """Before Lightning sets its handlers a spawned rank has SIGTERM's default action: it ended
    with "process 1 terminated with signal SIGTERM", read as a failure; now a stop (Terminated:
    the run reads interrupted, with nothing to resume)."""
    from litlab.errors import Terminated

    trainer = bare_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        callbacks=[SignalInSetup()],
    )
    with within(120), pytest.raises(Terminated):
        trainer.fit(Regression(str(tmp_path)))
