"""Reliability: exact resume, real signals, SIGKILL, atomic checkpoints, W&B outage, determinism."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
import yaml

from conftest import (
    CPU_DDP,
    QUIET,
    REPO,
    TINY_GAN,
    bare_trainer,
    make_cfg,
    refused,
    run_cli,
    summary_of,
)
from helpers import fake_scontrol
from litlab import rng
from litlab.checkpoint import AtomicCheckpointIO, load_checkpoint
from litlab.config import build
from litlab.errors import CheckpointError
from litlab.metrics.fid import domain_classifier
from litlab.resume import newest_checkpoint, record_resume_overrides, resume_argv
from litlab.train import train_task
from wandb_records import offline_run

CLF_EPOCHS = 4
CLF = [
    "data.batch_size=128",
    f"trainer.max_epochs={CLF_EPOCHS}",
    "model.net.width=8",
    "logger=csv",
    *QUIET,
]
CLF_STEPS_PER_EPOCH = 10  # the digits' train split in batches of 128
GAN_MODEL = [
    "model=dcgan",
    "data=synthetic",
    "data.image_shape=[1,16,16]",
    "data.source.train_size=256",
    "data.batch_size=32",
    "model.generator.width=8",
    "model.discriminator.width=8",
    "callbacks.fid.num_samples=64",
]
GAN = [*GAN_MODEL, "trainer.max_epochs=3", "logger=csv", *QUIET]


def run_folder(root: Path) -> Path:
    (summary,) = list(root.rglob("summary.json"))
    return summary.parent


def final_state(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def rows_tested_at(folder: Path) -> list[tuple[str, str]]:
    """(epoch, step) of each row of metrics.csv with the test's figures."""
    with open(folder / "csv" / "metrics.csv") as f:
        return [(r["epoch"], r["step"]) for r in csv.DictReader(f) if r.get("test/acc")]


def val_rows(folder: Path) -> list[tuple[str, str]]:
    with open(folder / "csv" / "metrics.csv") as f:
        return [
            (r["epoch"], r.get("val/acc") or r.get("val/fid"))
            for r in csv.DictReader(f)
            if r.get("val/acc") or r.get("val/fid")
        ]


def straight_and_stopped_at(
    tmp_path: Path, batch: int, *args: str, timeout: int = 600
) -> tuple[Path, Path]:
    """The run folders of ``args`` run to the end and of ``args`` stopped by SIGTERM in
    ``batch`` (exit status 143: interrupted, not finished)."""
    straight = run_cli(*args, f"paths.log_dir={tmp_path / 'straight'}", timeout=timeout)
    assert straight.returncode == 0, straight.stderr[-3000:]
    stop = ["+callbacks.stop._target_=helpers.SignalAt", f"+callbacks.stop.batch={batch}"]
    stopped = run_cli(*args, *stop, f"paths.log_dir={tmp_path / 'stopped'}", timeout=timeout)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    return run_folder(tmp_path / "straight"), run_folder(tmp_path / "stopped")


@pytest.mark.slow
@pytest.mark.parametrize("family, args, stop_batch", [("classifier", CLF, 6), ("gan", GAN, 13)])
def test_sigterm_then_resume_is_bit_identical_to_an_uninterrupted_run(
    tmp_path, family, args, stop_batch
):
    """A real SIGTERM mid-epoch (the classifier: in its first epoch, before any epoch's
    last.ckpt; its one-cycle schedule asks Lightning for the run's length before the checkpoint
    is restored), `resume=<folder>`, and the same weights as never stopping, in the same
    checkpoint files (the preemption's last.ckpt overwritten, never beside a last-v1.ckpt)."""
    straight, folder = straight_and_stopped_at(tmp_path, stop_batch, *args)
    assert summary_status(folder) == "interrupted"
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    stopped = json.loads((folder / "summary.json").read_text())
    assert stopped["last_checkpoint"] == str(folder / "checkpoints" / "last.ckpt")
    # and its best so far (walkthrough 157: best.ckpt there, no best_checkpoint in the summary)
    best = folder / "checkpoints" / "best.ckpt"
    assert stopped["best_checkpoint"] == (str(best) if best.is_file() else None)
    assert stopped["error"].endswith(f"continue with: python train.py resume={folder}")
    # the steps reached, as its checkpoint saved at the stop (null in a first epoch, else the
    # last epoch end's: walkthrough 139)
    saved = load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"]
    assert stopped["global_step"] == saved > 0

    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert list((tmp_path / "stopped").rglob("summary.json")) == [
        folder / "summary.json"
    ]  # same folder
    assert summary_status(folder) == "completed"
    assert not list((folder / "checkpoints").glob("*-v*.ckpt"))
    summary = json.loads((folder / "summary.json").read_text())
    assert Path(summary["last_checkpoint"]) == folder / "checkpoints" / "last.ckpt"
    a, b = final_state(straight), final_state(folder)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert val_rows(folder) == val_rows(straight)  # metrics of every epoch


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_does_not_say_to_resume_it(tmp_path):
    """Ctrl-C in the first epoch (Lightning ends it with SystemExit) left no checkpoint, and
    summary.json said to continue with resume=, which then refused: nothing to resume."""
    from litlab.run import ended_as

    status, error = ended_as(SystemExit(1), tmp_path)
    assert status == "interrupted" and "nothing to resume" in error and "resume=" not in error
    (tmp_path / "checkpoints").mkdir()
    for name in ("step.ckpt", "last.ckpt"):  # every N steps (resume= takes it too), epoch end
        (tmp_path / "checkpoints" / name).write_bytes(b"")
        for exc in (SystemExit(1), KeyboardInterrupt()):  # it said "interrupted by the user"
            assert ended_as(exc, tmp_path)[1] == (
                "stopped by a signal; continue from its last checkpoint with: "
                f"python train.py resume={tmp_path}"
            )


def test_a_rank_lost_by_the_others_and_a_stop_under_torchrun_say_how_to_continue(
    tmp_path, monkeypatch
):
    """A DDP rank killed (SIGKILL, out of memory): rank 0's collective failed with gloo's
    "Connection reset by peer ... GLHF!" and summary.json held that alone (walkthrough 153),
    though resume= continues the run. And under torchrun, "continue with: python train.py
    resume=" continued it on one process: the line repeats torchrun's layout."""
    from litlab.run import ended_as

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
        "[127.0.0.1]:22409: Connection reset by peer. This is typically caused by a remote "
        "worker hanging or bugs in the application. GLHF!"
    )
    status, error = ended_as(gloo, tmp_path)
    assert status == "failed" and error.startswith("another process of the run ended (killed, ")
    assert error.endswith(
        f"; continue from the newest checkpoint with: python train.py resume={tmp_path}"
    )
    assert ended_as(RuntimeError("CUDA error: an illegal memory access"), tmp_path)[1] == (
        "RuntimeError: CUDA error: an illegal memory access"  # not another process's end
    )
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ended_as(SystemExit(1), tmp_path)[1] == (
        "stopped by a signal; continue from its last checkpoint with: torchrun --nnodes=1 "
        f"--nproc_per_node=2 train.py resume={tmp_path}"
    )


@pytest.mark.slow
def test_ctrl_c_says_on_the_console_how_to_continue(tmp_path):
    """Ctrl-C (SIGINT) ended a run with Lightning's "Detected KeyboardInterrupt" alone: how to
    continue was in summary.json only. W&B shows the run stopped (exit code 255, wandb's own for
    Ctrl-C), not finished: it closed the run with 0, as if it had trained to its end."""
    result = run_cli(
        *CLF, "logger=wandb", "trainer.max_epochs=3", "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=12", "+callbacks.stop.signum=SIGINT", f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 130  # 128 + SIGINT (Lightning's exit, 1, read as a failure)
    (folder,) = {p.parent for p in tmp_path.rglob("summary.json")}
    said = f"litlab: stopped by a signal; continue from its last checkpoint with: python train.py resume={folder}"
    assert said in result.stdout + result.stderr, result.stdout[-2000:]
    (part,) = (folder / "wandb").glob("offline-run-*")
    assert offline_run(part)["exit_code"] == 255
    # the values logged before the stop (an epoch validated): summary.json held none
    metrics = json.loads((folder / "summary.json").read_text())["metrics"]
    assert {"val/loss", "val/acc", "train/loss"} <= set(metrics), metrics


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_ctrl_c_while_the_libraries_load_is_one_line(tmp_path, script):
    """Ctrl-C in the first seconds (torch and Lightning importing, before any run) printed a
    traceback of 20-120 lines from whichever import it interrupted (walkthrough)."""
    started = subprocess.Popen(
        [sys.executable, str(REPO / script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # the imports take several seconds
    started.send_signal(signal.SIGINT)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 130, err[-2000:]
    assert err == "litlab: interrupted (Ctrl-C)\n" and not list(tmp_path.iterdir())


def uncached_folder(root: Path, cache: Path, workers: int) -> list[str]:
    """A small CNN on a folder of 3 classes of images read as they go (cache=false)."""
    return [
        *QUIET,
        "logger=csv",
        "data=image_folder",
        f"data.source.root={root}",
        f"data.source.cache_dir={cache}",
        "data.source.cache=false",
        "data.source.size=20",
        "data.image_shape=[3,16,16]",
        "data.num_classes=3",
        f"data.num_workers={workers}",
        "data.batch_size=4",
        "model.net.width=8",
        "model.scheduler=null",
    ]


def test_a_resumed_run_counts_the_unreadable_files_read_before_it_stopped(tmp_path):
    """Files read as they go (cache=false): a resumed epoch skips its trained batches without
    reading their files, so the unreadable ones found before the stop travel in the checkpoint;
    stopped and resumed, the run counts what the same run counts uninterrupted."""
    from conftest import write_png_folder

    root = tmp_path / "images"
    write_png_folder(root, per_class=12)
    for i in range(8):
        (root / "fox" / f"broken{i}.png").write_bytes(b"not an image")
    args = [*uncached_folder(root, tmp_path / "cache", workers=0), "trainer.max_epochs=1"]
    straight, folder = straight_and_stopped_at(tmp_path, 5, *args)
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def skipped(run: Path) -> int:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed"
        return summary["data"]["skipped_while_loading"]

    assert skipped(folder) == skipped(straight) > 0


@pytest.mark.parametrize("batch", [0, 5])  # mid-epoch; the epoch's last (validation next)
def test_a_signal_to_the_whole_group_stops_with_a_checkpoint_when_workers_read(tmp_path, batch):
    """scancel, SLURM's --signal and `kill -- -PGID` signal every process of the job: the
    loader's workers died of it ("DataLoader worker exited unexpectedly" at a batch the stop
    still needed: a validation, the next batch), the run failed without its checkpoint."""
    from conftest import write_png_folder

    root = tmp_path / "images"
    write_png_folder(root, per_class=12)
    args = [
        *uncached_folder(root, tmp_path / "cache", workers=2),
        "trainer.max_epochs=2",
        "test=false",
        f"paths.log_dir={tmp_path / 'out'}",
        "+callbacks.stop._target_=helpers.SignalAt",
        f"+callbacks.stop.batch={batch}",
        "+callbacks.stop.group=true",
    ]
    stopped = run_cli(*args, new_session=True)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    folder = run_folder(tmp_path / "out")
    assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == batch + 1


@pytest.mark.slow
@pytest.mark.dist
def test_gan_under_ddp_ranks_draw_their_own_noise_and_resume_bit_identically(tmp_path):
    """2 CPU ranks: the ranks' training noise differs, FID's generated images are N distinct
    ones split over the ranks, and SIGTERM + resume= ends as an uninterrupted run on both
    ranks (weights, and each rank's own random state)."""
    # The FID extractor cached beforehand: no rank trains it (which would shift that rank's
    # global random generator, and hide identical noise on the others).
    cfg = make_cfg(tmp_path / "cfg", GAN_MODEL)
    images, labels = build(cfg.data, "data").arrays("train")
    domain_classifier(images, labels, cfg.data.mean, cfg.data.std, tmp_path / "cache")
    ddp = [*GAN, *CPU_DDP]
    ddp += [f"callbacks.fid.cache_dir={tmp_path / 'cache'}"]
    ddp += ["+callbacks.capture._target_=helpers.CaptureNoise"]
    straight = run_cli(
        *ddp,
        f"+callbacks.capture.folder={tmp_path / 'a'}",
        f"paths.log_dir={tmp_path / 'straight'}",
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    ranks = [torch.load(tmp_path / "a" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for z0, z1 in zip(ranks[0]["train"], ranks[1]["train"], strict=True):
        assert z0.shape == z1.shape and not torch.equal(z0, z1)  # every batch, D's and G's noise
    for r, rank in enumerate(ranks):  # from the rank's own stream, not the global generator
        expected = torch.randn(32, 100, generator=rng.stream(42, r, "train", 0))
        assert torch.equal(rank["train"][0], expected), f"rank {r}"
    fid = [torch.cat(rank["fid"]).unique(dim=0) for rank in ranks]
    # 64 test images -> N = 64 generated images per evaluation: 32 latents per rank, reused for
    # G_ema and G and at every evaluation, none shared between the ranks.
    assert [len(f) for f in fid] == [32, 32]
    assert len(torch.cat(fid).unique(dim=0)) == 64
    # FID's real statistics: each rank reads and feeds its own part of the training images, the
    # parts disjoint, all of them together (fewer than callbacks.fid.num_real here) once.
    reals = [torch.cat(rank["fid_real"]).flatten(1) for rank in ranks]
    assert abs(len(reals[0]) - len(reals[1])) <= 1
    assert len(torch.cat(reals).unique(dim=0)) == len(images.flatten(1).unique(dim=0))
    assert sum(map(len, reals)) == len(images)
    assert not torch.equal(ranks[0]["rng"], ranks[1]["rng"])  # augmentation/dropout streams
    # No Lightning warning (epoch metrics are reduced as they mean), and the job's throughput
    # is the sum of the ranks' own.
    warned = re.findall(r".*\.py:\d+: .*", straight.stderr)  # how Python prints a warning
    assert not warned, warned
    perf = json.loads((run_folder(tmp_path / "straight") / "summary.json").read_text())["perf"]
    assert perf["train_images_per_s"] == pytest.approx(sum(r["train_rate"] for r in ranks))
    # and its steps a second the ranks' mean (a step is one batch on each rank)
    assert perf["train_batches_per_s"] == pytest.approx(sum(r["step_rate"] for r in ranks) / 2)

    stopped = run_cli(
        *ddp,
        f"+callbacks.capture.folder={tmp_path / 'b'}",
        f"paths.log_dir={tmp_path / 'stopped'}",
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=4",
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    # how to continue, said once (each rank said it: twice on the console)
    assert (stopped.stdout + stopped.stderr).count("litlab: stopped by a signal") == 1
    folder = run_folder(tmp_path / "stopped")
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = final_state(run_folder(tmp_path / "straight")), final_state(folder)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    for r in (0, 1):
        resumed_rank = torch.load(tmp_path / "b" / f"rank{r}.pt", weights_only=True)
        assert torch.equal(resumed_rank["rng"], ranks[r]["rng"]), f"rank {r}"
    assert val_rows(folder) == val_rows(run_folder(tmp_path / "straight"))


@pytest.mark.slow
@pytest.mark.dist
def test_a_loss_that_diverges_on_one_rank_stops_every_rank_before_a_save(tmp_path):
    """NaN reals on rank 1 alone (a D-only batch, n_critic 2): the save at that batch's end is
    refused on both ranks (rank 0's losses were finite; it wrote NaN weights, and a classifier's
    rank 0 died in the next collective), and the error names the newest good checkpoint."""
    result = run_cli(
        *GAN,
        "trainer.max_epochs=1",
        "model.n_critic=2",
        "callbacks.step_checkpoint.every_n_train_steps=1",
        "callbacks.divergence_guard.check_every_n_steps=1000",
        "+callbacks.poison._target_=helpers.PoisonBatch",
        "+callbacks.poison.at_batch=2",
        "+callbacks.poison.rank=1",
        *CPU_DDP,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    folder = run_folder(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    step = folder / "checkpoints" / "step.ckpt"
    assert summary["status"] == "failed" and "training diverged: d/loss" in summary["error"]
    assert f"the last good checkpoint is {step}" in summary["error"]
    saved = load_checkpoint(step)
    assert saved["gan"]["d_steps"] == 2  # the batch before the fault's
    assert all(
        torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point()
    )


@pytest.mark.slow
@pytest.mark.dist
def test_a_stop_on_an_epochs_last_batch_waits_for_validation_on_every_rank(tmp_path):
    """SIGTERM during an epoch's last training batch, 2 ranks whose validation shards differ
    in batches (33 images: 17 and 16, 16 a batch): both ranks finish validation, save and stop
    (Lightning's evaluation loop stopped one of them after its first batch while the other
    waited in the metrics' sync: a hang), and the resumed run ends as one never stopped."""
    args = [
        "data=synthetic",
        "data.image_shape=[1,16,16]",
        "data.source.train_size=330",
        "data.batch_size=32",
        "data.eval_batch_size=16",
        "model.net.width=8",
        "trainer.max_epochs=2",
        *CPU_DDP,
        "logger=csv",
        *QUIET,
    ]
    # batch 3: 297 training images, 4 batches a rank
    straight, folder = straight_and_stopped_at(tmp_path, 3, *args, timeout=300)
    assert [epoch for epoch, _ in val_rows(folder)] == ["0"]  # validated before stopping
    resumed = run_cli(f"resume={folder}", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = final_state(straight), final_state(folder)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert val_rows(folder) == val_rows(straight)


def summary_status(folder: Path) -> str:
    return json.loads((folder / "summary.json").read_text())["status"]


def start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO / "tests")}
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args, f"paths.log_dir={tmp_path}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path_glob: str, root: Path, timeout: float = 120) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(root.rglob(path_glob))
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"{path_glob} never appeared under {root}")


LONG = [
    "trainer.max_epochs=30",
    "model.net.width=8",
    "logger=csv",
    "callbacks.step_checkpoint.every_n_train_steps=5",
    *QUIET,
]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_from_outside_saves_and_resume_finishes(tmp_path, signum):
    proc = start(LONG, tmp_path)
    wait_for("step.ckpt", tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    folder = run_folder(tmp_path)
    saved = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    assert 0 < saved["global_step"] < 30 * 20
    assert summary_status(folder) == "interrupted"
    if signum != signal.SIGTERM:
        return  # saved as SIGTERM saves: the resume below is the same from here on
    # Finish sooner than the planned 30 epochs.
    resumed = run_cli(f"resume={folder}", f"trainer.max_epochs={saved['epoch'] + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary_status(folder) == "completed"
    # The report shows the run as it is now: the resume's override, both parts' wall time.
    from litlab.report.runs import find_runs

    (run,) = find_runs([folder])
    assert f"trainer.max_epochs={saved['epoch'] + 2}" in run.overrides
    durations = json.loads((folder / "summary.json").read_text())["durations_s"]
    first = json.loads((folder / "summary.json").read_text())["previous_summary"]["durations_s"]
    assert durations["earlier"] == first["total"] > 0
    assert run.duration_s == pytest.approx(durations["total"] + first["total"])


def test_sigterm_outside_the_fit_ends_the_run_as_interrupted(tmp_path):
    """SIGTERM before the fit trains (a first decode of a large folder; scancel, docker stop)
    killed the process with the default disposition: exit -15 and a summary "running" forever.
    Now the run ends as a SIGTERM in the fit ends it: exit 143, "interrupted", and how to go on
    in the summary and the log. A signal as a continued run sets up leaves the folder's
    earlier run as it was: its summary, and the last.ckpt that resume= continues from (a
    stop's save of the model not yet restored would have overwritten it)."""
    args = [*CLF, "trainer.max_epochs=1", f"paths.log_dir={tmp_path}"]
    in_setup = "+callbacks.stop._target_=helpers.SignalInSetup"
    folder = tmp_path / "run"
    first = run_cli(*args, f"hydra.run.dir={folder}", in_setup)
    assert first.returncode == 143, first.stderr[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "before its first checkpoint" in summary["error"]
    assert "before its first checkpoint" in (folder / "train.log").read_text()

    # as the fit ends (Lightning's teardown, before the run records it trained): held until
    # the .trained mark is written, then the run stops; resume= (what the summary said) had
    # nothing to train and no mark for a requeued job to test again: how to test it
    tested = tmp_path / "tested"
    at_fit_end = "+callbacks.stop._target_=helpers.SignalAtFitEnd"
    second = run_cli(*args, f"hydra.run.dir={tested}", at_fit_end)
    assert second.returncode == 143, second.stderr[-2000:]
    assert (tested / ".trained").is_file()
    before = (tested / "summary.json").read_text()
    summary = json.loads(before)
    assert summary["status"] == "interrupted"
    command = summary["error"].split("test it with: ")[1].split(" (")[0]
    assert command == f"python train.py resume={tested}"

    saved = (tested / "checkpoints" / "last.ckpt").read_bytes()
    again = run_cli(f"resume={tested}", "trainer.max_epochs=2", f"+{in_setup}")
    assert again.returncode == 143, again.stderr[-2000:]
    assert (tested / "summary.json").read_text() == before
    assert (tested / "checkpoints" / "last.ckpt").read_bytes() == saved
    # what the summary said: the run tested in its folder, training nothing (before: eval.py,
    # which left the run's summary "interrupted"; resume= was refused as trained to its end)
    finished = run_cli(command.removeprefix("python train.py "))
    assert finished.returncode == 0, finished.stderr[-2000:]
    summary = json.loads((tested / "summary.json").read_text())
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]
    assert (tested / "checkpoints" / "last.ckpt").read_bytes() == saved
    # an extension (resume= trainer.max_epochs=<more>) killed in its first epoch leaves the
    # earlier fit's .trained, no .completed and its own summary "running": not stopped while
    # testing (review: a plain resume= then ended it "completed" at the earlier fit's weights)
    time.sleep(1)
    (tested / ".completed").unlink()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (tested / "summary.json").write_text(
        json.dumps({**summary, "status": "running", "started_at": started})
    )
    extension = run_cli(f"resume={tested}")
    assert extension.returncode == 2 and "has already trained 1 epochs" in extension.stderr


def test_a_second_sigterm_or_one_as_the_fit_ends_is_lightnings_to_handle(tmp_path):
    """Inside the trainer SIGTERM is Lightning's (a flag; litlab's Preemption in training):
    litlab's handler for outside it, which Lightning's calls, does nothing there. Before it
    did (review): a second SIGTERM during the stop's save ended the save (last.ckpt the epoch
    before's, the steps since lost), and one as the fit ended left a run neither completed nor
    resumable (resume= refused: nothing to train; no .trained mark for a requeued job)."""
    args = [*CLF, "trainer.max_epochs=3"]
    folder = tmp_path / "second"
    twice = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=20"]
    twice += ["+callbacks.again._target_=helpers.SignalInSave"]
    first = run_cli(*args, f"hydra.run.dir={folder}", *twice)
    assert first.returncode == 143, first.stderr[-2000:]
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 21
    assert "saved" in (folder / "train.log").read_text()
    ended = tmp_path / "ended"
    at_end = "+callbacks.stop._target_=helpers.SignalAtTrainEnd"
    second = run_cli(*args, "trainer.max_epochs=1", f"hydra.run.dir={ended}", at_end)
    assert second.returncode == 0, second.stderr[-2000:]
    assert summary_status(ended) == "completed"


@pytest.mark.slow
def test_sigkill_leaves_a_loadable_checkpoint(tmp_path):
    proc = start(LONG, tmp_path)
    first = wait_for("step.ckpt", tmp_path)
    written = first.stat().st_mtime  # the killed part ran at least until then
    time.sleep(1.5)  # let it write more checkpoints, then kill it at an arbitrary moment
    proc.kill()
    proc.wait(timeout=60)
    summary = json.loads((run_folder(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "running" and summary["pid"] == proc.pid  # says it never finished
    checkpoint = load_checkpoint(first)  # complete and readable, never a truncated file
    assert checkpoint["global_step"] > 0
    newest = max(
        (load_checkpoint(p) for p in first.parent.glob("*.ckpt")), key=lambda c: c["global_step"]
    )
    # one more epoch than the newest checkpoint began (a finished epoch's is refused as done)
    resumed = run_cli(f"resume={run_folder(tmp_path)}", f"trainer.max_epochs={newest['epoch'] + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The killed part's time counts in the run's duration (it wrote no total): from its start
    # to its last write (was 0), at least until the step.ckpt seen before the kill.
    durations = json.loads((run_folder(tmp_path) / "summary.json").read_text())["durations_s"]
    started = datetime.fromisoformat(summary["started_at"]).timestamp()
    assert durations["earlier_estimated"] is True
    assert 0 < written - started <= durations["earlier"] <= time.time() - started


def test_no_periodic_checkpoint_on_an_epochs_last_batch(tmp_path):
    """A periodic save that falls on an epoch's last batch is left to the epoch's end: resumed
    from there, Lightning would count the epoch as done and skip its validation (no val/* and
    no best checkpoint from it) and its end (the training sums carried into the next epoch)."""
    cfg = make_cfg(
        tmp_path,
        [
            "trainer.max_epochs=1",
            "+trainer.limit_train_batches=8",
            "callbacks.step_checkpoint.every_n_train_steps=4",
            "model.net.width=4",
            "test=false",
            *QUIET,
        ],
    )
    train_task(cfg)
    folder = Path(cfg.paths.output_dir) / "checkpoints"
    assert load_checkpoint(folder / "step.ckpt")["global_step"] == 4  # not 8, the last batch
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 8


def test_a_resumed_run_saves_no_periodic_checkpoint_inside_an_accumulation(tmp_path):
    """accumulate_grad_batches=2, step.ckpt every 2 steps, resumed from it at step 4: the first
    resumed batch leaves global_step at 4, which Lightning's ModelCheckpoint (its last saved step
    not restored) took for a step to save, overwriting step.ckpt with half an accumulation whose
    gradient no checkpoint holds (a second resume from it trained a step on the other half).
    Every periodic save comes after an accumulation's last batch."""
    record = tmp_path / "saves.json"
    args = [
        "data.batch_size=32",  # about 45 batches an epoch: no epoch ends here
        "model.net.width=4",
        "model.scheduler=null",  # one schedule whatever max_steps
        "trainer.accumulate_grad_batches=2",
        "callbacks.step_checkpoint.every_n_train_steps=2",
        "+callbacks.record._target_=helpers.RecordBatchSaves",
        f"+callbacks.record.path={record}",
        "+callbacks.record.batches=true",
        "test=false",
        *QUIET,
    ]
    first = make_cfg(tmp_path / "first", [*args, "trainer.max_steps=4"])
    train_task(first)
    step = Path(first.paths.output_dir) / "checkpoints" / "step.ckpt"
    # [global step, batches trained]: step.ckpt twice, then best.ckpt and last.ckpt as
    # max_steps ends the fit (validated there)
    assert json.loads(record.read_text()) == [[2, 4], [4, 8], [4, 8], [4, 8]]
    resumed = make_cfg(tmp_path / "resumed", [*args, "trainer.max_steps=8", f"ckpt_path={step}"])
    train_task(resumed)
    # (before: [4, 9] first, step.ckpt rewritten after the first resumed batch)
    assert json.loads(record.read_text()) == [[6, 12], [8, 16], [8, 16], [8, 16]]


@pytest.mark.parametrize(
    ("n_critic", "every", "saved"), [(1, 3, [4, 6, 10, 12]), (2, 2, [3, 4, 6, 9])]
)
def test_a_gans_periodic_checkpoints_come_every_n_steps(tmp_path, n_critic, every, saved):
    """A GAN's global_step counts both optimizers' steps (+2 on a batch where G steps too) and
    can pass over a multiple of every_n_train_steps: the save comes on the batch that reaches
    or passes it, so a killed run loses fewer than N steps (Lightning saved only on a multiple:
    with n_critic=1 and N odd, every 2N; here [6, 12] and [4, 6])."""
    record = tmp_path / "saves.json"
    cfg = make_cfg(
        tmp_path,
        [
            *GAN_MODEL,
            "trainer.max_epochs=1",
            f"model.n_critic={n_critic}",
            f"callbacks.step_checkpoint.every_n_train_steps={every}",
            "+callbacks.record._target_=helpers.RecordBatchSaves",
            f"+callbacks.record.path={record}",
            "test=false",
            *QUIET,
        ],
    )
    train_task(cfg)
    # 7 batches; after them global_step is 2, 4, .., 14 (n_critic 1) or 1, 3, 4, 6, 7, 9, 10
    assert json.loads(record.read_text()) == saved
    step = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "step.ckpt")
    assert step["global_step"] == saved[-1]


def test_a_gan_resumed_between_generator_steps_logs_the_generators_last_loss(tmp_path):
    """n_critic 3: g/loss is G's latest loss, logged with D's steps between G's. A run resumed
    between two G steps lost it until the next one (summary.json had no g/loss when the run
    ended first); the checkpoint now keeps it."""
    args = [*GAN_MODEL, "model.n_critic=3", "test=false", *QUIET]
    # epoch 1: 4 batches, D steps 1-4, G's step at D's third: g/loss from batch 3
    first = make_cfg(
        tmp_path / "first", [*args, "trainer.max_epochs=1", "+trainer.limit_train_batches=4"]
    )
    train_task(first)
    stopped = summary_of(first)["metrics"]["g/loss"]
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    # epoch 2: one batch, D's fifth step, no G step: G's loss is still batch 3's
    resumed = make_cfg(
        tmp_path / "resumed",
        [*args, "trainer.max_epochs=2", "+trainer.limit_train_batches=1", f"ckpt_path={last}"],
    )
    train_task(resumed)
    metrics = summary_of(resumed)["metrics"]
    assert metrics["g/step"] == 1 and metrics["g/loss"] == stopped


def test_a_resumed_gan_makes_each_sample_grid_once(tmp_path):
    """Stopped on the batch whose G step made the grid of g/step 2 (n_critic 2), the resumed run
    starts with D's batch alone: it leaves that grid as it was and makes the next ones."""
    args = [
        *GAN,
        "trainer.max_epochs=2",
        "model.n_critic=2",
        "callbacks.samples.every_n_g_steps=2",
        f"paths.log_dir={tmp_path}",
    ]
    stopped = run_cli(*args, "+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=3")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    folder = run_folder(tmp_path)
    grid = folder / "samples" / "g_step_0000002.png"
    assert sorted(p.name for p in (folder / "samples").glob("g_step_*")) == [grid.name]
    written = grid.stat().st_mtime_ns
    time.sleep(0.05)
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert grid.stat().st_mtime_ns == written  # not drawn again
    made = sorted(p.name for p in (folder / "samples").glob("g_step_*"))
    assert made == ["g_step_0000002.png", "g_step_0000004.png", "g_step_0000006.png"]


class Exploding:
    """Pickles half way, then fails: a crash in the middle of writing a checkpoint."""

    def __reduce__(self):
        raise RuntimeError("crash while saving")


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, path)
    with pytest.raises(RuntimeError, match="crash while saving"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(1000)}, "boom": Exploding()}, path)
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_atomic_files_of_two_writers_as_pid_1_never_meet(tmp_path, monkeypatch):
    """checkpoints, summaries and cached extractors are written through litlab.files.atomic_file:
    each writer has its own temporary file, even as pid 1 (containers sharing a volume), and a
    reader sees the old file or the new one whole."""
    from litlab.files import atomic_file

    monkeypatch.setattr(os, "getpid", lambda: 1)
    path = tmp_path / "sub" / "summary.json"
    with atomic_file(path, "w") as first, atomic_file(path, "w") as second:
        assert first.name != second.name and Path(first.name).parent == path.parent
        first.write("first")
        second.write("second")
        assert not path.exists()  # nothing is visible before the body ends
    assert path.read_text() == "first"  # the outer writer finished last
    with pytest.raises(RuntimeError), atomic_file(path, "w") as f:
        f.write("half")
        raise RuntimeError
    assert path.read_text() == "first" and sorted(p.name for p in path.parent.iterdir()) == [
        "summary.json"
    ]
    # What a writer killed mid-write (SIGKILL after a preemption's save began) left is removed by
    # the next one that finishes, once it sat unchanged for an hour; a live writer's is not.
    killed, live = path.parent / ".summary.json.0123.tmp", path.parent / ".summary.json.4567.tmp"
    for left in (killed, live):
        left.write_text("{")
    os.utime(killed, (time.time() - 3700, time.time() - 3700))
    with atomic_file(path, "w") as f:
        f.write("third")
    assert path.read_text() == "third" and not killed.exists() and live.exists()


def test_truncated_checkpoint_is_one_clear_error(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(path)


@pytest.mark.slow
def test_wandb_outage_falls_back_to_offline_within_the_timeout(tmp_path):
    """Online mode with a key, but the server is an unused loopback port: the run starts offline
    at once (a TCP probe; before: wandb's init_timeout, 60 s, plus about 10 s of its login, at
    every run), and so does the next run of a sweep, without probing again."""
    t0 = time.time()
    args = ["-m", "seed=1,2", "trainer.max_epochs=1", "logger=wandb", f"paths.log_dir={tmp_path}"]
    result = run_cli(*args, *QUIET, timeout=240, wandb_online=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.time() - t0 < 120
    said = result.stdout + result.stderr
    assert said.count("W&B could not start online (127.0.0.1:9 not reachable") == 2
    for folder in sorted(p.parent for p in tmp_path.rglob("summary.json")):
        assert summary_status(folder) == "completed"
        assert list((folder / "wandb").glob("offline-run-*/run-*.wandb"))  # for `wandb sync`


@pytest.mark.parametrize(
    "args", [["trainer.max_epochs=2", "model.net.width=8"], [*GAN_MODEL, "trainer.max_epochs=1"]]
)
def test_same_seed_same_weights(tmp_path, args):
    states = []
    for name in ("a", "b"):
        cfg = make_cfg(
            tmp_path / name,
            [*args, "trainer.deterministic=true", "logger=csv", "test=false", *QUIET],
        )
        train_task(cfg)
        assert summary_of(cfg)["status"] == "completed"
        states.append(final_state(Path(cfg.paths.output_dir)))
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


@pytest.fixture(scope="module")
def straight_classifier(tmp_path_factory) -> Path:
    """The uninterrupted classifier run that requeued runs must match."""
    root = tmp_path_factory.mktemp("straight")
    result = run_cli(*CLF, f"paths.log_dir={root}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_folder(root)


SLURM_JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


def wandb_run_ids(folder: Path) -> set[str]:
    return {p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*")}


@pytest.mark.slow
def test_sigterm_to_the_whole_job_stops_at_the_batch_end_without_a_traceback(tmp_path):
    """SIGTERM to the run and its child processes (SLURM's time limit, `docker stop`): W&B's
    service dies with it; one warning (before: the next W&B log call crashed the run with a
    ConnectionResetError and no checkpoint), the batch ends, last.ckpt is saved, exit 143."""
    stop = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=19"]
    result = run_cli(
        *CLF, "logger=wandb", f"paths.log_dir={tmp_path}", *stop, "+callbacks.stop.job=true"
    )
    assert result.returncode == 143, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "W&B stopped taking data" in result.stdout + result.stderr  # its service is gone
    folder = run_folder(tmp_path)
    assert summary_status(folder) == "interrupted"
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 20


@pytest.mark.slow
@pytest.mark.parametrize(("checkpoint", "step"), [("last", 20), ("step", 24)])
def test_a_run_killed_after_its_checkpoint_resumes_without_repeating_steps_in_its_csv(
    tmp_path, checkpoint, step
):
    """SIGKILL (out of memory, a lost node) after the last checkpoint: the resume logs the steps
    since then again, and metrics.csv held each of them twice (reviewer: steps 39, 44, 49, 44,
    49, 54). The rows from the resumed fit's first step on go as it logs it: from a checkpoint
    written inside an epoch (every 4 steps here) Lightning logs from the checkpoint's step + 1,
    and a cut at the checkpoint's own step lost that step's rows (its validation's too)."""
    logs = ["trainer.log_every_n_steps=1", "+logger.csv.flush_logs_every_n_steps=1"]
    kill = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=25"]
    every = "callbacks.step_checkpoint.every_n_train_steps=" + (
        "4" if checkpoint == "step" else "1000"
    )
    killed = run_cli(
        *CLF, *logs, *kill, every, "+callbacks.stop.signum=SIGKILL", f"paths.log_dir={tmp_path}"
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    folder = run_folder(tmp_path)
    assert newest_checkpoint(folder) == folder / "checkpoints" / f"{checkpoint}.ckpt"
    assert load_checkpoint(newest_checkpoint(folder))["global_step"] == step

    def steps(metric: str) -> list[int]:
        with (folder / "csv" / "metrics.csv").open(newline="") as f:
            return [int(row["step"]) for row in csv.DictReader(f) if row.get(metric)]

    assert max(steps("train/loss_step")) >= step  # logged after the checkpoint, then killed
    resumed = run_cli(f"resume={folder}", "callbacks.stop.batch=-1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps("train/loss_step") == list(range(40))  # 4 epochs of 10 batches, each once
    assert steps("val/acc") == [9, 19, 29, 39]  # each epoch's validation once


@pytest.mark.slow
def test_a_run_killed_after_its_checkpoint_keeps_every_row_logged_before_it(tmp_path):
    """Lightning's CSV writer holds rows for flush_logs_every_n_steps (100): SIGKILL after a
    step checkpoint lost the rows logged before it (the learning rate LearningRateMonitor logs
    at each epoch's start: review 170), which the resume, logging from the checkpoint on, never
    wrote again. Each checkpoint writes the rows out; the history is the uninterrupted run's.
    Killed in the last epoch: the resume logs no rate (an epoch's start is not run again), and
    summary.json had none (review 181): the earlier part's, which held all that epoch."""
    rate = ["model/scheduler=plateau", "model.scheduler_interval=epoch"]
    kill = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=35"]
    every = "callbacks.step_checkpoint.every_n_train_steps=4"
    killed = run_cli(
        *CLF, *rate, *kill, every, "+callbacks.stop.signum=SIGKILL", f"paths.log_dir={tmp_path}"
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    folder = run_folder(tmp_path)
    resumed = run_cli(f"resume={folder}", "callbacks.stop.batch=-1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with (folder / "csv" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows if row.get("lr-AdamW")] == [0, 10, 20, 30]
    assert [int(row["step"]) for row in rows if row.get("val/acc")] == [9, 19, 29, 39]
    last_rate = float([row for row in rows if row.get("lr-AdamW")][-1]["lr-AdamW"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["metrics"]["lr-AdamW"] == pytest.approx(last_rate)
    # the epoch the resume went on with part way is timed too (Lightning calls no
    # on_train_epoch_start there: it had no training rate, review 170)
    rated = [int(row["step"]) for row in rows if row.get("perf/train_images_per_s")]
    assert rated == [9, 19, 29, 39]
    # and train.log says where it went on from (walkthrough 168: Lightning's console alone)
    step = folder / "checkpoints" / "step.ckpt"
    assert (
        f"continuing from {step}, written in epoch 4 at global step 32"
        in (folder / "train.log").read_text()
    )


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["TERM", "KILL"])
def test_slurm_requeue_continues_in_the_job_folder(
    tmp_path, monkeypatch, straight_classifier, kill
):
    """SLURM's warning signal (SIGUSR1): the batch ends, last.ckpt is saved, then `scontrol
    requeue`; SLURM ends the process (SIGTERM, ignored by then: the summary says requeued; or
    SIGKILL at once) and starts the same command again, which continues in the job's folder
    from last.ckpt to the weights of an uninterrupted run."""
    # SIGTERM a moment after `scontrol requeue` returns, as SLURM sends it (the run had put
    # back SIGTERM's default by then, and died at it: review); SIGKILL at once
    delay = 0.2 if kill == "TERM" else 0
    for key, value in {**fake_scontrol(tmp_path, kill, delay), **SLURM_JOB}.items():
        monkeypatch.setenv(key, value)
    args = [*CLF, "logger=wandb", f"paths.log_dir={tmp_path / 'out'}"]
    signal_at = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=19"]

    first = run_cli(*args, *signal_at, "+callbacks.stop.signum=SIGUSR1")
    assert first.returncode == (143 if kill == "TERM" else -9), first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    folder = tmp_path / "out" / "train" / "slurm" / "4242"
    assert not list(folder.glob("hpc_ckpt_*"))  # Lightning's handler (in the signal) replaced
    assert summary_status(folder) == ("requeued" if kill == "TERM" else "running")
    if kill == "TERM":  # W&B shows the part stopped by the preemption (128 + SIGTERM)
        (part,) = (folder / "wandb").glob("offline-run-*")
        assert offline_run(part)["exit_code"] == 143

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = run_cli(*args, *signal_at, "+callbacks.stop.signum=SIGUSR1")  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing the interrupted run" in (folder / "train.log").read_text()
    assert list((tmp_path / "out").rglob("summary.json")) == [folder / "summary.json"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert len(wandb_run_ids(folder)) == 1  # the requeued job logs to the same W&B run
    last = max((folder / "wandb").glob("offline-run-*"))  # named by its start time
    assert offline_run(last)["exit_code"] == 0
    straight = load_checkpoint(straight_classifier / "checkpoints" / "last.ckpt")
    resumed = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == straight["global_step"]  # all the planned epochs
    assert summary["resumed_from"] == str(folder / "checkpoints" / "last.ckpt")
    a, b = straight["state_dict"], resumed["state_dict"]
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_a_job_killed_while_testing_tests_again_when_requeued(
    tmp_path, monkeypatch, straight_classifier
):
    """Preempted after its training ended, while testing (SIGKILL: SLURM's end of a job whose
    signal was not acted on in time), a requeued job trains nothing and tests the best
    checkpoint as the uninterrupted run did: its summary completed, with the fit's metrics,
    the test's and the objective (before: it exited 0 saying the run had completed, its
    summary "running" with no metrics, no test, no objective). Requeued again: nothing."""
    for key, value in SLURM_JOB.items():
        monkeypatch.setenv(key, value)
    args = [
        *CLF,
        "logger=wandb",
        f"paths.log_dir={tmp_path / 'out'}",
        "+callbacks.stop._target_=helpers.SignalInTest",
        "+callbacks.stop.signum=SIGKILL",
        f"+callbacks.stop.mark={tmp_path / 'killed'}",
    ]
    first = run_cli(*args)
    assert first.returncode == -9, first.stderr[-3000:]
    folder = tmp_path / "out" / "train" / "slurm" / "4242"
    assert summary_status(folder) == "running"
    trained = load_checkpoint(folder / "checkpoints" / "last.ckpt")

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = run_cli(*args)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "testing best.ckpt again, training nothing" in (folder / "train.log").read_text()
    summary = json.loads((folder / "summary.json").read_text())
    straight = json.loads((straight_classifier / "summary.json").read_text())
    assert summary["status"] == "completed"
    for key in ("best_score", "objective"):
        assert summary[key] == straight[key]
    assert summary["metrics"] == pytest.approx(straight["metrics"])  # fit's and test's
    assert summary["tested_checkpoint"] == str(folder / "checkpoints" / "best.ckpt")
    assert len(wandb_run_ids(folder)) == 1  # the test logged to the same W&B run
    # and at the step and epoch the fit ended (it logged epoch 0, step 0: walkthrough 135)
    assert rows_tested_at(folder) == rows_tested_at(straight_classifier)
    now = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    assert now["global_step"] == trained["global_step"]  # nothing trained

    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    third = run_cli(*args)
    assert third.returncode == 0 and "holds a run that completed" in third.stdout + third.stderr
    assert json.loads((folder / "summary.json").read_text())["metrics"] == summary["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["last validation", "test"])
def test_slurms_warning_signal_after_training_requeues_the_job_to_test(
    tmp_path, monkeypatch, straight_classifier, where
):
    """SLURM's warning signal (SIGUSR1) where training can no longer stop: in the fit's last
    validation (Preemption took it and let it go: the run tested and completed without a
    requeue, in a real job killed at its time limit part way through a long test) or in the
    test (Lightning's SLURM handler wrote hpc_ckpt_1.ckpt from inside the handler, a
    collective under DDP, and requeued the job while the test went on). The run stops once its
    fit is recorded, the job is requeued, and the requeued job tests as the uninterrupted run
    did, training nothing."""
    for key, value in {**fake_scontrol(tmp_path), **SLURM_JOB}.items():
        monkeypatch.setenv(key, value)
    signal_in = {
        "last validation": [
            "+callbacks.stop._target_=helpers.SignalInValidation",
            f"+callbacks.stop.epoch={CLF_EPOCHS - 1}",
        ],
        "test": [
            "+callbacks.stop._target_=helpers.SignalInTest",
            f"+callbacks.stop.mark={tmp_path / 'signalled'}",
        ],
    }[where]
    args = [*CLF, f"paths.log_dir={tmp_path / 'out'}", "data.eval_batch_size=64", *signal_in]
    first = run_cli(*args, "+callbacks.stop.signum=SIGUSR1")
    assert first.returncode == 143, first.stderr[-3000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    folder = tmp_path / "out" / "train" / "slurm" / "4242"
    assert summary_status(folder) == "requeued" and (folder / ".trained").is_file()
    assert not list(folder.glob("hpc_ckpt_*"))  # Lightning's handler (in the signal) not set
    assert "test/acc" not in json.loads((folder / "summary.json").read_text())["metrics"]

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = run_cli(*args, "+callbacks.stop.signum=SIGUSR1")  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "testing best.ckpt again, training nothing" in (folder / "train.log").read_text()
    summary = json.loads((folder / "summary.json").read_text())
    straight = json.loads((straight_classifier / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["metrics"] == pytest.approx(straight["metrics"])  # fit's and test's
    now = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    straight_last = load_checkpoint(straight_classifier / "checkpoints" / "last.ckpt")
    assert now["global_step"] == straight_last["global_step"]  # trained to its end, no more


@pytest.mark.slow
def test_submitit_requeue_continues_in_the_same_folder(tmp_path, straight_classifier):
    """Hydra's submitit launcher (local executor): submitit's preemption signal (USR2) saves
    last.ckpt at the batch boundary, submitit requeues the job, and the job continues."""
    result = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        *CLF,
        "logger=wandb",
        f"paths.log_dir={tmp_path}",
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=19",
        "+callbacks.stop.signum=SIGUSR2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_folder(tmp_path)
    log = (folder / "train.log").read_text()
    assert "saved" in log and "Requeued job" in log and "continuing the interrupted run" in log
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    assert summary["resumed_from"] == str(folder / "checkpoints" / "last.ckpt")
    assert len(wandb_run_ids(folder)) == 1
    a, b = final_state(straight_classifier), final_state(folder)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert val_rows(folder) == val_rows(straight_classifier)


@pytest.mark.slow
def test_a_submitit_job_a_signal_stopped_leaves_its_sweeps_summary(tmp_path):
    """A job of Hydra's submitit launcher that SIGTERM stops (scancel of one job, kill) ends
    without a result, and submitit's launcher raises for it (UncompletedJobError: the
    sweep's traceback, exit status 1): the sweep's summary was never written (review 187). It
    is now written as the sweep's process exits, stopped, naming the job and its resume=."""
    folder = tmp_path / "sweep"
    result = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        *CLF,
        f"hydra.sweep.dir={folder}",
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=3",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert summary_status(folder / "0") == "interrupted"
    summary = json.loads((folder / "sweep_summary.json").read_text())
    assert summary["stopped"] is True and summary["completed"] == 0
    (job,) = summary["interrupted"]
    assert job["job_dir"] == str(folder / "0")
    assert f"continue with: python train.py resume={folder / '0'}" in job["error"]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["finished", "stopped"])
def test_resume_with_another_max_epochs_ends_the_lr_schedule_at_the_new_end(tmp_path, start):
    """Train further (or stop sooner) than planned, or on with larger batches from an epoch's
    end: OneCycleLR's length follows the run (the steps taken, then the rest at the new rate),
    so it neither fails when stepped past its old end nor stops half way down."""
    every_step = "trainer.log_every_n_steps=1"  # the LR in the logs at every step
    steps_per_epoch = CLF_STEPS_PER_EPOCH
    if start == "finished":  # a run of 2 epochs, resumed from its end: further, and (a copy)
        # on with larger batches
        first = run_cli(*CLF, every_step, "trainer.max_epochs=2", f"paths.log_dir={tmp_path}")
        assert first.returncode == 0, first.stderr[-3000:]
        folder = run_folder(tmp_path)
        trained = load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"]
        assert trained == 2 * steps_per_epoch
        copy = shutil.copytree(folder, tmp_path / "copy", symlinks=True)
        resumed_further(folder, 4, [], trained)
        resumed_further(copy, 3, ["data.batch_size=256"], trained)
    else:  # stopped by a signal after one epoch, then resumed shorter
        stopped = run_cli(
            *CLF,
            every_step,
            "trainer.max_epochs=5",
            f"paths.log_dir={tmp_path / 'b'}",
            "+callbacks.stop._target_=helpers.SignalAt",
            f"+callbacks.stop.batch={steps_per_epoch - 1}",
        )
        assert stopped.returncode == 143, stopped.stderr[-3000:]
        folder = run_folder(tmp_path / "b")
        trained = load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"]
        assert trained == steps_per_epoch  # (CLF_STEPS_PER_EPOCH as the digits have it)
        resumed_further(folder, 3, [], trained)


def resumed_further(folder: Path, epochs: int, changed: list[str], resumed_from: int) -> None:
    """resume= the folder with trainer.max_epochs=<epochs> and the changed settings: the
    one-cycle schedule ends where the run does, its LR at every step that of a run planned for
    so many steps."""
    steps_per_epoch = CLF_STEPS_PER_EPOCH
    resumed = run_cli(f"resume={folder}", f"trainer.max_epochs={epochs}", *changed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # kept for the next resume= of the folder (its saved config stays the first command's)
    recorded = yaml.safe_load((folder / ".hydra" / "resume_overrides.yaml").read_text())
    assert recorded == [f"trainer.max_epochs={epochs}", *changed]
    saved = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    total = saved["global_step"]  # the schedule ends where the run does
    if not changed:
        assert total == epochs * steps_per_epoch
    else:  # the third epoch in half as many steps (256 images a batch instead of 128)
        assert total == resumed_from + math.ceil(steps_per_epoch / 2)
    schedule = saved["lr_schedulers"][0]
    assert schedule["total_steps"] == schedule["last_epoch"] == total
    # From the resume on, the LR is that of a run planned for that many steps: at every step
    # and at the end.
    planned = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-3)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(
        planned, max_lr=3e-3, pct_start=0.25, total_steps=total
    )
    plan = [planned.param_groups[0]["lr"]]
    for _ in range(total):
        planned.step()
        one_cycle.step()
        plan.append(planned.param_groups[0]["lr"])
    with open(folder / "csv" / "metrics.csv") as f:
        logged = {int(r["step"]): float(r["lr-AdamW"]) for r in csv.DictReader(f) if r["lr-AdamW"]}
    resumed_steps = [step for step in logged if step >= resumed_from]
    assert resumed_steps and all(
        logged[step] == pytest.approx(plan[step], rel=1e-5) for step in resumed_steps
    ), (logged, plan)
    final_lr = saved["optimizer_states"][0]["param_groups"][0]["lr"]
    assert final_lr == pytest.approx(plan[-1], rel=1e-6)


@pytest.mark.slow
def test_a_run_with_max_steps_resumed_at_an_epochs_end_trains_every_epoch(tmp_path):
    """trainer.max_steps set (the run still ends at max_epochs): resumed from last.ckpt written at
    an epoch's end, it trains the next epoch whole, as the same resume without max_steps does.
    (Lightning 2.6.6 alone trains none of that epoch's batches: compat.restart_finished_epochs_
    as_epoch_based.)"""
    first = run_cli(
        *CLF, "trainer.max_epochs=2", "trainer.max_steps=1000", f"paths.log_dir={tmp_path}"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_folder(tmp_path)
    twin = tmp_path / "twin"
    shutil.copytree(folder, twin)
    steps_per_epoch = load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] // 2
    for run, overrides in ((folder, []), (twin, ["trainer.max_steps=-1"])):
        resumed = run_cli(f"resume={run}", "trainer.max_epochs=4", *overrides)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 4 * steps_per_epoch
    )
    assert [epoch for epoch, _ in val_rows(folder)] == ["0", "1", "2", "3"]
    assert val_rows(folder) == val_rows(twin)
    a, b = final_state(folder), final_state(twin)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_a_run_with_max_steps_resumed_mid_epoch_continues_that_epoch(tmp_path, straight_classifier):
    """With trainer.max_steps set, a checkpoint from within an epoch (a preemption) still
    continues that epoch where it stopped: the same weights as the run never stopped. Before
    it, a resume with another batch size, refused as the fit restores the loader (start-up lines
    logged), leaves the run folder's summary and log as they were."""
    args = [*CLF, "trainer.max_steps=1000", f"paths.log_dir={tmp_path}"]
    stopped = run_cli(*args, "+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=6")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    folder = run_folder(tmp_path)
    kept = {name: (folder / name).read_bytes() for name in ("summary.json", "train.log")}
    refused = run_cli(f"resume={folder}", "data.batch_size=64")
    assert refused.returncode == 2 and "resume with the same values" in refused.stderr
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = final_state(straight_classifier), final_state(folder)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert val_rows(folder) == val_rows(straight_classifier)


def test_an_epoch_cut_short_by_max_steps_logs_its_whole_means_when_resumed(tmp_path):
    """A run that trainer.max_steps ended inside epoch 1, resumed without it: the rest of that
    epoch trains (compat.reopen_an_epoch_cut_short) and its end logs train/loss and train/acc
    over the whole epoch, as an uninterrupted run does. Before: the sums were zeroed at the cut,
    so the resumed epoch's row was the mean of the batches after the cut only."""
    args = ["data.batch_size=128", "model.net.width=4", "model.scheduler=null", "logger=csv"]
    args += ["trainer.max_epochs=2", "+trainer.limit_val_batches=0", "test=false", *QUIET]

    def epoch_means(*overrides: str) -> tuple[dict[str, tuple[float, float]], Path]:
        cfg = make_cfg(tmp_path / str(len(list(tmp_path.iterdir()))), [*args, *overrides])
        train_task(cfg)
        folder = Path(cfg.paths.output_dir)
        with open(folder / "csv" / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
        return {r["epoch"]: (float(r["train/loss"]), float(r["train/acc"])) for r in rows}, folder

    cut, first = epoch_means("trainer.max_steps=14")  # 10 batches an epoch
    resumed, _ = epoch_means(f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}")
    whole, _ = epoch_means()
    assert resumed["1"] == pytest.approx(whole["1"], rel=1e-6)
    assert cut["1"] != pytest.approx(whole["1"], rel=1e-3)  # the mean of the cut's 4 batches


@pytest.mark.slow
def test_a_finished_cosine_run_trained_further_follows_the_longer_cosine(tmp_path):
    """`resume=<folder> trainer.max_epochs=4` after a 2-epoch cosine run: the LR is the 4-epoch
    cosine's from the step reached on (torch's recursive form, at eta_min = 0 after a finished
    schedule, kept the LR at 0: the added epochs changed no weight)."""
    args = [*CLF, "model/scheduler=cosine", "trainer.max_epochs=2", "trainer.log_every_n_steps=1"]
    args += [f"paths.log_dir={tmp_path}"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_folder(tmp_path)
    before = final_state(folder)
    steps_per_epoch = load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] // 2
    resumed = run_cli(f"resume={folder}", "trainer.max_epochs=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    total = 4 * steps_per_epoch
    with open(folder / "csv" / "metrics.csv") as f:
        logged = {int(r["step"]): float(r["lr-AdamW"]) for r in csv.DictReader(f) if r["lr-AdamW"]}
    later = {step: lr for step, lr in logged.items() if step >= 2 * steps_per_epoch}
    cosine = {step: 3e-3 * (1 + math.cos(math.pi * step / total)) / 2 for step in later}
    assert later and all(later[s] == pytest.approx(cosine[s], rel=1e-5) for s in later), later
    after = final_state(folder)
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_a_tuned_run_continues_in_place_with_the_values_found(tmp_path, monkeypatch):
    """The requeued command still says tune.batch_size=true: it continues with the batch size
    found the first time (kept in the checkpoint) instead of refusing or searching again."""
    monkeypatch.syspath_prepend(str(REPO / "tests"))  # helpers.SignalAt
    args = [
        *(a for a in CLF if not a.startswith("data.batch_size=")),  # the finder's to choose
        "trainer.max_epochs=3",
        "tune.batch_size=true",
        "tune.batch_size_finder.init_val=16",
        "tune.batch_size_finder.max_trials=2",  # 16, 32
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=40",
    ]
    with pytest.raises(SystemExit) as stopped:
        train_task(make_cfg(tmp_path, args))
    assert stopped.value.code == 143
    again = make_cfg(tmp_path, args)  # the same command in the same folder
    train_task(again)
    summary = summary_of(again)
    assert summary["status"] == "completed"
    # the first part's values, carried (run.WHOLE_RUN) for the report: no second search
    assert summary["tuned"] == summary["previous_summary"]["tuned"]
    assert summary["tuned"]["batch_size"] == 32
    assert summary["resumed_from"].endswith("last.ckpt")
    assert again.data.batch_size == 32


@pytest.mark.slow
def test_a_requeued_tuned_run_leaves_the_values_found_for_a_later_resume(tmp_path):
    """Hydra writes the command's config again when a requeued job starts: the saved config
    went back to tune.batch_size=true and the batch size before the search, and a later
    resume= refused the switch; dropping it trained on at the old batch size (review). Now the
    requeued job writes the values found again, switches off; and a resume whose saved config
    still has a switch on (folders requeued before) takes the checkpoint's values."""
    folder = tmp_path / "run"
    args = [
        *(a for a in CLF if not a.startswith("data.batch_size=")),  # the finder's to choose
        "trainer.max_epochs=2",
        "tune.batch_size=true",
        "tune.batch_size_finder.init_val=16",
        "tune.batch_size_finder.max_trials=2",  # 16, 32
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=20",
        f"hydra.run.dir={folder}",
    ]
    assert run_cli(*args).returncode == 143
    requeued = run_cli(*args)  # the same command in the same folder
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    saved_path = folder / ".hydra" / "config.yaml"
    saved = yaml.safe_load(saved_path.read_text())
    assert saved["data"]["batch_size"] == 32 and saved["tune"]["batch_size"] is False
    saved["tune"]["batch_size"] = True  # as a folder requeued before this fix left it
    saved["data"]["batch_size"] = 128
    saved_path.write_text(yaml.safe_dump(saved))
    resumed = run_cli(f"resume={folder}", "trainer.max_epochs=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    assert last["epoch"] == 2 and last["hyper_parameters"]["data"]["batch_size"] == 32  # 3rd


def test_a_save_after_a_step_that_broke_the_weights_is_refused(tmp_path, capsys):
    """The batch's loss was finite (computed before the step), the weights the step left are
    not: the periodic save at that batch is refused, the earlier step.ckpt stays."""
    cfg = make_cfg(
        tmp_path,
        [
            *CLF,
            "callbacks.step_checkpoint.every_n_train_steps=2",
            "callbacks.divergence_guard.check_every_n_steps=1000",
            "+callbacks.nan._target_=helpers.InjectNaN",
            "+callbacks.nan.at_batch=3",
            "+callbacks.nan.module=net",
            "+callbacks.nan.after_step=true",
        ],
    )
    err = refused(capsys, train_task, cfg, "training diverged: the weights became NaN")
    step = Path(cfg.paths.output_dir) / "checkpoints" / "step.ckpt"
    assert "training diverged: the weights became NaN or infinite by step 4" in err, err
    assert f"the last good checkpoint is {step}" in err
    saved = load_checkpoint(step)
    assert saved["global_step"] == 2
    weights = {k: v for k, v in saved["state_dict"].items() if k.startswith("net.")}
    assert weights and all(
        torch.isfinite(v).all() for v in weights.values() if v.is_floating_point()
    )


def test_divergence_guard_reads_its_sums_every_n_steps_and_forgets_nothing_between():
    """A non-finite loss anywhere in the window is caught at the next check (none at a step
    before it: no host sync), large finite half-precision losses are not taken for one, and a
    window that passed does not carry into the next."""
    from litlab.callbacks.guard import DivergenceGuard
    from litlab.errors import TrainingDiverged

    trainer = bare_trainer()
    guard = DivergenceGuard(check_every_n_steps=3)

    def step(**losses):
        guard.on_train_batch_end(trainer, None, losses, None, 0)

    for _ in range(6):  # 2 windows of half-precision losses summing past float16's 65,504
        step(loss=torch.tensor(40_000.0, dtype=torch.float16))
    step(loss=torch.tensor(1.0), d=torch.tensor(float("inf")))
    step(loss=torch.tensor(float("nan")))  # not checked yet: step 8 of a window of 3
    with pytest.raises(TrainingDiverged, match="loss, d became NaN or infinite"):
        step(loss=torch.tensor(2.0))


def test_a_resume_repeating_the_runs_command_takes_its_config_group_choices_as_made(tmp_path):
    """The run's own command repeated with resume= (`python train.py model=cnn logger=csv ...
    resume=<folder>`): its config group choices are the run's already and are left out (Hydra
    read `logger=csv` as the value of the key logger in the saved config: a traceback); another
    choice of a group is refused in one line (the saved config cannot be composed anew)."""
    args = ["model=cnn", "logger=csv", "model/net=small_cnn", "model.scheduler=null", *QUIET]
    args += ["trainer.max_epochs=1"]
    first = run_cli(*args, "trainer.max_steps=2", f"paths.log_dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_folder(tmp_path)
    again = run_cli(*args, "trainer.max_steps=4", f"resume={folder}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 4
    other = run_cli(*args, "trainer=ddp", "trainer.max_steps=6", f"resume={folder}")
    assert other.returncode == 2 and other.stderr.strip().splitlines()[-1] == (
        "litlab: error: resume= continues the run's saved config, whose config groups are "
        "chosen: trainer=ddp (the run has trainer=default); set the keys to change instead "
        "(e.g. trainer.devices=2), or start a new run with that choice"
    )


def test_a_resumes_group_choices_are_compared_with_the_runs_own(capsys):
    """What _unchosen makes of each form (review): the run's own choice, also quoted or a
    null it had, is left out; a null where the run chose (logger=null: no loggers) stays a
    value of the saved config; `~group` and keys pass; another choice is refused."""
    from litlab.resume import _unchosen

    choices = {"logger": "csv", "model/scheduler": None, "experiment": None, "trainer": "default"}
    given = ["logger='csv'", "model/scheduler=null", "experiment=null", "logger=null"]
    given += ["~callbacks", "trainer.devices=2", "+trainer=default"]
    assert _unchosen(choices, given) == ["logger=null", "~callbacks", "trainer.devices=2"]
    with pytest.raises(SystemExit):
        _unchosen(choices, ["trainer=ddp", "experiment=fashion_cnn"])
    told = "trainer=ddp (the run has trainer=default), experiment=fashion_cnn (the run has none);"
    assert told in capsys.readouterr().err


def test_a_resume_continues_with_what_earlier_resumes_changed(tmp_path, monkeypatch):
    """`resume=<folder> trainer.max_epochs=4` that trains is remembered: a later plain
    `resume=<folder>` (after another preemption) keeps 4 epochs instead of the first command's
    value; a resume refused before training changes nothing; a later value of a key wins."""
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    monkeypatch.setenv("LITLAB_RESUME_OVERRIDES", "")  # restored (absent) after the test
    monkeypatch.delenv("LITLAB_RESUME_OVERRIDES")

    def resume(*overrides: str) -> list[str]:
        argv = resume_argv(["train.py", f"resume={folder}", *overrides])
        return [arg for arg in argv if arg.startswith(("trainer.", "+callbacks."))]

    assert resume("trainer.max_epochs=4", "+callbacks.x.a=1") == [
        "trainer.max_epochs=4",
        "+callbacks.x.a=1",
    ]
    assert resume() == []  # the first was refused (never recorded): nothing carried
    record_resume_overrides(tmp_path / "elsewhere")  # another folder's run: not this one's
    assert resume("trainer.max_epochs=4", "+callbacks.x.a=1")
    record_resume_overrides(folder)  # this one trained
    assert resume() == ["trainer.max_epochs=4", "+callbacks.x.a=1"]
    assert resume("trainer.max_epochs=6") == ["+callbacks.x.a=1", "trainer.max_epochs=6"]
    record_resume_overrides(folder)
    assert resume() == ["+callbacks.x.a=1", "trainer.max_epochs=6"]


def test_a_run_refused_in_a_run_folder_leaves_its_saved_config_as_it_was(tmp_path):
    """`hydra.run.dir=<a run folder>` with another net is refused; Hydra had written the refused
    command's .hydra files over the run's before litlab ran, and the run's own `resume=` (the
    refusal's advice) then built the other net: a size-mismatch traceback. They stay the run's."""
    folder = tmp_path / "run"
    args = [*CLF, "trainer.max_epochs=1", "trainer.max_steps=2", "model.scheduler=null"]
    args += [f"hydra.run.dir={folder}"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = {path.name: path.read_bytes() for path in (folder / ".hydra").iterdir()}
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= saved.keys()
    other = run_cli(*args, "model.net.width=16")
    assert other.returncode == 2
    assert "already holds checkpoints of a run with another config" in other.stderr
    assert {path.name: path.read_bytes() for path in (folder / ".hydra").iterdir()} == saved
    resumed = run_cli(f"resume={folder}", "trainer.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 4


def test_a_resume_that_fails_before_training_leaves_the_finished_run_as_it_was(tmp_path):
    """A resume that Lightning rejects in the fit's setup (a val_check_interval beyond the
    epoch) had dropped the finished run's marks, recorded its overrides (every later plain
    `resume=` failed the same way) and put its summary one level down; now the folder is left
    as it was, and a resume that trains records its overrides with its first checkpoint."""
    folder = tmp_path / "run"
    first = run_cli(*CLF, "trainer.max_epochs=1", f"hydra.run.dir={folder}")
    assert first.returncode == 0, first.stderr[-3000:]
    summarized = (folder / "summary.json").read_bytes()
    logged = (folder / "train.log").read_bytes()
    failed = run_cli(f"resume={folder}", "trainer.max_epochs=2", "+trainer.val_check_interval=1000")
    assert failed.returncode == 1 and "val_check_interval" in failed.stderr
    assert (folder / "train.log").read_bytes() == logged  # its last line: not this error (review)
    assert (folder / ".completed").is_file() and (folder / ".trained").is_file()
    assert not (folder / ".hydra" / "resume_overrides.yaml").exists()
    assert (folder / "summary.json").read_bytes() == summarized
    further = run_cli(f"resume={folder}", "trainer.max_epochs=2")
    assert further.returncode == 0, further.stderr[-3000:]
    recorded = yaml.safe_load((folder / ".hydra" / "resume_overrides.yaml").read_text())
    assert recorded == ["trainer.max_epochs=2"] and (folder / ".completed").is_file()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["previous_summary"] == json.loads(summarized)


def test_a_finished_run_trained_further_that_fails_before_a_checkpoint_is_not_completed(
    tmp_path, capsys, caplog
):
    """A resume that trains a completed run further and fails before it writes a checkpoint
    is recorded failed, and the folder's run is no longer completed: its .completed mark had
    stayed, and the run's command requeued (a batch script's) said "holds a run that completed"
    and put the failed summary back. The checkpoints are still the finished run's: the
    requeued command tests them again, training nothing, and the run completes as it had."""
    args = ["model.net.width=4", "trainer.max_epochs=1", "+trainer.limit_train_batches=4"]
    args += ["model.scheduler=null", *QUIET]
    first = make_cfg(tmp_path, args)
    objective = train_task(first)
    folder = Path(first.paths.output_dir)
    last = folder / "checkpoints" / "last.ckpt"
    written = last.read_bytes()
    # one more batch trains, the next one's weights are NaN: the divergence guard fails the run
    diverge = ["+callbacks.nan._target_=helpers.InjectNaN", "+callbacks.nan.at_batch=5"]
    diverge += ["+callbacks.nan.module=net", "callbacks.divergence_guard.check_every_n_steps=1"]
    further = make_cfg(tmp_path, [*args, f"ckpt_path={last}", "trainer.max_epochs=2", *diverge])
    refused(capsys, train_task, further, "training diverged")
    assert summary_of(first)["status"] == "failed" and last.read_bytes() == written
    assert not (folder / ".completed").exists() and (folder / ".trained").is_file()
    with caplog.at_level("WARNING", logger="litlab"):
        again = train_task(make_cfg(tmp_path, args))  # the run's own command, requeued
    assert "testing best.ckpt again, training nothing" in caplog.text
    summary = summary_of(first)
    assert summary["status"] == "completed" and again == objective
    assert summary["previous_summary"]["status"] == "failed"
    assert (folder / ".completed").is_file() and last.read_bytes() == written


@pytest.mark.slow
@pytest.mark.dist
def test_a_resume_in_spawned_processes_that_fails_is_recorded_failed(tmp_path):
    """trainer.strategy=ddp_spawn trains in spawned processes, whose Run tells the main one
    nothing of its own: a resume of a completed run that failed there must be recorded failed
    by the main process, whether the fit began to train over the completed run (its
    .completed mark gone) and diverged before writing a checkpoint, or trained (a checkpoint
    written) and diverged after: the main process put the folder's previous summary
    ("completed") back over the failure. One first run serves both: the second a copy,
    without its .completed mark, so that only the checkpoint written can tell (review 138:
    with the mark, a Run that ignored checkpoints written passed)."""
    args = ["data=synthetic", "data.image_shape=[1,16,16]", "data.source.train_size=512"]
    args += ["data.batch_size=32", "model.net.width=8", "model.scheduler=null", "test=false"]
    args += ["logger=csv", *QUIET, "trainer.accelerator=cpu", "trainer.devices=2"]
    args += ["trainer.strategy=ddp_spawn"]
    folder = tmp_path / "run"
    first = run_cli(*args, "trainer.max_epochs=1", f"hydra.run.dir={folder}", timeout=400)
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary_status(folder) == "completed"
    after = shutil.copytree(folder, tmp_path / "copy")
    # the copy without its .completed mark: its failure is found by the checkpoint the resume
    # wrote alone (with the mark, the mark's removal as the fit began would find it first)
    (after / ".completed").unlink()
    written = (folder / "checkpoints" / "last.ckpt").read_bytes()
    diverge = ["+callbacks.nan._target_=helpers.InjectNaN", "+callbacks.nan.module=net"]
    diverge += ["callbacks.divergence_guard.check_every_n_steps=1"]
    for run, epochs, at_batch in ((folder, 2, 9), (after, 3, 20)):
        # 8 batches an epoch: the second batch of the second epoch (before a checkpoint), or
        # in the third epoch (after the second one's)
        failed = run_cli(
            f"resume={run}",
            f"trainer.max_epochs={epochs}",
            *diverge,
            f"+callbacks.nan.at_batch={at_batch}",
            timeout=400,
        )
        assert failed.returncode != 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed" and "diverged" in summary["error"].lower(), summary
        assert not (run / ".completed").exists()
    assert (folder / "checkpoints" / "last.ckpt").read_bytes() == written
    # it trained: its last.ckpt is the second epoch's (the first run's, epoch 0, was there)
    assert load_checkpoint(after / "checkpoints" / "last.ckpt")["epoch"] == 1


TINY = ["model.net.width=4", "trainer.max_epochs=1", "trainer.max_steps=2", "model.scheduler=null"]
TINY += ["test=false", *QUIET]


def test_a_resume_with_another_network_is_refused_in_one_line(tmp_path, capsys):
    """`resume=<run> model.net.width=16` passed every check and ended in a size-mismatch
    traceback as the checkpoint's weights were loaded; now one line says what changed and what
    to do, and the run's summary stays as it was."""
    train_task(make_cfg(tmp_path, TINY))
    folder = tmp_path / "run"
    last, summary = folder / "checkpoints" / "last.ckpt", folder / "summary.json"
    summarized = summary.read_bytes()
    other = [*TINY, f"ckpt_path={last}", "trainer.max_steps=4"]
    other += ["model.net.width=8", "model.net.depth=2"]
    line = refused(capsys, train_task, make_cfg(tmp_path, other), "holds another network")
    assert "(model.net.width: 4 -> 8; model.net.depth: 1 -> 2)" in line
    assert "start a new run to train this network" in line
    assert summary.read_bytes() == summarized


def test_a_resume_of_a_run_still_in_progress_is_refused(tmp_path):
    """`resume=<run>` while the run still trains (its summary "running", its process alive on
    this machine) was accepted: two processes trained in one folder, metrics.csv got every
    step twice and rows in mixed columns (walkthrough 132). Now refused in one line, the
    summary left; once that process is gone (a run killed hard also says "running") it resumes."""
    folder = tmp_path / "run"
    first = run_cli(*TINY, "logger=csv", f"hydra.run.dir={folder}")
    assert first.returncode == 0, first.stderr[-2000:]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        summary = json.loads((folder / "summary.json").read_text())
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        summary.update(status="running", pid=live.pid, started_at=started)
        (folder / "summary.json").write_text(json.dumps(summary))
        refused = run_cli(f"resume={folder}", "trainer.max_steps=4")
        assert refused.returncode == 2
        assert f"holds a run still in progress: process {live.pid} on this machine" in (
            refused.stderr
        )
        assert json.loads((folder / "summary.json").read_text()) == summary
        # the same command again in its folder (a grid sweep run again while its jobs ran, a
        # job of a sweep whose own process was killed: review 187): refused before it wrote
        saved = (folder / ".hydra" / "config.yaml").read_bytes()
        again = run_cli(*TINY, "logger=csv", f"hydra.run.dir={folder}")
        assert again.returncode == 2, again.stderr[-2000:]
        assert f"holds a run still in progress: process {live.pid}" in again.stderr
        assert json.loads((folder / "summary.json").read_text()) == summary
        assert (folder / ".hydra" / "config.yaml").read_bytes() == saved
        # the same number in another pid namespace (a container with the host's name) is
        # another process: a dead run of one container does not stop a resume in another
        from litlab.resume import process_of_a_live_run

        assert process_of_a_live_run(summary) == live.pid
        assert process_of_a_live_run({**summary, "pid_namespace": 1}) is None
    finally:
        live.kill()
        live.wait()
    resumed = run_cli(f"resume={folder}", "trainer.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert summary_status(folder) == "completed"


def test_a_resume_from_the_validation_at_a_max_steps_cut_logs_at_the_uninterrupted_steps(
    tmp_path,
):
    """trainer.max_steps ending a fit inside an epoch validates there; best.ckpt written in that
    validation (before Lightning counts the batch, as its in-epoch checkpoints are), resumed
    without max_steps, logged every later row one step early: validations at 23 and 28 where
    the run straight through has 24 and 29 (review). Now at the same steps, same weights."""
    args = ["data.batch_size=128", "model.net.width=4", "model.scheduler=null", "logger=csv"]
    args += ["trainer.max_epochs=3", "test=false", "+trainer.val_check_interval=0.5", *QUIET]

    def steps(name: str, *overrides: str) -> tuple[list[str], list[str], Path]:
        cfg = make_cfg(tmp_path / name, [*args, *overrides])
        train_task(cfg)
        folder = Path(cfg.paths.output_dir)
        with open(folder / "csv" / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        logged = [[r["step"] for r in rows if r.get(key)] for key in ("val/loss", "train/loss")]
        return logged[0], logged[1], folder

    straight_val, straight_train, straight = steps("straight")
    _, _, cut = steps("cut", "trainer.max_steps=23")  # 10 batches an epoch: inside epoch 2
    val, train, resumed = steps("resumed", f"ckpt_path={cut / 'checkpoints' / 'best.ckpt'}")
    assert val == [s for s in straight_val if int(s) > 22] and train == straight_train[-1:]
    a, b = final_state(straight), final_state(resumed)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_gan_resumed_without_its_ema_or_with_other_fixed_noise_is_refused(tmp_path, capsys):
    """A GAN's EMA generator switched off (model.ema_decay=null) or its grids' fixed noise
    resized at a resume ended in Lightning's traceback (unexpected keys; size mismatch)."""
    gan = [*TINY_GAN, "trainer.max_steps=2", "test=false", "callbacks.fid.num_samples=16", *QUIET]
    train_task(make_cfg(tmp_path, gan))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    other = [*gan, f"ckpt_path={last}", "trainer.max_steps=4"]
    other += ["model.ema_decay=null", "model.num_fixed_noise=16"]
    line = refused(capsys, train_task, make_cfg(tmp_path, other), "holds another network")
    assert "(model.ema_decay: 0.999 -> None; model.num_fixed_noise: 64 -> 16)" in line
    # another decay: another average than val/fid measured so far (walkthrough 145: trained on)
    decay = make_cfg(tmp_path, [*gan, f"ckpt_path={last}", "model.ema_decay=0.9"])
    line = refused(capsys, train_task, decay, "model.ema_decay: 0.999 -> 0.9 would change what")


def test_a_resumes_run_control_keys_are_not_carried_to_the_next(tmp_path, monkeypatch):
    """`resume=<run> ckpt_path=<run>/checkpoints/best.ckpt` starts from best.ckpt, once: its
    ckpt_path was recorded with its overrides, and every later plain `resume=<run>` restarted
    from best.ckpt too, losing what was trained since. ckpt_path, train and test are this
    command's, not the run's (a record that holds them already is read without them)."""
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (folder / "checkpoints").mkdir()
    last, best = folder / "checkpoints" / "last.ckpt", folder / "checkpoints" / "best.ckpt"
    last.write_bytes(b"")
    best.write_bytes(b"")
    monkeypatch.setenv("LITLAB_RESUME_OVERRIDES", "")  # restored (absent) after the test
    monkeypatch.delenv("LITLAB_RESUME_OVERRIDES")

    def resume(*overrides: str) -> list[str]:
        argv = resume_argv(["train.py", f"resume={folder}", *overrides])
        return [arg for arg in argv if arg.startswith(("ckpt_path=", "trainer.", "test="))]

    given = [f"ckpt_path={best}", "trainer.max_epochs=6", "test=false"]
    assert resume(*given) == [f"ckpt_path={last}", *given]  # this run: from best.ckpt
    record_resume_overrides(folder)  # it trained
    record = folder / ".hydra" / "resume_overrides.yaml"
    assert yaml.safe_load(record.read_text()) == ["trainer.max_epochs=6"]
    assert resume() == [f"ckpt_path={last}", "trainer.max_epochs=6"]
    record.write_text(yaml.safe_dump([f"ckpt_path={best}", "trainer.max_epochs=6", "train=false"]))
    assert resume() == [f"ckpt_path={last}", "trainer.max_epochs=6"]


def test_a_resume_with_another_fid_measure_is_refused(tmp_path, capsys):
    """A GAN's val/fid (its objective, which picks the best checkpoint) resumed with other FID
    settings was measured two ways in one run; now refused in one line, like model.tta_flip."""
    args = [*GAN_MODEL, "trainer.max_epochs=1", "trainer.max_steps=2", "test=false", *QUIET]
    args += [f"paths.cache_dir={tmp_path / 'cache'}"]
    train_task(make_cfg(tmp_path, args))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    resumed = [*args, f"ckpt_path={last}", "trainer.max_steps=4"]
    for other, told in [
        ("callbacks.fid.num_samples=128", "callbacks.fid.num_samples: 64 -> 128"),
        ("callbacks.fid.num_real=500", "callbacks.fid.num_real: 10000 -> 500"),
        ("callbacks.fid.extractor=inception", "callbacks.fid.extractor: auto -> inception"),
    ]:
        cfg = make_cfg(tmp_path, [*resumed, other])
        refused(capsys, train_task, cfg, f"{told} would change what val/* measures part way")


def test_resume_takes_the_checkpoint_written_last_also_in_a_copy_without_times(tmp_path):
    """newest_checkpoint chose by the files' times: in a copy that did not keep them (cp -r
    writes step.ckpt after last.ckpt) resume= went back to the older periodic save. Each
    checkpoint now holds when it was written; not its global step, which a run restarted from
    an earlier checkpoint has not yet caught up with in the older step.ckpt it leaves."""
    args = [*TINY, "callbacks.step_checkpoint.every_n_train_steps=2"]
    train_task(make_cfg(tmp_path, [*args, "trainer.max_steps=2"]))
    checkpoints = tmp_path / "run" / "checkpoints"
    step, last = checkpoints / "step.ckpt", checkpoints / "last.ckpt"
    early = shutil.copy(last, tmp_path / "early.ckpt")  # step 2
    train_task(make_cfg(tmp_path, [*args, f"ckpt_path={last}", "trainer.max_steps=5"]))
    assert load_checkpoint(step)["global_step"] == 4 and load_checkpoint(last)["global_step"] == 5
    later = last.stat().st_mtime + 60  # copied in another order: step.ckpt's time the later
    os.utime(step, (later, later))
    assert newest_checkpoint(tmp_path / "run") == last
    train_task(make_cfg(tmp_path, [*args, f"ckpt_path={early}", "trainer.max_steps=3"]))
    assert load_checkpoint(step)["global_step"] == 4 and load_checkpoint(last)["global_step"] == 3
    os.utime(step, (later, later))
    assert newest_checkpoint(tmp_path / "run") == last


@pytest.mark.slow
def test_a_run_folder_moved_elsewhere_resumes_with_its_best_checkpoint_and_score(tmp_path):
    """Lightning keeps a ModelCheckpoint's best score and paths only where the checkpoint was
    saved in the same folder: a run folder copied elsewhere and continued with resume= started
    with no best, and its next, worse validation overwrote best.ckpt and became the run's
    objective (reviewer: 0.840 for the run's 0.965)."""
    # digits: val/acc about 0.76, 0.96 (val_rows reads val/acc: the objective here)
    args = ["trainer.max_epochs=2", "objective=accuracy", "logger=csv", *QUIET]
    trained = run_cli(*args, f"paths.log_dir={tmp_path / 'a'}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    moved = tmp_path / "b" / "run"
    shutil.copytree(run_folder(tmp_path / "a"), moved)
    best = (moved / "checkpoints" / "best.ckpt").read_bytes()
    # a third epoch of one batch, its first layer zeroed as it starts: a worse val/acc
    resumed = run_cli(
        f"resume={moved}",
        "trainer.max_epochs=3",
        "+trainer.limit_train_batches=1",
        "+callbacks.hurt._target_=helpers.ZeroAtStart",
        "+callbacks.hurt.module=net",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    scores = [float(value) for _, value in val_rows(moved)]
    assert len(scores) == 3 and scores[2] < max(scores[:2])  # the case: the last one worse
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["objective"]["value"] == pytest.approx(max(scores))
    assert (moved / "checkpoints" / "best.ckpt").read_bytes() == best
    assert Path(summary["best_checkpoint"]) == moved / "checkpoints" / "best.ckpt"


@pytest.mark.slow
def test_a_resumed_offline_wandb_run_says_to_sync_all_its_parts_together(tmp_path):
    """A resumed run logs to the same W&B run id, offline in a second folder; the line at its
    end named that part alone, whose sync uploads its history only. It names every part not
    uploaded, in order: wandb syncs the parts of one run together, in order of start time.
    Resumed online (credentials now; no server here) while the first part is not uploaded, it
    logs offline too, without trying the server: W&B drops the steps of an earlier part uploaded
    after a later part's."""
    args = ["logger=wandb", "extras.print_config=false", "callbacks.progress_bar=null"]
    args += ["data.batch_size=1294"]  # the digits' training split: one step an epoch
    first = run_cli(*args, "trainer.max_epochs=2", f"paths.log_dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_folder(tmp_path)
    (part,) = (folder / "wandb").glob("offline-run-*")
    # A resume refused once W&B has started (as the fit restores the schedule: a one-cycle
    # warm-up of one step over 4 steps) leaves no part of its own: its part held the refusal
    # alone, and syncing it closed the W&B run as failed (walkthrough 137).
    links = {p.name: os.readlink(p) for p in (folder / "wandb").iterdir() if p.is_symlink()}
    logged = (folder / "train.log").read_bytes()
    refused = run_cli(f"resume={folder}", "trainer.max_epochs=4")
    assert refused.returncode == 2 and "one-cycle warm-up of exactly one step" in refused.stderr
    assert "is removed with it" in refused.stdout + refused.stderr  # said on the console
    assert (folder / "train.log").read_bytes() == logged  # (it held that line alone: 186)
    assert list((folder / "wandb").glob("offline-run-*")) == [part]
    assert {p.name: os.readlink(p) for p in (folder / "wandb").iterdir() if p.is_symlink()} == links
    assert summary_status(folder) == "completed"
    online = run_cli(f"resume={folder}", "trainer.max_epochs=3", wandb_online=True)
    assert online.returncode == 0, online.stderr[-3000:]
    said = online.stdout + online.stderr
    assert "this run's earlier part is offline and not uploaded" in said
    assert f"upload them first (wandb sync {part})" in said
    assert "W&B could not start online" not in said
    parts = sorted((folder / "wandb").glob("offline-run-*"))
    assert len(parts) == 2 and len(wandb_run_ids(folder)) == 1
    line = f"upload it later with: wandb sync {parts[0]} {parts[1]}"
    assert line in (folder / "train.log").read_text()
    # Once `wandb sync` has uploaded them (its marker beside each part's .wandb file), a resume
    # tries the server (online); the part it logs offline is the only one left to upload.
    for run in (folder / "wandb").glob("offline-run-*/run-*.wandb"):
        run.with_suffix(".wandb.synced").touch()
    again = run_cli(f"resume={folder}", "trainer.max_epochs=5", wandb_online=True)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "W&B could not start online (127.0.0.1:9 not reachable" in said
    assert "earlier part is offline" not in said
    (last,) = set((folder / "wandb").glob("offline-run-*")) - set(parts)
    assert (folder / "train.log").read_text().endswith(f"wandb sync {last}\n")


def test_a_finished_run_started_again_in_its_folder_trains_nothing(tmp_path, caplog):
    """A requeued batch script runs its commands again, each in the folder it had: a run that
    had completed, stopped early by early stopping, was continued (another epoch, its summary
    and best checkpoint rewritten). It now trains nothing and exits 0, and says that more
    patience trains it further; continued with more patience, it waits that long (Lightning
    restored the checkpoint's patience: one more epoch, whatever was asked), then it is finished
    again."""
    args = [
        "callbacks=early_stopping",
        "callbacks.early_stopping.patience=0",
        "objective=accuracy",  # (digits' own, val/loss, can fall by more than 1 in an epoch)
        "callbacks.early_stopping.min_delta=1.0",  # no epoch improves val/acc by 1: stops at 2
        "trainer.max_epochs=10",
        "model.net.width=4",
        "test=false",
        *QUIET,
    ]
    first = make_cfg(tmp_path, args)
    with caplog.at_level("WARNING", logger="litlab"):
        objective = train_task(first)
    folder = Path(first.paths.output_dir)
    last, summary = folder / "checkpoints" / "last.ckpt", folder / "summary.json"
    assert load_checkpoint(last)["epoch"] == 1  # stopped early, before max_epochs
    # said and recorded (walkthrough 160: it read as a normal finish)
    why = "Monitored metric val/acc did not improve in the last 1 records"
    assert f"early stopping ended the fit after epoch 2 of trainer.max_epochs=10 ({why}" in (
        caplog.text
    )
    stopped = json.loads(summary.read_text())["early_stopped"]
    assert stopped["epoch"] == 2 and stopped["max_epochs"] == 10 and why in stopped["why"]
    written, summarized = last.read_bytes(), summary.read_bytes()
    with caplog.at_level("WARNING", logger="litlab"):
        again = train_task(make_cfg(tmp_path, args))  # the same command, the same folder
    assert again == objective and "holds a run that completed: nothing to train" in caplog.text
    assert "(early stopping ended it: a resume waits its patience again)" in caplog.text
    assert last.read_bytes() == written and summary.read_bytes() == summarized
    # resumed, it waits its patience again (walkthrough 160: the restored count stopped it
    # after one more epoch, and the old stop was said as this fit's: review 161); patience 3:
    # epochs 2, 3 and 4 without improvement, then it stops
    further = [*args, f"ckpt_path={last}", "callbacks.early_stopping.patience=3"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(make_cfg(tmp_path, further))
    resumed = json.loads(summary.read_text())
    assert resumed["resumed_from"] == str(last) and resumed["early_stopped"]["epoch"] == 5
    assert load_checkpoint(last)["epoch"] == 4 and (folder / ".completed").is_file()
    assert (
        "after epoch 5 of trainer.max_epochs=10 (Monitored metric val/acc did not improve in "
        "the last 3 records" in caplog.text
    )
    # and to its end: max_epochs reached is not early stopping's doing
    train_task(make_cfg(tmp_path, [*args, f"ckpt_path={last}", "trainer.max_epochs=6"]))
    assert json.loads(summary.read_text()).get("early_stopped") is None


def test_a_finished_run_without_a_resumable_checkpoint_is_not_trained_again(tmp_path):
    """Finished with best.ckpt alone (no last or step checkpoint to continue from), the same
    command again in its folder trained a new run from scratch over it: now nothing."""
    args = ["trainer.max_epochs=1", "model.net.width=4", "test=false", *QUIET]
    args += ["callbacks.last_checkpoint=null", "callbacks.step_checkpoint=null"]
    first = make_cfg(tmp_path, args)
    train_task(first)
    folder = Path(first.paths.output_dir)
    best, summary = folder / "checkpoints" / "best.ckpt", folder / "summary.json"
    written, summarized = best.read_bytes(), summary.read_bytes()
    train_task(make_cfg(tmp_path, args))
    assert best.read_bytes() == written and summary.read_bytes() == summarized


def test_a_checkpoints_state_moves_with_its_folder_and_only_then(tmp_path):
    """relocated: the paths move where the file named as best is in the new folder (a folder
    moved or copied); a new run started from another run's checkpoint keeps Lightning's way (no
    best carried into a folder that holds none of that run's files)."""
    from litlab.callbacks.checkpoint import relocated

    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    score = torch.tensor(0.9)
    state = {
        "dirpath": str(old),
        "best_model_path": str(old / "best.ckpt"),
        "best_model_score": score,
        "kth_best_model_path": str(old / "best.ckpt"),
        "last_model_path": "",
        "best_k_models": {str(old / "best.ckpt"): score},
    }
    assert relocated(state, old, new) == state  # nothing of the run's in the new folder
    new.mkdir(parents=True)
    (new / "best.ckpt").touch()
    moved = relocated(state, old, new)
    assert moved["dirpath"] == str(new) and moved["best_model_score"] is score
    assert moved["best_model_path"] == moved["kth_best_model_path"] == str(new / "best.ckpt")
    assert moved["best_k_models"] == {str(new / "best.ckpt"): score}
    assert moved["last_model_path"] == ""


@pytest.mark.slow
def test_a_stop_waits_for_the_step_of_accumulated_gradients(tmp_path):
    """accumulate_grad_batches=2, SIGTERM in batch 2 (whose gradient waits for batch 3's step):
    the accumulated gradient is in no checkpoint, so a stop there lost it and the resumed run
    ended elsewhere (reviewer: 4 of 21 tensors equal); the stop now comes after batch 3."""
    args = [*CLF, "trainer.max_epochs=2", "trainer.accumulate_grad_batches=2"]
    straight, folder = straight_and_stopped_at(tmp_path, 2, *args)
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 2
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = final_state(straight), final_state(folder)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_a_stop_after_a_validation_inside_the_epoch_resumes_at_the_same_logged_steps(tmp_path):
    """val_check_interval=0.5, SIGTERM in the batch a validation follows: Lightning skips that
    validation on resuming (it ran) and counts the batch for the loggers then, so the stop's
    checkpoint holds the count from before it; the resumed run logged every row one step late."""
    args = [*CLF, "trainer.max_epochs=2", "+trainer.val_check_interval=0.5"]
    args += ["trainer.log_every_n_steps=1"]
    straight, folder = straight_and_stopped_at(tmp_path, 4, *args)
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def rows(folder: Path) -> list[tuple[str, str, str]]:
        with open(folder / "csv" / "metrics.csv") as f:
            return [
                (r["epoch"], r["step"], r.get("val/acc") or r["train/loss_step"])
                for r in csv.DictReader(f)
                if r.get("val/acc") or r.get("train/loss_step")
            ]

    a, b = rows(straight), rows(folder)
    assert sum(1 for row in a if row[0] == "0") > 4 and a == b


@pytest.mark.slow
def test_a_signal_at_the_last_training_batch_ends_the_fit_then_stops_the_run(tmp_path):
    """SIGTERM during the fit's last batch (here max_steps'): a stop there left a run that was
    'interrupted' with nothing left to train, which resume= refuses; the fit ends as planned,
    and the run stops once it has recorded it, before its test (which then went on: the
    signal was swallowed), and resume= tests it, training nothing."""
    args = [*CLF, "trainer.max_steps=5", "+callbacks.stop._target_=helpers.SignalAt"]
    result = run_cli(*args, "+callbacks.stop.batch=4", f"paths.log_dir={tmp_path}")
    assert result.returncode == 143, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "a signal came at the last training batch: the fit ends as planned" in said
    assert "SIGTERM came as the fit ended (its last batch or validation)" in said
    folder = run_folder(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "test it with" in summary["error"]
    assert (folder / ".trained").is_file() and "test/acc" not in summary["metrics"]
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 5
    resumed = run_cli(f"resume={folder}", "callbacks.stop.batch=-1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["global_step"] == 5


def test_a_checkpoint_s_processes_are_counted_without_its_random_states():
    """callbacks.rng_state=null leaves no per-process states in a checkpoint: its processes
    are then its config's trainer.devices x num_nodes (a launcher's layout is written there),
    unknown for devices=auto (review 155: such a run was continued on 1 process unchecked)."""
    from litlab.resumable import _processes_of

    states = {"callbacks": {"RNGState": {"ranks": [{}, {}, {}]}}}
    assert _processes_of(states, {"devices": 1, "num_nodes": 1}) == 3
    assert _processes_of({"callbacks": {}}, {"devices": 2, "num_nodes": 2}) == 4
    assert _processes_of({}, {"devices": 2}) == 2
    assert _processes_of({}, {"devices": "auto", "num_nodes": 1}) is None
    assert _processes_of({}, {"devices": -1, "num_nodes": 1}) is None


@pytest.mark.slow
@pytest.mark.dist
def test_a_stopped_fit_in_spawned_processes_records_what_it_trained(tmp_path):
    """SIGTERM to a ddp_spawn job (every process, as SLURM or docker stop signal it): the
    spawned ranks stop after the same batch and write last.ckpt, but the main process, which
    writes summary.json, got nothing back from them: its summary had no metrics, epochs,
    global_step or best checkpoint (best.ckpt was there). Rank 0 now records them as it
    stops, as at a normal end."""
    args = ["data=synthetic", "data.image_shape=[1,16,16]", "data.source.train_size=512"]
    args += ["data.batch_size=32", "model.net.width=8", "model.scheduler=null", "test=false"]
    args += ["logger=csv", *QUIET, "trainer.accelerator=cpu", "trainer.devices=2"]
    args += ["trainer.strategy=ddp_spawn", "trainer.max_epochs=3"]
    args += ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=11"]
    folder = tmp_path / "run"
    stopped = run_cli(
        *args, "+callbacks.stop.group=true", f"hydra.run.dir={folder}", new_session=True
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    saved = load_checkpoint(folder / "checkpoints" / "last.ckpt")
    assert 11 <= summary["global_step"] == saved["global_step"] < 16  # in the second epoch
    assert summary["epochs"] == {"trained": 1, "validated": 1}
    assert summary["best_checkpoint"] == str(folder / "checkpoints" / "best.ckpt")
    (score,) = [
        state["best_model_score"]
        for name, state in saved["callbacks"].items()
        if name.startswith("ModelCheckpoint") and state["best_model_path"].endswith("best.ckpt")
    ]
    assert summary["best_score"] == pytest.approx(float(score))
    assert {"val/loss", "val/acc", "train/loss_step"} <= summary["metrics"].keys()
    assert summary["metrics"]["val/acc_best"] == pytest.approx(float(score))


def test_a_resume_at_another_precision_says_so(tmp_path):
    """resume= with another trainer.precision (or auto on another kind of machine) continued
    at it without a word, summary.json then naming the new precision alone (walkthrough 178);
    the switch is said, with the step it happens at and how to keep the run's."""
    args = [*CLF[: -len(QUIET)], *QUIET, "trainer.max_epochs=1", "test=false"]
    folder = tmp_path / "run"
    first = run_cli(*args, f"hydra.run.dir={folder}")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(f"resume={folder}", "trainer.max_epochs=2", "trainer.precision=64-true")
    assert again.returncode == 0, again.stderr[-3000:]
    said = (
        "the run trained at trainer.precision=32-true up to global step 10 and continues at "
        "64-true: its later steps round otherwise (trainer.precision=32-true keeps it)"
    )
    assert said in (folder / "train.log").read_text()
    same = run_cli(f"resume={folder}", "trainer.max_epochs=3")  # (its own: 64-true now)
    assert same.returncode == 0, same.stderr[-3000:]
    assert (folder / "train.log").read_text().count("continues at") == 1
