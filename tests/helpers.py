"""Test-only callbacks, importable by child processes (tests/ is put on PYTHONPATH)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

from litlab.data.sources import Source
from litlab.models import ImageClassifier


class DumpWeights(Callback):
    """Each rank saves its final parameters: proves ranks end with identical weights.

    (BatchNorm running statistics are buffers, not parameters: each rank keeps its own between
    evaluations, and litlab gives every rank rank 0's before each one; checkpoints hold rank 0's.)
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        parameters = {name: p.detach().cpu() for name, p in pl_module.named_parameters()}
        from litlab.callbacks import FID

        for fid in (c for c in trainer.callbacks if isinstance(c, FID)):  # and FID's extractor's
            for name, tensor in fid.metric.inception.state_dict().items():
                parameters[f"fid_extractor.{name}"] = tensor.detach().cpu()
        torch.save(parameters, self.folder / f"rank{trainer.global_rank}.pt")


class CountAllReduced(Callback):
    """Each rank writes, at the fit's end, how many gradient elements each DDP wrapper
    all-reduced (the benchmarks' count, scripts/benchlib.count_all_reduced), its final state
    dict (parameters and buffers), the nets' sizes and the GAN's step counts: rank{r}.pt."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.elements: dict[str, int] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
        from benchlib import count_all_reduced  # scripts/ is not a package

        self.elements = count_all_reduced(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {
            "elements": self.elements,
            "state": {k: v.detach().cpu() for k, v in pl_module.state_dict().items()},
            "sizes": {
                name: sum(p.numel() for p in getattr(pl_module, name).parameters())
                for name in pl_module.ddp_nets
            },
            "steps": {"generator": pl_module.g_steps, "discriminator": pl_module.d_steps},
        }
        torch.save(record, self.folder / f"rank{trainer.global_rank}.pt")


class RecordEpochSums(Callback):
    """Rank 0 writes every rank's own training sums (the classifier's epoch_sums) at each
    training epoch's end, before the model reduces them: rank{r}: [loss x n, top-1, top-k, n];
    and every rank's loss of the epoch's last batch: last_losses."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.last_losses: list[float] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if trainer.is_last_batch:
            self.last_losses = pl_module.all_gather(outputs["loss"].detach()).tolist()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sums = pl_module.all_gather(pl_module.epoch_sums()).reshape(-1, 4)
        if trainer.global_rank == 0:
            ranks = {f"rank{r}": s for r, s in enumerate(sums.tolist())}
            self.path.write_text(json.dumps({**ranks, "last_losses": self.last_losses}))


class RecordAverageDevice(Callback):
    """Writes where callbacks=ema keeps its average (parameters and count) and where the module
    trains, at the first training batch's end, as JSON."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.path.exists():
            return
        from litlab.callbacks import EMA

        average = next(c for c in trainer.callbacks if isinstance(c, EMA))._average_model
        where = {
            "average": sorted({p.device.type for p in average.parameters()}),
            "count": average.n_averaged.device.type,
            "module": pl_module.device.type,
        }
        self.path.write_text(json.dumps(where))


class RecordBatchSaves(Callback):
    """Writes the global step of every checkpoint saved within a training epoch (not at its end:
    the periodic saves) to a JSON file, a list growing as they come; with ``batches``, pairs of
    it and the number of the epoch's batches trained when it was saved."""

    def __init__(self, path: str, batches: bool = False) -> None:
        self.path, self.steps, self.batches = Path(path), [], batches

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.training and not trainer.is_last_batch:
            step = checkpoint["global_step"]
            if self.batches:
                step = [step, trainer.fit_loop.epoch_loop.batch_progress.current.ready]
            self.steps.append(step)
            self.path.write_text(json.dumps(self.steps))


class InjectNaN(Callback):
    """Poisons the first parameter of a submodule at a given training batch (a fault injector):
    at its start, or with ``after_step`` at its end (the batch's loss stays finite)."""

    def __init__(self, at_batch: int, module: str, after_step: bool = False) -> None:
        self.at_batch, self.module, self.after_step = at_batch, module, after_step

    def _poison(self, trainer, pl_module) -> None:
        if trainer.fit_loop.total_batch_idx == self.at_batch:
            with torch.no_grad():
                next(getattr(pl_module, self.module).parameters()).fill_(float("nan"))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.after_step:
            self._poison(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.after_step:  # before the checkpoints' hooks (Lightning runs those last)
            self._poison(trainer, pl_module)


class ZeroAtStart(Callback):
    """Zeroes the first parameter of a submodule when the fit starts (or, with ``epoch``, when
    that epoch starts): a handicap that makes the validations after it worse than the best
    before it."""

    def __init__(self, module: str, epoch: int | None = None) -> None:
        self.module, self.epoch = module, epoch

    def _zero(self, pl_module) -> None:
        with torch.no_grad():
            next(getattr(pl_module, self.module).parameters()).zero_()

    def on_train_start(self, trainer, pl_module) -> None:
        if self.epoch is None:
            self._zero(pl_module)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            self._zero(pl_module)


class PoisonBatch(Callback):
    """Fills one rank's training images with NaN at a given training batch (a bad input that
    only that rank sees)."""

    def __init__(self, at_batch: int, rank: int) -> None:
        self.at_batch, self.rank = at_batch, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.at_batch and trainer.global_rank == self.rank:
            images = batch[0] if isinstance(batch, (list, tuple)) else batch
            images.fill_(float("nan"))


class SignalAt(Callback):
    """Sends a real signal to this process (global rank ``rank``) during a training batch (a
    preemption); the run stops at the end of that batch. ``job``: to its child processes too
    (W&B's service), as SLURM and ``docker stop`` signal a whole job; ``group``: to its whole
    process group, as scancel and ``kill -- -PGID`` do (grandchildren too: loader workers and
    their forkserver; run it in a session of its own: run_cli(new_session=True))."""

    def __init__(
        self,
        batch: int,
        signum: str = "SIGTERM",
        job: bool = False,
        group: bool = False,
        rank: int = 0,
    ) -> None:
        self.batch, self.signum, self.job, self.group = batch, signum, job, group
        self.rank = rank  # the global rank signalled

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import os
        import signal
        import subprocess

        if trainer.fit_loop.total_batch_idx == self.batch and trainer.global_rank == self.rank:
            signum = getattr(signal, self.signum)
            if self.group:  # from another process, as slurmstepd's or a shell's kill
                subprocess.run(["kill", f"-{signum.value}", "--", f"-{os.getpgrp()}"], check=False)
                return
            if self.job:  # as the stand-in scontrol does (test_reliability.FAKE_SCONTROL)
                subprocess.run(["pkill", f"-{signum.value}", "-P", str(os.getpid())], check=False)
            os.kill(os.getpid(), signum)


class SignalInJob(Callback):
    """SIGTERM (or ``signum``) at a training batch of one job of a sweep (its
    ``hydra.job.num``), once: not in the job continued with resume= (the same callback), which
    finds ``mark`` written."""

    def __init__(self, job: int, batch: int, mark: str, signum: str = "SIGTERM") -> None:
        self.job, self.batch, self.mark, self.signum = job, batch, Path(mark), signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import os
        import signal

        from hydra.core.hydra_config import HydraConfig

        if trainer.fit_loop.total_batch_idx != self.batch or self.mark.exists():
            return
        if HydraConfig.get().job.num == self.job:
            self.mark.touch()
            os.kill(os.getpid(), getattr(signal, self.signum))


class SignalInTest(Callback):
    """Sends a real signal to this process at the start of the test's first batch: a job
    preempted after its training ended, while it tested the best checkpoint. Once: not in the
    requeued job (the same command), which finds ``mark`` written."""

    def __init__(self, mark: str, signum: str = "SIGTERM") -> None:
        self.mark, self.signum = Path(mark), signum

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        import os
        import signal

        if batch_idx == 0 and trainer.is_global_zero and not self.mark.exists():
            self.mark.touch()
            os.kill(os.getpid(), getattr(signal, self.signum))


class CaptureNoise(Callback):
    """Each rank saves what its generators were fed (the first training batches' noise, and the
    noise of FID's samples at validation), the real images it fed FID's real statistics (as
    uint8) and its random state at the end of training."""

    def __init__(self, folder: str, train_batches: int = 2) -> None:
        self.folder, self.train_batches = Path(folder), train_batches
        self.seen: dict[str, list[torch.Tensor]] = {"train": [], "fid": [], "fid_real": []}

    def on_fit_start(self, trainer, pl_module) -> None:
        from litlab.callbacks import FID

        (fid,) = [c for c in trainer.callbacks if isinstance(c, FID)]
        update = fid.metric.update

        def record(images, real):
            if real:
                self.seen["fid_real"].append(images.mul(255).round().to(torch.uint8).cpu())
            return update(images, real=real)

        fid.metric.update = record

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit":
            return

        def record(module, args) -> None:
            z = args[0].detach().cpu()
            if module.training and len(self.seen["train"]) < 2 * self.train_batches:
                self.seen["train"].append(z)  # D's and G's noise of each batch
            elif not module.training and trainer.validating:
                self.seen["fid"].append(z)

        pl_module.generator.register_forward_pre_hook(record)
        pl_module.generator_ema.module.register_forward_pre_hook(record)

    def on_train_end(self, trainer, pl_module) -> None:
        from litlab.callbacks import Throughput

        self.folder.mkdir(parents=True, exist_ok=True)
        (clock,) = [c.totals["train"] for c in trainer.callbacks if isinstance(c, Throughput)]
        state = {**self.seen, "rng": torch.get_rng_state()}
        state["train_rate"] = clock.samples / clock.seconds  # this rank's own images/s
        state["step_rate"] = clock.batches / clock.seconds  # and its own batches/s
        torch.save(state, self.folder / f"rank{trainer.global_rank}.pt")


class ProbeTrainingClock(Callback):
    """Records whether the Throughput callback's training clock runs: inside training batches,
    at validation's end (where FID runs) and while a checkpoint is saved. Listed after the
    default callbacks, so it sees their hooks' effect."""

    last: ClassVar[dict[str, list[bool]]] = {}  # the newest instance's records

    def __init__(self) -> None:
        self.seen: dict[str, list[bool]] = {"batch": [], "validation end": [], "saving": []}
        ProbeTrainingClock.last = self.seen

    def _running(self, trainer) -> bool | None:
        from litlab.callbacks import Throughput

        (throughput,) = [c for c in trainer.callbacks if isinstance(c, Throughput)]
        clock = throughput._clocks.get("train")
        return None if clock is None else clock.running

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= 5:  # after the warm-up
            self.seen["batch"].append(self._running(trainer))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.seen["validation end"].append(self._running(trainer))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.seen["saving"].append(self._running(trainer))


class RecordImages(Callback):
    """Each rank writes a fingerprint of every image it was given (per training epoch and at
    test), so that a test can see which images each rank saw. Needs deterministic transforms
    (no random crop or flip): the uint8 pixels are recovered from the normalized batch."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: dict[str, list[list[int]]] = {"test": []}

    def _fingerprints(self, trainer, images: torch.Tensor) -> list[int]:
        transform = trainer.datamodule.transform
        pixels = ((images.float() * transform.std + transform.mean) * 255).round().long()
        return fingerprints(pixels.cpu())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        key = f"epoch{trainer.current_epoch}"
        self.seen.setdefault(key, []).append(self._fingerprints(trainer, batch[0]))
        self.seen.setdefault(f"labels{trainer.current_epoch}", []).append(batch[1].tolist())

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.seen["test"].append(self._fingerprints(trainer, batch[0]))

    def on_test_end(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


def fingerprints(pixels: torch.Tensor) -> list[int]:
    """One integer per uint8 image (exact: a fixed integer projection of its pixels)."""
    flat = pixels.flatten(1).long()
    weights = torch.randint(
        0, 1 << 20, (flat.shape[1],), generator=torch.Generator().manual_seed(0)
    )
    return (flat * weights).sum(1).tolist()


class RecordEvalWeights(Callback):
    """Saves the net's weights as the last validation batch and the test saw them:
    {"validate": {name: tensor}, "test": {name: tensor}} (state_dict names)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seen: dict[str, dict[str, torch.Tensor]] = {}

    def _record(self, stage: str, pl_module: L.LightningModule) -> None:
        state = pl_module.state_dict()
        self.seen[stage] = {
            k: v.detach().cpu().clone() for k, v in state.items() if k.startswith("net.")
        }

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record("validate", pl_module)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record("test", pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        torch.save(self.seen, self.path)


class RecordDraws(Callback):
    """Each rank saves the next draws of its global torch generator at the start of training
    (what augmentation and dropout would draw)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(torch.rand(8), self.folder / f"rank{trainer.global_rank}.pt")


def agree_on_flags(rank: int, world: int, init_file: str, out: str) -> None:
    """One process of a gloo job that raises flags through litlab.distributed.agree.AnyRank and
    saves what it was told (test_distributed)."""
    import torch.distributed as dist

    from litlab.distributed.agree import AnyRank

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    agreed = AnyRank(torch.device("cpu"))
    told = {"later": [], "now": []}
    for call in range(6):  # rank 1 is signalled at call 2; the answer comes one call late
        told["later"].append(agreed.later(rank == 1 and call == 2))
        if told["later"][-1]:
            break  # as Preemption does: every rank stops here
    told["now"].append(agreed.now(rank == 0))  # raised now: answered at once
    told["now"].append(agreed.now(False))
    agreed.later(rank == 1)  # pending when now() is asked: counted
    told["now"].append(agreed.now(False))
    agreed.later(False)
    told["now"].append(agreed.now(False))
    agreed.later(False)
    agreed.settle()
    torch.save(told, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


# Stand-in for SLURM's scontrol: it records the call, and a requeue ends the job's processes
# as SLURM does: all of them (here the run and its children, W&B's service among them), with
# SIGTERM (then SIGKILL after KillWait; "KILL": as if KillWait were 0).
FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "$FAKE_SLURM_LOG"
if [ "$1" = requeue ]; then
  P=$PPID
  (
    sleep "${FAKE_SLURM_DELAY:-0}"
    for pid in $(pgrep -P "$P"); do [ "$pid" != "$$" ] && kill -"$FAKE_SLURM_KILL" "$pid"; done
    kill -"$FAKE_SLURM_KILL" "$P"
  ) >/dev/null 2>&1 &
  [ "${FAKE_SLURM_DELAY:-0}" = 0 ] && wait
fi
exit 0
"""


def fake_scontrol(folder: Path, kill: str = "TERM", delay: float = 0) -> dict[str, str]:
    """Put FAKE_SCONTROL in ``folder``/bin; the environment that finds it first (its calls are
    recorded in ``folder``/scontrol.log). It ends the job with ``kill`` before it returns, or
    ``delay`` seconds after (SLURM signals the job a moment after the requeue call returns)."""
    import os

    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SLURM_LOG": str(folder / "scontrol.log"),
        "FAKE_SLURM_KILL": kill,
        "FAKE_SLURM_DELAY": str(delay),
    }


def fetch_fashion_mnist(data_dir: str, mirror: str, md5s: str, ready: str, go: str) -> None:
    """One job's prepare_data on a fresh machine, against a local mirror of torchvision's
    Fashion-MNIST files (``md5s``: JSON {file name: md5}): says it is ready, waits for the go,
    fetches, then prints a digest of both splits as the job reads them."""
    import hashlib
    import time

    import torchvision

    from litlab.data.sources import FashionMNIST

    torchvision.datasets.FashionMNIST.mirrors = [mirror]
    torchvision.datasets.FashionMNIST.resources = list(json.loads(md5s).items())
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    source = FashionMNIST(data_dir, system_dir=None)
    source.prepare()
    digest = hashlib.sha256()
    for split in ("train", "test"):
        for tensor in source.load(split).tensors:
            digest.update(tensor.numpy().tobytes())
    print(digest.hexdigest())


def resumed_adam(saved: bool | None, built: bool | None, device: str = "cpu") -> dict:
    """Two Adams (fused=saved, fused=built; litlab.models.optim.make_optimizer) on copies of one
    net: the first steps 5 times and its state is loaded, as from a file, into the second; then
    both step 5 more times on the same gradients. Returns the loaded optimizer's first group and
    step counts right after the load, and the nets' parameters at the end."""
    import copy
    import functools

    from torch import nn

    from litlab.models.optim import make_optimizer

    torch.manual_seed(0)
    nets = [nn.Linear(6, 3).to(device) for _ in "ab"]
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers = [
        make_optimizer(functools.partial(torch.optim.Adam, lr=0.01, fused=chosen), net.parameters())
        for net, chosen in zip(nets, (saved, built), strict=True)
    ]
    grads = [[torch.randn_like(p) for p in nets[0].parameters()] for _ in range(10)]

    def step(net: nn.Module, optimizer: torch.optim.Optimizer, g: list[torch.Tensor]) -> None:
        for p, grad in zip(net.parameters(), g, strict=True):
            p.grad = grad.clone()
        optimizer.step()

    for g in grads[:5]:
        step(nets[0], optimizers[0], g)
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers[1].load_state_dict(copy.deepcopy(optimizers[0].state_dict()))  # as from a file
    group = dict(optimizers[1].param_groups[0])
    counts = [optimizers[1].state[p]["step"].clone() for p in nets[1].parameters()]
    for g in grads[5:]:
        for net, optimizer in zip(nets, optimizers, strict=True):
            step(net, optimizer, g)
    params = [list(net.parameters()) for net in nets]
    return {"group": group, "counts": counts, "saved": params[0], "loaded": params[1]}


class RecordMatmulPrecision(Callback):
    """Writes torch's float32 matmul precision as the fit starts."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_fit_start(self, trainer, pl_module) -> None:
        self.path.write_text(torch.get_float32_matmul_precision())


def decay_groups_under_fsdp(rank: int, world: int, init_file: str, out: str) -> None:
    """One process of a gloo job: a classifier's weight-decay groups (decay_norm_and_bias
    false) before and after FSDP wraps it as Lightning's FSDPStrategy does (original
    parameters, each residual block a unit), saved as the groups' sizes (test_distributed)."""
    import functools

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from litlab.models.optim import weight_decay_groups
    from litlab.nets import ResNet
    from litlab.nets.resnet import BasicBlock

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    optimizer = functools.partial(torch.optim.SGD, lr=0.1, weight_decay=5e-4)
    model = ImageClassifier(
        ResNet(1, 10, width=8, depth=[1, 1]), optimizer, num_classes=10, decay_norm_and_bias=False
    )

    def sizes() -> list[int]:
        groups = weight_decay_groups(model.named_parameters(), model.parameter_ndims)
        return [len(group["params"]) for group in groups]

    before = sizes()
    FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({BasicBlock}),
        use_orig_params=True,
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
    )
    flat = all(p.ndim == 1 for p in model.parameters())
    torch.save({"before": before, "after": sizes(), "flat": flat}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def streamed_evaluation_under_fsdp(rank: int, world: int, init_file: str, out: str, chunks: str):
    """One process of a gloo job: a converted test split streamed as litlab evaluates it under
    FSDP (batches padded to the largest count of any rank), each batch through an FSDP-wrapped
    net; saved: every rank's number of batches, the real images' fingerprints, the empty
    batches (test_streaming)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel

    from litlab.data.decode import skip_unreadable
    from litlab.data.streaming import Streaming, streaming_loader_class
    from litlab.distributed.agree import largest_on_any_rank

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dataset = Streaming(chunks, size=8).load("test")
    loader = streaming_loader_class()(  # as litlab.data.DataModule's for an evaluation
        dataset,
        batch_size=4,
        shuffle=False,
        drop_last=False,
        collate_fn=skip_unreadable,
        pad_to=largest_on_any_rank,
    )
    counts: list[Any] = [None] * world
    dist.all_gather_object(counts, len(loader))
    net = FullyShardedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)), device_id=torch.device("cpu")
    )
    seen, empty, batches = [], 0, 0
    if len(set(counts)) == 1:  # else a forward would wait for the other rank forever
        for images, labels, _ in loader:
            batches += 1
            empty += not len(labels)
            images = images.reshape(len(labels), 3, 8, 8)
            net(images.float())  # a collective: every rank the same number of times
            seen += [image.numpy().tobytes() for image in images]
    torch.save(
        {"counts": counts, "batches": batches, "seen": seen, "empty": empty}, f"{out}/rank{rank}.pt"
    )
    dist.destroy_process_group()


def claim_run_folder(barrier: Any, queue: Any, base: str, attempt: int) -> None:
    """A run of a SLURM job (job 77, ``attempt``) asking for its run folder when another does
    (test_distributed: `python train.py ... &` twice in one batch script)."""
    import os

    os.environ.update(SLURM_JOB_ID="77", SLURM_JOB_NAME="train", SLURM_RESTART_COUNT=str(attempt))
    from litlab.resume import run_dir

    barrier.wait()
    queue.put(run_dir(base, "d/t"))


class RecordHostCopies(Callback):
    """Counts the copies of a tensor's value to the host (``aten::_local_scalar_dense``: what
    ``.item()``, ``float(t)``, ``bool(t)`` run; on a GPU each waits for the device) from each
    training batch's start to the next one's, and writes [[batch_idx, copies], ...] as JSON at
    the fit's end. A TorchDispatchMode of the main thread sees the ops on any device."""

    def __init__(self, path: str) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        self.path, self.copies, self.windows = Path(path), 0, []
        owner = self

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._local_scalar_dense.default:
                    owner.copies += 1
                return func(*args, **(kwargs or {}))

        self.mode = Count()

    def on_train_start(self, trainer, pl_module) -> None:
        self.mode.__enter__()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.windows:
            self.windows[-1][1] = self.copies
        self.windows.append([batch_idx, 0])
        self.copies = 0

    def on_train_end(self, trainer, pl_module) -> None:
        self.mode.__exit__(None, None, None)
        self.path.write_text(json.dumps(self.windows[:-1]))  # the last window runs to the end


class RecordBarMetrics(Callback):
    """Writes the values the progress bar shows (its get_metrics) at the fit's end, as JSON."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_end(self, trainer, pl_module) -> None:
        bar = trainer.progress_bar_callback
        shown = {k: v for k, v in bar.get_metrics(trainer, pl_module).items() if k != "v_num"}
        # the training batches the bar shows done in the last epoch, and the batches trained
        shown["bar_batches"] = bar.progress.tasks[bar.train_progress_bar_id].completed
        shown["batches"] = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        self.path.write_text(json.dumps(shown))


class ShardedOnCPU:
    """Lightning's FSDPStrategy on CPU processes (gloo), for tests (a class made on first use:
    importing FSDP here would slow every helper import). Lightning's refuses a CPU accelerator
    and hands torch's FSDP no device: this wraps a module as Lightning does, with the CPU as
    the device; a module already holding FSDP units takes Lightning's own path."""

    def __new__(cls, wrap: list[str] = (), **kwargs: Any) -> Any:
        from hydra.utils import get_class
        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel

        class FSDPWithCPUDevice(FSDPStrategy):
            def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
                if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
                    return super()._setup_model(model)
                model = FullyShardedDataParallel(
                    module=model,
                    sharding_strategy=self.sharding_strategy,
                    device_id=torch.device("cpu"),
                    **self.kwargs,
                )
                policy = self.kwargs.pop("auto_wrap_policy", None)  # kept for the next module
                try:  # Lightning's path for a wrapped module (it drops a policy it finds)
                    return super()._setup_model(model)
                finally:
                    if policy is not None:
                        self.kwargs["auto_wrap_policy"] = policy

        policy = {get_class(name) for name in wrap} or None
        return FSDPWithCPUDevice(auto_wrap_policy=policy, **kwargs)


class StopAfterBatch(Callback):
    """Stops the fit at the end of training batch ``at`` of the first epoch (as max_time's Timer
    does, after the training step) and writes every batch's loss to ``path`` (JSON), by the
    step the loggers stamp it with."""

    def __init__(self, at: int, path: str) -> None:
        self.at, self.path, self.losses = at, Path(path), {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from litlab.compat import logging_step

        self.losses[logging_step(trainer)] = float(outputs["loss"])
        self.path.write_text(json.dumps(self.losses))
        if batch_idx == self.at and trainer.current_epoch == 0:
            trainer.should_stop = True


class RaiseOnRank(Callback):
    """One rank raises at a given training batch (an error of that rank alone: a bad file it
    read, its device): the others wait for it in the next collective."""

    def __init__(self, at_batch: int, rank: int) -> None:
        self.at_batch, self.rank = at_batch, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.at_batch and trainer.global_rank == self.rank:
            raise RuntimeError(f"an error on rank {self.rank} alone")


class SignalInValidation(Callback):
    """Sends a real signal to this process (global rank ``rank``) at the first batch of the
    validation that follows training epoch ``epoch`` (not the sanity check)."""

    def __init__(self, epoch: int, signum: str = "SIGTERM", rank: int = 0) -> None:
        self.epoch, self.signum, self.rank = epoch, signum, rank

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        import os
        import signal

        if (
            not trainer.sanity_checking
            and batch_idx == 0
            and trainer.current_epoch == self.epoch
            and trainer.global_rank == self.rank
        ):
            os.kill(os.getpid(), getattr(signal, self.signum))


class SignalInSetup(Callback):
    """Sends SIGTERM to this process as the fit sets up (before Lightning's signal handling
    and litlab's Preemption: a first decode of a large folder, a job ended while it waits).
    ``mark``, ``signum``: unused (a run resumed from one with SignalInTest keeps its settings)."""

    def __init__(self, mark: str | None = None, signum: str | None = None) -> None:
        self.mark, self.signum = mark, signum

    def setup(self, trainer, pl_module, stage) -> None:
        import os
        import signal

        if stage == "fit":
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInSave(Callback):
    """A second SIGTERM while the stop's checkpoint is written (Preemption.on_exception)."""

    def __init__(self) -> None:
        self.sent = False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        import os
        import signal

        if trainer.received_sigterm and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


class SignalAtFitEnd(Callback):
    """SIGTERM in on_fit_end: after Lightning's signal handling ended, before the run records
    that it trained to its end. ``mark``, ``signum``: unused (SignalInSetup's, on resume)."""

    def __init__(self, mark: str | None = None, signum: str | None = None) -> None:
        self.mark, self.signum = mark, signum

    def on_fit_end(self, trainer, pl_module) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


class SignalAtTrainEnd(Callback):
    """SIGTERM as the fit ends (another callback's on_train_end: EMA's swap, final samples)."""

    def on_train_end(self, trainer, pl_module) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


class LazyNet(torch.nn.Module):
    """A user's net written with lazy layers (no input sizes: torch sizes them at the first
    forward pass)."""

    def __init__(self, num_classes: int = 10, reach_all: bool = True, frozen: bool = False):
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(
            nn.LazyConv2d(8, 3, padding=1), nn.LazyBatchNorm2d(), nn.ReLU(), nn.AdaptiveAvgPool2d(4)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))
        self.unused = None if reach_all else nn.LazyLinear(3)
        if frozen:  # a batch norm the user keeps in eval mode
            self.body[1].eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class LazyGenerator(torch.nn.Module):
    """A user's generator written with lazy layers: latent vectors to images in [-1, 1]."""

    def __init__(self, image_shape: list[int], latent_dim: int = 16) -> None:
        super().__init__()
        nn = torch.nn
        self.latent_dim = latent_dim
        shape = tuple(image_shape)
        self.net = nn.Sequential(
            nn.LazyLinear(32), nn.LazyBatchNorm1d(), nn.ReLU(), nn.LazyLinear(math.prod(shape)),
            nn.Tanh(), nn.Unflatten(1, shape),
        )  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Classifier(ImageClassifier):
    """A module of one's own: litlab's classifier under another name."""


class FavouriteClassNet(torch.nn.Module):
    """A net that predicts one class whatever the image (the model of an unbalanced folder
    that never predicts its small classes)."""

    def __init__(self, num_classes: int, favourite: int = 0, scale: float = 1.0) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(
            scale * torch.nn.functional.one_hot(torch.tensor(favourite), num_classes).float()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(x), -1) + 0 * x.flatten(1)[:, :1]


class NetOf(torch.nn.Module):
    """A net of one's own, wrong as users' nets are (walkthrough 173): ``kind`` "flat64" sized
    for 64 inputs (8x8 images), "tuple" returning (logits, features), "one" one row of logits
    for a whole batch."""

    def __init__(self, kind: str, num_classes: int = 10) -> None:
        super().__init__()
        self.kind = kind
        self.layer = torch.nn.Linear(64 if kind == "flat64" else 784, num_classes)

    def forward(self, x: torch.Tensor) -> Any:
        logits = self.layer(x.flatten(1))
        if self.kind == "tuple":
            return logits, x
        return logits[:1] if self.kind == "one" else logits


class GivenImages(Source):
    """A source of one's own that returns the images and labels it is given (in memory), or,
    with ``one_at_a_time``, a map-style Dataset of them (no TensorDataset)."""

    name = "given"

    def __init__(self, images: Any, labels: Any, one_at_a_time: bool = False) -> None:
        self.images, self.labels, self.one_at_a_time = images, labels, one_at_a_time

    def load(self, split: str) -> torch.utils.data.Dataset:
        tensors = TensorDataset(torch.as_tensor(self.images), torch.as_tensor(self.labels))
        return OneAtATime(tensors) if self.one_at_a_time else tensors


class OneAtATime(torch.utils.data.Dataset):
    def __init__(self, tensors: TensorDataset) -> None:
        self.tensors_of = tensors

    def __len__(self) -> int:
        return len(self.tensors_of)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.tensors_of[i]
        return image, int(label) if not label.is_floating_point() else float(label)


class Ramp(Source):
    """A source of one's own without options: 1x8x8 grey ramps of 3 classes."""

    name = "ramp"

    def load(self, split: str) -> TensorDataset:
        n = 60 if split == "train" else 30
        labels = torch.arange(n) % 3
        images = (labels[:, None, None, None] * 100 + torch.arange(8)).expand(n, 1, 8, 8)
        return TensorDataset(images.to(torch.uint8).contiguous(), labels)


class SpareLayerNet(torch.nn.Module):
    """A classifier with a layer its forward never calls (DDP's unused parameters)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(16))
        self.spare = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))
