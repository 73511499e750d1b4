"""Reading litlab checkpoints safely (weights_only) with one-line errors for bad files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from litlab.errors import CheckpointError, first_line
from litlab.files import atomic_file

# ckpt_path values that Lightning's Trainer resolves itself (trainer.fit/test(ckpt_path=...)).
LIGHTNING_SHORTHANDS = ("last", "best", "hpc", "registry")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file on the CPU without unpickling arbitrary objects."""
    if str(path) in LIGHTNING_SHORTHANDS:
        raise CheckpointError(
            f"ckpt_path={path} is Lightning's name for a checkpoint of the trainer at hand, which "
            "a new litlab run does not have: continue a run with python train.py "
            "resume=<run folder> (its newest checkpoint), or pass a .ckpt file, e.g. "
            f"outputs/train/<date>/<time>/checkpoints/{'best' if str(path) == 'best' else 'last'}.ckpt"
        )
    path = Path(path)
    if (path / "meta.pt").is_file():  # Lightning's sharded checkpoint: a folder of shards
        raise CheckpointError(
            f"ckpt_path={path} is a sharded FSDP checkpoint (one shard per rank); consolidate it "
            "into one file with python -m lightning.pytorch.utilities.consolidate_checkpoint "
            f"{path}, then pass ckpt_path={path}.consolidated"
        )
    if path.is_dir():  # a run folder: resume= takes one, ckpt_path a file in it
        found = sorted(str(p) for p in path.glob("checkpoints/*.ckpt"))
        best = _sweeps_best(path)  # a sweep's folder: its best job's (walkthrough 146)
        raise CheckpointError(
            f"ckpt_path={path} is a folder; pass a .ckpt file"
            + (
                f", e.g. the sweep's best, {best}"
                if best
                else f", e.g. {found[0]} (of {len(found)} there)"
                if found
                else " (none in its checkpoints/)"
            )
        )
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass the path of a .ckpt file, "
            "e.g. ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load fails in many ways on a foreign or truncated file
        # not a zip archive, as torch.save writes: torch's words (its weights_only advice,
        # cut mid-sentence: walkthrough 186) say nothing of use
        zipped = zipfile.is_zipfile(path)
        reason = first_line(e, 160) if zipped else "not a file torch.save wrote"
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({reason}); it may be truncated or from another "
            "program: use a .ckpt file written by litlab"
        ) from e
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path} holds no model weights (no state_dict); use a .ckpt file written by litlab"
        )
    return checkpoint


def checkpoint_step(path: str | Path | None) -> int | None:
    """The optimizer steps a checkpoint file's weights had taken (Lightning's global_step), read
    without loading its tensors; None for none or a folder (a sharded checkpoint). Recorded
    beside a tested checkpoint's path: a run extended later (resume= trainer.max_epochs=...)
    writes other weights under the same name, best.ckpt."""
    if path is None or not Path(path).is_file():
        return None
    checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    return checkpoint.get("global_step") if isinstance(checkpoint, dict) else None


def stored_config(checkpoint: dict[str, Any], path: str | Path) -> DictConfig:
    """The resolved run config that litlab stores in every checkpoint's hyperparameters."""
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or not isinstance(hparams.get("model"), dict):
        raise CheckpointError(
            f"{path} carries no litlab config (it was not written by litlab's train task); "
            "use a checkpoint from a litlab run folder"
        )
    return OmegaConf.create(hparams)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint writes that never leave a truncated file where a good one was.

    The checkpoint is written to a temporary file in the same folder, flushed to disk, then
    renamed over the target (rename is atomic within a filesystem). Lightning's own save goes
    through a temporary file in the system temp folder, which is a copy, not a rename, when
    that folder is on another filesystem (typical on clusters).
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if "://" in str(path):  # remote storage: keep Lightning's fsspec transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_file(path) as f:
            torch.save(checkpoint, f)


def early_stopping_states(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The EarlyStopping callbacks' states a checkpoint holds (Lightning keys each by its class
    name and settings: "EarlyStopping{'monitor': ...}")."""
    return [
        state
        for key, state in (checkpoint.get("callbacks") or {}).items()
        if str(key).startswith("EarlyStopping") and isinstance(state, dict)
    ]


def data_state(checkpoint: dict[str, Any], stored: DictConfig) -> dict[str, Any]:
    """The training DataModule's state in the checkpoint (Lightning keys it by class name)."""
    target = str(OmegaConf.select(stored, "data._target_") or "")
    return checkpoint.get(target.rsplit(".", 1)[-1], {})


def _sweeps_best(folder: Path) -> str | None:
    """The best job's checkpoint a sweep folder's sweep_summary.json names, if any."""
    try:
        summary = json.loads((folder / "sweep_summary.json").read_text())
        return (summary.get("best") or {}).get("best_checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
