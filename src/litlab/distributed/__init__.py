"""What Lightning lacks for GANs (and Hydra) under DDP: the strategy a model family needs."""

from __future__ import annotations

from typing import Any

import lightning as L

from litlab.errors import ConfigError


def _many_processes(devices: Any, num_nodes: int) -> bool:
    if num_nodes > 1:
        return True
    if isinstance(devices, int):
        return devices > 1 or devices == -1
    if isinstance(devices, str):
        return devices not in ("1", "auto") and not (devices.isdigit() and int(devices) == 1)
    return len(devices) > 1


def strategy_for(model: L.LightningModule, strategy: Any, devices: Any, num_nodes: int) -> Any:
    """The Lightning strategy to use for this model, given the configured one.

    A GAN steps G and D separately (manual optimization): in D's step G's parameters produce
    no gradient and in G's step D's are frozen, so DDP must look for unused parameters in
    each backward. Lightning's "ddp_find_unused_parameters_true" does exactly that and keeps
    one DDP wrapper (checkpoint keys unchanged); wrapping G and D separately would need a
    custom strategy for the same effect. Lightning's FSDP does not support manual optimization.
    """
    if model.automatic_optimization or not isinstance(strategy, str):
        return strategy
    if strategy.startswith("fsdp"):
        raise ConfigError(
            f"trainer.strategy={strategy} does not support GANs (Lightning's FSDP has no manual "
            "optimization); use trainer.strategy=ddp"
        )
    if strategy == "ddp" or (strategy == "auto" and _many_processes(devices, num_nodes)):
        return "ddp_find_unused_parameters_true"
    if strategy == "ddp_spawn":
        return "ddp_spawn_find_unused_parameters_true"
    return strategy
