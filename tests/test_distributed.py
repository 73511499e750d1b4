"""Scale-out: strategy choice, validation, and real multi-process runs on CPU (gloo)."""

from __future__ import annotations

import csv
import json
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import (
    CPU_DDP,
    QUIET,
    QUIET_CSV,
    REPO,
    bare_trainer,
    make_cfg,
    run_cli,
    summary_of,
    write_digits_folder,
    write_png_folder,
)
from helpers import fake_scontrol
from litlab.config import build
from litlab.distributed import SeparateNetsDDPStrategy, launcher_layout, rank0_dir, strategy_for
from litlab.distributed.slurm import check_slurm_sweep, slurm_gpus, slurm_tasks
from litlab.errors import ConfigError
from litlab.evaluate import eval_task
from litlab.hardware import check_hardware
from litlab.models import GAN, ImageClassifier
from litlab.resume import checkpoint_folder, run_dir
from litlab.tune import tune
from wandb_records import offline_run

SYNTH = [
    "data=synthetic",
    "data.image_shape=[1,16,16]",
    "data.source.train_size=512",
    "data.source.test_size=256",
    "data.batch_size=32",
    "model.net.width=8",
]


def test_gans_get_a_ddp_wrapper_per_net():
    gan, clf = GAN.__new__(GAN), ImageClassifier.__new__(ImageClassifier)
    gan._automatic_optimization, clf._automatic_optimization = False, True
    assert strategy_for(gan, "ddp", 2, 1) == "ddp_separate_nets"
    assert strategy_for(gan, "auto", 4, 1) == "ddp_separate_nets"
    assert strategy_for(gan, "auto", 1, 2) == "ddp_separate_nets"
    assert strategy_for(gan, "auto", 1, 1) == "auto"
    # devices=auto (every GPU) on a machine with several: DDP too, the GAN's
    assert strategy_for(gan, "auto", "auto", 1, "auto", cuda_devices=4) == "ddp_separate_nets"
    assert strategy_for(gan, "auto", -1, 1, "gpu", cuda_devices=2) == "ddp_separate_nets"
    assert strategy_for(gan, "auto", "auto", 1, "auto", cuda_devices=1) == "auto"
    assert strategy_for(gan, "auto", "auto", 1, "cpu", cuda_devices=4) == "auto"
    assert strategy_for(gan, "auto", "0,1", 1, "gpu", cuda_devices=2) == "ddp_separate_nets"
    assert strategy_for(gan, "ddp_spawn", 2, 1) == "ddp_spawn_separate_nets"
    # Lightning's one wrapper, chosen by name, stays; and a manual-optimization module that
    # names no nets gets it
    one = "ddp_find_unused_parameters_true"
    assert strategy_for(gan, one, 2, 1) == one
    unnamed = type("UnnamedNets", (GAN,), {"ddp_nets": ()})
    unnamed = unnamed.__new__(unnamed)
    unnamed._automatic_optimization = False
    assert strategy_for(unnamed, "ddp", 2, 1) == one
    assert strategy_for(unnamed, "ddp_spawn", 2, 1) == "ddp_spawn_find_unused_parameters_true"
    for name, start in (("ddp_separate_nets", "popen"), ("ddp_spawn_separate_nets", "spawn")):
        strategy = bare_trainer(accelerator="cpu", devices=2, strategy=name).strategy
        assert type(strategy) is SeparateNetsDDPStrategy and strategy._start_method == start
    assert strategy_for(clf, "ddp", 2, 1) == "ddp"
    with pytest.raises(ConfigError, match="does not support GANs"):
        strategy_for(gan, "fsdp", 2, 1)
    with pytest.raises(ConfigError, match="does not support GANs"):
        strategy_for(gan, OmegaConf.create({"_target_": "litlab.distributed.fsdp_strategy"}), 2, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_blocking_the_backward_sync_blocks_it_on_every_nets_wrapper(tmp_path):
    """Lightning's block_backward_sync (toggle_model(sync_grad=False), manual accumulation)
    enters no_sync on its one wrapper alone: under a wrapper per net it blocked nothing."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from litlab.distributed.strategy import _WRAPPERS
    from litlab.nets import Discriminator, Generator

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        gan = GAN(
            Generator((1, 16, 16), latent_dim=8, width=8),
            Discriminator((1, 16, 16), width=8),
            torch.optim.Adam,
            torch.optim.Adam,
            [0.5],
            [0.5],
        )
        wrappers = {name: DistributedDataParallel(getattr(gan, name)) for name in gan.ddp_nets}
        gan.__dict__[_WRAPPERS] = wrappers
        strategy = SeparateNetsDDPStrategy()
        strategy.connect(gan)
        with strategy.block_backward_sync():
            assert [w.require_backward_grad_sync for w in wrappers.values()] == [False, False]
        assert [w.require_backward_grad_sync for w in wrappers.values()] == [True, True]
    finally:
        dist.destroy_process_group()


def test_devices_on_a_machine_without_a_gpu_say_they_are_cpu_processes(tmp_path, caplog):
    """trainer.devices=4, written for a GPU machine, ran as 4 CPU processes without a word."""
    with caplog.at_level("WARNING", logger="litlab"):
        check_hardware(make_cfg(tmp_path, ["trainer.devices=4"]).trainer)
    assert "trainer.devices=4 on a machine without a GPU: 4 CPU processes" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        check_hardware(make_cfg(tmp_path, ["trainer=ddp", "trainer.accelerator=cpu"]).trainer)
    assert not caplog.text  # asked for by name: nothing to say


@pytest.mark.parametrize(
    "overrides, message, engine",
    [
        (["trainer=fsdp", "trainer.accelerator=cpu"], "on CPU use trainer.strategy=ddp", None),
        # one line for both (it said the accelerator's alone, then FSDP's once that was changed)
        (["trainer=fsdp"], "has none; on CPU use trainer=ddp trainer.accelerator=cpu", None),
        (["trainer.accelerator=cpu", "trainer.devices=-1"], "means every GPU", None),
        # Lightning's TypeError as Hydra's "Error executing job" (walkthrough 178)
        (["trainer.accelerator=cpu", "trainer.devices=[0,1]"], "give a number of processes", None),
        (["trainer.accelerator=cpu", "trainer.devices=two"], "give a number of processes", None),
        (["trainer.accelerator=cpu", "trainer.devices='-1'"], "means every GPU", None),
        (["trainer.devices=0"], "trainer.devices must be a positive count", None),
        (["trainer.num_nodes=0"], "trainer.num_nodes at least 1", None),
        # Lightning would not refuse, but silently run another precision than asked for
        (["trainer.accelerator=cpu", "trainer.precision=16-mixed"], "needs a GPU", "bf16-mixed"),
    ],
)
def test_refusals_are_what_lightning_refuses_or_would_silently_change(
    tmp_path, overrides, message, engine
):
    """Each refusal, checked against the Lightning and torch at hand (they change)."""
    cfg = make_cfg(tmp_path, overrides)
    if torch.cuda.is_available() and "fsdp" in overrides[0]:
        pytest.skip("FSDP is valid here")
    with pytest.raises(ConfigError, match=message):
        check_hardware(cfg.trainer)
    if engine is None:
        with pytest.raises(Exception):  # noqa: B017 - ValueError, TypeError, Misconfiguration...
            build(cfg.trainer, "trainer", logger=False)
    else:
        assert build(cfg.trainer, "trainer", logger=False).precision == engine


@pytest.mark.dist
@pytest.mark.slow
def test_bf16_true_trains_under_ddp_on_cpu(tmp_path):
    """litlab refused bf16-true with DDP on CPU ("not supported by gloo"); it was litlab's own
    float32 batches that failed. Both precisions of the 'true' kind now get their input dtype."""
    result = run_cli(
        *SYNTH,
        *QUIET,
        "logger=csv",
        *CPU_DDP,
        "trainer.precision=bf16-true",
        "trainer.max_epochs=3",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(tmp_path)
    assert summary["status"] == "completed" and summary["metrics"]["test/acc"] > 0.2


@pytest.mark.dist
@pytest.mark.slow
def test_ranks_draw_their_own_augmentation_without_any_callback(tmp_path):
    """Every rank starts from the run's seed; the models themselves reseed ranks > 0, so
    augmentation and dropout differ between ranks also with callbacks=none (no RNGState)."""
    result = run_cli(
        *SYNTH,
        "extras.print_config=false",
        "logger=csv",
        "callbacks=none",
        "+callbacks.draws._target_=helpers.RecordDraws",
        f"+callbacks.draws.folder={tmp_path / 'draws'}",
        *CPU_DDP,
        "trainer.max_epochs=1",
        "test=false",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    draws = [torch.load(tmp_path / "draws" / f"rank{r}.pt") for r in (0, 1)]
    assert not torch.equal(draws[0], draws[1])


def test_rank0_dir_gives_one_run_folder_under_external_launchers(monkeypatch):
    for var in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    assert rank0_dir("/out/run") == "/out/run"
    monkeypatch.setenv("RANK", "0")
    assert rank0_dir("/out/run") == "/out/run"
    monkeypatch.setenv("RANK", "3")
    assert not rank0_dir("/out/run").startswith("/out/") and rank0_dir("/out/run").endswith(
        "run-rank3"
    )
    # each user's ranks have a scratch folder of their own: on a shared machine a folder made by
    # the first user (mode 755) would refuse the others' ranks
    scratch = {}
    for uid in (1000, 1001):
        monkeypatch.setattr(os, "getuid", lambda uid=uid: uid)
        scratch[uid] = Path(rank0_dir("/out/run")).parent
    assert scratch[1000] != scratch[1001] and scratch[1000].name.endswith("1000")


SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_PROCID",
    "RANK",
)


def test_runs_of_one_slurm_job_started_at_once_take_a_folder_each(tmp_path):
    """Two runs of a batch script started together (`python train.py seed=1 & python train.py
    seed=2 &`) each take their own folder, in the first attempt and when requeued (before: both
    could see the folder free and share it, checkpoints and summary, in 4 pairs of 20)."""
    import multiprocessing as mp

    from helpers import claim_run_folder

    context = mp.get_context("fork")  # (a run's imports done: the two ask at the same moment)
    for trial in range(10):
        base = str(tmp_path / str(trial))
        for attempt in (0, 1):
            barrier, queue = context.Barrier(2), context.Queue()
            runs = [
                context.Process(target=claim_run_folder, args=(barrier, queue, base, attempt))
                for _ in range(2)
            ]
            for run in runs:
                run.start()
            folders = sorted(queue.get(timeout=120) for _ in runs)
            for run in runs:
                run.join()
            assert folders == [f"{base}/slurm/77", f"{base}/slurm/77-1"], (trial, attempt)


def test_run_folder_is_fixed_per_slurm_job_so_that_a_requeued_job_finds_it(monkeypatch, tmp_path):
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    base = str(tmp_path)
    assert run_dir(base, "2026-11-30/06-00-00-000001") == f"{base}/2026-11-30/06-00-00-000001"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    # A batch script that trains three times: one folder each, in order.
    first_attempt = [run_dir(base, "d/t") for _ in range(3)]
    assert first_attempt == [f"{base}/slurm/77", f"{base}/slurm/77-1", f"{base}/slurm/77-2"]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued: the same runs, the same folders
    assert [run_dir(base, "d/t") for _ in range(3)] == first_attempt
    assert run_dir(base, "d/t") == f"{base}/slurm/77-3"  # a fourth run is a new one
    assert checkpoint_folder(f"{base}/slurm/77", base) == Path(f"{base}/slurm/77")

    monkeypatch.setenv("SLURM_STEP_ID", "1")  # srun steps: the step in the name
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert run_dir(base, "d/t") == f"{base}/slurm/70_7.1"
    monkeypatch.setenv("SLURM_PROCID", "2")  # other ranks: scratch for Hydra's files, but they
    scratch = run_dir(base, "d/t")  # look for the run's checkpoints where rank 0 has them
    assert not scratch.startswith(base) and scratch.endswith("t-rank2")
    assert checkpoint_folder(scratch, base) == Path(f"{base}/slurm/70_7.1")
    # every rank in the run folder itself (submitit's job folder in a sweep, or hydra.run.dir
    # given): that folder (rank 1 of a requeued submitit job looked in slurm/<job> and found
    # no checkpoint, started afresh beside rank 0's resumed run, and the ranks hung)
    shared = f"{base}/multirun/d/t/3"
    assert checkpoint_folder(shared, base) == Path(shared)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert checkpoint_folder(scratch, base) == Path(scratch)  # a first attempt starts afresh
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # an allocation used by hand
    assert run_dir(base, "d/t") == f"{base}/d/t"


def test_sharded_fsdp_checkpoints_are_refused_not_trained_over(tmp_path, capsys):
    """trainer.strategy.state_dict_type=sharded leaves last.ckpt/ as a folder of shards, which
    litlab took for no checkpoint: a requeued job started afresh in the run's folder (over its
    checkpoints, metrics and W&B run). Now one line saying what to do, there and for resume=."""
    from litlab.resume import newest_checkpoint, resume_argv

    folder = tmp_path / "run"
    (folder / "checkpoints" / "last.ckpt").mkdir(parents=True)  # as Lightning's FSDP writes it
    (folder / "checkpoints" / "last.ckpt" / "meta.pt").touch()
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    with pytest.raises(ConfigError, match="sharded FSDP checkpoints") as error:
        newest_checkpoint(folder)
    assert "state_dict_type=full" in str(error.value)
    with pytest.raises(SystemExit) as exit_info:
        resume_argv(["train.py", f"resume={folder}"])
    assert exit_info.value.code == 2
    assert "sharded FSDP checkpoints" in capsys.readouterr().err


def test_slurm_launcher_maps_devices_and_nodes(tmp_path):
    cfg = make_cfg(
        tmp_path,
        ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"],
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 4 and launcher.nodes == 2 and launcher.gpus_per_node == 4


@pytest.mark.parametrize("devices", ["auto", -1, "-1", 0, "0,1", [0, 1], True])
def test_slurm_launcher_refuses_devices_that_are_not_a_count(devices):
    with pytest.raises(ConfigError, match="needs their number"):
        slurm_tasks(devices)


def test_slurm_launcher_asks_no_gpus_for_a_cpu_job(tmp_path):
    assert slurm_tasks("4") == 4 and slurm_gpus(4, "auto") == 4 and slurm_gpus(4, "gpu") == 4
    cfg = make_cfg(
        tmp_path, ["hydra/launcher=slurm", "trainer.accelerator=cpu", "trainer.devices=2"]
    )
    assert cfg.hydra.launcher.tasks_per_node == 2 and cfg.hydra.launcher.gpus_per_node is None


@pytest.mark.parametrize(
    "task",
    [
        ["trainer.devices=1,4"],
        ["+trainer.num_nodes=range(1,3)"],
        ["trainer=ddp,fsdp", "trainer.devices=4"],  # fsdp's own devices and num_nodes differ
        ["trainer.accelerator=cpu,gpu", "trainer.devices=2"],  # GPUs asked for, or none
        ["trainer=cpu,gpu", "trainer.devices=2", "trainer.num_nodes=1"],
    ],
)
def test_slurm_sweeps_cannot_vary_the_resources_of_their_one_array_job(task):
    with pytest.raises(ConfigError, match="one set of resources"):
        check_slurm_sweep(OmegaConf.create({"hydra": {"overrides": {"task": task}}}))
    fixed = ["trainer=ddp,fsdp", "trainer.devices=4", "trainer.num_nodes=2", "seed=1,2"]
    fixed.append("trainer.accelerator=gpu")
    check_slurm_sweep(OmegaConf.create({"hydra": {"overrides": {"task": fixed}}}))


def test_slurm_sweep_with_devices_auto_or_swept_ends_in_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "bin"  # an sbatch that records being called: a refused sweep submits nothing
    fake.mkdir()
    for tool in ("sbatch", "srun"):  # SLURM's, as submitit looks for them
        (fake / tool).write_text(f"#!/bin/sh\ntouch {tmp_path / 'submitted'}\nexit 1\n")
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    common = ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=p", *QUIET]
    for args, says in [
        (["trainer=ddp"], "trainer.devices=auto"),
        (["trainer=fsdp"], "trainer.devices=-1"),
        (["trainer=ddp", "trainer.devices=1,4"], "varies trainer.devices"),
    ]:
        out = run_cli(*common, *args, f"paths.log_dir={tmp_path / 'out'}")
        assert out.returncode == 2, out.stderr[-2000:]
        assert out.stderr.strip().splitlines()[-1].startswith("litlab: error: hydra/launcher=slurm")
        assert says in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_ddp_job_of_the_submitit_local_launcher_is_refused_and_recorded_failed(tmp_path):
    """Hydra's submitit_local launcher runs each job in one process started by submitit's
    script: Lightning started rank 1 by running that script again with Hydra's arguments, it
    failed on them, the job waited 90 s, Hydra ended in a traceback and the run's summary stayed
    "running" (walkthrough 142). Refused as the trainer is built: the job failed, the sweep
    says so. (ddp_spawn runs there: not refused.)"""
    out = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        *SYNTH,
        *QUIET_CSV,
        *CPU_DDP,
        "trainer.max_epochs=1",
        f"paths.log_dir={tmp_path}",
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    (summary,) = summaries(tmp_path)
    assert summary["status"] == "failed"
    assert "hydra/launcher=submitit_local runs each job in one process" in summary["error"]
    assert len(list(tmp_path.rglob("sweep_summary.json"))) == 1


def test_command_lines_that_hydra_or_submitit_end_in_a_traceback_are_one_line(
    tmp_path, monkeypatch
):
    """submitit looked for srun once Hydra had started the sweep; Hydra refused --cfg beside -m
    and resolved --cfg hydra without the run's paths: each a traceback."""
    from litlab.distributed.launchers import check_command_line

    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    argv = ["train.py", "-m", "hydra/launcher=slurm", "seed=1,2"]
    with pytest.raises(ConfigError, match=r"which this machine does not have \(no srun on PATH\)"):
        check_command_line(argv)
    with pytest.raises(ConfigError, match="no srun"):
        check_command_line(["train.py", "--multirun", "+hydra/launcher=slurm", "seed=1,2"])
    check_command_line(["train.py", "-m", "seed=1,2"])  # no SLURM asked for: nothing to check
    check_command_line([*argv, "--help"])  # prints, submits nothing (walkthrough 142)
    # --cfg beside -m: Hydra's traceback (ValueError: Only one of --run, --multirun, --cfg...)
    with pytest.raises(ConfigError, match="--cfg prints the config of one job, which Hydra"):
        check_command_line([*argv, "--cfg", "job"])
    check_command_line(["train.py", "hydra/launcher=slurm"])  # no -m: Hydra runs it here
    # Hydra resolved its own node without the job's ${paths...}: InterpolationKeyError traceback
    for shown in (["--cfg", "hydra"], ["--cfg=hydra"], ["-c", "hydra"]):
        with pytest.raises(ConfigError, match="show them resolved with --cfg all --resolve"):
            check_command_line(["eval.py", *shown, "--resolve"])
    check_command_line(["train.py", "--cfg", "all", "--resolve"])
    check_command_line(["train.py", "--cfg", "hydra"])
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    check_command_line(argv)


LAUNCHER_VARS = (
    "TORCHELASTIC_RUN_ID",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "SLURM_JOB_NAME",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NNODES",
)


def test_nodes_nothing_started_and_a_spawning_strategy_under_a_launcher_are_refused(monkeypatch):
    """trainer.num_nodes=2 with nothing to start the other node waited 30 minutes at "MEMBER:
    1/2"; trainer=ddp_spawn under torchrun started 2 processes from each rank (then a gloo
    traceback). Both one line now; MASTER_ADDR and NODE_RANK set by hand start a node."""
    from litlab.distributed import adopt_launcher_layout
    from litlab.distributed.launchers import NODE_VARIABLES

    for var in (*LAUNCHER_VARS, *NODE_VARIABLES):
        monkeypatch.delenv(var, raising=False)

    def trainer(strategy: str, nodes: int = 1):
        return OmegaConf.create({"devices": 2, "num_nodes": nodes, "strategy": strategy})

    with pytest.raises(
        ConfigError, match=r"trainer\.num_nodes=2, but nothing started this process"
    ):
        adopt_launcher_layout(trainer("ddp", nodes=2))
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("NODE_RANK", "1")
    assert adopt_launcher_layout(trainer("ddp", nodes=2)) == {}  # Lightning's own environment
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ConfigError, match=r"torchrun started this run's processes, and trainer\.strategy=ddp_spawn"
    ):
        adopt_launcher_layout(trainer("ddp_spawn"))
    assert adopt_launcher_layout(trainer("ddp")) == {"devices": 2, "num_nodes": 1}


def test_devices_and_nodes_follow_the_processes_srun_started(monkeypatch, caplog):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert launcher_layout(1, 1) == {}
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a batch script's one task: one process
    assert launcher_layout(1, 1) == {}
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_NNODES", "1")
    assert launcher_layout(1, 1) == {"devices": 2, "num_nodes": 1}
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # a salloc shell: srun's counts, not ours
    assert launcher_layout(1, 1) == {}
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_NTASKS", "6")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x3)")
    monkeypatch.setenv("SLURM_NNODES", "3")
    with caplog.at_level(logging.INFO, logger="litlab"):
        assert launcher_layout(4, 1) == {"devices": 2, "num_nodes": 3}
    # what it replaced is said too (walkthrough 153: the 4 asked for was not in the line)
    assert "using trainer.devices=2 trainer.num_nodes=3 (the config's: 4 and 1)" in caplog.text
    for per_node, nodes in [("2(x2),1", "3"), ("2", "2")]:  # uneven; 6 tasks are not 2 x 2
        monkeypatch.setenv("SLURM_NTASKS_PER_NODE", per_node)
        monkeypatch.setenv("SLURM_NNODES", nodes)
        with pytest.raises(ConfigError, match="srun started 6 tasks"):
            launcher_layout(1, 1)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")  # Lightning's SLURM environment needs it
    with pytest.raises(ConfigError, match="--ntasks-per-node"):
        launcher_layout(1, 1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")  # torchrun inside a SLURM job: torchrun's
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert launcher_layout(1, 1) == {"devices": 4, "num_nodes": 2}


@pytest.mark.parametrize("launcher", [{"WORLD_SIZE": "2"}, {"SLURM_NTASKS": "2"}])
def test_tuning_refuses_the_processes_of_an_external_launcher(tmp_path, monkeypatch, launcher):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in launcher.items():
        monkeypatch.setenv(var, value)
    cfg = make_cfg(
        tmp_path,
        [*SYNTH, "trainer.accelerator=cpu", "tune.lr=true", "tune.lr_finder.num_training=10"],
    )
    with pytest.raises(ConfigError, match="without torchrun or srun"):
        tune(cfg, tmp_path)


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


def wandb_runs(root: Path) -> list[Path]:
    return sorted(root.rglob("offline-run-*"))


@pytest.mark.dist
@pytest.mark.slow
def test_ddp_single_run_one_folder_and_exact_eval(tmp_path):
    result = run_cli(
        *SYNTH,
        *QUIET,
        "logger=wandb",
        "trainer=ddp",  # README's line: the GPU option (sync_batchnorm on) run on CPU processes
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        "data.source.test_size=255",  # odd: a padded evaluation would count one image twice
        f"paths.log_dir={tmp_path / 'out'}",
        "+callbacks.sums._target_=helpers.RecordEpochSums",
        f"+callbacks.sums.path={tmp_path / 'sums.json'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = one_completed_run(tmp_path, 2)
    # data.batch_size is each process's: the log says what a step of the job is, once
    log_text = (Path(summary["run_dir"]) / "train.log").read_text()
    steps = summary["data"]["splits"]["train"] // 64  # (the last partial batch dropped)
    said = (
        f"2 processes x data.batch_size=32: 64 images a batch of the job, {steps} batches an epoch"
    )
    assert log_text.count(said) == 1
    # The epoch's training accuracy and loss are over both ranks' images, each rank counting
    # its own shard (a rank's sums are not rank 0's: DDP copies buffers from rank 0).
    ranks = json.loads((tmp_path / "sums.json").read_text())
    assert ranks["rank0"] != ranks["rank1"] and ranks["rank0"][3] == ranks["rank1"][3] > 0
    # and the step curve too (it was rank 0's batch alone): the last batch's, over both ranks
    losses = ranks["last_losses"]
    assert len(set(losses)) == 2
    assert summary["metrics"]["train/loss_step"] == pytest.approx(sum(losses) / 2, rel=1e-6)
    total = [a + b for a, b in zip(ranks["rank0"], ranks["rank1"], strict=True)]
    assert summary["metrics"]["train/acc"] == pytest.approx(total[1] / total[3], abs=1e-6)
    assert summary["metrics"]["train/loss"] == pytest.approx(total[0] / total[3], rel=1e-6)
    # The DDP test accuracy (255 test images split over 2 ranks, each tested once, synced by
    # torchmetrics) equals the accuracy of the same checkpoint tested by one process.
    cfg = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={summary['best_checkpoint']}", "extras.print_config=false"],
        config_name="eval",
    )
    eval_task_acc = eval_task(cfg)
    assert eval_task_acc == pytest.approx(summary["metrics"]["test/acc"], abs=1e-7)
    # and the loss: each rank's images weigh what they are (127 and 128 here)
    single = summary_of(cfg)["metrics"]["test/loss"]
    assert summary["metrics"]["test/loss"] == pytest.approx(single, rel=1e-6)
    # and each class's counts (synced over the ranks), so the classes' mean accuracy too
    assert summary["test_per_class"] == summary_of(cfg)["test_per_class"]
    assert sum(c["images"] for c in summary["test_per_class"].values()) == 255
    macro = summary_of(cfg)["metrics"]["test/acc_macro"]
    assert summary["metrics"]["test/acc_macro"] == pytest.approx(macro, abs=1e-7)
    # eval.py under ddp_spawn: the same figures, and the data's account (its summary had the
    # source's name alone: the report put the run on another scale, review 177)
    spawned = tmp_path / "spawned"
    args = [f"ckpt_path={summary['best_checkpoint']}", f"hydra.run.dir={spawned}", "logger=csv"]
    result = run_cli(*args, "trainer=ddp_spawn", *CPU_DDP[:2], script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    tested = json.loads((spawned / "summary.json").read_text())
    assert tested["data"] == summary_of(cfg)["data"] and tested["data"]["splits"] == {"test": 255}
    assert tested["metrics"]["test/acc"] == pytest.approx(eval_task_acc, abs=1e-7)


@pytest.mark.dist
@pytest.mark.slow
def test_unreadable_files_are_counted_once_over_every_rank_and_pass(tmp_path):
    """Files read as they go (cache=false): each rank reads its own share of every split, and
    the training files again every epoch. summary.json counts each unreadable file once,
    whichever rank read it (rank 0's reads, summed over passes, before)."""
    root = tmp_path / "images"
    for split, per_class, broken in (("train", 6, 2), ("val", 2, 1), ("test", 3, 4)):
        write_png_folder(root / split, per_class=per_class)
        for i in range(broken):
            (root / split / "fox" / f"broken{i}.png").write_bytes(b"not an image")
    (root / "train" / "fox" / "notes.txt").write_text("not an image either")
    # train/: 20 files, 10 a rank, 2 batches of 5: every file read in each of the 3 epochs
    result = run_cli(
        *CPU_DDP,
        *QUIET_CSV,
        "data=image_folder",
        f"data.source.root={root}",
        "data.source.cache=false",
        "data.source.size=20",
        "data.image_shape=[3,16,16]",
        "data.num_classes=3",
        "data.num_workers=0",
        "data.batch_size=5",
        "model.net.width=8",
        "model.scheduler=null",  # 6 steps: too few for the one-cycle warm-up
        "trainer.max_epochs=3",
        f"paths.log_dir={tmp_path / 'out'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]
    assert summary["data"]["skipped_while_loading"] == 7
    # and the run's log names every one, whichever rank read it (it named rank 0's alone)
    (log,) = [p.read_text() for p in (tmp_path / "out").rglob("train.log")]
    for broken in root.rglob("broken*.png"):
        assert str(broken) in log, broken
    # what a scan leaves unread, said once, not by every rank (walkthrough 182)
    assert (result.stdout + result.stderr).count("not read: 1 .txt") == 1


def test_an_evaluation_split_of_fewer_images_than_ranks_is_refused_not_counted_twice(tmp_path):
    """A val/ folder of 1 image on 2 ranks: each rank's loader was padded by repeating the
    image, so val/acc and val/loss, the objective, counted it twice (a val split of 2 images on
    3 ranks gave val/acc 0.6667 where 1 of 2 was right; review 151), without a word. Refused
    before the fit trains, in the line a streamed split gets."""
    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=6)
    write_png_folder(root / "val", classes=("cat",), per_class=1)
    for other in ("dog", "fox"):
        (root / "val" / other).mkdir()  # the same classes, without validation images
    write_png_folder(root / "test", per_class=2)
    args = [*CPU_DDP, *QUIET_CSV, "data=image_folder", f"data.source.root={root}"]
    args += ["data.source.size=20", "data.image_shape=[3,16,16]", "data.num_classes=3"]
    args += ["data.num_workers=0", "data.batch_size=4", "model.net.width=8"]
    args += ["model.scheduler=null", "trainer.max_epochs=1"]
    result = run_cli(*args, f"paths.log_dir={tmp_path / 'out'}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "litlab: error: the image_folder val split holds 1 image(s), fewer than the run's 2 "
        "processes, each of which evaluates images of its own (repeated images would count "
        "twice); add images to the split, or run on fewer processes"
    )
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "failed" and not list((tmp_path / "out").rglob("*.ckpt"))
    # a test/ of 1 image: refused before the fit, not after it (its folder is decoded at the
    # test; review 154)
    write_png_folder(root / "val", per_class=2)
    shutil.rmtree(root / "test")
    write_png_folder(root / "test", classes=("cat",), per_class=1)
    for other in ("dog", "fox"):
        (root / "test" / other).mkdir()
    again = run_cli(*args, f"paths.log_dir={tmp_path / 'out2'}")
    assert again.returncode == 2, again.stderr[-3000:]
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "litlab: error: the image_folder test split holds 1 image(s), fewer than the run's 2 "
        )
    )
    assert not list((tmp_path / "out2").rglob("*.ckpt"))  # nothing trained


def test_a_spawned_copy_of_the_classifier_accumulates_into_tensors_of_its_own():
    """What ddp_spawn's processes get: the module sent through torch.multiprocessing, its
    tensors in shared memory (Lightning unshares parameters and buffers only). Set up, the
    copy's training sums and torchmetrics states are its own (each rank added into one copy)."""
    from multiprocessing.reduction import ForkingPickler

    import lightning as L
    import torch.multiprocessing  # registers the shared-memory reductions

    model = ImageClassifier(torch.nn.Linear(4, 10), torch.optim.SGD, num_classes=10)
    copy = pickle.loads(ForkingPickler.dumps(model))

    def states(m: ImageClassifier) -> list[torch.Tensor]:
        return [m._loss_sum, m._place_sums, m.val_loss.mean_value, m.test_loss.weight]

    assert all(t.is_shared() for t in states(copy))
    copy.trainer = L.Trainer(logger=False, enable_checkpointing=False)
    copy.setup("fit")
    assert not any(t.is_shared() for t in states(copy))


@pytest.mark.dist
@pytest.mark.slow
def test_ddp_and_ddp_spawn_sweeps_train_and_report_alike(tmp_path):
    """A sweep of two jobs in a row under ddp, and of one under ddp_spawn (its processes,
    pickled config and W&B run are what differ; the jobs' sequence is the same code).

    The spawned job trains as the ddp job of the same settings and seed, the second of its
    sweep: on a CPU the spawned processes get the module in shared memory, and Lightning
    unshares only its parameters and buffers: both ranks added into one copy of the
    classifier's epoch sums (the reviewer's train/acc 1.85 where ddp gave 0.92), while
    validation was right. Its summary says what ddp's says: epochs, the splits' images, rates
    and FLOPs (walkthrough 132: none of them, FLOPs null, and the report compared such runs
    apart for want of the splits)."""
    asked = {"ddp": [1e-3, 3e-3], "ddp_spawn": [3e-3]}
    jobs: dict[str, list[Path]] = {}
    for strategy, lrs in asked.items():
        result = run_cli(
            "-m",
            f"model.optimizer.lr={','.join(map(str, lrs))}",
            *SYNTH,
            *QUIET,
            "logger=wandb",
            *CPU_DDP,
            f"trainer.strategy={strategy}",
            "trainer.max_epochs=1",
            f"paths.log_dir={tmp_path / strategy}",
            timeout=400,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        root = tmp_path / strategy
        jobs[strategy] = sorted(p.parent for p in root.rglob("summary.json"))
        # one sweep, a folder per job, nothing else
        assert [p.name for p in jobs[strategy]] == [str(i) for i in range(len(lrs))]
        assert len(list(root.rglob("sweep_summary.json"))) == 1
        logged = []
        for job in jobs[strategy]:
            summary = json.loads((job / "summary.json").read_text())
            assert summary["status"] == "completed"
            # the best file's score (ddp_spawn brings back its path alone: was null, the
            # objective then the last validation's value)
            assert summary["best_score"] is not None
            assert summary["objective"]["value"] == summary["best_score"]
            (wandb_dir,) = wandb_runs(job)
            logged.append(offline_run(wandb_dir)["config"]["model.optimizer.lr"])
            if strategy == "ddp":  # rank 1 ran this job, in this folder
                assert (job / "train_ddp_process_1.log").is_file()
                assert "results: " not in (job / "train_ddp_process_1.log").read_text()
            # the job's figures in its log, once (rank 0's)
            assert (job / "train.log").read_text().count("results: val/acc ") == 1
        assert logged == lrs
        assert len({offline_run(w)["id"] for w in wandb_runs(root)}) == len(lrs)  # finish()
        leftover = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True)
        assert leftover.stdout.split() == []  # no orphaned rank processes

    def said(job: Path) -> dict:
        summary = json.loads((job / "summary.json").read_text())
        with open(job / "csv" / "metrics.csv") as f:
            (row,) = [r for r in csv.DictReader(f) if r.get("test/acc")]
        return {
            "metrics": summary["metrics"],
            "tested_at": (row["epoch"], row["step"]),
            "epochs": summary.get("epochs"),
            "steps_per_epoch": summary.get("steps_per_epoch"),
            "data": summary.get("data"),
            "perf": sorted(summary.get("perf", {})),
            "flops_per_image": summary.get("perf", {}).get("flops_per_image"),
            "memory": sorted(summary.get("memory", {})),
            # (the spawned rank's, handed to the main process: none before, walkthrough 165)
            "test_per_class": summary.get("test_per_class"),
            # litlab's lines from the fit, in train.log (a spawned process had no handler:
            # its lines were lost, its warnings printed bare to the console alone)
            "logged": [
                line.split(" - ", 1)[1]
                for line in (job / "train.log").read_text().splitlines()
                if "a batch of the job" in line or line.endswith("one latent vector)")
            ],
        }

    ddp, spawned = said(jobs["ddp"][1]), said(jobs["ddp_spawn"][0])  # both at lr 3e-3
    for name in ("train/loss", "train/acc", "train/acc_top5", "val/loss", "val/acc", "test/acc"):
        assert spawned["metrics"][name] == pytest.approx(ddp["metrics"][name], rel=1e-4), name
    # the test is logged where the fit ended (the spawned fit's counters stayed in its
    # processes: the test row read epoch 0, step 0)
    assert ddp["tested_at"][1] not in ("", "0")
    del ddp["metrics"], spawned["metrics"]
    assert spawned == ddp and ddp["flops_per_image"] > 0 and ddp["test_per_class"]
    assert "test_images_per_s" in ddp["perf"] and ddp["data"]["splits"]["val"] > 0


@pytest.mark.slow
@pytest.mark.dist
def test_a_ddp_job_failing_on_every_rank_does_not_end_the_sweep(tmp_path):
    """Job 0 diverges on both ranks; Lightning's watcher of rank processes used to SIGKILL the
    main process (the sweep) when rank 1 exited with the error, so job 1 never finished."""
    result = run_cli(
        "-m",
        "+callbacks.nan.at_batch=3,100000",
        "+callbacks.nan._target_=helpers.InjectNaN",
        "+callbacks.nan.module=net",
        "callbacks.divergence_guard.check_every_n_steps=1",
        *SYNTH,
        *QUIET,
        "logger=csv",
        "trainer.max_epochs=1",
        *CPU_DDP,
        f"paths.log_dir={tmp_path}",
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    statuses = [json.loads((job / "summary.json").read_text())["status"] for job in jobs]
    assert statuses == ["failed", "completed"]
    leftover = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True
    ).stdout.split()
    assert leftover == []


@pytest.mark.slow
@pytest.mark.dist
def test_an_error_on_rank_0_alone_stops_the_other_ranks_soon(tmp_path):
    """Rank 0 raises in a training step; rank 1 waits in the backward's all-reduce for it, and
    Lightning does not stop it (its launcher kills the ranks on Ctrl-C only): the run took the
    whole 120 s that litlab gave a rank to end once the job was over, then killed it."""
    result = run_cli(
        "+callbacks.boom._target_=helpers.RaiseOnRank",
        "+callbacks.boom.at_batch=2",
        "+callbacks.boom.rank=0",
        *SYNTH,
        *QUIET,
        "logger=csv",
        "trainer.max_epochs=1",
        *CPU_DDP,
        f"paths.log_dir={tmp_path}",
        timeout=400,
    )
    assert result.returncode == 1 and "an error on rank 0 alone" in result.stderr
    (summary,) = tmp_path.rglob("summary.json")
    record = json.loads(summary.read_text())
    assert record["status"] == "failed" and "an error on rank 0 alone" in record["error"]
    # the grace (10 s) and the start, not the 120 s a finished job's ranks get
    assert record["durations_s"]["total"] < 90
    stopped = "still ran 10 s after this rank's job ended (waiting on this rank in a collective)"
    assert stopped in result.stdout + result.stderr
    log = (summary.parent / "train.log").read_text()  # the error, with its traceback
    assert "the run failed: an error on rank 0 alone" in log and "Traceback" in log
    leftover = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True
    ).stdout.split()
    assert leftover == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], tmp_path: Path, own_tmp: bool = False) -> subprocess.Popen:
    """torchrun ``args``; ``own_tmp``: its temporary folder (ranks > 0's scratch folders:
    rank_scratch) tmp_path/tmp (not with loader workers: a forkserver's socket path under
    pytest's deep folders is longer than AF_UNIX allows)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        **({"TMPDIR": str(tmp_path / "tmp")} if own_tmp else {}),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_args(tmp_path: Path, data: list[str] = SYNTH) -> list[str]:
    return [
        str(REPO / "train.py"),
        *data,
        *QUIET,
        "logger=wandb",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        "trainer.strategy=ddp",
        f"paths.log_dir={tmp_path / 'out'}",
        "+callbacks.dump._target_=helpers.DumpWeights",
        f"+callbacks.dump.folder={tmp_path / 'weights'}",
    ]


def one_completed_run(tmp_path: Path, ranks: int) -> dict:
    """The one run's summary (one folder, one W&B run, completed) of ``ranks`` processes."""
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "completed"
    # one W&B run (a requeued job's part is another offline folder of the same run id)
    assert len({run.name.rsplit("-", 1)[-1] for run in wandb_runs(tmp_path / "out")}) == 1
    # the run says how many processes trained it: in summary.json and in its checkpoints' config
    assert summary["world_size"] == ranks
    trainer = torch.load(summary["last_checkpoint"], weights_only=False)["hyper_parameters"]
    assert trainer["trainer"]["devices"] * trainer["trainer"]["num_nodes"] == ranks
    return summary


def assert_one_run_identical_weights(tmp_path: Path, ranks: int) -> dict:
    """The one run's summary, completed, its ranks ending with identical weights."""
    summary = one_completed_run(tmp_path, ranks)
    weights = [
        torch.load(tmp_path / "weights" / f"rank{r}.pt", weights_only=True) for r in range(ranks)
    ]
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.equal(value, other[name]), name
    return summary


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_single_node(tmp_path):
    proc = torchrun(["--standalone", "--nproc_per_node=2", *run_args(tmp_path)], tmp_path, True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    # litlab's lines once (rank 0's): rank 1 said the launcher's layout on the console too
    assert out.count("torchrun started 2 process(es) per node") == 1, out[-3000:]
    summary = assert_one_run_identical_weights(tmp_path, 2)
    # how to start it again: a report's resume line for it, were it killed hard (walkthrough 162)
    assert summary["launched_as"] == "torchrun --nnodes=1 --nproc_per_node=2"
    # eval.py under the same torchrun: it kept trainer.devices=1 against torchrun's 2 processes
    # (Lightning's "does not match the world size" after the data and model were built)
    evaluation = [str(REPO / "eval.py"), f"ckpt_path={summary['best_checkpoint']}"]
    evaluation += ["extras.print_config=false", "logger=wandb"]
    evaluation += ["trainer.accelerator=cpu", f"paths.log_dir={tmp_path / 'eval'}"]
    proc = torchrun(["--standalone", "--nproc_per_node=2", *evaluation], tmp_path, True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    (tested,) = summaries(tmp_path / "eval")
    assert tested["status"] == "completed" and tested["world_size"] == 2
    assert tested["metrics"]["test/acc"] == summary["metrics"]["test/acc"]
    # rank 1's Hydra files and log (a scratch folder each run) are gone once its runs completed
    assert not list((tmp_path / "tmp").glob("litlab-ranks-*/*"))


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (not ended, nor a zombie yet to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.dist
@pytest.mark.slow
def test_the_ranks_of_a_torchrun_killed_hard_stop_as_by_sigterm(tmp_path):
    """torch's elastic agent starts each rank in a session of its own: a torchrun killed with
    SIGKILL (the out-of-memory killer; kill -9 of its process group reaches it alone) left its
    ranks training on, unsupervised, to the end (walkthrough 162). They stop now as a SIGTERM
    stops them: last.ckpt saved, the run interrupted, its resume line torchrun's."""
    args = [*run_args(tmp_path), "trainer.max_epochs=1000"]  # (the last of a key wins)
    proc = torchrun(["--standalone", "--nproc_per_node=2", *args], tmp_path)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "out").rglob("best.ckpt")):  # training: an epoch ended
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        listed = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        ranks += [int(pid) for pid in listed.stdout.split()]
        assert len(ranks) == 2
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120
        while any(running(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(running(pid) for pid in ranks)
    finally:
        proc.kill()
        for pid in ranks:  # (a failed test leaves none behind)
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "interrupted"
    # ("continue [from its last checkpoint] with: ..."; the launcher's layout in it)
    assert " with: torchrun --nnodes=1 --nproc_per_node=2 train.py resume=" in summary["error"]
    assert Path(summary["last_checkpoint"]).is_file()


@pytest.mark.dist
@pytest.mark.slow
def test_ranks_resolving_different_precisions_are_refused(tmp_path):
    """trainer.precision=auto is resolved by each process on its own hardware: under torchrun a
    job spanning node types trained its ranks at different precisions (tests/two_kinds_of_node.py:
    rank 0's CPU has native bfloat16, rank 1's not)."""
    args = run_args(tmp_path)
    args[0] = str(REPO / "tests" / "two_kinds_of_node.py")
    proc = torchrun(
        ["--standalone", "--nproc_per_node=2", *args, "trainer.precision=auto"], tmp_path, True
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    needle = "the ranks would compute at different precisions (bf16-mixed on rank(s) 0; 32-true on"
    assert needle in out, out[-3000:]
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "failed" and summary["precision"]["chosen"] == "bf16-mixed"
    # rank 1's log is kept where the run failed (its scratch folder): its own precision's line
    (log,) = (tmp_path / "tmp").glob("litlab-ranks-*/*-rank1/train.log")
    assert "trainer.precision=auto: 32-true (this CPU has no native bfloat16" in log.read_text()


def streamed_digits(tmp_path: Path) -> list[str]:
    """data=streaming over the digits converted into LitData chunks."""
    from litlab.data.optimize import convert

    convert(write_digits_folder(tmp_path / "digits"), str(tmp_path / "chunks"), workers=2)
    return [
        "data=streaming",
        f"data.source.input_dir={tmp_path / 'chunks'}",
        "data.num_classes=10",
        "data.source.channels=1",
        "data.source.size=28",
        "data.image_shape=[1,28,28]",
        "data.batch_size=64",
        "data.num_workers=1",
        "model.net.width=8",
    ]


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_two_nodes_on_loopback(tmp_path):
    """Two torchrun "nodes" of one process each on this machine: one run, the same weights on
    both ranks, on streamed data (LitData finds its ranks under torchrun; the single-node test
    above runs the in-memory loader)."""
    args = run_args(tmp_path, streamed_digits(tmp_path))
    port = free_port()
    nodes = [
        torchrun(
            [
                "--nnodes=2",
                f"--node_rank={rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                *args,
            ],
            tmp_path,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, out in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-3000:]
    assert_one_run_identical_weights(tmp_path, 2)


@pytest.mark.dist
@pytest.mark.slow
def test_srun_tasks_train_one_model_whatever_trainer_devices_says(tmp_path):
    """Two processes as `srun --ntasks-per-node=2 python train.py` starts them, with the default
    trainer.devices=1: they follow srun's layout and train one model in one run folder."""
    args = [a for a in run_args(tmp_path) if a != "trainer.strategy=ddp"]
    for code, out in srun_two_tasks(args):
        assert code == 0, out[-3000:]
    assert_one_run_identical_weights(tmp_path, 2)
    assert (tmp_path / "out" / "train" / "slurm" / "4242" / "summary.json").is_file()


def srun_two_tasks(args: list[str], **env: str) -> list[tuple[int, str]]:
    """train.py ``args`` in two processes as `srun --ntasks-per-node=2` starts them in SLURM
    job 4242 (with ``env``); each one's exit status and output."""
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2"}
    slurm.update(SLURM_NTASKS_PER_NODE="2", SLURM_NNODES="1", SLURM_NODEID="0")
    slurm.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "WANDB_SERVICE"))}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), base.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env={**base, **slurm, **env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]


@pytest.mark.dist
@pytest.mark.slow
def test_slurm_warning_signal_under_ddp_saves_on_every_rank_and_requeues_once(tmp_path):
    """SIGUSR1 (SLURM's --signal before the time limit) reaching one rank of two: both stop
    after the same batch, last.ckpt is written, rank 0 calls `scontrol requeue` once, and the
    requeued job finishes the run in the job's folder. (Lightning's SLURM handler saved from
    inside the signal handler: its collectives met the other rank's training ones, which hung
    or broke the job; the reviewer's 2 of 6 runs with the signal on both ranks hung.) The
    signal on rank 1 alone: rank 0, which requeues, did not know which signal stopped the run,
    and the job ended without a requeue (walkthrough 184)."""
    args = [a for a in run_args(tmp_path) if a != "trainer.strategy=ddp"]
    args += ["trainer.max_epochs=2", "+callbacks.stop._target_=helpers.SignalAt"]
    args += ["+callbacks.stop.batch=3", "+callbacks.stop.signum=SIGUSR1", "+callbacks.stop.rank=1"]
    scontrol = fake_scontrol(tmp_path)
    for code, out in srun_two_tasks(args, **scontrol):
        assert code == 143, out[-3000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    folder = tmp_path / "out" / "train" / "slurm" / "4242"
    assert json.loads((folder / "summary.json").read_text())["status"] == "requeued"
    saved = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 5  # batch 3's signal read at batch 4's end: 5 steps

    for code, out in srun_two_tasks(args, **scontrol, SLURM_RESTART_COUNT="1"):
        assert code == 0, out[-3000:]
    summary = assert_one_run_identical_weights(tmp_path, 2)
    assert summary["resumed_from"] == str(folder / "checkpoints" / "last.ckpt")
    # the job again once completed: how to train it further, under srun as it runs
    # (walkthrough 184: "python train.py resume=...", then refused for its process count)
    again = srun_two_tasks(args, **scontrol, SLURM_RESTART_COUNT="2")
    assert f"srun --nodes=1 --ntasks-per-node=2 python train.py resume={folder}" in again[0][1]


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize(
    "signal_at",
    [
        ["+callbacks.stop._target_=helpers.SignalAtTrainEnd"],
        [
            "+callbacks.stop._target_=helpers.SignalInValidation",
            "+callbacks.stop.epoch=0",
            "+callbacks.stop.rank=1",
        ],
    ],
    ids=["fit end", "rank 1 in the last validation"],
)
def test_a_sigterm_as_a_ddp_fit_ends_is_held_until_the_run_records_it(tmp_path, signal_at):
    """Under DDP a SIGTERM from the fit's end to the run's .trained mark went to Lightning's
    handler, which broadcasts from inside itself: a rank whose peer had ended failed there,
    the run "failed" without .trained, and its resume= was refused as trained to its end
    (walkthrough 184, 1 run in 3). Held for the run: it stops once .trained is written,
    interrupted, and resume= tests the trained model. A SIGTERM to one rank in the last
    validation was swallowed (the run tested and completed): every rank stops alike."""
    folder = tmp_path / "run"
    args = [*CPU_DDP, *QUIET_CSV, "model.net.width=8", "trainer.max_epochs=1"]
    args += ["model.scheduler=null", f"hydra.run.dir={folder}"]
    stopped = run_cli(*args, *signal_at)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (folder / ".trained").is_file()
    assert "test/acc" not in summary["metrics"]
    assert f"test it with: python train.py resume={folder}" in stopped.stderr + stopped.stdout
    tested = run_cli(f"resume={folder}")
    assert tested.returncode == 0, tested.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_multirun_leaves_one_sweep_folder_with_every_job(tmp_path):
    """torchrun ... train.py -m seed=1,2: every rank runs the sweep's jobs in step; only rank 0's
    sweep folder is written, and it holds both jobs, each trained by both ranks alike."""
    script, *args = run_args(tmp_path)
    args = [a if not a.startswith("+callbacks.dump.folder") else a + "/${seed}" for a in args]
    proc = torchrun(
        ["--standalone", "--nproc_per_node=2", script, "-m", *args, "seed=1,2"], tmp_path
    )
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    (sweep,) = sorted(p.parent for p in (tmp_path / "out").rglob("sweep_summary.json"))
    assert json.loads((sweep / "sweep_summary.json").read_text())["jobs"] == 2
    assert [s["status"] for s in summaries(sweep)] == ["completed", "completed"]
    assert sorted(p.name for p in (tmp_path / "out").rglob(".hydra")) == [".hydra"] * 2
    # rank 1 said its scratch sweep folder had "no job ... with an objective value"
    # (walkthrough 153): rank 0 alone sums up the sweep
    assert "has an objective value" not in out and out.count("compare the runs offline") == 1
    for seed in (1, 2):
        weights = [
            torch.load(tmp_path / "weights" / str(seed) / f"rank{r}.pt", weights_only=True)
            for r in (0, 1)
        ]
        for name, value in weights[0].items():
            assert torch.equal(value, weights[1][name]), (seed, name)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("saved", ["full", "sharded", "none kept"])
def test_a_model_sharded_over_two_ranks_is_tested_after_its_fit(tmp_path, saved):
    """FSDP on 2 ranks: the fit wraps the net's blocks inside the LightningModule, and the test
    after it loaded the full checkpoint into those flat shards ("size mismatch for
    net.stem.0.weight": every multi-GPU trainer=fsdp run ended failed after training; on one
    GPU torch shards nothing). Lightning's FSDPStrategy, given the CPU as its device
    (helpers.ShardedOnCPU; Lightning's own refuses a CPU), on 2 gloo processes."""
    result = run_cli(
        *SYNTH,
        *QUIET,
        "model=resnet",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        "+trainer.strategy={_target_: helpers.ShardedOnCPU, "
        "wrap: [torchvision.models.resnet.BasicBlock], "
        f"state_dict_type: {'sharded' if saved == 'sharded' else 'full'}}}",
        f"paths.log_dir={tmp_path / 'out'}",
        # no checkpoint kept: the test measured a model built afresh, its initial weights
        *(
            ["callbacks.model_checkpoint=null", "callbacks.last_checkpoint=null"]
            * (saved == "none kept")
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert 0 <= summary["metrics"]["test/acc"] <= 1
    if saved == "sharded":  # a folder of shards: eval.py says how to consolidate it
        assert summary["tested_checkpoint"] == summary["best_checkpoint"]
        return
    if saved == "none kept":  # the trained weights, saved for the test
        assert summary["best_checkpoint"] is None and summary["last_checkpoint"] is None
        assert summary["tested_checkpoint"].endswith("checkpoints/tested.ckpt")
    else:
        assert summary["tested_checkpoint"] == summary["best_checkpoint"]
    cfg = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={summary['tested_checkpoint']}", "extras.print_config=false"],
        config_name="eval",
    )
    assert eval_task(cfg) == pytest.approx(summary["metrics"]["test/acc"], abs=1e-7)


@pytest.mark.dist
def test_weight_decay_keeps_its_kernels_under_fsdp(tmp_path):
    """decay_norm_and_bias=false: the kernels decay, the norms and biases do not, told apart by
    shape. FSDP with its original parameters (Lightning's, before configure_optimizers) shows
    every parameter as a flat 1-D view of its shard, so every one went to no_decay: ResNet-50 on
    several GPUs trained with no weight decay at all. Told apart by name now, as before wrapping."""
    import torch.multiprocessing as mp

    from helpers import decay_groups_under_fsdp

    mp.spawn(decay_groups_under_fsdp, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        groups = torch.load(tmp_path / f"rank{rank}.pt")
        assert groups["flat"], rank  # the case: FSDP flattened every parameter
        assert groups["after"] == groups["before"] and groups["before"][0] > 0, (rank, groups)


@pytest.mark.dist
def test_ranks_agree_on_a_flag_one_call_late_or_at_once(tmp_path):
    """Preemption's agreement (AnyRank): a flag raised on one rank reaches every rank at the
    same call, the next one (the all-reduce runs while the next step does), or at once where
    asked; a flag never raised is never reported."""
    import torch.multiprocessing as mp

    from helpers import agree_on_flags

    mp.spawn(agree_on_flags, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        told = torch.load(tmp_path / f"rank{rank}.pt")
        assert told["later"] == [False, False, False, True], rank
        assert told["now"] == [True, False, True, False], rank


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_continues_an_optuna_study_once_on_every_rank(tmp_path):
    """README's "resume a study" under torchrun: every rank runs the sweep; asking the shared
    study, each rank recorded every trial (twice the trials), and a rank that saw rank 0's
    running trial drew other parameters, so the ranks trained different nets in one DDP job.
    Rank 0 asks the shared study, the other ranks a copy of its finished trials."""
    script, *args = run_args(tmp_path)
    args = [a for a in args if not a.startswith("+callbacks.dump")]
    args += ["logger=csv", "hydra.sweeper.sampler.n_startup_trials=1"]

    def study(*more: str) -> None:  # 2 trials of the study on 2 torchrun processes
        sweep = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", *args, *more]
        proc = torchrun(["--standalone", "--nproc_per_node=2", script, *sweep], tmp_path)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]

    study()
    (db,) = (tmp_path / "out").rglob("optuna.db")
    storage = f"sqlite:///{db}"
    weights = "+callbacks.dump.folder=" + str(tmp_path / "weights") + "/${hydra:job.num}"
    study(
        f"hydra.sweeper.storage={storage}", "+callbacks.dump._target_=helpers.DumpWeights", weights
    )
    import optuna

    trials = optuna.load_study(study_name="cnn_optuna", storage=storage).trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4  # new draws
    for job in (0, 1):  # each continued trial trained one net on both ranks alike
        ranks = [torch.load(tmp_path / "weights" / str(job) / f"rank{r}.pt") for r in (0, 1)]
        for name, value in ranks[0].items():
            assert torch.equal(value, ranks[1][name]), (job, name)


def test_a_fit_continued_on_another_number_of_processes_is_refused_unless_asked_for(tmp_path):
    """A run trained on 2 processes continued on 1 (a plain `python train.py resume=` of a run
    torchrun started, as its own "continue with" line said; walkthrough 153): each step half
    the images, the schedule refit, exit 0 with two warnings of other causes. Refused in one
    line naming how it ran; given trainer.devices, continued on purpose, with one warning."""
    out = tmp_path / "out"
    args = [*QUIET_CSV, "model.net.width=4", "data.batch_size=64"]
    first = run_cli(*CPU_DDP, *args, "trainer.max_epochs=1", f"paths.log_dir={out}")
    assert first.returncode == 0, first.stderr[-3000:]
    (last,) = out.rglob("last.ckpt")
    folder = last.parent.parent
    again = [*args, f"ckpt_path={last}", "trainer.max_epochs=2", f"paths.log_dir={tmp_path / 'b'}"]
    refused = run_cli(*again)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"litlab: error: {last} was written by a run on 2 process(es), and this one runs on 1: "
        "each step would take data.batch_size x 1 images, not x 2, and the LR schedule would be "
        "refit. Continue it on 2 (trainer.devices=2 trainer.num_nodes=1): under the torchrun or "
        f"srun command it ran with, train.py resume={folder}, or python train.py "
        f"resume={folder} trainer.devices=2 trainer.num_nodes=1; to continue on 1 on purpose, "
        "give trainer.devices (and trainer.num_nodes)"
    )
    # trainer=cpu chooses an accelerator, not a number of processes (review 155)
    assert run_cli(*again, "trainer=cpu").returncode == 2
    asked = run_cli(*again, "trainer.devices=1")
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert "continuing on 1 process(es) a run that trained on 2" in asked.stdout + asked.stderr


def test_a_ranks_scratch_folder_is_removed_only_when_it_holds_hydras_files_and_its_log(tmp_path):
    """Ranks > 0 under torchrun or srun remove their completed run's scratch folder: Hydra's
    files and the log; a profiler's file of that rank (debug=profile: review 159) keeps it."""
    from litlab.run import _remove_rank_scratch

    for extra, kept in ((None, False), ("profiler", True)):
        folder = tmp_path / f"stamp-rank1-{extra}"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text("{}")
        (folder / "train.log").write_text("a line")
        if extra:
            (folder / extra).mkdir()
            (folder / extra / "fit-rank1.txt").write_text("a profile")
        _remove_rank_scratch(folder)
        assert folder.is_dir() == kept


@pytest.mark.dist
@pytest.mark.slow
def test_a_net_with_a_layer_its_loss_never_uses_is_told_the_strategy_that_allows_it(tmp_path):
    """DDP refuses parameters a step's loss left unused: a net of one's own with a spare layer
    got a 40-frame traceback (walkthrough 173); one line now, naming the strategy that allows
    them, which then trains."""
    args = [*SYNTH[:-1], *QUIET_CSV, "model/net=custom", "model.net._target_=helpers.SpareLayerNet"]
    args += ["trainer.max_epochs=1", "+trainer.limit_train_batches=3", "test=false"]
    refused = run_cli(*args, *CPU_DDP, f"paths.log_dir={tmp_path / 'a'}")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "litlab: error: the model has parameters that a training step's loss did not use (a "
        "layer its forward never calls, or skips in some steps), and DDP all-reduces every one "
        "in every step: remove them from the net, or set "
        "trainer.strategy=ddp_find_unused_parameters_true (DDP then looks for them in every step)"
    )
    allowed = [*CPU_DDP[:-1], "trainer.strategy=ddp_find_unused_parameters_true"]
    trained = run_cli(*args, *allowed, f"paths.log_dir={tmp_path / 'b'}")
    assert trained.returncode == 0, trained.stderr[-2000:]


def test_the_unused_parameters_advice_keeps_how_the_ranks_start():
    """The strategy named for unused parameters starts the ranks as the one given did (ddp_fork
    was told ddp_...: review 179); a strategy node gets its own key (review 180)."""
    from litlab.distributed.strategy import unused_parameters_explained

    node = OmegaConf.create({"_target_": "lightning.pytorch.strategies.DDPStrategy"})
    advice = {
        "ddp": "trainer.strategy=ddp_find_unused_parameters_true",
        "ddp_spawn": "trainer.strategy=ddp_spawn_find_unused_parameters_true",
        "ddp_fork": "trainer.strategy=ddp_fork_find_unused_parameters_true",
        None: "trainer.strategy=ddp_find_unused_parameters_true",
    }
    for strategy, said in [*advice.items(), (node, "++trainer.strategy.find_unused_parameters")]:
        with (
            pytest.raises(ConfigError, match=re.escape(f"or set {said}")),
            unused_parameters_explained(strategy),
        ):
            raise RuntimeError("Expected to have finished reduction in the prior iteration")
