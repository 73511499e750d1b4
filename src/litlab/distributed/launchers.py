"""External launchers (torchrun, srun): one run or sweep folder for all ranks, and the layout of
the processes they started."""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from litlab.errors import ConfigError

log = logging.getLogger(__name__)


def check_command_line(argv: list[str]) -> None:
    """Refuse, before Hydra starts, what Hydra would end in a traceback: a flag that shows one
    job's config beside -m, ``--cfg hydra --resolve``, and ``hydra/launcher=slurm`` where SLURM
    is not installed (submitit looks for ``srun`` when it starts submitting)."""
    import shutil

    args = argv[1:]
    multirun = "-m" in args or "--multirun" in args  # else Hydra runs here, no launcher
    slurm = any(re.fullmatch(r"\+{0,2}hydra/launcher=(submitit_)?slurm", a) for a in args)
    shown = [flag for flag in (a.split("=", 1)[0] for a in args) if flag in SHOWS_ONLY]
    if multirun and set(shown) & ONE_JOB_ONLY:  # Hydra's ValueError traceback (walkthrough 142)
        raise ConfigError(
            f"{shown[0]} prints the config of one job, which Hydra does not take with -m: leave "
            "-m out and give each swept key one of its values (e.g. seed=1, not seed=1,2,3)"
        )
    if "--resolve" in args and _shown_part(args) == "hydra":  # InterpolationKeyError traceback
        raise ConfigError(
            "--cfg hydra --resolve: Hydra resolves its own settings apart from the run's config, "
            "where the run folder's ${paths...} are not found; show them resolved with --cfg all "
            "--resolve (its hydra: part), or unresolved with --cfg hydra"
        )
    if multirun and slurm and not shown and shutil.which("srun") is None:
        raise ConfigError(
            "hydra/launcher=slurm submits the sweep's jobs to SLURM, which this machine does not "
            "have (no srun on PATH): run the command on the cluster's login node, or leave "
            "hydra/launcher=slurm out to run the jobs here"
        )


def _shown_part(args: list[str]) -> str | None:
    """The part of the config ``--cfg``/``-c`` shows (job, hydra, all), None without one."""
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag in ("--cfg", "-c"):
            return value or (args[i + 1] if i + 1 < len(args) else None)
    return None


# Hydra's flags that print something and run no job; those it refuses beside -m.
SHOWS_ONLY = {"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion"}
ONE_JOB_ONLY = {"--cfg", "-c", "--info", "-i", "--shell-completion"}


def check_local_tasks(launcher: Any) -> None:
    """Refuse Hydra's submitit_local launcher with tasks_per_node above 1: it starts that many
    copies of each job's command, which litlab does not take as ranks of one run (each acted
    as rank 0: the job trained twice in one folder, then failed in the CSV writer, its
    summary "failed" beside a finished .trained: review 187). Said before any job starts (a
    job's own output goes to submitit's log files, not to the console)."""
    target = str((launcher or {}).get("_target_") or "")
    tasks = (launcher or {}).get("tasks_per_node") or 1
    if target.endswith("LocalLauncher") and isinstance(tasks, int) and tasks > 1:
        raise ConfigError(
            f"hydra/launcher=submitit_local with hydra.launcher.tasks_per_node={tasks} runs each "
            f"job {tasks} times over in one folder, not as the ranks of one run; leave it at 1 "
            "(one process a job; trainer.strategy=ddp_spawn for several), or run multi-process "
            "jobs with torchrun or hydra/launcher=slurm"
        )


def check_submitit_local(trainer: Any) -> None:
    """Refuse a job of Hydra's submitit_local launcher that Lightning would run on several
    processes it starts itself: it starts them by running the command again, which there is
    submitit's script, taking no Hydra arguments (rank 1 failed on them, the job waited for it,
    Hydra ended in a traceback after 90 s and the run stayed "running": walkthrough 142).
    ddp_spawn, and ranks started outside (torchrun, srun), are not refused."""
    from lightning.pytorch.strategies.launchers.subprocess_script import (
        _SubprocessScriptLauncher,
    )

    launcher = getattr(trainer.strategy, "launcher", None)
    if "SUBMITIT_LOCAL_JOB_ID" in os.environ and isinstance(launcher, _SubprocessScriptLauncher):
        raise ConfigError(
            f"hydra/launcher=submitit_local runs each job in one process, and Lightning cannot "
            f"start the job's {trainer.world_size} processes there (it runs the command again: "
            "submitit's script); run multi-process jobs with Hydra's default launcher (leave "
            "hydra/launcher out) or torchrun, or set trainer.strategy=ddp_spawn"
        )


def global_rank() -> int:
    """This process's global rank as an external launcher (torchrun, srun) set it; 0 otherwise."""
    return int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)


def rank0_dir(path: str) -> str:
    """``path`` on global rank 0, a scratch folder on other ranks.

    Under torchrun or srun every rank composes its own config, and ``${now:...}`` differs by
    microseconds between them; only rank 0 writes run files (checkpoint folders are broadcast
    from rank 0 by Lightning), so the other ranks' Hydra files go to a temporary folder and
    each run leaves exactly one folder. That folder is the user's own (``litlab-ranks-<uid>``): a
    shared machine's /tmp would otherwise hold one ``litlab-ranks`` made by whoever ran first,
    where the other users' ranks cannot write.
    """
    rank = global_rank()
    if rank == 0:
        return path
    return str(rank_scratch() / f"{Path(path).name}-rank{rank}")


def rank_scratch() -> Path:
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"litlab-ranks-{user}"


def is_rank_scratch(path: str | Path) -> bool:
    """Whether a folder is one of rank0_dir's scratch folders (a rank other than 0's)."""
    return Path(path).resolve().is_relative_to(rank_scratch().resolve())


# hydra.sweep.dir: under torchrun or srun -m every rank runs the whole sweep, job by job in step
OmegaConf.register_new_resolver("rank0_dir", rank0_dir, replace=True, use_cache=True)


def srun_tasks() -> int:
    """How many processes srun started for this step (1 outside srun).

    As Lightning's SLURM detection has it: SLURM_NTASKS, except in an allocation used by hand
    (job name "bash" or "interactive", e.g. a salloc shell), where it is not a process count.
    """
    if os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return 1
    return int(os.environ.get("SLURM_NTASKS") or 1)


def launched_processes() -> int:
    """How many processes an external launcher started for this run: torchrun's WORLD_SIZE,
    srun's tasks; 1 without one."""
    return max(int(os.environ.get("WORLD_SIZE") or 1), srun_tasks())


def _tasks_per_node(value: str, tasks: int) -> int:
    """SLURM's tasks per node ("2", or "2(x3)" for 2 on each of 3 nodes) as one count."""
    counts = {int(count) for count in re.findall(r"(\d+)(?:\(x\d+\))?", value)}
    if len(counts) != 1:
        raise ConfigError(
            f"srun started {tasks} tasks unevenly over the nodes (tasks per node: {value}); "
            "Lightning needs the same number on every node: srun --ntasks-per-node=<devices>"
        )
    return counts.pop()


def _srun_layout() -> dict[str, int]:
    tasks = srun_tasks()
    if tasks <= 1:  # one task: a plain batch script or an allocation used by hand
        return {}
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
    if per_node is None:  # Lightning's SLURM environment refuses this with a traceback
        raise ConfigError(
            f"srun started {tasks} tasks without --ntasks-per-node, which Lightning needs: "
            "srun --nodes=<nodes> --ntasks-per-node=<devices per node> python train.py ..."
        )
    devices = _tasks_per_node(per_node, tasks)
    num_nodes = int(os.environ.get("SLURM_NNODES") or max(1, tasks // devices))
    if devices * num_nodes != tasks:
        raise ConfigError(
            f"srun started {tasks} tasks as {devices} per node on {num_nodes} node(s); Lightning "
            f"needs tasks = tasks per node x nodes: srun --nodes={num_nodes} "
            f"--ntasks-per-node={devices} (or --ntasks={devices * num_nodes})"
        )
    return {"devices": devices, "num_nodes": num_nodes}


def _torchrun_layout() -> dict[str, int]:
    if "TORCHELASTIC_RUN_ID" not in os.environ or "LOCAL_WORLD_SIZE" not in os.environ:
        return {}
    local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    return {"devices": local, "num_nodes": max(1, world // local)}


def launched_as() -> str:
    """What runs a script (``<this> train.py ...``) as this process was started: ``python``;
    under torchrun or srun with several processes, the same launcher and layout."""
    layout = _torchrun_layout()
    if layout and layout["devices"] * layout["num_nodes"] > 1:
        nodes = layout["num_nodes"]
        where = " --node_rank=<this node> --master_addr=<node 0>" if nodes > 1 else ""
        return f"torchrun --nnodes={nodes} --nproc_per_node={layout['devices']}{where}"
    try:
        layout = _srun_layout()
    except ConfigError:
        layout = {}
    if layout:
        return f"srun --nodes={layout['num_nodes']} --ntasks-per-node={layout['devices']} python"
    return "python"


def as_launched(command: str) -> str:
    """``command`` (``python train.py ...``) as this process was started: under torchrun or
    srun with several processes, the same launcher and layout (a plain ``python train.py
    resume=...`` after a torchrun run continued it on one process: each step half the images,
    the schedule refit; walkthrough 153)."""
    return f"{launched_as()} {command.removeprefix('python ')}"


def launcher_layout(devices: Any, num_nodes: int) -> dict[str, int]:
    """Under torchrun or srun, the devices per node and nodes that the launcher laid out
    (Lightning needs trainer.devices and trainer.num_nodes equal to them); {} without one.

    The processes are already running, one per device: following their layout is the only
    way they train one model together (with trainer.devices=1, each would train its own).
    """
    # torchrun first, as in Lightning's detection: torchrun may run inside a SLURM job
    layout = _torchrun_layout() or _srun_layout()
    changed = layout and (devices, num_nodes) != (layout["devices"], layout["num_nodes"])
    if changed and global_rank() == 0:  # said once: every rank adopts it
        log.info(
            "%s started %d process(es) per node on %d node(s): using trainer.devices=%d "
            "trainer.num_nodes=%d (the config's: %s and %s)",
            "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "srun",
            layout["devices"],
            layout["num_nodes"],
            layout["devices"],
            layout["num_nodes"],
            devices,
            num_nodes,
        )
    return layout


# What says that something else set up this node's place among several: Lightning's plain
# environment (MASTER_ADDR, NODE_RANK, set by hand on each node), LSF's and MPI's
NODE_VARIABLES = ("MASTER_ADDR", "NODE_RANK", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")


def adopt_launcher_layout(trainer: Any) -> dict[str, int]:
    """Write the launcher's layout into the trainer config (before it is saved as hparams), so
    that the run's config says how many processes trained it. Refused in one line: several
    nodes without anything that starts them (each process waited 30 minutes for the others),
    and a strategy that starts processes itself under a launcher that did (ddp_spawn under
    torchrun: twice the processes, then a gloo or NCCL traceback)."""
    from litlab.distributed.strategy import strategy_name

    layout = launcher_layout(trainer.devices, trainer.num_nodes)
    name = strategy_name(trainer.get("strategy", "auto"))
    if layout and name.startswith(SPAWNING):
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "srun"
        raise ConfigError(
            f"{launcher} started this run's processes, and trainer.strategy={name} would start "
            "its own from each of them; use trainer.strategy=ddp (or trainer=ddp)"
        )
    nodes = int(trainer.get("num_nodes") or 1)
    if not layout and nodes > 1 and not any(v in os.environ for v in NODE_VARIABLES):
        raise ConfigError(
            f"trainer.num_nodes={nodes}, but nothing started this process as one of {nodes} "
            "nodes (it would wait 30 minutes for the others): launch it on every node with "
            "torchrun --nnodes or srun (README, Scaling out), or use hydra/launcher=slurm"
        )
    for key, value in layout.items():
        trainer[key] = value
    return layout
