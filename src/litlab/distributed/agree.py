"""This process's place in the process group, and flags that every rank must agree on during
training without a host sync in the step."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from litlab.errors import ConfigError


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) in torch.distributed's default group; (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class AnyRank:
    """Whether any rank raised a flag, agreed on by every rank.

    ``later(raised)`` hands this rank's flag to an asynchronous all-reduce and returns the one
    handed over at the previous call: every rank gets the same answer at the same call, one
    call late, and the step does not wait for the device (an all-reduce read at once stalls
    the host until the device has finished the whole step: under NCCL, a sync per batch). On a
    CUDA device the result travels to pinned host memory behind an event, so that reading it a
    step later waits only for the step before. ``now(raised)`` answers at once (with the
    pending flag too): for the places where waiting costs nothing, such as an epoch's end.
    Every rank must call the same methods in the same order (they are collectives).
    """

    def __init__(self, device: torch.device) -> None:
        self._value = torch.zeros(1, device=device)
        cuda = device.type == "cuda"
        self._host = torch.zeros(1, pin_memory=True) if cuda else self._value
        self._event = torch.cuda.Event() if cuda else None
        self._work: dist.Work | None = None

    def _launch(self, raised: bool) -> None:
        self._value.fill_(float(raised))  # a kernel with the value as its argument: no copy
        work = dist.all_reduce(self._value, op=dist.ReduceOp.MAX, async_op=True)
        if self._event is not None:
            work.wait()  # the current stream waits for the all-reduce; the host does not
            self._host.copy_(self._value, non_blocking=True)
            self._event.record()
        self._work = work

    def _pending(self) -> bool:
        """The flag handed over by the last launch (False if none), waited for."""
        work, self._work = self._work, None
        if work is None:
            return False
        if self._event is not None:
            self._event.synchronize()
        else:
            work.wait()
        return bool(self._host.item())

    def later(self, raised: bool) -> bool:
        """Whether any rank raised its flag at the previous call; hands over this one."""
        agreed = self._pending()
        if not agreed:  # else every rank stops here: nothing more to hand over
            self._launch(raised)
        return agreed

    def now(self, raised: bool) -> bool:
        """Whether any rank raised its flag, at the previous call or this one."""
        agreed = self._pending()
        self._launch(raised)
        return self._pending() or agreed

    def settle(self) -> None:
        """Wait for a flag still being handed over and forget it (the loop ended)."""
        self._pending()


def largest_on_any_rank(value: int) -> int:
    """The largest of every rank's ``value``: a collective, which every rank calls together."""
    _, world = rank_and_world()
    if world == 1:
        return value
    cuda = dist.get_backend() == "nccl"  # NCCL reduces device tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    largest = torch.tensor([value], device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest.item())


class OnePrecision(Callback):
    """Every rank computes at one precision, or the run stops before anything trains.

    trainer.precision=auto is resolved by each process on its own hardware: under torchrun or
    srun a job spanning node types (bf16 CPUs and others; a V100 node's 16-mixed with an
    A100's bf16-mixed) trained its ranks at different precisions, and DDP averaged a
    GradScaler's scaled gradients with unscaled ones (weights apart by orders of magnitude
    within 3 steps, found by review). One all_gather of the names at each setup."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        _, world = rank_and_world()
        if world == 1:
            return
        every: list[Any] = [None] * world
        dist.all_gather_object(every, str(trainer.precision))
        if len(set(every)) > 1:
            ranks: dict[str, list[int]] = {}
            for rank, precision in enumerate(every):
                ranks.setdefault(precision, []).append(rank)
            found = "; ".join(f"{p} on rank(s) {', '.join(map(str, r))}" for p, r in ranks.items())
            raise ConfigError(
                f"the ranks would compute at different precisions ({found}: trainer.precision="
                "auto picks by each machine's hardware, and these differ); DDP would average "
                "their gradients as if alike: set trainer.precision to one all of them run, "
                "e.g. trainer.precision=32-true"
            )
