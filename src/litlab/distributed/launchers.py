"""External launchers (torchrun, srun): one run folder for all ranks, and torchrun's layout."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def global_rank() -> int:
    """This process's global rank as an external launcher (torchrun, srun) set it; 0 otherwise."""
    return int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)


def rank0_dir(path: str) -> str:
    """``path`` on global rank 0, a scratch folder on other ranks.

    Under torchrun or srun every rank composes its own config, and ``${now:...}`` differs by
    microseconds between them; only rank 0 writes run files (checkpoint folders are broadcast
    from rank 0 by Lightning), so the other ranks' Hydra files go to a temporary folder and
    each run leaves exactly one folder.
    """
    rank = global_rank()
    if rank == 0:
        return path
    return str(Path(tempfile.gettempdir()) / "litlab-ranks" / f"{Path(path).name}-rank{rank}")


def torchrun_layout(devices: Any, num_nodes: int) -> dict[str, int]:
    """Under torchrun, the devices and nodes that torchrun laid out (Lightning needs them equal)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "LOCAL_WORLD_SIZE" not in os.environ:
        return {}
    local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    layout = {"devices": local, "num_nodes": max(1, world // local)}
    if (devices, num_nodes) != (layout["devices"], layout["num_nodes"]):
        log.info(
            "torchrun started %d process(es) per node on %d node(s): using trainer.devices=%d "
            "trainer.num_nodes=%d",
            local,
            layout["num_nodes"],
            local,
            layout["num_nodes"],
        )
    return layout
