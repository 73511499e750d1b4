"""Loaders that deal each rank its shard of a seeded epoch order and resume mid-epoch exactly.

``DeviceLoader``, for splits that fit in memory: whole uint8 batches indexed on the device, no
workers. Per-sample Python (Dataset.__getitem__, collate) caps small-image training far below
what a GPU does; indexing one uint8 tensor that already lives on the device does not
(docs/benchmarks.md). ``ResumableDataLoader``: torch's DataLoader (files decoded in its
workers) with the same order, sharding and resume.

How Lightning drives them (lightning 2.6; read loops/fit_loop.py, utilities/combined_loader.py
and trainer/connectors/data_connector.py):
- Each rank takes its own shard (``ShardSampler``), from the trainer's rank and world size.
  DeviceLoader is no torch DataLoader, so Lightning leaves it alone; on a torch DataLoader
  Lightning keeps a sampler that is a DistributedSampler, which ShardSampler is.
- At every epoch start Lightning calls ``loader.sampler.set_epoch(epoch)``, as for a
  DistributedSampler; that alone puts a run resumed from an end-of-epoch checkpoint on the
  right epoch's order (Lightning loads loader state only when an epoch was cut short).
- ``state_dict`` / ``load_state_dict`` (``Resumable``) make them stateful loaders: checkpoints
  store ``{"epoch", "position", ...}`` under ``loops.fit_loop.state_dict.combined_loader``, and a
  run resumed mid-epoch yields the rest of that epoch's batches. The position counts batches
  of one epoch's order of the split: continuing an epoch with another batch size, number of
  ranks or number of training images is refused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler

from litlab import rng
from litlab.errors import ConfigError

log = logging.getLogger(__name__)
_SAID: set[tuple[int, int, int, int]] = set()


def even_batch_size(size: int, world_size: int, batch_size: int) -> int | None:
    """The largest batch size up to ``batch_size`` at which ``size`` samples, dealt to
    ``world_size`` ranks each once (a rank holds size // W of them or one more), make the same
    number of batches on every rank; where none does (batches of one or two, with a remainder),
    the smallest above it; None with fewer samples than ranks."""
    low = size // world_size
    if size % world_size == 0:
        return batch_size
    if low == 0:
        return None
    # b fails only where it divides low: a step or two down, or up (low + 1 never divides low)
    for b in [*range(batch_size, 1, -1), *range(batch_size + 1, low + 2)]:
        if -(-low // b) == -(-(low + 1) // b):
            return b
    return None


class ShardSampler(DistributedSampler):
    """This rank's share of every epoch's order: DistributedSampler's contract, as one tensor.

    The order is ``randperm`` from a CPU generator seeded with (seed, epoch), so it is the same on
    every device and rank, and the global RNG is neither read nor advanced. Rank r takes every
    W-th index from r on. When the size does not divide by W, ``drop_last`` drops the tail
    (training: every sample at most once per epoch). Evaluation (no ``drop_last``) with a
    ``batch_size`` deals every sample exactly once, in the same number of batches on every rank
    (each rank's evaluation steps may be collectives, as under FSDP), at ``batch_size`` or the
    nearest size that allows it (``even_batch_size``: below, or above for batches of one or
    two); with fewer samples than ranks (an evaluation split the DataModule refuses), and
    without a batch size, the order is padded by repeating its start, as Lightning's
    DistributedSampler does, so up to W-1 samples count twice. ``batch_size`` is then the size
    to batch with.

    A DistributedSampler, so that Lightning keeps it on a torch DataLoader under DDP (it
    replaces any other sampler with its own); iterating it leaves out the first ``skip``
    indices (a resumed epoch, without reading the images it already trained on:
    ``ResumableDataLoader`` sets it at each pass; torch's DataLoader may iterate the sampler
    twice when a pass starts).
    """

    def __init__(
        self,
        size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        batch_size: int | None = None,
    ) -> None:
        if size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need size >= 1 and 0 <= rank < world_size, got {size, rank, world_size}"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        super().__init__(
            range(size),
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.size = size
        self.batch_size = batch_size
        even = None
        if not drop_last and batch_size is not None:
            even = even_batch_size(size, world_size, batch_size)
        if even is not None:  # every sample once: this rank's share, no padding
            said = (size, world_size, batch_size, even)
            if even != batch_size and rank == 0 and said not in _SAID:
                _SAID.add(said)
                log.info(
                    "evaluation batch size %d, not %d: %d images in as many batches on each "
                    "of %d ranks, each image once",
                    even,
                    batch_size,
                    size,
                    world_size,
                )
            self.batch_size = even
            self.total_size = size
            self.num_samples = len(range(rank, size, world_size))
        else:
            self.num_samples = size // world_size if drop_last else -(-size // world_size)
            self.total_size = self.num_samples * world_size
        self.skip = 0

    def unshuffled(self) -> ShardSampler:
        """The same sampler without shuffling."""
        return ShardSampler(
            self.size,
            False,
            self.drop_last,
            self.seed,
            self.rank,
            self.world_size,
            self.batch_size,
        )

    @property
    def world_size(self) -> int:
        return self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``indices`` returns (Lightning calls this every epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices()[self.skip :].tolist())

    def indices(self) -> Tensor:
        """This rank's sample indices for the current epoch, in order (int64, CPU)."""
        if self.shuffle:
            # torch's CPU generator keeps only the low 32 bits of its seed, and seed + epoch (as in
            # DistributedSampler) makes (1, 0) and (0, 1) alike: mix both into 32 bits instead.
            mixed = np.random.SeedSequence([self.seed, self.epoch]).generate_state(1)[0]
            generator = torch.Generator().manual_seed(int(mixed))
            order = torch.randperm(self.size, generator=generator)
        else:
            order = torch.arange(self.size)
        order = order.repeat(-(-self.total_size // self.size))[: self.total_size]
        return order[self.rank :: self.world_size]


class Resumable:
    """A loader's place in its epochs, for Lightning's stateful-loader interface: checkpoints
    store ``{"epoch", "position", ...}`` under ``loops.fit_loop.state_dict.combined_loader``,
    and a run resumed mid-epoch yields the rest of that epoch's batches.

    The position counts the batches handed out, capped by what the trainer counts as trained
    (``trained``): a checkpoint written inside a batch (Lightning's SLURM handler saves in the
    signal handler) or after Lightning fetched the next batch holds a position ahead, and the
    trainer runs those batches again. Subclasses have ``sampler`` (a ``ShardSampler``) and
    ``batch_size``, call ``_start`` when a pass begins and ``_handed`` for each batch.
    """

    sampler: ShardSampler
    batch_size: int

    def _init_position(self, trained: Callable[[], int] | None) -> None:
        self._progress = (0, 0)  # (epoch, batches of it handed out)
        self._resume = False
        self.trained = trained

    def _start(self) -> tuple[int, int]:
        """The epoch of the pass that begins, and its first batch (0 unless resumed into it)."""
        epoch = self.sampler.epoch
        resumed_epoch, position = self._progress
        start = position if self._resume and resumed_epoch == epoch else 0
        if self._resume and self.trained is not None:
            start = min(start, self.trained())
        self._resume = False
        self._progress = (epoch, start)
        return epoch, start

    def _handed(self, epoch: int, batches: int) -> None:
        self._progress = (epoch, batches)

    def state_dict(self) -> dict[str, int]:
        """The epoch and how many of its batches were handed out: enough to continue mid-epoch
        (with the batches' layout: ranks, batch size, batches in the epoch, images in the split)."""
        epoch, position = self._progress
        if epoch != self.sampler.epoch:  # set_epoch moved on: nothing of the new epoch handed out
            epoch, position = self.sampler.epoch, 0
        layout = {
            "batches": len(self),  # type: ignore[arg-type]
            "samples": self.sampler.size,
            "world_size": self.sampler.world_size,
            "batch_size": self.batch_size,
        }
        return {"epoch": epoch, "position": position, **layout}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a ``state_dict``: the next pass yields that epoch's remaining batches.
        Mid-epoch, only with the same ranks, batch size and split: a position counted in other
        batches, or in the order of another number of images (a folder that gained or lost
        files), would skip some of the epoch's images and repeat others."""
        then = (state.get("world_size"), state.get("batch_size"))
        now = (self.sampler.world_size, self.batch_size)
        # older states keep no layout ("batches" absent): taken as they are
        mid_epoch = 0 < state["position"] < state.get("batches", 0)
        if mid_epoch and then != now:
            raise ConfigError(
                "this checkpoint stopped mid-epoch with (ranks, data.batch_size) = "
                f"{then}, this run has {now}: resume with the same values (or from a checkpoint "
                "written at an epoch's end)"
            )
        # states written before "samples" was kept: their number of batches tells some changes
        if "samples" in state:
            split = (state["samples"], self.sampler.size, "training images")
        else:
            split = (state.get("batches"), len(self), "training batches")  # type: ignore[arg-type]
        if mid_epoch and split[0] != split[1]:
            raise ConfigError(
                f"this checkpoint stopped mid-epoch of {split[0]} {split[2]}, this run has "
                f"{split[1]} (the training split changed): resume with the same files (or from "
                "a checkpoint written at an epoch's end)"
            )
        self.sampler.set_epoch(state["epoch"])
        self._progress = (state["epoch"], state["position"])
        self._resume = True


class DeviceLoader(Resumable):
    """Batches of (uint8 images, int64 labels) from tensors moved once to ``device``.

    ``len()`` is this rank's batches per epoch. The epoch advances when Lightning calls
    ``sampler.set_epoch`` or when a pass runs to its end; a new ``iter()`` starts the epoch from
    its first batch unless ``load_state_dict`` just set a position inside it.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        rows: Tensor | None = None,
        trained: Callable[[], int] | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or labels.shape != images.shape[:1]:
            raise ValueError(
                f"need uint8 images [N, C, H, W] and N labels, got {images.dtype} "
                f"{tuple(images.shape)} and {tuple(labels.shape)}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.images = images
        self.labels = labels.long()
        # The split's rows of images/labels (a view of a larger array, e.g. train within
        # train+val); all of them when None.
        self.rows = torch.arange(len(labels)) if rows is None else rows.long()
        self.drop_last = drop_last
        self.device = torch.device(device)
        self.sampler = ShardSampler(
            len(self.rows), shuffle, drop_last, seed, rank, world_size, batch_size
        )
        self.batch_size: int = self.sampler.batch_size  # type: ignore[assignment]
        # Lightning reads .batch_sampler wherever it finds .sampler (as on a torch DataLoader).
        self.batch_sampler = None
        self._init_position(trained)

    def __len__(self) -> int:
        whole, rest = divmod(len(self.sampler), self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # A generator: nothing below runs before the first next(). Lightning calls iter() before
        # set_epoch (and to probe the loader), so the epoch is read at the first batch.
        epoch, start = self._start()
        if self.images.device != self.device:
            self.images, self.labels = self.images.to(self.device), self.labels.to(self.device)
        order = self.rows[self.sampler.indices()].to(self.device)
        for b in range(start, len(self)):
            index = order[b * self.batch_size : (b + 1) * self.batch_size]
            self._handed(epoch, b + 1)
            yield self.images[index], self.labels[index]
        self.sampler.set_epoch(epoch + 1)


# The signals that stop a run at a batch boundary (litlab.callbacks.preemption: SIGTERM,
# SIGUSR1, submitit's SIGUSR2). Sent to a whole process group (scancel, SLURM's --signal,
# kill -- -PGID) they reach the loader's workers and their forkserver too.
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")


def reader_context(num_workers: int, *preload: str) -> Any:
    """The multiprocessing context for loader workers that read files (their dataset is a list
    of files or chunks: cheap to send to a worker): "forkserver" where the default would fork.

    A worker forked from the training process can hang for good in Python 3.11: the fork copies
    the interpreter's thread-state lock held by whichever thread was starting or ending at that
    moment (the previous pass's queue feeder threads end as its workers are shut down), and the
    child waits on it before it can reset it (CPython runs the two in that order until 3.12;
    seen here as a DDP rank stuck at a new pass, its worker in PyOS_AfterFork_Child). A
    forkserver forks workers from a process of one thread, started once per rank with torch
    and litlab imported (about 4 s, once); Python 3.14 makes it the default for this reason.
    In-memory datasets keep fork: sending them to a worker would copy them.

    The server also imports what litlab's scripts import (litlab.train, litlab.evaluate) and
    ``preload`` (LitData for a stream). multiprocessing runs the main script again in each
    worker it starts (as __mp_main__; Python 3.11's forkserver ignores a "__main__" preload:
    it looks for the script under a key its preparation data lacks), and LitData is imported
    on unpickling the worker's dataset: each worker would import Hydra, torch-fidelity,
    LitData... at every pass (a stream's workers are not persistent).
    Measured: an 8-epoch streamed digits run's fit in 16.0-16.9 s instead of 18.9-19.7 (2 CPU
    cores, 1 worker, alternating pairs, 2026-12-03)."""
    if num_workers == 0 or multiprocessing.get_context().get_start_method() != "fork":
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["litlab.evaluate", "litlab.train", "litlab.data.folder", "litlab.data.streaming", *preload]
    )
    # Started here with the stop signals ignored, which the server keeps (an exec keeps ignored
    # signals; not a blocked mask) and passes to what it forks: a worker ends when the process
    # that forked it does (torch's watchdog), and a stop signal to the whole process group
    # ended the server, then every worker with it. This process ignores them for the moment
    # of the server's fork and exec (milliseconds, once a process: before training starts).
    # The server still ends when this process does (its "alive" pipe closes).
    if getattr(_forkserver(), "_forkserver_pid", None) is not None:
        return context  # started (by an earlier loader of this process)
    if threading.current_thread() is not threading.main_thread():
        return context  # (signal handlers are set in the main thread only)
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in map(signal_number, STOP_SIGNALS)}
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as e:  # its socket lives in the temporary folder: at most 107 bytes a path
        if "AF_UNIX path too long" not in str(e):
            raise
        raise ConfigError(
            f"the loader workers' server could not make its socket under the temporary folder "
            f"{tempfile.gettempdir()} (AF_UNIX path too long: Python's socket path holds at "
            "most 107 bytes); set a shorter TMPDIR (e.g. export TMPDIR=/tmp) or "
            "data.num_workers=0"
        ) from e
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return context


def _forkserver() -> Any:
    """multiprocessing's forkserver client of this process (private state: its pid, its "alive"
    pipe), None where multiprocessing has none."""
    return getattr(multiprocessing.forkserver, "_forkserver", None)


def signal_number(name: str) -> signal.Signals:
    return getattr(signal, name)


def init_worker(worker_id: int, rank: int, seed_workers: bool, trainer: int) -> None:
    """A loader worker's start: stop signals from any process but the training one (pid
    ``trainer``) ignored, the forkserver let go, then Lightning's worker seeding where
    ``seed_everything(workers=True)`` asked for it (Lightning adds its own only to a loader that
    has none). A worker a stop signal to the process group ended took the run with it:
    "DataLoader worker exited unexpectedly" at the next batch, which the stop still needs (ranks
    agree a batch later; a validation), and no checkpoint. The training process's own SIGTERM
    (torch's and multiprocessing's way to end a worker that does not stop) still ends it."""
    _let_go_of_the_forkserver()
    _end_on_the_trainers_sigterm_only(trainer)
    if seed_workers:
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id, rank)


def _let_go_of_the_forkserver() -> None:
    """A forkserver's child holds the server's "alive" pipe, so the server, which ends when that
    pipe closes, outlived a training process killed by SIGKILL, and its workers (which end when
    their parent, the server, does) with it."""
    server = _forkserver()
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None


def _end_on_the_trainers_sigterm_only(trainer: int) -> None:
    """The stop signals blocked in this worker, and a thread that takes them: SIGTERM from the
    training process ends the worker (as its default action would), any other is dropped.
    Where signals cannot be waited for (macOS), a signal to the group ends the worker, as it did."""
    if not hasattr(signal, "sigwaitinfo"):
        return
    numbers = set(map(signal_number, STOP_SIGNALS))
    signal.pthread_sigmask(signal.SIG_BLOCK, numbers)  # threads started later inherit it

    def wait() -> None:
        while True:
            received = signal.sigwaitinfo(numbers)
            if received.si_signo == signal.SIGTERM and received.si_pid == trainer:
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="litlab-stop-signals", daemon=True).start()


def worker_init(rank: int) -> Callable[[int], None]:
    """``worker_init_fn`` for loaders with workers (a partial: workers started by a forkserver
    or spawned unpickle it), built in the training process."""
    seed_workers = bool(int(os.environ.get("PL_SEED_WORKERS", 0)))
    return functools.partial(init_worker, rank=rank, seed_workers=seed_workers, trainer=os.getpid())


class ResumableDataLoader(Resumable, DataLoader):
    """torch's DataLoader (file-backed sources: decoding in its workers), resumable mid-epoch
    like ``DeviceLoader``: each epoch's order comes from a ``ShardSampler`` seeded with (seed,
    epoch), not from the global generator, which a resumed run restores as it was mid-epoch, not
    at the epoch's start; a resumed pass starts at the first untrained batch without reading the
    files before it. The workers' seeds come from the rank's own "loader" stream, so iterating
    draws nothing from the global generator either. ``order`` is a ShardSampler of the
    dataset's size, with the batch size; other keyword arguments go to DataLoader."""

    def __init__(
        self,
        dataset: Dataset,
        order: ShardSampler,
        trained: Callable[[], int] | None = None,
        sampler: Sampler | None = None,
        batch_sampler: Sampler | None = None,
        **kwargs: Any,
    ) -> None:
        self.order = order  # Lightning rebuilds the loader from its arguments, read back
        # as attributes (trained: Resumable's)
        kwargs.setdefault("generator", rng.stream(order.seed, order.rank, "loader"))
        if kwargs.get("num_workers", 0) > 0:
            kwargs.setdefault("worker_init_fn", worker_init(order.rank))
        self._init_position(trained)
        if batch_sampler is not None:
            # trainer.predict: Lightning's batches (of this order's indices), nothing to resume
            for taken in ("batch_size", "drop_last", "shuffle"):
                kwargs.pop(taken, None)
            super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
            return
        # trainer.overfit_batches: Lightning passes a SequentialSampler (and shuffle=False): the
        # same order unshuffled, still sharded and resumable.
        if sampler is not None and not isinstance(sampler, SequentialSampler):
            raise ValueError(f"ResumableDataLoader deals its own order, got {sampler!r}")
        if sampler is not None:
            order = order.unshuffled()
        if order.batch_size is None:
            raise ValueError("order needs a batch_size")
        super().__init__(
            dataset,
            batch_size=order.batch_size,
            sampler=order,
            drop_last=order.drop_last,
            **kwargs,
        )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if not isinstance(self.sampler, ShardSampler):  # Lightning's predict batches
            yield from super().__iter__()
            return
        epoch, start = self._start()
        self.sampler.skip = start * self.batch_size  # type: ignore[operator]
        for b, batch in enumerate(super().__iter__(), start=start + 1):
            self._handed(epoch, b)
            yield batch
        self.sampler.set_epoch(epoch + 1)
