"""Hydra callback: fail early, in one line, when the run or sweep folder cannot be created.

Hydra creates the folder itself, before any litlab code runs, and reports a failure with a
traceback; this check runs first and says what to do instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from litlab.errors import fail
from litlab.files import writer_tag


def _check(folder: str, key: str) -> None:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        probe = Path(folder) / f".write-test-{writer_tag()}"  # ranks may probe at once
        probe.touch()
        probe.unlink()
    except OSError as e:
        fail(
            f"cannot write the run folder {folder} ({e.strerror or e}); "
            f"choose a writable place with paths.log_dir=<folder> (or {key}=<folder>)"
        )


class CheckOutputFolder(Callback):
    # Hydra registers its config (which ${hydra:runtime.cwd} in paths.root_dir reads) only when
    # the job starts, after these hooks; registering it here is what Hydra does there.
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        _check(config.hydra.run.dir, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        _check(config.hydra.sweep.dir, "hydra.sweep.dir")
