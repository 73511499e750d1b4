"""Hydra's SLURM launcher (hydra/launcher=slurm): the tasks and GPUs each job asks for.

SLURM starts one task per device and Lightning joins them (trainer.devices must equal the tasks
per node), so the job's resources are read from the trainer config. They are read once, from the
sweep's base config: every job of a sweep is one array job with the same resources.
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from litlab.errors import ConfigError, fail

# The keys that set a job's resources (tasks, nodes, GPUs or none); a trainer group sweep can
# change them too.
_RESOURCE_KEYS = ("trainer.devices", "trainer.num_nodes", "trainer.accelerator")


def slurm_tasks(devices: Any) -> int:
    """hydra.launcher.tasks_per_node: trainer.devices, which must be a number of devices."""
    count = devices if isinstance(devices, int) else None
    if isinstance(devices, str) and devices.isdigit():
        count = int(devices)
    if isinstance(count, bool) or count is None or count < 1:
        raise ConfigError(
            f"hydra/launcher=slurm starts one task per device and needs their number, but "
            f"trainer.devices={devices}; set trainer.devices=<GPUs (or CPU processes) per node>, "
            f"e.g. trainer.devices=4"
        )
    return count


def slurm_gpus(devices: Any, accelerator: Any) -> int | None:
    """hydra.launcher.gpus_per_node: one GPU per task, none for a CPU job."""
    if str(accelerator) not in ("auto", "gpu", "cuda"):
        return None
    return slurm_tasks(devices)


OmegaConf.register_new_resolver("slurm_tasks", slurm_tasks, replace=True)
OmegaConf.register_new_resolver("slurm_gpus", slurm_gpus, replace=True)


def check_slurm_sweep(config: DictConfig) -> None:
    """Refuse a SLURM sweep whose jobs would need other resources than the base config's."""
    task = list(config.hydra.overrides.get("task") or [])
    overrides = OverridesParser.create().parse_overrides(task)
    set_here = {o.key_or_group.lstrip("+~") for o in overrides if not o.is_sweep_override()}
    swept = {o.key_or_group.lstrip("+~") for o in overrides if o.is_sweep_override()}
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    swept |= {str(key) for key in params}
    if set(_RESOURCE_KEYS) <= set_here:  # else a trainer option may bring its own devices
        swept.discard("trainer")
    varied = sorted(swept & {*_RESOURCE_KEYS, "trainer"})
    if varied:
        raise ConfigError(
            f"hydra/launcher=slurm submits a sweep as one array job with one set of resources, "
            f"but this sweep varies {', '.join(varied)}; start one sweep per device layout (with "
            f"a trainer group sweep, also set trainer.devices, trainer.num_nodes and "
            f"trainer.accelerator)"
        )


class CheckSlurmLauncher(Callback):
    """Before a sweep starts: under hydra/launcher=slurm, its resources in one line or a refusal."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not str(OmegaConf.select(config, "hydra.launcher._target_")).endswith("SlurmLauncher"):
            return
        try:
            check_slurm_sweep(config)
            slurm_tasks(config.trainer.devices)
        except ConfigError as e:
            fail(str(e))
