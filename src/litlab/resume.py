"""`python train.py resume=<run folder>`: continue a run in its own folder, config and W&B run.

Hydra has no notion of "continue that run", so the switch is turned into plain Hydra arguments
before Hydra parses the command line: the folder's saved config as the primary config, the
folder as the run dir (its .hydra files are left as they are), its newest checkpoint as
ckpt_path, and its W&B run id. Further overrides on the command line still apply.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from litlab.checkpoint import load_checkpoint, stored_config
from litlab.distributed import checkpoint_folder
from litlab.errors import ConfigError
from litlab.run import config_digest
from litlab.tune import take_tuned_values

log = logging.getLogger("litlab")

CHECKPOINTS = ("last.ckpt", "step.ckpt")


def newest_checkpoint(folder: Path) -> Path | None:
    """The most recently written of the run's resumable checkpoints: epoch end, periodic and
    signal (checkpoints/), and Lightning's SLURM auto-requeue saves (hpc_ckpt_<n>.ckpt)."""
    found = [
        folder / "checkpoints" / name
        for name in CHECKPOINTS
        if (folder / "checkpoints" / name).is_file()
    ]
    found += folder.glob("hpc_ckpt_*.ckpt")
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def wandb_run_id(folder: Path) -> str | None:
    """The id of the W&B run a run folder logged to (wandb/<offline-run|run>-<date>-<id>)."""
    runs = sorted((folder / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime_ns)
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def _fail(message: str) -> None:
    print(f"litlab: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite `resume=<folder>` into the Hydra arguments that continue that run."""
    picks = [arg for arg in argv[1:] if arg.startswith("resume=")]
    if not picks:
        return argv
    folder = Path(picks[-1].split("=", 1)[1]).expanduser().resolve()
    saved = folder / ".hydra" / "config.yaml"
    if not saved.is_file():
        _fail(
            f"{folder} is not a litlab run folder (no .hydra/config.yaml); pass resume=<run folder>"
        )
    checkpoint = newest_checkpoint(folder)
    if checkpoint is None:
        _fail(
            f"{folder} has no checkpoint to resume from (checkpoints/last.ckpt); start a new run instead"
        )
    args = [
        f"--config-path={saved.parent}",
        "--config-name=config",
        f"hydra.run.dir={folder}",
        "hydra.output_subdir=null",
        f"ckpt_path={checkpoint}",
    ]
    config = yaml.safe_load(saved.read_text())
    if (config.get("logger") or {}).get("wandb"):
        run_id = wandb_run_id(folder)
        if run_id:
            args.append(f"+logger.wandb.id={run_id}")
        hydra_file = folder / ".hydra" / "hydra.yaml"
        if hydra_file.is_file():  # keep the run's name: what the original command changed
            original = yaml.safe_load(hydra_file.read_text())["hydra"]["job"].get(
                "override_dirname", ""
            )
            args.append(f"logger.wandb.overrides='{original}'")
    return [argv[0], *args, *(arg for arg in argv[1:] if not arg.startswith("resume="))]


def _computes(cfg: DictConfig) -> str:
    """The digest of what a config computes, wherever it starts from and whatever it logs to."""
    plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k not in ("ckpt_path", "logger")])
    return config_digest(plain)


def continue_in_place(cfg: DictConfig) -> dict[str, Any] | None:
    """A training run that starts in a folder holding its own checkpoints continues from them.

    That is a requeued cluster job: SLURM (the run folder is fixed per job, see
    litlab.distributed.run_dir) or submitit (the sweep folder is fixed) starts the same
    command again after a preemption. The newest checkpoint and the folder's W&B run are
    picked up, as ``resume=<folder>`` would. Checkpoints of a run with another config are
    never trained over: that is one clear error. Returns the checkpoint it continues from,
    loaded (so that it is read once), or None.
    """
    if cfg.get("ckpt_path") or not cfg.get("train"):
        return None
    folder = checkpoint_folder(cfg.paths.output_dir, f"{cfg.paths.log_dir}/{cfg.task_name}")
    path = newest_checkpoint(folder)
    if path is None:
        return None
    checkpoint = load_checkpoint(path)
    stored = stored_config(checkpoint, path)
    take_tuned_values(cfg, stored)
    if _computes(stored) != _computes(cfg):
        raise ConfigError(
            f"{folder} already holds checkpoints of a run with another config; continue that "
            f"run with: python train.py resume={folder}, or train in a new folder"
        )
    log.warning("continuing the interrupted run in %s from %s", folder, path.name)
    cfg.ckpt_path = str(path)
    wandb = (cfg.get("logger") or {}).get("wandb")
    run_id = wandb_run_id(folder)
    if wandb and run_id and not wandb.get("id"):
        with open_dict(wandb):
            wandb.id = run_id
    return checkpoint
