"""LitData's streamed dataset, its training epochs cutting a new random share of the images each
epoch (imported only by runs that stream: it imports LitData).

LitData (0.2.76) gives every rank whole batches by cutting the stream of an epoch where its
items run out: the tail of the last chunk in that epoch's chunk order, *before* it shuffles the
items within chunks. With one chunk (any split below LitData's 64 MB a chunk per conversion
worker), or a chunk order that repeats, the same items were never trained on, whatever the
epoch or seed: 57 of 1,273 digits on one process, 121 on two (review 147). Here the epoch's
stream, in LitData's chunk order, starts at a seeded random item of that epoch (the chunk
holding it split there, its first part moved to the end), so the cut falls on another stretch
every epoch and every image is trained on over the epochs. Everything else is LitData's:
which chunks a rank reads and in what order, the items' shuffle within chunks, resuming."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from litdata import StreamingDataset as _StreamingDataset
from litdata.streaming.shuffle import FullShuffle
from litdata.utilities.shuffle import (
    _associate_chunks_and_intervals_to_workers,
    node_shard_fits_in_cache,
)


def rotated(
    indexes: list[int], intervals: list[list[int]], start: int
) -> tuple[list[int], list[list[int]]]:
    """Chunks (their ``indexes`` and LitData intervals: chunk start, first and end item of the
    part read, chunk end) in order, begun at the ``start``-th item read: the chunk holding it
    split there, its part before ``start`` last."""
    for i, (chunk_start, first, end, chunk_end) in enumerate(intervals):
        if start < end - first:
            cut = first + start
            head = [(indexes[i], [chunk_start, cut, end, chunk_end])]
            tail = [(indexes[i], [chunk_start, first, cut, chunk_end])] if cut > first else []
            order = head + list(zip(indexes[i + 1 :], intervals[i + 1 :], strict=True))
            order += list(zip(indexes[:i], intervals[:i], strict=True)) + tail
            return [index for index, _ in order], [interval for _, interval in order]
        start -= end - first
    raise ValueError(f"start {start} past the items read")


class RotatedFullShuffle(FullShuffle):
    """LitData's FullShuffle, each training epoch's stream begun at a seeded random item; on
    several nodes too, every epoch dealt over all ranks as on one node. LitData's own later
    epochs on several nodes deal each node's chunks of the first epoch among that node's ranks
    alone (to keep them in its cache): a node holding more items gave its ranks more batches
    than the other node's (48 and 56 items, review 148; DDP ranks then wait for each other at
    the end), and a chunk shared by two nodes in the first epoch was read by both in every
    later one (its items twice an epoch)."""

    @lru_cache(maxsize=10)  # noqa: B019 - as LitData's (one shuffler a dataset)
    def get_chunks_and_intervals_per_workers(
        self, distributed_env: Any, num_workers: int, batch_size: int, current_epoch: int
    ) -> Any:
        if distributed_env.num_nodes == 1 or not self.drop_last:
            return super().get_chunks_and_intervals_per_workers(
                distributed_env, num_workers, batch_size, current_epoch
            )
        total = sum(self._chunk_byte_sizes())
        self.node_shard_fits = node_shard_fits_in_cache(total, self._max_cache_size())
        return self._global_assign(
            distributed_env,
            self.cache.get_chunk_intervals(),
            num_workers,
            batch_size,
            current_epoch,
        )

    def _global_assign(
        self,
        distributed_env: Any,
        chunk_intervals: Any,
        num_workers: int,
        batch_size: int,
        seed_shift: int,
    ) -> tuple[Any, Any]:
        items = sum(end - first for _, first, end, _ in chunk_intervals)
        if not self.drop_last or items == 0:  # nothing cut: LitData's as it is
            return super()._global_assign(
                distributed_env, chunk_intervals, num_workers, batch_size, seed_shift
            )
        # LitData's chunk order (FullShuffle._global_assign), then the start
        order = np.random.RandomState([self.seed, seed_shift]).permutation(len(chunk_intervals))
        intervals = np.asarray(chunk_intervals)[order].tolist()
        start = int(np.random.RandomState([self.seed, seed_shift, 1]).randint(items))
        indexes, intervals = rotated(order.tolist(), intervals, start)
        return _associate_chunks_and_intervals_to_workers(
            distributed_env, indexes, intervals, self.drop_last, num_workers, batch_size
        )


class StreamingDataset(_StreamingDataset):
    """LitData's StreamingDataset with RotatedFullShuffle where it would take FullShuffle;
    ``cut_at_random`` False: LitData's own (an epoch continued from a checkpoint of a run that
    streamed with it, CUT in its loader state, goes on as it began)."""

    cut_at_random = True

    def _create_shuffler(self, cache: Any) -> Any:
        shuffler = super()._create_shuffler(cache)
        if type(shuffler) is FullShuffle and self.cut_at_random:
            shuffler.__class__ = RotatedFullShuffle  # its state as LitData made it
        return shuffler


# The loader state's key saying its epochs were cut at random (absent: LitData's cut).
CUT = "litlab_cut_at_random"
