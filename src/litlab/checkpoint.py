"""Reading litlab checkpoints safely (weights_only) with one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from litlab.errors import CheckpointError


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file on the CPU without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass the path of a .ckpt file, "
            "e.g. ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load fails in many ways on a foreign or truncated file
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({reason}); it may be truncated or from another "
            "program: use a .ckpt file written by litlab"
        ) from e
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path} holds no model weights (no state_dict); use a .ckpt file written by litlab"
        )
    return checkpoint


def stored_config(checkpoint: dict[str, Any], path: str | Path) -> DictConfig:
    """The resolved run config that litlab stores in every checkpoint's hyperparameters."""
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or not isinstance(hparams.get("model"), dict):
        raise CheckpointError(
            f"{path} carries no litlab config (it was not written by litlab's train task); "
            "use a checkpoint from a litlab run folder"
        )
    return OmegaConf.create(hparams)
