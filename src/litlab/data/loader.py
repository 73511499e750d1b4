"""A loader for splits that fit in memory: whole uint8 batches indexed on the device, no workers.

Per-sample Python (Dataset.__getitem__, collate) caps small-image training far below what a GPU
does; indexing one uint8 tensor that already lives on the device does not (docs/benchmarks.md).

How Lightning drives it (lightning 2.6; read loops/fit_loop.py and utilities/combined_loader.py):
- It is no ``torch.utils.data.DataLoader``, so Lightning never injects a DistributedSampler:
  each rank takes its own shard here (``ShardSampler``), from the trainer's rank and world size.
- At every epoch start Lightning calls ``loader.sampler.set_epoch(epoch)``, as for a
  DistributedSampler; that alone puts a run resumed from an end-of-epoch checkpoint on the
  right epoch's order (Lightning loads loader state only when an epoch was cut short).
- ``state_dict`` / ``load_state_dict`` make it a stateful loader: checkpoints store
  ``{"epoch", "position"}`` under ``loops.fit_loop.state_dict.combined_loader``, and a run
  resumed mid-epoch yields the rest of that epoch's batches. The position counts batches, so
  resuming with another batch size or world size continues at the same step, not the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from litlab.errors import ConfigError


class ShardSampler:
    """This rank's share of every epoch's order: DistributedSampler's contract, as one tensor.

    The order is ``randperm`` from a CPU generator seeded with (seed, epoch), so it is the same on
    every device and rank, and the global RNG is neither read nor advanced. Rank r takes every
    W-th index from r on. When the size does not divide by W, ``drop_last`` drops the tail
    (training: every sample at most once per epoch); otherwise the order is padded by repeating
    its start, as Lightning's DistributedSampler does for evaluation under DDP, so up to W-1
    samples count twice in a distributed evaluation.
    """

    def __init__(
        self,
        size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need size >= 1 and 0 <= rank < world_size, got {size, rank, world_size}"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.size = size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.num_samples = size // world_size if drop_last else -(-size // world_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``indices`` returns (Lightning calls this every epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

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
        total = self.num_samples * self.world_size
        order = order.repeat(-(-total // self.size))[:total]
        return order[self.rank :: self.world_size]


class DeviceLoader:
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
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.device = torch.device(device)
        self.sampler = ShardSampler(len(self.rows), shuffle, drop_last, seed, rank, world_size)
        # Lightning reads .batch_sampler wherever it finds .sampler (as on a torch DataLoader).
        self.batch_sampler = None
        self._progress = (0, 0)  # (epoch, batches of it handed out)
        self._resume = False
        # How many of the epoch's batches the trainer counts as trained when it resumes: a
        # checkpoint written inside a batch (Lightning's SLURM handler saves in the signal
        # handler) holds a position one ahead, and the trainer runs that batch again.
        self._trained = trained

    def __len__(self) -> int:
        whole, rest = divmod(len(self.sampler), self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # A generator: nothing below runs before the first next(). Lightning calls iter() before
        # set_epoch (and to probe the loader), so the epoch is read at the first batch.
        epoch = self.sampler.epoch
        resumed_epoch, position = self._progress
        start = position if self._resume and resumed_epoch == epoch else 0
        if self._resume and self._trained is not None:
            start = min(start, self._trained())
        self._resume = False
        self._progress = (epoch, start)
        if self.images.device != self.device:
            self.images, self.labels = self.images.to(self.device), self.labels.to(self.device)
        order = self.rows[self.sampler.indices()].to(self.device)
        for b in range(start, len(self)):
            index = order[b * self.batch_size : (b + 1) * self.batch_size]
            self._progress = (epoch, b + 1)
            yield self.images[index], self.labels[index]
        self.sampler.set_epoch(epoch + 1)

    def state_dict(self) -> dict[str, int]:
        """The epoch and how many of its batches were handed out: enough to continue mid-epoch
        (with the batches' layout: ranks, batch size, batches in the epoch)."""
        epoch, position = self._progress
        if epoch != self.sampler.epoch:  # set_epoch moved on: nothing of the new epoch handed out
            epoch, position = self.sampler.epoch, 0
        layout = {"world_size": self.sampler.world_size, "batch_size": self.batch_size}
        return {"epoch": epoch, "position": position, "batches": len(self), **layout}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a ``state_dict``: the next pass yields that epoch's remaining batches.
        Mid-epoch, only with the same ranks and batch size: a position counted in other batches
        would skip some of the epoch's images and repeat others."""
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
        self.sampler.set_epoch(state["epoch"])
        self._progress = (state["epoch"], state["position"])
        self._resume = True
