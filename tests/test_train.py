"""End-to-end training runs: run folder, metrics, checkpoints, loggers, eval, resume."""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from omegaconf import open_dict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import QUIET as FAST
from conftest import (
    REPO,
    TINY_GAN_DATA,
    bare_trainer,
    make_cfg,
    needs_fashion,
    refused,
    run_cli,
    summary_of,
    write_idx_dataset,
)
from helpers import resumed_adam
from litlab.config import build
from litlab.data import FashionMNIST
from litlab.data.folder_cache import cached_folder
from litlab.data.folder_index import scan
from litlab.evaluate import eval_task
from litlab.models import ImageClassifier
from litlab.train import train_task
from wandb_records import offline_run


def metrics_csv(run_dir: Path) -> list[dict]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_training_run_leaves_a_self_describing_folder(tmp_path):
    cfg = make_cfg(tmp_path, ["logger=csv", "trainer.max_epochs=3", *FAST])
    objective = train_task(cfg)
    run_dir = Path(cfg.paths.output_dir)
    summary = summary_of(cfg)
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["metrics"]["test/acc"] > 0.85
    assert objective == summary["objective"]["value"] == summary["best_score"]
    # data=digits chooses val/loss (its 144 validation images saturate val/acc)
    assert summary["objective"] == {"metric": "val/loss", "mode": "min", "value": objective}
    assert Path(summary["best_checkpoint"]) == run_dir / "checkpoints" / "best.ckpt"
    # the report's epoch axis: an epoch's logging steps (its validation row is at its last)
    first_val = next(r for r in metrics_csv(run_dir) if r.get("val/loss") and r["epoch"] == "0")
    assert summary["steps_per_epoch"] == int(first_val["step"]) + 1
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert set(summary["durations_s"]) == {"fit", "test", "total"}
    assert summary["versions"]["torch"] == torch.__version__ and summary["config_digest"]
    # in a git checkout: its commit, and whether tracked files differ from it
    assert isinstance(summary["git_dirty"], bool) == (summary["git_commit"] is not None)
    rows = metrics_csv(run_dir)
    for name in (
        "train/loss_step",
        "val/acc",
        "val/acc_best",
        "val/acc_top5",
        "test/acc",
        "train/acc",
    ):
        assert any(row.get(name) for row in rows), name
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert (
        hparams["model"]["net"]["_target_"] == "litlab.nets.SmallCNN"
    )  # resolved config as hparams


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=cnn"],
        ["model=resnet", "model.net.width=8", "model.net.depth=[1,1]"],
        ["model=torchvision", "model.net.name=resnet18", "data.eval_batch_size=64"],
    ],
    ids=["cnn", "resnet", "torchvision"],
)
def test_every_model_trains_and_tests(tmp_path, overrides):
    cfg = make_cfg(
        tmp_path,
        [
            "data=synthetic",
            "data.source.train_size=128",
            "data.source.test_size=64",
            "data.batch_size=32",
            "trainer.max_epochs=1",
            "logger=csv",
            *overrides,
            *FAST,
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed"
    assert 0.0 <= summary["metrics"]["test/acc"] <= 1.0 and summary["metrics"]["train/loss"] > 0


def test_wandb_offline_run_holds_the_config(tmp_path):
    cfg = make_cfg(tmp_path, ["logger=wandb", "trainer.max_epochs=1", "tags=[smoke]", *FAST])
    train_task(cfg)
    runs = list((Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    record = offline_run(runs[0])
    assert record["project"] == "litlab" and record["job_type"] == "train"
    assert record["tags"][0] == "smoke" and "trainer.max_epochs=1" in record["tags"]
    # The resolved config, flat so that every key is a dashboard column.
    assert record["config"]["model.net._target_"] == "litlab.nets.SmallCNN"
    assert record["config"]["data.batch_size"] == 64
    assert not any(key.startswith("hydra") for key in record["config"])
    logged = {key for row in record["history"] for key in row}
    assert {"train/loss_step", "val/acc", "test/acc", "trainer/global_step"} <= logged
    assert record["summary"]["test/acc"] > 0.5
    assert (Path(cfg.paths.output_dir) / "csv" / "metrics.csv").is_file()  # CSV always
    assert record["exit_code"] == 0


def test_a_failed_run_ends_its_wandb_run_as_failed(tmp_path, capsys):
    """A run stopped by an error (here the divergence guard) ends its W&B run with exit code 1,
    which the dashboard shows as failed (before: 0, "finished", beside summary.json's failed)."""
    cfg = make_cfg(
        tmp_path,
        [
            "logger=wandb",
            "trainer.max_epochs=1",
            "callbacks.divergence_guard.check_every_n_steps=1",
            "+callbacks.nan._target_=helpers.InjectNaN",
            "+callbacks.nan.at_batch=3",
            "+callbacks.nan.module=net",
            *FAST,
        ],
    )
    refused(capsys, train_task, cfg, "training diverged")
    (run,) = (Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*")
    assert offline_run(run)["exit_code"] == 1


def test_a_fit_that_max_steps_ends_inside_an_epoch_validates_its_last_weights(tmp_path):
    """trainer.max_steps=25 on digits' 20 batches an epoch: Lightning ended the fit at step 25
    unvalidated, so val/*, best.ckpt and the test were of step 20's weights, before the
    one-cycle schedule's last steps (review). Now the cut validates, as an epoch's end does."""
    cfg = make_cfg(tmp_path, ["trainer.max_epochs=20", "trainer.max_steps=25", "logger=csv", *FAST])
    train_task(cfg)
    folder = Path(cfg.paths.output_dir)
    with open(folder / "csv" / "metrics.csv") as f:
        validated = [row for row in csv.DictReader(f) if row.get("val/loss")]
    assert [row["step"] for row in validated] == ["19", "24"]  # (steps counted from 0)
    summary = summary_of(cfg)
    assert summary["metrics"]["val/loss"] == pytest.approx(float(validated[-1]["val/loss"]))
    tested = torch.load(summary["tested_checkpoint"], weights_only=False)
    assert tested["global_step"] == 25 and summary["epochs"] == {"trained": 2, "validated": 2}
    assert summary["global_step"] == 25  # (epoch 2 was cut: "trained" counts it)


def test_a_fit_that_max_time_ends_before_its_schedule_says_so(tmp_path, caplog, capsys):
    """trainer.max_time stops a run whose LR schedule is sized by its epochs: the weights
    tested trained at a learning rate not annealed (review); the log says so, and how to size
    the run instead. (200 epochs of 20 steps: not in one second on any machine.)"""
    overrides = ["+trainer.max_time=00:00:00:01", "trainer.max_epochs=200", "test=false", *FAST]
    cfg = make_cfg(tmp_path, overrides)
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert "trainer.max_time=00:00:00:01 ended the fit before its LR schedule's end" in caplog.text
    assert "OneCycleLR at step" in caplog.text and "of 4000" in caplog.text
    # resumed with the time it has spent (restored with the checkpoint): refused, the run as it
    # was (it stopped at once, tested again and left its summary without epochs; walkthrough)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    again = make_cfg(tmp_path / "again", [*overrides, f"ckpt_path={last}"])
    line = refused(capsys, train_task, again, "allows 1 s (the time is restored with the")
    assert "set a longer trainer.max_time to train further" in line


def test_an_accuracy_objective_on_few_validation_images_is_said_to_be_coarse(tmp_path, caplog):
    """digits' 144 validation images: val/acc at 1.0 from epoch 7 of 20, best.ckpt the first
    epoch there; data=digits chooses val/loss, and an accuracy asked for is warned of (a
    user's small image folder likewise). Under trainer.limit_val_batches, the images of those
    batches are counted (it counted the whole split)."""
    coarse = "the objective val/acc on {} validation images moves in steps of {}%"
    cases = [
        (["objective=accuracy"], coarse.format(144, 0.69)),
        (["objective=accuracy", "+trainer.limit_val_batches=1", "data.eval_batch_size=32"],
         coarse.format(32, 3.1)),
        ([], None),
    ]  # fmt: skip
    for i, (overrides, said) in enumerate(cases):
        caplog.clear()
        more = ["trainer.max_epochs=1", "+trainer.limit_train_batches=2", "test=false", *FAST]
        cfg = make_cfg(tmp_path / str(i), [*more, *overrides])
        with caplog.at_level("WARNING", logger="litlab"):
            train_task(cfg)
        assert said is None or said in caplog.text
        assert ("(or raise data.val_fraction)" in caplog.text) == (said is not None)


def test_tensorboard_and_no_logger(tmp_path):
    cfg = make_cfg(tmp_path / "tb", ["logger=tensorboard", "trainer.max_epochs=1", *FAST])
    train_task(cfg)
    assert list((Path(cfg.paths.output_dir) / "tensorboard").rglob("events.out.tfevents.*"))
    cfg = make_cfg(tmp_path / "none", ["logger=none", "trainer.max_epochs=1", *FAST])
    train_task(cfg)
    assert not (Path(cfg.paths.output_dir) / "csv").exists()
    assert summary_of(cfg)["metrics"]["test/acc"] > 0


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_eval_reproduces_the_test_figures_of_the_best_checkpoint(tmp_path, precision, caplog):
    """eval.py tests in the precision the run trained with (trainer.precision=trained). Both
    say their figures in their log (train.log, eval.log held none of them)."""
    cfg = make_cfg(
        tmp_path / "train",
        ["logger=csv", "trainer.max_epochs=2", f"trainer.precision={precision}", *FAST],
    )
    with caplog.at_level("INFO", logger="litlab"):
        train_task(cfg)
    trained = summary_of(cfg)
    said = f"results: val/loss {trained['objective']['value']:.4g} (the objective), test/acc "
    assert said + f"{trained['metrics']['test/acc']:.4g}, " in caplog.text
    step = trained["tested_checkpoint_step"]  # which weights: best.ckpt's name is reused
    tested = f"; tested {trained['best_checkpoint']} (step {step}); all in {cfg.paths.output_dir}"
    assert tested in caplog.text
    eval_cfg = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={trained['best_checkpoint']}", "extras.print_config=false"],
        config_name="eval",
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="litlab"):
        value = eval_task(eval_cfg)
    said = f"test/loss {value:.4g} (the objective); tested {trained['best_checkpoint']} (step "
    assert f"{said}{step})" in caplog.text
    evaluated = summary_of(eval_cfg)
    assert evaluated["status"] == "completed" and evaluated["precision"]["chosen"] == precision
    # eval's default takes the run's: said so (it read "as configured": walkthrough 178)
    assert evaluated["precision"]["why"] == "the run's (trained)"
    assert f"trainer.precision=trained: {precision}, the run's" in caplog.text
    assert value == trained["metrics"]["test/loss"]  # the objective's (val/loss) counterpart
    assert evaluated["metrics"]["test/acc"] == trained["metrics"]["test/acc"]
    assert evaluated["trained_config_digest"] == trained["config_digest"]


def test_the_test_measures_the_best_checkpoints_weights_not_the_last(tmp_path):
    """The net's first layer zeroed as the second (last) epoch starts, so that the first epoch
    is the best: the run's test figures are that checkpoint's weights', not the last's."""
    worse = ["+callbacks.worse._target_=helpers.ZeroAtStart", "+callbacks.worse.module=net"]
    worse += ["+callbacks.worse.epoch=1"]
    cfg = make_cfg(tmp_path, ["logger=csv", "trainer.max_epochs=2", *worse, *FAST])
    train_task(cfg)
    trained = summary_of(cfg)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    best = torch.load(trained["best_checkpoint"], weights_only=True)
    assert best["epoch"] == 0 and torch.load(last, weights_only=True)["epoch"] == 1

    def tested(checkpoint: dict) -> float:
        model = build(cfg.model, "model")
        model.load_state_dict(checkpoint["state_dict"])
        (figures,) = bare_trainer(accelerator="cpu").test(model, build(cfg.data, "data"))
        return figures["test/acc"]

    assert trained["metrics"]["test/acc"] == pytest.approx(tested(best), abs=1e-6)
    assert abs(tested(torch.load(last, weights_only=True)) - tested(best)) > 0.01


def test_one_command_run_in_two_folders_has_one_config_digest(tmp_path):
    """summary.json's config_digest says what a run computes, not where it writes: the
    checkpoints' dirpath and trainer.default_root_dir, both under the run folder, made every
    run's digest its own. Another learning rate is another digest."""
    args = ["model.net.width=4", "trainer.max_epochs=1", "trainer.max_steps=2", "test=false"]
    args += ["logger=csv", *FAST]

    def digest(folder: str, *more: str) -> str:
        cfg = make_cfg(tmp_path / folder, [*args, *more])
        train_task(cfg)
        return summary_of(cfg)["config_digest"]

    first = digest("a")
    assert first is not None and digest("b") == first
    assert digest("c", "model.optimizer.lr=0.5") != first
    # nor whom it tells, nor where it starts from: a resumed part (its W&B id and ckpt_path added)
    assert digest("d", "logger=wandb", "+logger.wandb.id=abc123") == first


def test_eval_builds_only_the_callbacks_it_uses(tmp_path):
    """A training run's own callback (a class of the user's, not importable where eval runs)
    is not built by eval.py: only those used in evaluation (FID, sample grids)."""
    cfg = make_cfg(tmp_path / "train", ["logger=csv", "trainer.max_epochs=1", "test=false", *FAST])
    train_task(cfg)
    path = Path(summary_of(cfg)["best_checkpoint"])
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["hyper_parameters"]["callbacks"]["mine"] = {"_target_": "my_lab_only.Callback"}
    torch.save(checkpoint, path)
    eval_cfg = make_cfg(
        tmp_path / "eval", [f"ckpt_path={path}", "extras.print_config=false"], config_name="eval"
    )
    assert eval_task(eval_cfg) > 0.5


def test_eval_on_other_data_normalizes_it_as_the_model_was_trained(tmp_path):
    """digits (mean 0.306, std 0.325) -> MNIST files (its own config says 0.1307, 0.3081)."""
    cfg = make_cfg(tmp_path / "train", ["logger=csv", "trainer.max_epochs=1", "test=false", *FAST])
    train_task(cfg)
    write_idx_dataset(tmp_path / "mnist", n_train=64, n_test=256)
    best = summary_of(cfg)["best_checkpoint"]

    def evaluate(folder: str, *overrides: str) -> float:
        eval_cfg = make_cfg(
            tmp_path / folder,
            [f"ckpt_path={best}", "data=mnist", "data.source.download=false", *overrides],
            config_name="eval",
        )
        with open_dict(eval_cfg):
            eval_cfg.data.source.data_dir = str(tmp_path / "mnist")
        return eval_task(eval_cfg)

    as_trained = evaluate("explicit", "data.mean=[0.306]", "data.std=[0.325]")
    assert evaluate("chosen") == as_trained
    assert evaluate("chosen-again") == as_trained  # and eval is seeded


def test_last_checkpoint_every_epoch_when_validation_is_less_frequent(tmp_path):
    """README: last.ckpt every epoch; Lightning saves after validation by default instead."""
    cfg = make_cfg(
        tmp_path,
        [
            "logger=csv",
            "trainer.max_epochs=2",
            "trainer.check_val_every_n_epoch=3",  # no validation in this run at all
            "test=false",
            *FAST,
        ],
    )
    train_task(cfg)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 1  # written at the second epoch's end


def test_the_summary_and_report_say_which_epoch_the_last_values_are_of(tmp_path):
    """check_val_every_n_epoch=2 and a resume to 3 epochs: the summary's val/* values are the
    second epoch's and its train/* the third's (the report's "(last epoch)" read the same for
    both); the resumed part, which validated nothing, keeps the first part's val/* values (the
    report's columns were empty), and train/* measured half of each epoch's batches (the
    report named the whole split)."""
    from litlab.report import main as report

    settings = ["logger=csv", "trainer.check_val_every_n_epoch=2", "test=false", *FAST]
    settings.append("+trainer.limit_train_batches=0.5")
    first = make_cfg(tmp_path, ["trainer.max_epochs=2", *settings])
    train_task(first)
    validated = summary_of(first)["metrics"]
    assert summary_of(first)["epochs"] == {"trained": 2, "validated": 2}
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    resumed = make_cfg(tmp_path, ["trainer.max_epochs=3", f"ckpt_path={last}", *settings])
    train_task(resumed)
    summary = summary_of(resumed)
    assert summary["epochs"] == {"trained": 3, "validated": 2}
    assert summary["training_limit"] == 0.5
    assert {k: v for k, v in summary["metrics"].items() if k.startswith("val/")} == {
        k: v for k, v in validated.items() if k.startswith("val/")
    }
    report([str(resumed.paths.output_dir)])
    (header, _, row) = [
        line
        for line in (Path(resumed.paths.output_dir) / "report.md").read_text().splitlines()
        if line.startswith("|")
    ]
    cells = dict(zip(header.split(" | "), row.split(" | "), strict=True))
    assert cells["val/acc [digits, val=144] (last validation)"].endswith(" [epoch 2 of 3]")
    assert "train/loss [digits, train=1294, limit_train_batches=0.5] (last epoch)" in cells


def test_without_a_best_checkpoint_the_last_is_tested_and_named_so(tmp_path):
    """callbacks.model_checkpoint=null: no best checkpoint (not last.ckpt under that name); the
    test measures last.ckpt, and the objective is the final value, of those weights."""
    cfg = make_cfg(
        tmp_path,
        ["logger=csv", "trainer.max_epochs=2", "callbacks.model_checkpoint=null", *FAST],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    last = str(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    assert summary["best_checkpoint"] is None and "best_score" not in summary
    assert summary["tested_checkpoint"] == summary["last_checkpoint"] == last
    assert summary["objective"]["value"] == summary["metrics"]["val/loss"]


def test_resume_from_a_checkpoint_continues_training(tmp_path):
    # No LR schedule: a OneCycle schedule restored from the checkpoint ends where the first run ended.
    first = make_cfg(
        tmp_path / "a",
        ["logger=csv", "trainer.max_epochs=1", "test=false", "model.scheduler=null", *FAST],
    )
    train_task(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    second = make_cfg(
        tmp_path / "b",
        ["logger=csv", "trainer.max_epochs=2", f"ckpt_path={last}", "model.scheduler=null", *FAST],
    )
    train_task(second)
    rows = metrics_csv(Path(second.paths.output_dir))
    epochs = {int(row["epoch"]) for row in rows if row.get("epoch") and row.get("val/acc")}
    assert epochs == {1}  # only the second epoch ran here
    ckpt = torch.load(
        Path(second.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True
    )
    assert (
        ckpt["epoch"] == 1
        and ckpt["global_step"] == 2 * torch.load(last, weights_only=True)["global_step"]
    )


def test_plateau_schedule_resumes_with_every_epochs_step(tmp_path):
    """ReduceLROnPlateau (patience 0, no improvement counts): a halving per epoch after the
    first. The
    epoch's last.ckpt holds that epoch's step, and a run resumed from it ends with the
    learning rate and weights of an uninterrupted run (Lightning's own stepping lost one a
    resume)."""
    plateau = [
        "model/scheduler=plateau",
        "model.scheduler.patience=0",
        "model.scheduler.factor=0.5",
    ]
    # accuracy's direction (max): the first epoch sets the best, no later one beats it by 10x
    plateau += ["+model.scheduler.threshold=10", "objective=accuracy", "test=false"]
    plateau += ["logger=csv", *FAST]
    plateau += ["model.net.width=8", "+trainer.limit_train_batches=4"]

    def run(name: str, *more: str) -> Path:
        cfg = make_cfg(tmp_path / name, [*plateau, *more])
        train_task(cfg)
        return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"

    lr = make_cfg(tmp_path / "cfg", plateau).model.optimizer.lr
    first = run("first", "trainer.max_epochs=2")  # the first epoch sets the best: no cut
    (schedule,) = torch.load(first, weights_only=True)["lr_schedulers"]
    assert schedule["last_epoch"] == 2 and schedule["_last_lr"] == pytest.approx([lr / 2])
    straight = torch.load(run("straight", "trainer.max_epochs=3"), weights_only=True)
    resumed = torch.load(run("resumed", "trainer.max_epochs=3", f"ckpt_path={first}"))
    assert straight["lr_schedulers"] == resumed["lr_schedulers"]
    assert straight["lr_schedulers"][0]["_last_lr"] == pytest.approx([lr / 4])
    for name, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][name]), name


def test_a_plateau_schedule_waits_for_validations_run_every_n_steps(tmp_path, capsys):
    """Validation every 30 steps on digits (20 batches an epoch): the first epoch ends before
    any validation (the run stopped, saying val/loss was never logged). The schedule steps at the
    first epoch end after each validation (epochs 1, 2 and 4 of 5), and a run resumed from the
    end of epoch 2 steps as the uninterrupted one (its mark is in the checkpoint, the last
    validation's values are not). Without validation at all, the one line still."""
    every_30 = ["trainer.check_val_every_n_epoch=null", "+trainer.val_check_interval=30"]
    small = ["model/scheduler=plateau", *every_30, "model.net.width=8", "test=false"]
    small += ["logger=csv", *FAST]

    def schedule(name: str, *more: str) -> dict:
        cfg = make_cfg(tmp_path / name, [*small, *more])
        train_task(cfg)
        assert summary_of(cfg)["status"] == "completed"
        last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
        return torch.load(last, weights_only=True)["lr_schedulers"][0]

    straight = schedule("straight", "trainer.max_epochs=5")
    assert straight["last_epoch"] == 3
    schedule("first", "trainer.max_epochs=3")
    first = tmp_path / "first"
    (last,) = first.rglob("last.ckpt")
    assert schedule("resumed", "trainer.max_epochs=5", f"ckpt_path={last}") == straight
    never = make_cfg(tmp_path / "never", [*small, "+trainer.limit_val_batches=0"])
    refused(
        capsys, train_task, never, "ReduceLROnPlateau watches val/loss, which this run does not"
    )


def test_train_false_with_a_checkpoint_tests_that_checkpoint(tmp_path, capsys, caplog):
    """`train=false ckpt_path=<ckpt>` measures the checkpoint (it tested the freshly built,
    untrained model, with the checkpoint recorded as resumed from)."""
    small = ["logger=csv", "trainer.max_epochs=1", "model.net.width=8", *FAST]
    trained = make_cfg(tmp_path / "a", small)
    train_task(trained)
    summary = summary_of(trained)
    best = summary["best_checkpoint"]
    assert summary["tested_checkpoint"] == best
    # which weights: a run extended later writes others under the same name (best.ckpt)
    step = torch.load(best, weights_only=True)["global_step"]
    assert summary["tested_checkpoint_step"] == step == summary["global_step"] > 0
    tested = make_cfg(tmp_path / "b", [*small, "train=false", f"ckpt_path={best}"])
    train_task(tested)
    again = summary_of(tested)
    assert again["tested_checkpoint"] == best and again["tested_checkpoint_step"] == step
    assert again["metrics"]["test/acc"] == pytest.approx(summary["metrics"]["test/acc"], abs=1e-7)
    # its test split moved: images it trained on could be tested (eval.py keeps the run's)
    moved = ["train=false", f"ckpt_path={best}", "data.source.test_fraction=0.4"]
    needle = "set up otherwise than its run's (data.source.test_fraction: 0.2 -> 0.4)"
    refused(capsys, train_task, make_cfg(tmp_path / "c", [*small, *moved]), needle)
    # another way of measuring (flip TTA, another crop): allowed, and said (it was silent)
    for change, said in [
        ("+model.tta_flip=true", "model.tta_flip: False -> True"),
        ("data.eval_crop=0.875", "data.eval_crop: 1.0 -> 0.875"),
    ]:
        with caplog.at_level("WARNING", logger="litlab"):
            train_task(
                make_cfg(tmp_path / "d", [*small, "train=false", f"ckpt_path={best}", change])
            )
        assert f"otherwise than its run measured val/* ({said})" in caplog.text


def test_training_accuracy_counts_as_torchmetrics_does():
    from torchmetrics.classification import MulticlassAccuracy

    from litlab.models.classifier import place_hits

    logits, labels = torch.randn(257, 10), torch.randint(0, 10, (257,))
    places = place_hits(logits, labels, 5)
    assert places.shape == (5,)
    top1, top5 = places[0] / len(labels), places.sum() / len(labels)
    assert float(top1) == pytest.approx(
        float(MulticlassAccuracy(10, average="micro")(logits, labels))
    )
    top5_metric = MulticlassAccuracy(10, top_k=5, average="micro")
    assert float(top5) == pytest.approx(float(top5_metric(logits, labels)))
    assert place_hits(logits[:, :3], labels % 3, 0).shape == (1,)  # 5 classes or fewer: top-1


def test_weight_decay_groups_spare_a_vision_transformers_token_and_position_embeddings():
    """torchvision's ViT (model=torchvision net.name=vit_b_16): its class token and position
    embeddings (3-D, learned inputs) go with the norms and biases into no_decay, as torchvision's
    and timm's recipes have them; its weight matrices decay. The rule before (grouping 1, a
    resumed older run's) decayed them by their shape."""
    from torchvision.models import VisionTransformer

    from litlab.models.optim import weight_decay_groups

    vit = VisionTransformer(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16
    )
    names = {id(p): name for name, p in vit.named_parameters()}
    decay, no_decay = weight_decay_groups(vit.named_parameters())
    spared = {names[id(p)] for p in no_decay["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert {"class_token", "encoder.pos_embedding"} <= spared
    assert {"conv_proj.weight", "heads.head.weight"} <= decayed
    assert all(p.ndim >= 2 for p in decay["params"])
    assert len(spared) + len(decayed) == len(names)
    decay, _ = weight_decay_groups(vit.named_parameters(), grouping=1)
    assert {"class_token", "encoder.pos_embedding"} <= {names[id(p)] for p in decay["params"]}


def test_a_vision_transformer_run_from_before_the_embeddings_were_spared_resumes(
    tmp_path, caplog, monkeypatch
):
    """A ViT run with decay_norm_and_bias=false records its grouping in its checkpoints; one
    whose checkpoint has no record (written before the embeddings were spared: its optimizer
    state in the groups of then) resumes with that grouping, said once. Sparing them under an
    unchanged config had failed such a resume in Lightning's optimizer load, a traceback."""
    vit = ["model/net=custom", "model.net._target_=torchvision.models.VisionTransformer"]
    vit += [f"+model.net.{k}={v}" for k, v in (("image_size", 16), ("patch_size", 8))]
    vit += [f"+model.net.{k}={v}" for k, v in (("num_layers", 1), ("num_heads", 2))]
    vit += ["+model.net.hidden_dim=8", "+model.net.mlp_dim=16", "+model.net.num_classes=10"]
    vit += ["data=synthetic", "data.image_shape=[3,16,16]", "model.decay_norm_and_bias=false"]
    vit += ["model.scheduler=null", "logger=csv", "test=false", *FAST]

    def train(name: str, *overrides: str) -> dict:
        cfg = make_cfg(tmp_path / name, [*vit, *overrides])
        train_task(cfg)
        assert summary_of(cfg)["status"] == "completed"
        return torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")

    def no_decay(checkpoint: dict) -> int:  # the parameters in the optimizer's no_decay group
        groups = checkpoint["optimizer_states"][0]["param_groups"]
        return next(len(g["params"]) for g in groups if g["name"] == "no_decay")

    first = train("first", "trainer.max_steps=2")
    state = first["state_dict"]
    by_shape = sum(1 for name, value in state.items() if value.ndim <= 1 and "net." in name)
    assert first["classifier"]["decay_grouping"] == 2 and no_decay(first) == by_shape + 2
    with monkeypatch.context() as patch:  # a run of the rule before, its checkpoint unrecorded
        patch.setattr("litlab.models.classifier.DECAY_GROUPING", 1)
        older = train("older", "trainer.max_steps=2")
    assert no_decay(older) == by_shape
    del older["classifier"]["decay_grouping"]
    torch.save(older, tmp_path / "older.ckpt")
    with caplog.at_level("WARNING", logger="litlab"):
        resumed = train("resumed", f"ckpt_path={tmp_path / 'older.ckpt'}", "trainer.max_steps=4")
    assert "written before litlab spared a vision transformer's embeddings" in caplog.text
    assert resumed["global_step"] == 4 and resumed["classifier"]["decay_grouping"] == 1
    assert no_decay(resumed) == by_shape


@pytest.mark.parametrize("decay_norm_and_bias", [True, False])
def test_weight_decay_spares_norms_and_biases_when_asked(tmp_path, decay_norm_and_bias):
    """model.decay_norm_and_bias=false (folder_resnet50): a step with zero gradients shrinks
    the weight matrices and kernels by the decay and leaves BatchNorm's scales and shifts and
    the biases as they were; the default decays every parameter."""
    from hydra.utils import instantiate

    overrides = ["model=resnet", "model.net.width=4", "model.scheduler=null"]
    # plain SGD (no momentum): a step moves each parameter by -lr x (gradient + decay x value)
    overrides += ["model.optimizer.momentum=0", "model.optimizer.nesterov=false"]
    overrides += ["model.optimizer.weight_decay=0.1"]
    cfg = make_cfg(tmp_path, [*overrides, f"model.decay_norm_and_bias={decay_norm_and_bias}"])
    model = instantiate(cfg.model)
    model.trainer = bare_trainer(max_epochs=1)
    optimizer = model.configure_optimizers()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    in_groups = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())  # each one, once
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    shrink = 1 - cfg.model.optimizer.lr * 0.1
    one_dim = [name for name, p in model.named_parameters() if p.ndim <= 1]
    assert any("bn" in name or "norm" in name for name in one_dim) and any(
        name.endswith("bias") for name in one_dim
    )
    for name, param in model.named_parameters():
        spared = param.ndim <= 1 and not decay_norm_and_bias
        expected = before[name] if spared else before[name] * shrink
        assert torch.allclose(param.detach(), expected, rtol=1e-6), name


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [
        (["model=cnn", "model.scheduler=null"], torch.optim.AdamW),
        (["model=resnet", "model.net.width=4", "model.scheduler=null"], torch.optim.SGD),
        (["model=dcgan", "data=synthetic"], torch.optim.Adam),
    ],
)
def test_optimizers_take_torchs_fused_kernels_unless_the_config_chooses(tmp_path, overrides, kind):
    """Adam, AdamW and SGD are built with torch's fused implementation (fewer kernels a step;
    the same update to rounding); a config that names an implementation gets what it names, and
    an optimizer without a fused one is built as before."""
    from hydra.utils import instantiate

    from litlab.models.optim import make_optimizer

    def optimizers(more: list[str]) -> list[torch.optim.Optimizer]:
        cfg = make_cfg(tmp_path / str(len(list(tmp_path.iterdir()))), [*overrides, *more])
        model = instantiate(cfg.model)
        model.trainer = bare_trainer(max_epochs=1)
        built = model.configure_optimizers()
        built = built[0] if isinstance(built, tuple) else built
        built = built.get("optimizer", built) if isinstance(built, dict) else built
        return built if isinstance(built, list) else [built]

    names = ["g_optimizer", "d_optimizer"] if "model=dcgan" in overrides else ["optimizer"]
    for optimizer in optimizers([]):
        assert type(optimizer) is kind and optimizer.defaults["fused"] is True
    for chosen, fused, foreach in [("fused=false", False, None), ("foreach=true", None, True)]:
        for optimizer in optimizers([f"+model.{name}.{chosen}" for name in names]):
            assert (optimizer.defaults["fused"], optimizer.defaults["foreach"]) == (fused, foreach)
    assert (
        "fused"
        not in make_optimizer(
            functools.partial(torch.optim.RMSprop, lr=0.1), nn.Linear(2, 2).parameters()
        ).defaults
    )  # no fused implementation: built as the config says


CNN = ["model=cnn", "model.scheduler=null"]
CLIPPED_GAN = [*TINY_GAN_DATA[1:], "model=dcgan", "model.gradient_clip_val=1.0"]  # (data=synthetic)


@pytest.mark.parametrize(
    "precision, overrides, clip, fused",
    [
        ("16-mixed", CNN, {"gradient_clip_val": 1.0}, None),
        ("16-mixed", CNN, {}, None),
        ("bf16-mixed", CNN, {"gradient_clip_val": 1.0}, None),
        ("bf16-mixed", CNN, {}, True),
        ("16-mixed", CLIPPED_GAN, {}, None),
        ("bf16-mixed", CLIPPED_GAN, {}, None),
    ],
)
def test_mixed_precision_fuses_only_where_lightning_can_unscale_and_clip(
    tmp_path, precision, overrides, clip, fused
):
    """Lightning's mixed precision refuses to clip gradients (the classifier's
    trainer.gradient_clip_val, the GAN's model.gradient_clip_val) for an optimizer that unscales
    them in its step, which every fused one may: a RuntimeError at the first step, with or
    without a GradScaler. And under 16-mixed's GradScaler it would not unscale them before
    on_before_optimizer_step. So there the optimizers keep torch's default implementation and
    the run trains; bf16-mixed without clipping keeps the fused one. Real autocast and
    Lightning's GradScaler, on the CPU."""
    from hydra.utils import instantiate
    from lightning.pytorch.plugins.precision import MixedPrecision

    # small batches: float16 arithmetic on a CPU is slow, and two steps are all it takes
    cfg = make_cfg(tmp_path, ["data=synthetic", "data.batch_size=16", *overrides])
    trainer = bare_trainer(
        accelerator="cpu",
        plugins=[MixedPrecision(precision, "cpu")],
        max_steps=2,
        limit_val_batches=0,
        **clip,
    )
    trainer.fit(instantiate(cfg.model), instantiate(cfg.data))
    assert trainer.global_step >= 2
    assert (trainer.precision_plugin.scaler is not None) == (precision == "16-mixed")
    assert [o.defaults["fused"] for o in trainer.optimizers] == [fused] * len(trainer.optimizers)


def test_float16_weights_keep_torchs_default_optimizer():
    """precision=16-true: fused Adam keeps its second moment in float16, where small values
    underflow to 0, and divides by eps: steps thousands of times too large but finite, so
    nothing stops the run. Such weights keep torch's default implementation; bfloat16 ones
    (wider exponent) are fused."""
    from litlab.models.optim import make_optimizer

    adam = functools.partial(torch.optim.Adam, lr=1e-3)
    assert not make_optimizer(adam, nn.Linear(4, 4).half().parameters()).defaults["fused"]
    assert make_optimizer(adam, nn.Linear(4, 4).bfloat16().parameters()).defaults["fused"]


@pytest.mark.parametrize("saved, built", [(True, None), (None, True)])
def test_a_resumed_optimizer_steps_as_built_not_as_saved(saved, built):
    """torch restores a parameter group's fused/foreach as saved: a checkpoint saved fused would
    step fused after a resume with +model.optimizer.fused=false (and one saved before litlab
    chose fused would never be). After loading, the optimizer steps as make_optimizer built it,
    its step counts where that implementation keeps them, and the update continues where the
    saved optimizer would have."""
    run = resumed_adam(saved, built)
    assert run["group"]["fused"] is built and run["group"]["fused"] is not saved
    assert all(c.dtype == torch.float32 and float(c) == 5 for c in run["counts"])
    for a, b in zip(run["saved"], run["loaded"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_a_fused_optimizer_makes_the_default_implementations_update(kind):
    """What make_optimizer changes is how the update is computed, not the update: 50 steps on
    the same gradients end on the same weights as torch's default implementation, to float
    rounding."""
    from litlab.models.optim import make_optimizer

    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)) for _ in "ab"]
    nets[1].load_state_dict(nets[0].state_dict())
    start = [p.detach().clone() for p in nets[0].parameters()]
    settings = {"lr": 0.01, "weight_decay": 0.01}
    if kind is torch.optim.SGD:
        settings.update(momentum=0.9, nesterov=True)
    fused = make_optimizer(functools.partial(kind, **settings), nets[0].parameters())
    default = make_optimizer(functools.partial(kind, fused=None, **settings), nets[1].parameters())
    assert fused.defaults["fused"] is True and not default.defaults["fused"]
    for _ in range(50):
        grads = [torch.randn_like(p) for p in nets[0].parameters()]
        for net, optimizer in zip(nets, (fused, default), strict=True):
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    for a, b, before in zip(nets[0].parameters(), nets[1].parameters(), start, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert (a - before).abs().max() > 0.05  # they did move


def test_evaluation_loss_is_the_plain_cross_entropy_over_every_image():
    """val/loss and test/loss are the mean cross-entropy of all the images, batches of any size
    weighted by their images, without the training's label smoothing (so that val/loss of a
    smoothed recipe compares with an unsmoothed one's)."""
    torch.manual_seed(0)
    optimizer = functools.partial(torch.optim.SGD, lr=0.0)
    classifier = ImageClassifier(nn.Linear(4, 10), optimizer, num_classes=10, label_smoothing=0.2)
    data = TensorDataset(torch.randn(71, 4) * 5, torch.randint(0, 10, (71,)))
    with torch.no_grad():
        logits = classifier(data.tensors[0])
    want = nn.functional.cross_entropy(logits, data.tensors[1]).item()
    smoothed = classifier.criterion(logits, data.tensors[1]).item()
    assert abs(smoothed - want) > 0.01  # the two differ here
    trainer = bare_trainer()
    (val,) = trainer.validate(classifier, DataLoader(data, 32), verbose=False)  # 32, 32, 7
    (test,) = trainer.test(classifier, DataLoader(data, 32), verbose=False)
    assert val["val/loss"] == pytest.approx(want, rel=1e-6)
    assert test["test/loss"] == pytest.approx(want, rel=1e-6)


def test_epoch_sums_are_the_batches_sums_and_survive_a_checkpoint():
    """What training steps accumulate: loss x images in float64 (the loss as computed), top-1
    and top-5 hits, and the images; a checkpoint's sums ([loss x n, top-1, top-k, n], also
    those written before the sums were split) come back as they were."""

    def model() -> ImageClassifier:  # learning rate 0: the same weights at every step
        optimizer = functools.partial(torch.optim.SGD, lr=0.0)
        return ImageClassifier(nn.Linear(4, 10), optimizer, num_classes=10)

    class Record(L.Callback):  # runs before the module's on_train_epoch_end resets the sums
        def on_train_epoch_end(self, trainer, pl_module):
            self.sums = pl_module.epoch_sums().clone()

    classifier, record = model(), Record()
    data = TensorDataset(torch.randn(71, 4), torch.randint(0, 10, (71,)))
    bare_trainer(max_epochs=1, callbacks=[record]).fit(classifier, DataLoader(data, 32))
    want = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for images, labels in DataLoader(data, 32):  # 32, 32, 7
            logits = classifier(images)
            loss = classifier.criterion(logits, labels)
            top5 = logits.topk(5, dim=1).indices == labels[:, None]
            n = len(labels)
            want += torch.stack([loss.double() * n, top5[:, 0].sum(), top5.sum(), torch.tensor(n)])
    assert torch.equal(record.sums, want)
    assert torch.equal(classifier.epoch_sums(), torch.zeros(4, dtype=torch.float64))  # reset
    resumed = model()
    resumed.on_load_checkpoint({"classifier": {"train_sums": want.float()}})  # any float dtype
    assert torch.equal(resumed.epoch_sums(), want.float().double())


@pytest.mark.parametrize("precision", ["16-true", "bf16-true"])
def test_evaluation_means_add_in_float32_under_true_half_precisions(precision):
    """Lightning's 16-true and bf16-true convert the module with Module.to(dtype), which
    torchmetrics does not guard against: val/loss's MeanMetric summed in float16 (nan past
    65,504 images: the count overflows) or bfloat16 (off in the third digit). Its sums now stay
    float32 and each image's loss is computed in float32 from the run's logits; the accuracy's
    counts stay integers, and its best is not rounded to the half dtype."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(70_000, 4), torch.randint(0, 10, (70_000,)))
    optimizer = functools.partial(torch.optim.SGD, lr=0.0)
    classifier = ImageClassifier(nn.Linear(4, 10), optimizer, num_classes=10)
    (metrics,) = bare_trainer(precision=precision).validate(classifier, DataLoader(data, 1000))
    half = torch.float16 if precision == "16-true" else torch.bfloat16
    assert classifier.net.weight.dtype == half  # the module ran converted
    with torch.no_grad():  # the same batches: a half matmul's rounding depends on its shape
        losses = [
            F.cross_entropy(classifier.net(x.to(half)).float(), y, reduction="none").double()
            for x, y in DataLoader(data, 1000)
        ]
    assert metrics["val/loss"] == pytest.approx(torch.cat(losses).mean().item(), rel=1e-6)
    assert classifier.val_loss.weight.dtype == torch.float32
    assert classifier.val_metrics["acc"].tp.dtype == torch.long
    assert metrics["val/acc_best"] == metrics["val/acc"]  # not rounded to the half dtype
    # a resumed run's best, restored before the module is converted: kept, not rounded
    from litlab.metrics.aggregation import Max

    best = Max()
    best.update(torch.tensor(0.9650))
    assert best.to(half).max_value.item() == torch.tensor(0.9650).item()


def test_a_nan_loss_on_one_validation_image_makes_val_loss_nan():
    """torchmetrics' mean drops NaN values by default: one image whose logits are NaN left
    val/loss the mean of the others, finite, with a warning. Now it is NaN, as an average is."""
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 10, (64,)))
    data.tensors[0][5] = float("nan")
    optimizer = functools.partial(torch.optim.SGD, lr=0.0)
    classifier = ImageClassifier(nn.Linear(4, 10), optimizer, num_classes=10)
    (metrics,) = bare_trainer().validate(classifier, DataLoader(data, 16))
    assert math.isnan(metrics["val/loss"])


def test_step_curves_every_n_steps_and_the_epochs_means(tmp_path):
    cfg = make_cfg(
        tmp_path, ["trainer.max_epochs=2", "trainer.log_every_n_steps=5", "logger=csv", *FAST]
    )
    train_task(cfg)
    rows = metrics_csv(Path(cfg.paths.output_dir))
    steps = [int(r["step"]) for r in rows if r.get("train/loss_step")]
    assert len(steps) == 2 * (1294 // 64) // 5 and {
        b - a for a, b in itertools.pairwise(steps)
    } == {5}
    epochs = [r for r in rows if r.get("train/acc")]
    assert len(epochs) == 2 and all(float(r["train/loss"]) > 0 for r in epochs)
    assert all(0.0 <= float(r["train/acc"]) <= float(r["train/acc_top5"]) <= 1.0 for r in epochs)


def test_debug_fast_runs_one_batch_of_everything(tmp_path):
    cfg = make_cfg(tmp_path, ["debug=fast", "logger=csv", *FAST])
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_debug_overfit_drives_the_loss_down(tmp_path, loader):
    # Lightning rebuilds a torch DataLoader with a SequentialSampler for overfit_batches
    overrides = ["debug=overfit", "logger=csv", "trainer.max_epochs=15", f"data.loader={loader}"]
    cfg = make_cfg(tmp_path, [*overrides, *FAST])
    train_task(cfg)
    losses = [
        float(r["train/loss"])
        for r in metrics_csv(Path(cfg.paths.output_dir))
        if r.get("train/loss")
    ]
    assert losses[-1] < 0.2 * losses[0]


@pytest.mark.slow
def test_python_train_py_default_reaches_97_percent(tmp_path):
    """The README's first command, as a user runs it (W&B offline without credentials)."""
    result = run_cli(f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [p.parent for p in tmp_path.rglob("summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.97
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    assert offline_run(wandb_run)["summary"]["test/acc"] == pytest.approx(
        summary["metrics"]["test/acc"]
    )
    assert "wandb sync" in result.stdout + result.stderr
    # Not a benchmark (docs/benchmarks.md measures speed): a guard against a default run gone
    # an order of magnitude slower (about 60-100 s on 2 cores beside the suite's other worker;
    # 357 s once with the cores shared by four more processes).
    assert summary["durations_s"]["total"] < 600


@pytest.mark.slow
@needs_fashion
def test_default_cnn_one_epoch_on_real_fashion_mnist_reaches_85_percent(tmp_path):
    # on half of the training images (class-stratified): 87.6% where the whole split gives
    # 89.3%, in 41 s instead of 72 s (2 cores, 2026-12-02); the full test split
    half = ["data.train_fraction=0.5", "trainer.max_epochs=1", "logger=csv"]
    cfg = make_cfg(tmp_path, ["data=fashion_mnist", *half, *FAST])
    train_task(cfg)
    assert summary_of(cfg)["metrics"]["test/acc"] >= 0.85


@needs_fashion
@pytest.mark.parametrize("kind", ["png", "jpg"])
def test_a_folder_of_fashion_mnist_files_caches_the_very_pixels_and_labels_of_the_idx_files(
    tmp_path, kind
):
    """Fashion-MNIST written as files in ImageNet's layout (at its own 28 px), then scanned,
    decoded by every core and cached: every label is the IDX file's, every image too (PNG,
    lossless) or within JPEG's error (quality 95: 0.9 of 255 on average over the 60,000, 1.5 for
    the worst image). The 70,000 JPEGs train to the IDX files' accuracy with the same recipe:
    docs/benchmarks.md, "A folder of JPEGs trains as the IDX files do"."""
    script = REPO / "scripts" / "make_image_folder.py"
    root = tmp_path / kind
    subprocess.run(
        [sys.executable, str(script), str(root), "--format", kind, "--limit", "3000"],
        check=True,
        cwd=REPO,
    )
    source = FashionMNIST(str(REPO / "data"))
    source.prepare()
    images, labels = source.load("train").tensors
    cached = cached_folder(root / "train", 28, 1, tmp_path / "cache")
    original = torch.tensor([int(Path(f).stem) for f in scan(root / "train").files])
    assert len(original) == 3000 and len(set(original.tolist())) == 3000
    if kind == "png":
        assert torch.equal(cached.images, images[original])
    else:
        error = (cached.images.float() - images[original].float()).abs().mean(dim=(1, 2, 3))
        assert error.mean() < 1.2 and error.max() < 2.5, (error.mean(), error.max())
    # the folders' sorted order is the source's label order: the same labels
    assert torch.equal(cached.labels, labels[original])


@pytest.mark.parametrize(
    ("limits", "recorded"),
    [
        (
            [
                "+trainer.limit_test_batches=0.5",
                "+trainer.limit_val_batches=1",
                "data.eval_batch_size=64",
            ],
            {"test": 0.5, "val": 1},
        ),
        (["+trainer.limit_val_batches=1.0", "+trainer.limit_test_batches=0"], None),
        # more batches than the splits have: all of each measured (warned before it is known)
        (["+trainer.limit_test_batches=1000", "+trainer.limit_val_batches=1000"], None),
    ],
)
def test_an_evaluation_of_part_of_a_split_says_so(tmp_path, caplog, limits, recorded):
    """trainer.limit_test_batches=0.5: test/acc measured half of the test split while
    summary.json counted all of it, and nothing said so. Now summary.json's evaluation_limits
    and one warning; a whole split (1.0), none (0) or a number of batches that covered the
    split is not a part."""
    cfg = make_cfg(tmp_path, ["logger=csv", "trainer.max_epochs=1", *limits, *FAST])
    with caplog.at_level("INFO", logger="litlab"):
        train_task(cfg)
    summary = summary_of(cfg)
    assert summary.get("evaluation_limits") == recorded
    numbers = "1000" in limits[0]
    assert ("measure only these batches" in caplog.text) == (recorded is not None or numbers)
    assert ("covered every batch" in caplog.text) == numbers
    # eval.py: its test split alone (before: neither recorded nor said)
    from litlab.evaluate import eval_task

    best = Path(cfg.paths.output_dir) / "checkpoints" / "best.ckpt"
    tested = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={best}", "extras.print_config=false", *limits[:1]],
        config_name="eval",
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        eval_task(tested)
    test_limit = None if recorded is None else {"test": recorded["test"]}
    assert summary_of(tested).get("evaluation_limits") == test_limit
    warned = test_limit is not None or numbers
    assert ("test/* measure only these batches" in caplog.text) == warned


@pytest.mark.parametrize("best", [False, True])
def test_a_nan_objective_is_a_divergence(tmp_path, capsys, best):
    """callbacks.model_checkpoint=null: the objective is the final value; a NaN there was stored
    as null and reported as "never logged; check objective.metric" (a config error in a sweep).
    With a best checkpoint, a NaN at every validation is ranked by Lightning as the worst value,
    inf, which became the objective (Optuna was told inf; found by review)."""
    cfg = make_cfg(
        tmp_path,
        [
            "trainer.max_epochs=1",
            *([] if best else ["callbacks.model_checkpoint=null"]),
            "objective=accuracy",
            "objective.metric=val/loss",
            "objective.mode=min",
            "callbacks.divergence_guard=null",  # nothing watches the loss and weights
            "logger=wandb",
            "+callbacks.nan._target_=helpers.InjectNaN",
            "+callbacks.nan.at_batch=19",  # the epoch's last: the validation after it is NaN
            "+callbacks.nan.module=net",
            "+callbacks.nan.after_step=true",
            *FAST,
        ],
    )
    told = "is infinite (NaN or infinite at every validation)" if best else "is NaN"
    refused(capsys, train_task, cfg, f"the objective val/loss {told}: training diverged")
    (run,) = (Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*")
    assert offline_run(run)["exit_code"] == 1  # W&B shows it failed too


def test_an_objective_never_logged_because_nothing_validated_says_so(tmp_path, caplog):
    """A recipe's check_val_every_n_epoch above a shortened max_epochs: the objective is never
    logged, and the line says why instead of "check objective.metric" (a new-user walkthrough:
    experiment=digits_dcgan trainer.max_epochs=1)."""
    cfg = make_cfg(
        tmp_path, ["trainer.max_epochs=1", "trainer.check_val_every_n_epoch=2", "test=false", *FAST]
    )
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert "the objective val/loss was never logged: no val step ran" in caplog.text


def test_make_image_folder_refuses_a_folder_that_is_not_empty(tmp_path):
    """PNGs written over an earlier run's JPEGs kept both: every image twice in the folder."""
    out = tmp_path / "digits"

    def make(fmt: str) -> subprocess.CompletedProcess:
        script = REPO / "scripts" / "make_image_folder.py"
        command = [str(out), "--source", "digits", "--format", fmt, "--limit", "20"]
        return subprocess.run(
            [sys.executable, str(script), *command], capture_output=True, text=True, cwd=REPO
        )

    assert make("jpg").returncode == 0
    before = sorted(out.rglob("*"))
    again = make("png")
    assert again.returncode == 1 and "is not an empty folder" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert sorted(out.rglob("*")) == before


def test_each_class_of_an_unbalanced_folder_is_measured_and_said(tmp_path, caplog):
    """A model that never predicts the small classes of an unbalanced folder read test/acc
    0.976, not a word (walkthrough 157). The training split's imbalance is said; the test gives
    test/acc_macro (the classes' accuracies averaged: scikit-learn's balanced accuracy), each
    class's images, accuracy and predictions in summary.json, and names the classes never
    predicted; the images of each class and split are in summary.json too."""
    from conftest import write_png_folder

    root = tmp_path / "images"
    for name, train, test in (("cat", 20, 6), ("dog", 6, 3), ("fox", 2, 1)):
        write_png_folder(root / "train", classes=(name,), per_class=train)
        write_png_folder(root / "test", classes=(name,), per_class=test, seed=1)
    cfg = make_cfg(
        tmp_path / "run",
        [
            "data=image_folder",
            f"data.source.root={root}",
            "data.num_classes=3",
            "data.source.size=16",
            "data.image_shape=[3,16,16]",
            "data.val_fraction=0.25",
            "model/net=custom",
            "model.net._target_=helpers.FavouriteClassNet",  # predicts cat, whatever the image
            "+model.net.num_classes=3",
            "+model.net.scale=1000",  # (one epoch's steps leave it predicting cat)
            "trainer.max_epochs=1",
            "data.batch_size=4",
            "model.scheduler=null",
            "logger=csv",
            *FAST,
        ],
    )
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    summary = summary_of(cfg)
    metrics = summary["metrics"]
    assert metrics["test/acc"] == pytest.approx(0.6) and metrics["test/acc_macro"] == (
        pytest.approx(1 / 3)
    )
    assert summary["test_per_class"] == {
        "cat": {"images": 6, "accuracy": 1.0, "predicted": 10},
        "dog": {"images": 3, "accuracy": 0.0, "predicted": 0},
        "fox": {"images": 1, "accuracy": 0.0, "predicted": 0},
    }
    assert "the test never predicted class(es) dog (3), fox (1)" in caplog.text
    counts = summary["data"]["class_images"]
    assert counts["test"] == {"cat": 6, "dog": 3, "fox": 1}
    assert sum(counts["train"].values()) + sum(counts["val"].values()) == 28
    fewest, most = min(counts["train"].values()), max(counts["train"].values())
    assert f"the training images are unbalanced: class fox has {fewest}, class cat {most}" in (
        caplog.text
    )


def test_a_classifier_whose_loss_diverged_without_a_nan_is_said_to_have(tmp_path, caplog):
    """val/loss 7.2e5 on 3 classes, test/acc at chance, status completed and not a word
    (walkthrough 157: a learning rate for another batch size): finite, so the divergence
    guard let it be. Said, with what to change."""
    sure = ["model/net=custom", "model.net._target_=helpers.FavouriteClassNet"]
    sure += ["+model.net.num_classes=10", "+model.net.scale=1000"]  # wrong, and sure of it
    cfg = make_cfg(tmp_path, [*sure, "trainer.max_epochs=1", "test=false", "logger=csv", *FAST])
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    loss = summary_of(cfg)["metrics"]["val/loss"]
    assert loss > 100
    assert f"val/loss {loss:.4g} is {loss / math.log(10):.0f} times a uniform guess's" in (
        caplog.text
    )
    # and in its summary, which the report shows beside "completed" (walkthrough 163)
    far = summary_of(cfg)["loss_far_above_chance"]
    assert far == round(loss / math.log(10), 1)
    from litlab.report.compare import compare, status_text
    from litlab.report.runs import find_runs

    (run,) = compare(find_runs([Path(cfg.paths.output_dir)])).runs
    assert status_text(run).startswith(f"completed: its val/loss ended {far:g} times a uniform")
