"""Experiment loggers. W&B never prompts or blocks: online with credentials, offline without.

wandb itself is imported only when a W&B logger is actually built.
"""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlparse

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import Logger, WandbLogger

log = logging.getLogger(__name__)

Mode = Literal["auto", "online", "offline", "disabled"]


def wandb_credentials() -> bool:
    """True when W&B has an API key: WANDB_API_KEY or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC", os.path.expanduser("~/.netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(requested: Mode) -> str:
    """The mode W&B will run in; WANDB_MODE wins, and online without credentials means offline."""
    mode = os.environ.get("WANDB_MODE", requested).lower()
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)
    if mode in ("auto", "online") and not wandb_credentials():
        if mode == "online":
            log.warning(
                "W&B online mode was asked for but no credentials were found: logging offline"
            )
        return "offline"
    return "online" if mode == "auto" else mode


def split_overrides(text: str) -> list[str]:
    """Split Hydra's override_dirname ("a=1,b=[1,2]") at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[({") - (char in "])}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in [*items, current] if item]


class FlatConfigWandbLogger(WandbLogger):
    """Logs the config flat ("model.optimizer.lr"), so W&B's table and parallel-coordinates
    views can use every key without editing."""

    def log_hyperparams(self, params: dict[str, Any] | Any) -> None:
        super().log_hyperparams(_flatten_dict(_convert_params(params), delimiter="."))


def wandb_logger(
    save_dir: str,
    project: str = "litlab",
    mode: Mode = "auto",
    name: str | None = None,
    group: str | None = None,
    tags: Sequence[str] = (),
    overrides: str = "",
    **kwargs: Any,
) -> WandbLogger:
    """A W&B logger that writes under the run folder and never waits for a login.

    ``overrides`` (what this run changed, e.g. "model.optimizer.lr=0.001,seed=2") names the run
    when ``name`` is not given and adds one tag per override, so sweep jobs are told apart.
    """
    changed = split_overrides(overrides)
    return FlatConfigWandbLogger(
        save_dir=save_dir,
        project=project,
        mode=wandb_mode(mode),
        name=name or overrides or None,
        group=group,
        tags=[*tags, *(tag[:64] for tag in changed)],
        **kwargs,
    )


def finish_loggers(loggers: list[Logger]) -> None:
    """Close W&B runs (so the next multirun job gets its own) and say how to sync offline ones."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            run = logger.experiment
            offline = getattr(run.settings, "mode", "") in ("offline", "dryrun")
            sync_dir = getattr(run.settings, "sync_dir", None)
            run.finish()
            if offline and sync_dir:
                log.info("W&B run saved offline; upload it later with: wandb sync %s", sync_dir)
