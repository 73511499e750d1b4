"""Scale-out: strategy choice, validation, and real multi-process runs on CPU (gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import QUIET, REPO, make_cfg, run_cli, summary_of, write_digits_folder
from litlab.config import build
from litlab.distributed import rank0_dir, strategy_for
from litlab.errors import ConfigError
from litlab.evaluate import eval_task
from litlab.hardware import check_hardware
from litlab.models import GAN, ImageClassifier
from litlab.resume import checkpoint_folder, run_dir
from wandb_records import offline_run

SYNTH = [
    "data=synthetic",
    "data.image_shape=[1,16,16]",
    "data.source.train_size=512",
    "data.source.test_size=256",
    "data.batch_size=32",
    "model.net.width=8",
]


def test_gans_get_a_ddp_that_finds_unused_parameters():
    gan, clf = GAN.__new__(GAN), ImageClassifier.__new__(ImageClassifier)
    gan._automatic_optimization, clf._automatic_optimization = False, True
    assert strategy_for(gan, "ddp", 2, 1) == "ddp_find_unused_parameters_true"
    assert strategy_for(gan, "auto", 4, 1) == "ddp_find_unused_parameters_true"
    assert strategy_for(gan, "auto", 1, 2) == "ddp_find_unused_parameters_true"
    assert strategy_for(gan, "auto", 1, 1) == "auto"
    # devices=auto (every GPU) on a machine with several: DDP too, the GAN-safe one
    assert strategy_for(gan, "auto", "auto", 1, "auto", cuda_devices=4).endswith("_true")
    assert strategy_for(gan, "auto", -1, 1, "gpu", cuda_devices=2).endswith("_true")
    assert strategy_for(gan, "auto", "auto", 1, "auto", cuda_devices=1) == "auto"
    assert strategy_for(gan, "auto", "auto", 1, "cpu", cuda_devices=4) == "auto"
    assert strategy_for(gan, "auto", "0,1", 1, "gpu", cuda_devices=2).endswith("_true")
    assert strategy_for(gan, "ddp_spawn", 2, 1) == "ddp_spawn_find_unused_parameters_true"
    assert strategy_for(clf, "ddp", 2, 1) == "ddp"
    with pytest.raises(ConfigError, match="does not support GANs"):
        strategy_for(gan, "fsdp", 2, 1)
    with pytest.raises(ConfigError, match="does not support GANs"):
        strategy_for(gan, OmegaConf.create({"_target_": "litlab.distributed.fsdp_strategy"}), 2, 1)


@pytest.mark.parametrize(
    "overrides, message, engine",
    [
        (["trainer=fsdp", "trainer.accelerator=cpu"], "on CPU use trainer.strategy=ddp", None),
        (["trainer.accelerator=cpu", "trainer.devices=-1"], "means every GPU", None),
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
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
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
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
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
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert checkpoint_folder(scratch, base) == Path(scratch)  # a first attempt starts afresh
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # an allocation used by hand
    assert run_dir(base, "d/t") == f"{base}/d/t"


def test_slurm_launcher_maps_devices_and_nodes(tmp_path):
    cfg = make_cfg(
        tmp_path,
        ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"],
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 4 and launcher.nodes == 2 and launcher.gpus_per_node == 4


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
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "completed"
    assert len(wandb_runs(tmp_path / "out")) == 1
    # The epoch's training accuracy and loss are over both ranks' images, each rank counting
    # its own shard (a rank's sums are not rank 0's: DDP copies buffers from rank 0).
    ranks = json.loads((tmp_path / "sums.json").read_text())
    assert ranks["rank0"] != ranks["rank1"] and ranks["rank0"][3] == ranks["rank1"][3] > 0
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
    assert eval_task(cfg) == pytest.approx(summary["metrics"]["test/acc"], abs=1e-7)
    # and the loss: each rank's images weigh what they are (127 and 128 here)
    single = summary_of(cfg)["metrics"]["test/loss"]
    assert summary["metrics"]["test/loss"] == pytest.approx(single, rel=1e-6)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_multirun_of_ddp_jobs(tmp_path, strategy):
    # two jobs in a row under ddp; one under ddp_spawn (its processes, pickled config and W&B
    # run are what differ; the jobs' sequence is the same code)
    lrs_asked = [1e-3, 3e-3] if strategy == "ddp" else [3e-3]
    result = run_cli(
        "-m",
        f"model.optimizer.lr={','.join(map(str, lrs_asked))}",
        *SYNTH,
        *QUIET,
        "logger=wandb",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        f"trainer.strategy={strategy}",
        f"paths.log_dir={tmp_path}",
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    # one sweep, a folder per job, nothing else
    assert [p.name for p in jobs] == [str(i) for i in range(len(lrs_asked))]
    assert len(list(tmp_path.rglob("sweep_summary.json"))) == 1
    lrs = []
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed"
        (wandb_dir,) = wandb_runs(job)
        record = offline_run(wandb_dir)
        lrs.append(record["config"]["model.optimizer.lr"])
        if strategy == "ddp":
            assert (
                job / "train_ddp_process_1.log"
            ).is_file()  # rank 1 ran this job, in this folder
    assert lrs == lrs_asked
    ids = {offline_run(w)["id"] for w in wandb_runs(tmp_path)}
    assert len(ids) == len(lrs_asked)  # wandb.finish() between jobs
    leftover = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True
    ).stdout.split()
    assert leftover == []  # no orphaned rank processes


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
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
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


def assert_one_run_identical_weights(tmp_path: Path, ranks: int) -> None:
    (summary,) = summaries(tmp_path / "out")
    assert summary["status"] == "completed"
    assert len(wandb_runs(tmp_path / "out")) == 1
    weights = [
        torch.load(tmp_path / "weights" / f"rank{r}.pt", weights_only=True) for r in range(ranks)
    ]
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.equal(value, other[name]), name


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_single_node(tmp_path):
    proc = torchrun(["--standalone", "--nproc_per_node=2", *run_args(tmp_path)], tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert_one_run_identical_weights(tmp_path, 2)


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
