"""Hydra callback: fail early, in one line, when the run or sweep folder cannot be created;
and keep an earlier run's saved config, for a run in its folder that is then refused.

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


# The files Hydra writes into <run dir>/.hydra/ as a job starts, before any litlab code runs.
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# What those files held before this process's Hydra wrote them, by run folder (None: absent).
_kept: dict[Path, dict[Path, bytes | None]] = {}


def keep_saved_config(run_dir: Path, subdir: str) -> None:
    """Keep the bytes of an earlier run's Hydra files in ``run_dir``/``subdir``: `hydra.run.dir=
    <a run folder>` with another config overwrote them before litlab refused it, and the run's
    own `resume=` then composed the refused command's config over its checkpoints."""
    saved = Path(run_dir, subdir)
    if saved.is_dir():
        _kept[Path(run_dir).resolve()] = {
            saved / name: (saved / name).read_bytes() if (saved / name).is_file() else None
            for name in HYDRA_FILES
        }


def restore_saved_config(run_dir: Path) -> None:
    """Put back the earlier run's Hydra files in ``run_dir`` (a run refused there, or failed
    before it trained: the folder stays the earlier run's); none kept, nothing done."""
    for path, data in _kept.pop(Path(run_dir).resolve(), {}).items():
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)


class CheckOutputFolder(Callback):
    # Hydra registers its config (which ${hydra:runtime.cwd} in paths.root_dir reads) only when
    # the job starts, after these hooks; registering it here is what Hydra does there.
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        run_dir = config.hydra.run.dir
        _check(run_dir, "hydra.run.dir")
        if config.hydra.output_subdir is not None:  # none under resume=: nothing is written
            keep_saved_config(Path(run_dir), config.hydra.output_subdir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        _check(config.hydra.sweep.dir, "hydra.sweep.dir")
