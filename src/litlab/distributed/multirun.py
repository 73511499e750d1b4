"""Multirun x DDP: every job of a Hydra sweep runs its own ranks on its own config."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, read_write

from litlab.compat import config_node, rank_watchers_with_grace
from litlab.distributed.launchers import launched_processes
from litlab.errors import Terminated

log = logging.getLogger("litlab")

_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


# How long the other ranks (children of Lightning's script launcher) get to end on their own
# once this rank's job is over: a job that ended here ends there at the same collective; one
# that failed here (an error on this rank alone) leaves them waiting in a collective for it,
# until the process group's timeout (30 minutes): they are stopped after a short grace.
DONE_GRACE_S = 120.0
FAILED_GRACE_S = 10.0


def end_the_other_ranks(children: list[subprocess.Popen], grace_s: float) -> None:
    """Wait up to ``grace_s`` seconds in all for the rank processes to exit; kill the rest."""
    deadline = time.monotonic() + grace_s
    for proc in children:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning(
                "rank process %d still ran %.0f s after this rank's job ended (waiting on this "
                "rank in a collective): stopped",
                proc.pid,
                grace_s,
            )
            proc.kill()
            proc.wait()


@contextmanager
def ranks_run_this_job(cfg: DictConfig, trainer: L.Trainer) -> Iterator[None]:
    """Make Lightning's DDP launcher start ranks 1..N-1 on exactly this Hydra job, then clean up.

    Lightning starts the other ranks by re-running ``sys.argv`` plus ``hydra.run.dir=<run dir>``.
    Under a multirun (``-m``) that would start a whole new sweep in every child, in the wrong
    folder. While this job runs, ``sys.argv`` names this job's config (saved as
    .hydra/ranks.yaml) and the run dir is the job's folder, so every child runs exactly this
    job's config in this job's folder. A job whose ranks all fail is failed by this process
    rather than killed by Lightning's watcher (litlab.compat.rank_watchers_with_grace). Afterwards the process
    group, launcher environment and children are cleaned up so that the next job of a sweep
    starts fresh (its own port, no orphans).
    """
    if not HydraConfig.initialized():
        yield
        return
    folder = Path(cfg.paths.output_dir)
    # The job's config as this process holds it (with every override, e.g. a resume's ckpt_path).
    saved = folder / ".hydra" / "ranks.yaml"
    saved.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), saved)
    hydra_cfg = HydraConfig.get()
    # hydra.run.dir as written, not resolved: resolving it claims a run folder (run_dir, in a
    # SLURM job: slurm/<job>[-k]), which this job does not use and would leave behind empty
    argv, run_dir = sys.argv[:], config_node(hydra_cfg.run, "dir")._value()
    env = {k: os.environ.get(k) for k in _LAUNCH_ENV}
    sys.argv = [argv[0], f"--config-path={saved.parent}", "--config-name=ranks"]
    with read_write(hydra_cfg):
        hydra_cfg.run.dir = str(folder)
    failed = stopped = False
    try:
        with rank_watchers_with_grace():
            yield
    except Exception:
        failed = True
        raise
    except Terminated:  # litlab.run's handler (outside the trainer): this rank alone may
        stopped = True  # have been signalled (`kill <pid>`): the others are told
        raise
    finally:
        sys.argv = argv
        with read_write(hydra_cfg):
            hydra_cfg.run.dir = run_dir
        launcher = getattr(trainer.strategy, "launcher", None)
        children = [p for p in getattr(launcher, "procs", []) if isinstance(p, subprocess.Popen)]
        if stopped:
            for proc in children:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        end_the_other_ranks(children, FAILED_GRACE_S if failed or stopped else DONE_GRACE_S)
        # Lightning's own ranks end with the job: the next job makes a new group on its own
        # port. Processes an external launcher started (torchrun, srun) run every job in step
        # and keep theirs: a new group on the launcher's store would read the last group's
        # rendezvous keys there (gloo then dials a closed address: a failed job or a hang).
        external = launched_processes() > 1
        if torch.distributed.is_available() and torch.distributed.is_initialized() and not external:
            torch.distributed.destroy_process_group()
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
