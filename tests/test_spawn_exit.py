"""ddp_spawn's processes close their process group before their interpreter shuts down: a gloo
group left to the shutdown aborted them now and then after training ("terminate called without
an active exception", SIGABRT), which failed the fit (litlab.distributed.ClosingDDPStrategy)."""

from __future__ import annotations

import atexit
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from conftest import bare_trainer
from litlab.distributed.strategy import SPAWNED_DDP, ClosingDDPStrategy

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


def test_lightnings_spawned_ddp_names_keep_their_parameters():
    for name, params in SPAWNED_DDP.items():
        strategy = bare_trainer(accelerator="cpu", devices=2, strategy=name).strategy
        assert type(strategy) is ClosingDDPStrategy and strategy._start_method == "spawn", name
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
