"""What Lightning lacks for GANs and Hydra under DDP: the strategy a GAN needs, multirun x DDP,
one run folder per job under torchrun."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch.strategies.launchers.subprocess_script as _script_launcher
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from omegaconf import DictConfig, OmegaConf, read_write

from litlab.errors import ConfigError

log = logging.getLogger(__name__)


def _many_processes(devices: Any, num_nodes: int, accelerator: str, cuda_devices: int) -> bool:
    """Whether Lightning will start more than one process for these trainer settings."""
    if num_nodes > 1:
        return True
    if devices in ("auto", -1, "-1"):  # Lightning's auto: every GPU (on a GPU accelerator), else 1
        return accelerator in ("auto", "gpu", "cuda") and cuda_devices > 1
    if isinstance(devices, int):
        return devices > 1
    if isinstance(devices, str):
        return "," in devices.strip(",") or (devices.isdigit() and int(devices) > 1)
    return len(devices) > 1


def strategy_for(
    model: L.LightningModule,
    strategy: Any,
    devices: Any,
    num_nodes: int,
    accelerator: str = "auto",
    cuda_devices: int | None = None,
) -> Any:
    """The Lightning strategy to use for this model, given the configured one.

    A GAN steps G and D separately (manual optimization): in D's step G's parameters produce
    no gradient and in G's step D's are frozen, so DDP must look for unused parameters in
    each backward. Lightning's "ddp_find_unused_parameters_true" does exactly that and keeps
    one DDP wrapper (checkpoint keys unchanged); wrapping G and D separately would need a
    custom strategy for the same effect. Lightning's FSDP does not support manual optimization.
    """
    name = strategy if isinstance(strategy, str) else str(strategy.get("_target_", ""))
    if model.automatic_optimization:
        return strategy
    if "fsdp" in name.lower():
        raise ConfigError(
            f"trainer.strategy={name} does not support GANs (Lightning's FSDP has no manual "
            "optimization); use trainer.strategy=ddp"
        )
    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count()
    many = _many_processes(devices, num_nodes, str(accelerator), cuda_devices)
    if strategy == "ddp" or (strategy == "auto" and many):
        return "ddp_find_unused_parameters_true"
    if strategy == "ddp_spawn":
        return "ddp_spawn_find_unused_parameters_true"
    return strategy


def broadcast_buffers(module: L.LightningModule) -> None:
    """Give every rank global rank 0's buffers (BatchNorm running statistics, EMA counters).

    Buffers are not parameters: each rank updates its own in its forward passes (under a GAN's
    manual optimization DDP never re-broadcasts them), so they drift apart between ranks, and
    checkpoints hold rank 0's. Called before every evaluation, so that all ranks evaluate the
    model that is saved, and a resumed run evaluates as an uninterrupted one.
    """
    trainer = module._trainer
    if trainer is None or trainer.world_size == 1:
        return
    for buffer in module.buffers():
        torch.distributed.broadcast(buffer.data, src=0)


_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


class _JobObserver(_ChildProcessObserver):
    """Lightning's watcher of the rank processes it started, with a grace period.

    Lightning kills every process, this main one included (SIGKILL), as soon as a rank
    process exits with an error, because the other ranks may hang in a collective. When all
    ranks fail together (a config error, divergence, out of memory) the main process fails
    the job by itself a moment later; killed instead, a single run loses its one-line error
    and summary, and a sweep (the main process runs it) loses all its later jobs. Here the
    kill waits until ``grace_s`` has passed without this process leaving the job.
    """

    def __init__(self, *args: Any, grace_s: float = 60, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job_over = threading.Event()
        self.grace_s = grace_s

    def _run(self) -> bool:
        return self.job_over.is_set() or super()._run()

    def _terminate_all(self) -> None:
        if not self.job_over.wait(self.grace_s):  # still in the job: hung, as Lightning fears
            super()._terminate_all()


@contextmanager
def _observers_with_grace() -> Iterator[list[_JobObserver]]:
    """While a job runs, Lightning's script launcher starts a _JobObserver (there is no
    public switch for its observer; without the private hook this is Lightning's default)."""
    started: list[_JobObserver] = []
    original = getattr(_script_launcher, "_launch_process_observer", None)

    def launch(child_processes: list[subprocess.Popen]) -> None:
        observer = _JobObserver(main_pid=os.getpid(), child_processes=child_processes)
        observer.start()
        started.append(observer)

    if original is not None:
        _script_launcher._launch_process_observer = launch
    try:
        yield started
    finally:
        if original is not None:
            _script_launcher._launch_process_observer = original
        for observer in started:
            observer.job_over.set()


@contextmanager
def ranks_run_this_job(cfg: DictConfig, trainer: L.Trainer) -> Iterator[None]:
    """Make Lightning's DDP launcher start ranks 1..N-1 on exactly this Hydra job, then clean up.

    Lightning starts the other ranks by re-running ``sys.argv`` plus ``hydra.run.dir=<run dir>``.
    Under a multirun (``-m``) that would start a whole new sweep in every child, in the wrong
    folder. While this job runs, ``sys.argv`` names this job's config (saved as
    .hydra/ranks.yaml) and the run dir is the job's folder, so every child runs exactly this
    job's config in this job's folder. A job whose ranks all fail is failed by this process
    rather than killed by Lightning's watcher (see _JobObserver). Afterwards the process
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
    argv, run_dir = sys.argv[:], hydra_cfg.run.dir
    env = {k: os.environ.get(k) for k in _LAUNCH_ENV}
    sys.argv = [argv[0], f"--config-path={saved.parent}", "--config-name=ranks"]
    with read_write(hydra_cfg):
        hydra_cfg.run.dir = str(folder)
    try:
        with _observers_with_grace():
            yield
    finally:
        sys.argv = argv
        with read_write(hydra_cfg):
            hydra_cfg.run.dir = run_dir
        launcher = getattr(trainer.strategy, "launcher", None)
        for proc in getattr(launcher, "procs", []):  # children of the subprocess-script launcher
            if not isinstance(proc, subprocess.Popen):
                continue
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def slurm_job() -> str | None:
    """This SLURM job's id (array jobs: <job>_<task>; srun steps: .<step>), None outside one.

    An allocation used by hand (job name "bash" or "interactive", as Lightning's SLURM
    detection has it) is not a job to requeue: None.
    """
    if "SLURM_JOB_ID" not in os.environ or os.environ.get("SLURM_JOB_NAME") in (
        "bash",
        "interactive",
    ):
        return None
    job = os.environ["SLURM_JOB_ID"]
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    step = os.environ.get("SLURM_STEP_ID")
    return f"{job}.{step}" if step else job


def slurm_attempt() -> int:
    """How many times SLURM has requeued this job (0 on its first run)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


_CLAIM = ".slurm-attempt"


def _claim_slurm_folder(base: str, job: str) -> str:
    """The folder of this run in the job: <job>, then <job>-1, <job>-2, ... for the second,
    third, ... run of the same job step (a batch script that trains several times), each
    marked with the attempt that took it. A requeued attempt takes them again in the same
    order, so every run of the script finds its own folder."""
    attempt, k = slurm_attempt(), 0
    while True:
        folder = Path(base, "slurm", job if k == 0 else f"{job}-{k}")
        claim = folder / _CLAIM
        taken = int(claim.read_text() or -1) if claim.is_file() else None
        if not folder.exists() or (taken is not None and taken < attempt):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                claim.write_text(str(attempt))
            except OSError:  # unwritable: the output-folder check says so in one line
                pass
            return str(folder)
        k += 1


def run_dir(base: str, stamp: str) -> str:
    """Hydra resolver for the folder of a single run: ``<base>/<stamp>`` (date/time) by default.

    In a SLURM job it is ``<base>/slurm/<job id>[.<step>]``: when SLURM requeues the job
    (preemption, time limit) the same command starts again in the same folder and continues
    from its checkpoints (litlab.resume.continue_in_place). Ranks other than 0 of an srun
    step write their Hydra files to a scratch folder, as under torchrun.
    """
    job = slurm_job()
    if job is not None and global_rank() == 0:
        return _claim_slurm_folder(base, job)
    return rank0_dir(f"{base}/{stamp}")


def checkpoint_folder(output_dir: str, base: str) -> Path:
    """The run folder as global rank 0 has it (where the run's checkpoints are).

    Ranks other than 0 of a requeued srun step have a scratch output folder; an srun step
    runs one command, so rank 0's folder is the step's first: <base>/slurm/<job>.<step>.
    """
    job = slurm_job()
    if job is not None and global_rank() != 0 and slurm_attempt() > 0:
        return Path(base, "slurm", job)
    return Path(output_dir)


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


def fsdp_strategy(wrap: Sequence[str] = (), state_dict_type: str = "full", **kwargs: Any) -> Any:
    """Lightning's FSDPStrategy with auto-wrapping at the named block classes (e.g. BasicBlock).

    ``state_dict_type``: "full" writes one consolidated checkpoint file from rank 0; "sharded"
    writes a folder with one shard per rank (faster, consolidate with Lightning's
    ``python -m lightning.pytorch.utilities.consolidate_checkpoint <folder>``).
    """
    import hydra
    from lightning.pytorch.strategies import FSDPStrategy

    classes = {hydra.utils.get_class(name) for name in wrap}
    return FSDPStrategy(auto_wrap_policy=classes or None, state_dict_type=state_dict_type, **kwargs)
