"""Random streams that differ between ranks and come back exactly after a restart.

Every DDP rank is seeded with the run's seed, so any draw from the global generators is the same
on every rank: a GAN's noise, augmentation parameters and dropout masks would repeat across
ranks. litlab therefore draws from streams whose seed mixes the run's seed with the global rank:

- ``stream(seed, rank, name, step)``: a torch.Generator for one use, seeded from all four. A GAN
  draws the noise of training batch ``step`` from it, so ranks draw distinct noise and a resumed
  run draws exactly what an uninterrupted one would (the step counters are in the checkpoint),
  whatever the number of ranks it resumes on.
- ``seed_rank(seed, rank)``: reseeds a rank's global generators (rank 0 with the run's seed,
  the others with seeds mixed from it and their rank), which litlab's models do at the start of
  every multi-process fit (``RankSeeded``, whatever callbacks a run has; a single-process run
  is not reseeded there, so its draws after the model's initialization differ from rank 0's);
  the RNGState callback saves and restores each rank's global generators with the checkpoint.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

_STREAMS = {"train": 1, "fid": 2, "generate": 3, "loader": 4, "eval": 5}


def mixed_seed(*parts: int) -> int:
    """One 63-bit seed from several integers (numpy's SeedSequence): (1, 0) and (0, 1) differ."""
    entropy = [int(p) % 2**64 for p in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def stream(
    seed: int, rank: int, name: str, step: int = 0, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator on ``device`` for stream ``name`` ("train", "fid", "generate", "loader") of
    ``rank`` at ``step``: distinct for every (seed, rank, name, step), the same on every call."""
    generator = torch.Generator(device=device)
    generator.manual_seed(mixed_seed(seed, rank, _STREAMS[name], step))
    return generator


def seed_rank(seed: int, rank: int) -> None:
    """Seed this process's global generators (torch, CUDA, numpy, random) for ``rank``.

    Rank 0 takes ``seed`` itself; other ranks a seed mixed from (seed, rank). Lightning's
    PL_GLOBAL_SEED is left alone: loaders read it for the epoch order, which all ranks share.
    """
    value = seed if rank == 0 else mixed_seed(seed, rank)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % 2**32)


class RankSeeded:
    """LightningModule mixin: at the start of a multi-process fit (``setup``, once the ranks are
    known, before a checkpoint's states are restored), every rank reseeds its global generators
    (``seed_rank``), so that augmentation and dropout differ between ranks."""

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        trainer = self.trainer  # type: ignore[attr-defined]
        if stage == "fit" and trainer.world_size > 1:
            seed_rank(int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank)
