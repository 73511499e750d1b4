"""The device-resident loader: shards, order, resume, and real Lightning training through it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor
from torch.utils.data import TensorDataset

from conftest import QUIET as FAST
from conftest import bare_trainer, make_cfg, needs_cuda, summary_of
from litlab.config import build
from litlab.data import DataModule, DeviceLoader, Source
from litlab.data.loader import ResumableDataLoader, ShardSampler
from litlab.errors import ConfigError
from litlab.train import train_task


def indexed(n: int) -> tuple[Tensor, Tensor]:
    """Images that carry their own index in two pixels, labels equal to it: pairs are checkable."""
    index = torch.arange(n)
    images = torch.zeros(n, 1, 4, 4, dtype=torch.uint8)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = index % 256, index // 256
    return images, index


def passes(loader: DeviceLoader) -> list[Tensor]:
    """One pass: each batch's sample indices, read from the images, after checking the labels."""
    out = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        index = images[:, 0, 0, 0].long() + 256 * images[:, 0, 0, 1].long()
        assert torch.equal(index, labels)  # images and labels stay paired
        out.append(labels)
    return out


def shards(n: int, world: int, train: bool, batch: int = 4, seed: int = 0, epoch: int = 0):
    images, labels = indexed(n)
    loaders = [
        DeviceLoader(images, labels, batch, train, train, seed=seed, rank=r, world_size=world)
        for r in range(world)
    ]
    for loader in loaders:
        loader.sampler.set_epoch(epoch)
    return loaders, [torch.cat(passes(loader)) for loader in loaders]


@pytest.mark.parametrize("n, world", [(96, 1), (96, 3), (103, 2), (103, 4)])
def test_training_ranks_take_disjoint_equal_shards_of_one_permutation(n, world):
    loaders, seen = shards(n, world, train=True, epoch=5)
    assert len({len(loader) for loader in loaders}) == 1  # the same number of steps on every rank
    assert all(len(s) == len(loaders[0]) * 4 for s in seen)
    union = torch.cat(seen)
    assert len(set(union.tolist())) == len(union)  # pairwise disjoint
    # Interleaved, the ranks' orders are the one epoch permutation, its tail dropped.
    samplers = [ShardSampler(n, True, True, rank=r, world_size=world) for r in range(world)]
    whole = ShardSampler(n, True, True)
    for sampler in [*samplers, whole]:
        sampler.set_epoch(5)
    by_rank = torch.stack([sampler.indices() for sampler in samplers], dim=1).flatten()
    assert torch.equal(by_rank, whole.indices()[: n // world * world])
    for rank, sampler in enumerate(samplers):  # each rank's batches follow its order
        assert torch.equal(seen[rank], sampler.indices()[: len(seen[rank])])
    if n % (world * 4) == 0:
        assert sorted(union.tolist()) == list(range(n))  # every sample exactly once


@pytest.mark.parametrize(
    "n, world, asked, batch",
    [
        (96, 2, 5, 5),
        (103, 4, 10, 10),
        (103, 4, 5, 4),
        (103, 4, 25, 24),
        (1025, 2, 512, 511),
        (9, 2, 1, 3),  # one-image batches: 5 and 4 images would make 5 and 4 batches
        (9, 2, 2, 3),
        (359, 2, 1, 2),  # the digits' test split, data.eval_batch_size=1
    ],
)
def test_evaluation_ranks_see_every_sample_once_in_as_many_batches(n, world, batch, asked):
    """Evaluation under DDP counts each image once (no padding: the metrics are the one-process
    ones), in the same number of batches on every rank (steps that are collectives, as under
    FSDP, stay paired): where the batch size asked leaves a rank a batch more, one below (or
    above, for batches of one or two)."""
    loaders, seen = shards(n, world, train=False, batch=asked)
    assert len({len(loader) for loader in loaders}) == 1
    assert {loader.batch_size for loader in loaders} == {batch}
    by_rank = torch.cat(seen)
    assert sorted(by_rank.tolist()) == list(range(n))  # each sample once
    for rank, s in enumerate(seen):
        assert s.tolist() == list(range(rank, n, world))  # rank r: every W-th from r, in order


@pytest.mark.parametrize("n, world, batch", [(3, 4, 8), (3, 4, 1)])
def test_evaluation_pads_like_distributed_sampler_where_even_batches_cannot_be_had(n, world, batch):
    # fewer samples than ranks (a rank without batches would skip the epoch's collectives)
    loaders, seen = shards(n, world, train=False, batch=batch)
    assert len({len(loader) for loader in loaders}) == 1 and {len(s) for s in seen} == {
        -(-n // world)
    }
    by_rank = torch.stack(seen, dim=1).flatten()
    padded = -(-n // world) * world
    assert by_rank.tolist() == list(range(n)) + list(range(padded - n))  # repeats the start


def test_drop_last_only_in_training():
    images, labels = indexed(100)
    train = DeviceLoader(images, labels, 32, shuffle=True, drop_last=True)
    evaluate = DeviceLoader(images, labels, 32, shuffle=False, drop_last=False)
    assert len(train) == 3 and [len(b) for b in passes(train)] == [32, 32, 32]
    assert len(evaluate) == 4 and [len(b) for b in passes(evaluate)] == [32, 32, 32, 4]
    assert torch.cat(passes(evaluate)).tolist() == list(range(100))


def test_order_comes_from_seed_and_epoch_only():
    def order(seed: int, epoch: int) -> list[int]:
        return shards(64, 1, train=True, seed=seed, epoch=epoch)[1][0].tolist()

    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = order(7, 0)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is not advanced
    torch.manual_seed(2)
    assert order(7, 0) == first  # nor read
    assert order(7, 1) != first and order(8, 0) != first and order(0, 1) != order(1, 0)
    assert sorted(first) == list(range(64))


def test_passes_advance_the_epoch_and_a_new_iter_restarts_the_epoch():
    images, labels = indexed(64)
    loader = DeviceLoader(images, labels, 8, shuffle=True, drop_last=True, seed=3)
    epoch0 = passes(loader)
    layout = {"batches": 8, "samples": 64, "world_size": 1, "batch_size": 8}
    assert loader.state_dict() == {"epoch": 1, "position": 0, **layout}
    partial = next(iter(loader))[1]
    assert loader.state_dict() == {"epoch": 1, "position": 1, **layout}
    epoch1 = passes(loader)  # an abandoned pass (a sanity check, say) does not eat batches
    assert torch.equal(epoch1[0], partial) and len(epoch1) == 8
    assert not torch.equal(torch.cat(epoch0), torch.cat(epoch1))


def loader_of(kind: str, n: int, batch: int, seed: int) -> DeviceLoader | ResumableDataLoader:
    """A shuffled training loader of n index-coded images: the device loader, or torch's
    DataLoader (its sampler, its worker processes when kind ends in "workers")."""
    images, labels = indexed(n)
    if kind == "device":
        return DeviceLoader(images, labels, batch, shuffle=True, drop_last=True, seed=seed)
    workers = 2 if kind == "dataloader, workers" else 0
    order = ShardSampler(n, shuffle=True, drop_last=True, seed=seed, batch_size=batch)
    dataset = TensorDataset(images, labels)
    return ResumableDataLoader(dataset, order, num_workers=workers, persistent_workers=workers > 0)


class CountReads(TensorDataset):
    """Counts the samples read (in this process: no workers)."""

    reads = 0

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        self.reads += 1
        return super().__getitem__(index)


@pytest.mark.parametrize("kind", ["device", "dataloader", "dataloader, workers"])
@pytest.mark.parametrize("stop", [0, 3, 8])
def test_resume_yields_exactly_the_rest_of_the_epoch(stop, kind):
    reference = loader_of(kind, 70, 8, seed=11)
    passes(reference)  # epoch 0
    batches = iter(reference)
    for _ in range(stop):
        next(batches)
    state = reference.state_dict()
    layout = {"batches": 8, "samples": 70, "world_size": 1, "batch_size": 8}
    assert state == {"epoch": 1, "position": stop, **layout}
    rest = [labels for _, labels in batches]
    resumed = loader_of(kind, 70, 8, seed=11)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(state["epoch"])  # what Lightning does next: must keep the position
    assert [b.tolist() for b in passes(resumed)] == [b.tolist() for b in rest]
    assert stop + len(rest) == len(reference)
    assert [b.tolist() for b in passes(resumed)] == [b.tolist() for b in passes(reference)]


def test_torch_loaders_order_is_the_device_loaders_and_a_resumed_pass_reads_only_the_rest():
    """Both loaders deal the same epochs (seed, epoch), drawing nothing from the global
    generator; a resumed DataLoader pass does not read the images before its position."""
    device = loader_of("device", 70, 8, seed=5)
    images, labels = indexed(70)
    dataset = CountReads(images, labels)
    torch_loader = ResumableDataLoader(dataset, ShardSampler(70, True, True, seed=5, batch_size=8))
    state = torch.get_rng_state()
    for _ in range(2):  # two epochs
        assert [b.tolist() for b in passes(torch_loader)] == [b.tolist() for b in passes(device)]
    assert torch.equal(torch.get_rng_state(), state)
    dataset.reads = 0
    torch_loader.load_state_dict({"epoch": 2, "position": 6})
    assert len(passes(torch_loader)) == 2 and dataset.reads == 16


def test_the_task_trains_as_well_with_either_loader(tmp_path):
    accuracy = {}
    small = ["trainer.max_epochs=2", "data.source.size=16", "model.net.width=16"]
    for loader in ("device", "dataloader"):
        cfg = make_cfg(tmp_path / loader, ["logger=csv", *small, f"data.loader={loader}", *FAST])
        train_task(cfg)
        summary = summary_of(cfg)
        assert summary["status"] == "completed"
        accuracy[loader] = summary["metrics"]["test/acc"]
    assert min(accuracy.values()) > 0.8, accuracy
    assert abs(accuracy["device"] - accuracy["dataloader"]) < 0.05, accuracy


class Fingerprints(Callback):
    """The hash of every training batch, in order: two runs saw the same data iff these agree."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        images, labels = batch
        data = images.cpu().numpy().tobytes() + labels.cpu().numpy().tobytes()
        self.seen.append(hashlib.sha1(data).hexdigest())


def fit(
    tmp_path: Path, callbacks: list[Callback], ckpt_path: str | None = None, loader: str = "device"
) -> L.Trainer:
    """Two epochs of the real DataModule and classifier on small digits (no augmentation, so
    that a batch's hash depends on the loader alone)."""
    small = ["data.source.size=12", "model.net.width=4", "model.scheduler=null"]
    loading = [f"data.loader={loader}", f"data.num_workers={2 if loader == 'dataloader' else 0}"]
    cfg = make_cfg(tmp_path, ["data.translate=0", "data.batch_size=128", *loading, *small])
    trainer = bare_trainer(
        accelerator="cpu",
        max_epochs=2,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(build(cfg.model, "model"), build(cfg.data, "data"), ckpt_path=ckpt_path)
    return trainer


def test_a_mid_epoch_position_is_refused_on_another_layout():
    """A position counts batches of one batch size on one number of ranks: continued with
    another, some of the epoch's images would be skipped and others repeated."""
    images, labels = indexed(64)
    loader = DeviceLoader(images, labels, 8, shuffle=True, drop_last=True, seed=3)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    for other in (
        DeviceLoader(images, labels, 4, shuffle=True, drop_last=True, seed=3),
        DeviceLoader(images, labels, 8, shuffle=True, drop_last=True, seed=3, world_size=2),
    ):
        with pytest.raises(ConfigError, match="resume with the same values"):
            other.load_state_dict(state)
    passes(loader)  # the epoch's end: any layout may start the next epoch
    DeviceLoader(images, labels, 4, shuffle=True, drop_last=True, seed=3).load_state_dict(
        loader.state_dict()
    )
    old = {"epoch": 0, "position": 1}  # written before the layout was kept: taken as it is
    DeviceLoader(images, labels, 4, shuffle=True, drop_last=True, seed=3).load_state_dict(old)


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_checkpoints_hold_the_loader_state_and_resumed_runs_see_the_same_batches(tmp_path, loader):
    # 1294 training digits / 128 = 10 batches an epoch. Checkpoints: every 4 steps (mid-epoch),
    # at each validation end (as the project's last.ckpt) and at each training epoch end.
    # torch's DataLoader (data.loader=dataloader, the path of folders too large to cache) too.
    reference = Fingerprints()
    steps = ModelCheckpoint(tmp_path / "steps", "{step}", every_n_train_steps=4, save_top_k=-1)
    last = ModelCheckpoint(tmp_path / "last", "{epoch}", monitor="val/acc", save_top_k=-1)
    epoch_end = ModelCheckpoint(
        tmp_path / "epoch_end", "{epoch}", save_top_k=-1, save_on_train_epoch_end=True
    )
    trainer = fit(tmp_path / "reference", [reference, steps, last, epoch_end], loader=loader)
    kind = DeviceLoader if loader == "device" else ResumableDataLoader
    assert type(trainer.train_dataloader) is kind  # not wrapped or replaced
    assert len(reference.seen) == 20 and len(set(reference.seen)) == 20
    cases = [
        (tmp_path / "steps" / "step=4.ckpt", {"epoch": 0, "position": 4}),
        (tmp_path / "steps" / "step=12.ckpt", {"epoch": 1, "position": 2}),
        (tmp_path / "last" / "epoch=0.ckpt", {"epoch": 0, "position": 10}),
        (tmp_path / "epoch_end" / "epoch=0.ckpt", {"epoch": 0, "position": 10}),
    ]
    layout = {"batches": 10, "samples": 1294, "world_size": 1, "batch_size": 128}
    for ckpt, state in cases:
        saved = torch.load(ckpt, weights_only=True)
        assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{**state, **layout}]
        resumed = Fingerprints()
        fit(tmp_path / ckpt.parent.name, [resumed], ckpt_path=str(ckpt), loader=loader)
        assert resumed.seen == reference.seen[saved["global_step"] :], ckpt


class Indexed(Source):
    """Index-coded images whose label is their index (a module-level class: ddp_spawn pickles it)."""

    name = "indexed"

    def load(self, split: str) -> TensorDataset:
        return TensorDataset(*indexed(200 if split == "train" else 50))


class RecordLabels(L.LightningModule):
    """Records the labels (= sample indices) each rank trains on; learns nothing of note."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if batch_idx == 0:
            self.seen.append([])
        self.seen[-1] += batch[1].tolist()
        return (self.weight * batch[0].mean()).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        loader = self.trainer.train_dataloader
        record = {
            "seen": self.seen,
            "loader": type(loader).__name__,
            "sampler": type(loader.sampler).__name__,
            "rank": loader.sampler.rank,
        }
        torch.save(record, self.folder / f"rank{self.global_rank}.pt")


def test_a_batch_size_larger_than_a_ranks_share_is_refused():
    """Each rank trains on its share (drop_last): 180 images on 4 ranks make 45 each, no batch
    of 64 (Lightning would end the fit at once, "no training batches", and report completed)."""
    dm = DataModule(Indexed(), [1, 4, 4], 200, mean=[0.0], std=[1.0], batch_size=64)
    dm.setup()
    assert len(dm.train_dataloader()) == len(dm.datasets["fit"]) // 64  # one process: fine
    dm.trainer = SimpleNamespace(world_size=4)
    with pytest.raises(ConfigError, match="exceeds the 45 training images of each of the 4 ranks"):
        dm.train_dataloader()


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_ddp_ranks_train_on_disjoint_shards_of_each_epoch(tmp_path, loader):
    dm = DataModule(Indexed(), [1, 4, 4], 200, mean=[0.0], std=[1.0], batch_size=8, loader=loader)
    dm.setup()
    trainer = bare_trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, limit_val_batches=0
    )
    trainer.fit(RecordLabels(str(tmp_path)), dm)
    records = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # Lightning keeps the loader and its sampler (no DistributedSampler put in its place)
    kind = "DeviceLoader" if loader == "device" else "ResumableDataLoader"
    assert [r["loader"] for r in records] == [kind] * 2
    assert [(r["sampler"], r["rank"]) for r in records] == [("ShardSampler", r) for r in (0, 1)]
    for epoch in range(2):
        a, b = (set(r["seen"][epoch]) for r in records)
        assert not a & b and len(a) == len(b) == len(dm.datasets["train"]) // 2 // 8 * 8
    assert records[0]["seen"][0] != records[0]["seen"][1]  # a new order each epoch


@pytest.mark.gpu
@needs_cuda
def test_batches_are_indexed_on_the_gpu_in_the_cpu_order():
    images, labels = indexed(300)
    on_gpu = DeviceLoader(images, labels, 32, shuffle=True, drop_last=True, seed=5, device="cuda")
    on_cpu = DeviceLoader(images, labels, 32, shuffle=True, drop_last=True, seed=5)
    for (gi, gl), (ci, cl) in zip(on_gpu, on_cpu, strict=True):
        assert gi.device.type == gl.device.type == "cuda"
        assert torch.equal(gi.cpu(), ci) and torch.equal(gl.cpu(), cl)


@pytest.mark.gpu
@needs_cuda
def test_training_on_the_gpu_keeps_the_split_on_the_gpu(tmp_path):
    cfg = make_cfg(tmp_path, [])
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_epochs=3,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    trainer.fit(build(cfg.model, "model"), build(cfg.data, "data"))
    assert trainer.train_dataloader.images.device.type == "cuda"
    assert trainer.callback_metrics["val/acc"] > 0.8


class Predicted(L.LightningModule):
    """Predicts each sample's label (= its index): which samples a predict pass reads."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def predict_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return batch[1]


def test_trainer_predict_reads_a_resumable_dataloader_whole():
    """Lightning rebuilds predict loaders with its own batch sampler: a ResumableDataLoader
    passed to trainer.predict (as a user might, data.loader=dataloader) predicts every sample
    once, in its order."""
    images, labels = indexed(10)
    loader = ResumableDataLoader(
        TensorDataset(images, labels), ShardSampler(10, False, False, batch_size=3)
    )
    trainer = bare_trainer(accelerator="cpu", logger=False)
    predicted = trainer.predict(Predicted(), dataloaders=loader)
    assert torch.cat(predicted).tolist() == list(range(10))


@pytest.mark.parametrize("kind", ["device", "dataloader"])
def test_a_mid_epoch_position_is_refused_when_the_split_changed_size(kind):
    """A position indexes the epoch's order of the split's images: one image more reshuffles
    the epoch, and the rest of it would repeat trained images and leave out others. Refused
    mid-epoch (the saved number of images against this run's); an epoch's end is fine."""
    loader = loader_of(kind, 103, 8, seed=1)
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    state = loader.state_dict()
    for n in (100, 120):  # the same number of batches (12), then more
        with pytest.raises(ConfigError, match=r"103 training images, this run has \d+"):
            loader_of(kind, n, 8, seed=1).load_state_dict(state)
    assert state["samples"] == 103
    older = {k: v for k, v in state.items() if k != "samples"}  # kept the batches only
    with pytest.raises(ConfigError, match="of 12 training batches, this run has 15"):
        loader_of(kind, 120, 8, seed=1).load_state_dict(older)
    loader_of(kind, 103, 8, seed=1).load_state_dict(state)
    for _ in batches:  # the epoch's end: another split may start the next epoch
        pass
    loader_of(kind, 120, 8, seed=1).load_state_dict(loader.state_dict())


READER = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from litlab.data.loader import reader_context, worker_init


class Slow(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        if i >= {hang_from}:
            time.sleep(600)  # a read that hangs (a stale network file system)
        time.sleep(0.01)
        return torch.tensor(i)


if __name__ == "__main__":
    loader = DataLoader(Slow(), batch_size=2, num_workers=2, multiprocessing_context=reader_context(2),
                        worker_init_fn=worker_init(0))
    batches = iter(loader)
    next(batches)
    print("reading", flush=True)
    {then}
"""


def test_a_temporary_folder_too_long_for_the_workers_server_is_said(tmp_path):
    """The file readers' forkserver makes a socket in the temporary folder, whose path Python
    caps at 107 bytes: a long TMPDIR (a test's, a cluster job's) failed the run with
    "OSError: AF_UNIX path too long" in a traceback. One line now, saying what to set."""
    import os
    import subprocess
    import sys

    long = tmp_path / ("t" * max(1, 100 - len(str(tmp_path))))
    long.mkdir()
    code = "from litlab.data.loader import reader_context; reader_context(1)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last and "set a shorter TMPDIR (e.g. export TMPDIR=/tmp)" in last
    assert str(long) in last


def group_alive(pgid: int) -> list[str]:
    import subprocess

    found = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_loader_workers_end_with_the_training_process(tmp_path, end):
    """The workers ignore stop signals sent to the whole process group (from any process but
    the training one): a SIGKILLed training process left its forkserver and workers running
    (each worker held the server's "alive" pipe), and a worker hung in a read kept a training
    process from exiting (torch ends such a worker with SIGTERM)."""
    import subprocess
    import sys
    import time

    then = "time.sleep(600)" if end == "sigkill" else "del batches; print('done', flush=True)"
    script = tmp_path / "reader.py"
    script.write_text(READER.format(hang_from=10**9 if end == "sigkill" else 6, then=then))
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout.readline().strip() == "reading"
        assert len(group_alive(process.pid)) >= 4  # itself, the forkserver, two workers
        if end == "sigkill":
            process.kill()
        else:
            assert process.stdout.readline().strip() == "done"
        process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_alive(process.pid) == []
    finally:
        subprocess.run(["kill", "-KILL", "--", f"-{process.pid}"], capture_output=True)
