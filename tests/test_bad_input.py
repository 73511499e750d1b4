"""User mistakes end with one line that says what to do, a non-zero exit and no traceback."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from conftest import QUIET_CSV as QUIET
from conftest import (
    make_cfg,
    refused,
    run_cli,
    summary_of,
    write_idx_dataset,
    write_png_folder,
    write_unusual_images,
)
from litlab.errors import ConfigError
from litlab.evaluate import eval_task
from litlab.loggers import check_forked_wandb
from litlab.train import train_task


def assert_one_clear_line(result, *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    text = result.stderr + result.stdout
    for needle in needles:
        assert needle in text, text[-2000:]


@pytest.mark.parametrize(
    "args, needles",
    [
        (
            ["data=nope"],
            ["Could not find 'data/nope'", "Available options in 'data'", "fashion_mnist"],
        ),
        (["data.nope=1"], ["Could not override 'data.nope'"]),
        (["+data.nope=1"], ["litlab: error: data.nope is not an option of litlab.data.DataModule"]),
        (["data.batch_size=abc"], ["litlab: error: data.batch_size must be int, got 'abc'"]),
        (
            ["data.batch_size=0"],
            ["litlab: error: data: batch_size must be a positive integer, got 0"],
        ),
    ],
    ids=["unknown-option", "unknown-key", "unknown-key-appended", "wrong-type", "batch-size-zero"],
)
def test_cli_config_mistakes(tmp_path, args, needles):
    result = run_cli(*args, f"paths.log_dir={tmp_path}", "logger=csv")
    assert_one_clear_line(result, *needles)
    # refused inside the task: its run folder's log ends with the line too (it ended without)
    said = [needle for needle in needles if needle.startswith("litlab: error:")]
    logs = list(tmp_path.rglob("train.log"))
    assert len(logs) == (1 if said else 0)
    assert all(said[0] in log.read_text().splitlines()[-1] for log in logs)


@pytest.mark.skipif(
    importlib.util.find_spec("psutil") is not None, reason="psutil installed: the stats work"
)
def test_cpu_stats_without_psutil_is_refused_before_the_data(tmp_path, capsys):
    """callbacks=device_stats cpu_stats=true without psutil failed at the first training batch
    (after the data's setup), in Lightning's traceback."""
    cfg = make_cfg(
        tmp_path, ["callbacks=device_stats", "callbacks.device_stats.cpu_stats=true", *QUIET]
    )
    refused(capsys, train_task, cfg, "callbacks.device_stats.cpu_stats=true needs psutil")
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()


def test_device_stats_on_a_cpu_run_says_it_logs_nothing_there(tmp_path, caplog):
    """callbacks=device_stats on a CPU run logged no column and said nothing (walkthrough 132):
    Lightning's DeviceStatsMonitor reads a GPU's counters, or the CPU's with cpu_stats=true."""
    args = ["callbacks=device_stats", "trainer.accelerator=cpu", "trainer.max_epochs=1"]
    args += ["+trainer.limit_train_batches=2", "test=false", *QUIET]
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(make_cfg(tmp_path, args))
    assert "callbacks.device_stats logs a GPU's counters" in caplog.text
    assert "callbacks.device_stats.cpu_stats=true logs the CPU's (psutil)" in caplog.text


def test_ddp_on_the_cpu_without_a_number_of_processes_says_it_runs_one(tmp_path, caplog):
    """trainer=ddp trainer.accelerator=cpu, devices left at auto: Lightning ran one process,
    and nothing said so (walkthrough 132)."""
    from litlab.train import say_one_cpu_process

    for devices, said in (("auto", True), ("2", False)):
        caplog.clear()
        args = ["trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={devices}"]
        with caplog.at_level("WARNING", logger="litlab"):
            say_one_cpu_process(make_cfg(tmp_path, args))
        assert ("trains in one process" in caplog.text) is said
        assert ("e.g. trainer.devices=2" in caplog.text) is said


def test_cli_eval_without_checkpoint(tmp_path):
    result = run_cli(f"paths.log_dir={tmp_path}", script="eval.py")
    assert_one_clear_line(result, "litlab: error: ckpt_path is required: python eval.py ckpt_path=")
    assert result.returncode == 2


def fails_with(capsys, task, cfg, needle: str) -> dict:
    """``refused``, and the run's summary says failed, with the line; return the summary."""
    refused(capsys, task, cfg, needle)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "failed" and needle in summary["error"]
    return summary


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["data.val_fraction=1.5"], "val_fraction must lie strictly between 0 and 1"),
        # the checkpoint's monitor alone: told the objective's metric at the mode it had
        # followed (min), which the next check refused for val/acc (walkthrough 173)
        (
            ["objective=loss", "callbacks.model_checkpoint.monitor=val/acc"],
            "set objective.metric=val/acc objective.mode=max (the checkpoint follows",
        ),
        # keys of plain-settings groups (no _target_ to refuse them): silently nothing before
        (["+tune.lrr=true"], "tune.lrr is not a setting; did you mean tune.lr?"),
        (["+objective.metrc=val/acc"], "objective.metrc is not a setting; did you mean "),
        (["data.batch_size=-3"], "batch_size must be a positive integer"),
        (
            ["data.image_shape=[1,32,32]"],  # digits are drawn at data.source.size
            "set data.source.size=32 (decoded so), or data.image_shape=[1,28,28]",
        ),
        (
            ["data.num_classes=4", "model.num_classes=4", "model.net.num_classes=4"],
            "set data.num_classes=10",
        ),
        (["model.net.width=0"], "width >= 1"),
        (["model.label_smoothing=1.5"], "label_smoothing must lie in [0, 1)"),
        (["trainer.max_epochs=ten"], "trainer.max_epochs must be"),
        (["trainer.max_epochs=0"], "trainer.max_epochs=0 trains nothing; set it to 1 or more"),
        (["trainer.max_epochs=0", "trainer.max_steps=5"], "trainer.max_epochs=0 trains nothing"),
        (["trainer.precision=16-mixed", "trainer.accelerator=cpu"], "needs a GPU; on CPU use"),
        (["trainer.precision=auto", "+trainer.foo=1"], "trainer.foo is not an option"),
        (
            ["model=torchvision", "model.net.name=resnet9000"],
            "unknown torchvision model 'resnet9000'",
        ),
        (["data=image_folder", "data.num_classes=3"], "data.source.root must be set"),
        (["data=mnist", "data.source.download=false"], "mnist files not found"),
        # values that only a constructor checks (torch, Lightning): the class of cause, closed
        (["model.optimizer.lr=-1"], "model.optimizer: Invalid learning rate: -1"),
        (["+model.optimizer.betas=[2,0.9]"], "model.optimizer: Invalid beta parameter"),
        (["model.scheduler.pct_start=1.5"], "model.scheduler: Expected float between 0 and 1"),
        (["callbacks=early_stopping", "callbacks.early_stopping.mode=up"], "`mode` can be"),
        (
            ["+trainer.val_check_interval=-1"],
            "trainer: You have passed invalid value -1 for val_check",
        ),
        (["+seeed=3"], "seeed is not a setting of the train task; did you mean seed?"),
        # Lightning's seed_everything refused them with numpy's traceback (found by a walkthrough)
        (["seed=-1"], "seed=-1: give a whole number from 0 to 4294967295"),
        (["seed=abc"], "seed=abc: give a whole number"),
        # a switch's typo was a string, true: the LR finder ran (walkthrough 132)
        (["tune.lr=ture"], "tune.lr='ture': give true or false"),
        (["test=no"], "test='no': give true or false"),
        # a net of the user's own module, not on PYTHONPATH: Hydra's 3-line error, logged too
        (
            ["model/net=custom", "model.net._target_=mypackage.MyNet"],
            "(No module named 'mypackage'): mypackage is not importable, put its folder on PYTHONPATH",
        ),
        # max_lr follows the optimizer's lr: the message named only max_lr (walkthrough)
        (["model.optimizer.lr=abc"], "model.scheduler.max_lr (from model.optimizer.lr) must be"),
        (["ckpt_path=last"], "resume=<run folder>"),
        (["model=dcgan", "data.translate=2"], "augments the real images only"),
        (["model=dcgan", "trainer.precision=bf16-true"], "use trainer.precision=bf16-mixed"),
        # AdamW's eps is 0 in float16: NaN at step 20, told "lower the learning rate" (176)
        (["trainer.precision=16-true"], "model.optimizer.eps=1e-08 is below its smallest normal"),
        (["trainer.precision=16-true", "+model.optimizer.eps=0"], "model.optimizer.eps=0 is"),
        # a typo got Lightning's type in full, without litlab's auto (walkthrough 137)
        (
            ["trainer.precision=bf17"],
            "trainer.precision=bf17 is not a precision: auto (the machine's fastest; eval.py's "
            "default, trained: the run's), 32-true, bf16-mixed, 16-mixed, bf16-true, 16-true, "
            "64-true",
        ),
        (
            ["callbacks=ema", "+callbacks.ema.update_starting_at_epoch=1"],
            "use callbacks.ema.update_starting_at_step",
        ),
        (["callbacks=ema", "callbacks.ema.decay=1.5"], "callbacks.ema.decay must lie in (0, 1)"),
        (["callbacks=ema", "trainer=fsdp"], "callbacks.ema averages whole parameters"),
        # it replaced the GAN's callbacks, and the FID "off" was blamed (walkthrough)
        (["model=dcgan", "callbacks=ema"], "this callbacks group has no GAN callbacks"),
        (  # Lightning's FSDP raised it as a traceback once the fit had started
            ["trainer=fsdp", "trainer.gradient_clip_val=1.0"],
            "set trainer.gradient_clip_algorithm=value, or use trainer.strategy=ddp",
        ),
        (
            ["callbacks.model_checkpoint.monitor=val/acc", "callbacks.model_checkpoint.mode=max"],
            "set objective.metric=val/acc objective.mode=max",
        ),
        (["data.train_fraction=0"], "train_fraction must lie in (0, 1]"),
        (  # accuracy's max kept: the worst checkpoint was tested and scored
            ["objective=accuracy", "objective.metric=val/loss"],
            "objective.metric=val/loss is better when lower, but objective.mode=max",
        ),
        (["model=dcgan", "objective.mode=max"], "set objective.mode=min"),
        (  # Lightning's checkpoint refused it in a traceback after the first epoch (145)
            ["model=dcgan", "objective=accuracy"],
            "objective.metric=val/acc is not logged by a GAN's validation, which measures FID",
        ),
        (  # a sweep then selected on the test set (and best.ckpt by it): no word said
            ["objective.metric=test/acc", "callbacks.model_checkpoint=null"],
            "the test set would choose the model it then scores; set objective.metric=val/acc",
        ),
        (  # torch's "Output size is too small" deep in the first batch
            ["model=torchvision", "model.net.name=vgg11"],
            "torchvision's vgg11 cannot take 28x28 images (Given input size: (512x1x1)",
        ),
        (  # a traceback from the top-5 metric (with 5 classes or fewer: trained on silently)
            ["model.net.num_classes=12"],
            "SmallCNN gives outputs shaped (12,) per image, but data.num_classes=10: give the net",
        ),
        # a net of one's own that cannot take the images, or gives other than [batch,
        # classes]: tracebacks from deep in torch and litlab's own check (walkthrough 173)
        (
            ["model/net=custom", "model.net._target_=helpers.NetOf", "+model.net.kind=flat64"],
            "NetOf fails on this data's images, a batch shaped (144, 1, 28, 28) (mat1 and mat2",
        ),
        (  # compiled: torch's error inside Dynamo's, 470 lines of traceback
            [
                "model/net=custom",
                "model.net._target_=helpers.NetOf",
                "+model.net.kind=flat64",
                "callbacks.speed.compile=true",
            ],
            "NetOf fails on this data's images, a batch shaped (144, 1, 28, 28) (a and b must",
        ),
        (
            ["model/net=custom", "model.net._target_=helpers.NetOf", "+model.net.kind=tuple"],
            "NetOf returns a tuple, not a tensor of logits",
        ),
        (
            ["model/net=custom", "model.net._target_=helpers.NetOf", "+model.net.kind=one"],
            "NetOf gives outputs shaped (1, 10) for a batch of 144 images",
        ),
        # a net of one's own given by _target_ alone: SmallCNN's keys came with it, and the
        # line did not say why (walkthrough 173); its own required key, with the + it needs
        (
            ["model.net._target_=helpers.NetOf"],
            "(in_channels came with the model/net option, which model.net._target_ alone keeps:",
        ),
        (
            ["model/net=custom", "model.net._target_=helpers.NetOf"],
            "model.net.kind is required by helpers.NetOf; set it: +model.net.kind=<value>",
        ),
        (  # the module imports, the class is not in it ("'helpers' is not a package" before)
            ["model/net=custom", "model.net._target_=helpers.NoSuchNet"],
            "model.net._target_: cannot import 'helpers.NoSuchNet' (helpers has no NoSuchNet)",
        ),
        (  # digits at batch 256: 5 steps, x pct_start 0.2 = a warm-up of one step
            ["data.batch_size=256", "trainer.max_epochs=1", "model.scheduler.pct_start=0.2"],
            "a one-cycle warm-up of exactly one step",
        ),
        (
            # in the objective's direction (digits': val/loss, min)
            ["model/scheduler=plateau", "model.scheduler_monitor=val/acc"],
            "set model.scheduler_mode=min or max for it too",
        ),
        (
            ["callbacks.model_checkpoint.save_top_k=3"],  # best.ckpt: the newest of the top 3
            "would hold the newest of the top k, not the best",
        ),
        (  # the objective (last validation, epoch 2) and the test (last.ckpt, epoch 3) apart
            [
                "callbacks.model_checkpoint=null",
                "trainer.check_val_every_n_epoch=2",
                "trainer.max_epochs=3",
            ],
            "set trainer.max_epochs to a multiple of 2, or keep callbacks.model_checkpoint",
        ),
        (  # never validated: no objective, early stopping never acts
            [
                "callbacks=early_stopping",
                "trainer.max_epochs=2",
                "trainer.check_val_every_n_epoch=3",
            ],
            "set trainer.check_val_every_n_epoch to at most 2",
        ),
        (  # no length for it (torch's T_max=-1 would cycle the LR up and down)
            ["model/scheduler=cosine", "model.scheduler_interval=epoch", "trainer.max_epochs=-1"],
            "set trainer.max_epochs (or trainer.max_steps)",
        ),
    ],
)
def test_train_mistakes_in_process(tmp_path, capsys, overrides, needle):
    fails_with(capsys, train_task, make_cfg(tmp_path, [*overrides, *QUIET]), needle)


def test_wandb_under_ranks_forked_from_the_run_is_refused(tmp_path, capsys):
    """W&B's runs do not survive a fork: under ddp_fork two offline runs were left, neither with
    a record of the run, its history or its end. CSV alone (or W&B disabled) is accepted."""
    fork = ["trainer.strategy=ddp_fork", "trainer.accelerator=cpu", "trainer.devices=2"]
    needle = "trainer.strategy=ddp_fork forks the ranks from this process, and W&B cannot log"
    fails_with(
        capsys, train_task, make_cfg(tmp_path / "w", [*QUIET, *fork, "logger=wandb"]), needle
    )
    disabled = make_cfg(
        tmp_path / "d", [*QUIET, *fork, "logger=wandb", "logger.wandb.mode=disabled"]
    )
    check_forked_wandb(disabled)  # (not trained: a forked run is ~10 s)
    node = "+trainer.strategy={_target_:lightning.pytorch.strategies.DDPStrategy,start_method:fork}"
    with pytest.raises(ConfigError, match="forks the ranks from this process"):
        check_forked_wandb(
            make_cfg(tmp_path / "n", [*QUIET, "logger=wandb", "~trainer.strategy", node])
        )
    check_forked_wandb(make_cfg(tmp_path / "c", [*QUIET, *fork]))


@pytest.mark.parametrize("metric", ["val/d_real", "val/fid_g", "val/class_entropy"])
def test_a_gan_objective_its_validation_logs_is_accepted(tmp_path, metric):
    """val/d_real was refused as "not logged by a GAN's validation" (review 148)."""
    from litlab.config import check_objective

    check_objective(make_cfg(tmp_path, ["model=dcgan", f"objective.metric={metric}"]))


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.scheduler_mode=max"],
        ["+model.scheduler.mode=max"],
        ["model.scheduler_monitor=val/loss"],  # the objective itself (digits')
    ],
)
def test_a_plateau_schedule_on_another_metric_with_its_direction_is_accepted(tmp_path, overrides):
    from litlab.config import check_plateau_mode

    base = ["model/scheduler=plateau", "model.scheduler_monitor=val/acc"]
    check_plateau_mode(make_cfg(tmp_path, [*base, *overrides]))


def test_a_failed_download_is_one_line_with_the_ways_that_remain(tmp_path, capsys, monkeypatch):
    """torchvision's download error lists each mirror on its own line: litlab's is one line,
    and offers no system copy where there is none (MNIST) and no download=true when it is on."""
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError(
            "Error downloading train-images-idx3-ubyte.gz:\nTried https://a/, got:\n"
            "<urlopen error [Errno -2] Name or service not known>\n"
        )

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)  # as if offline
    cfg = make_cfg(tmp_path, ["data=mnist", f"data.source.data_dir={tmp_path}", *QUIET])
    message = fails_with(capsys, train_task, cfg, "download failed: Error downloading")["error"]
    assert "\n" not in message and "Name or service not known" in message, message
    assert "system copy" not in message and "download=true" not in message
    assert "retry the download" in message


def test_truncated_data_file_names_the_file(tmp_path, capsys):
    data = tmp_path / "data"
    write_idx_dataset(data, n_train=40, n_test=10)
    path = data / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    cfg = make_cfg(
        tmp_path, ["data=mnist", "data.source.download=false", "data.batch_size=8", *QUIET]
    )
    fails_with(capsys, train_task, cfg, str(path))
    assert path.is_file()  # nothing already written is removed


@pytest.mark.parametrize(
    "content",
    [None, b"not a checkpoint", b"PK\x03\x04truncated zip", "a run folder", "a sweep folder"],
)
def test_eval_with_a_missing_or_corrupt_checkpoint(tmp_path, capsys, content):
    path = tmp_path / "model.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    if content == "a run folder":  # resume= takes one; "does not exist" was untrue for it
        path = tmp_path / "run"
        (path / "checkpoints").mkdir(parents=True)
        (path / "checkpoints" / "best.ckpt").write_bytes(b"")
    best = str(tmp_path / "sweep" / "3" / "checkpoints" / "best.ckpt")
    if content == "a sweep folder":  # its best job's checkpoint named (walkthrough 146)
        path = tmp_path / "sweep"
        path.mkdir()
        (path / "sweep_summary.json").write_text(json.dumps({"best": {"best_checkpoint": best}}))
    cfg = make_cfg(tmp_path, [f"ckpt_path={path}", "extras.print_config=false"], config_name="eval")
    needle = {
        None: "does not exist",
        "a run folder": f"is a folder; pass a .ckpt file, e.g. {path}",
        "a sweep folder": f"is a folder; pass a .ckpt file, e.g. the sweep's best, {best}",
        # torch's weights_only advice, cut mid-sentence, said nothing of use (walkthrough 186)
        b"not a checkpoint": "is not a readable checkpoint (not a file torch.save wrote)",
    }
    fails_with(capsys, eval_task, cfg, needle.get(content, "is not a readable checkpoint"))


def test_eval_of_a_foreign_checkpoint(tmp_path, capsys):
    import torch

    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "hyper_parameters": {"lr": 0.1}}, path)
    cfg = make_cfg(tmp_path, [f"ckpt_path={path}", "extras.print_config=false"], config_name="eval")
    fails_with(capsys, eval_task, cfg, "carries no litlab config")


def test_eval_of_a_sharded_fsdp_checkpoint_says_how_to_consolidate_it(tmp_path, capsys):
    """trainer.strategy.state_dict_type=sharded leaves best.ckpt/ as a folder of shards (its
    meta.pt and one .distcp per rank): it was called a run folder without checkpoints."""
    import torch

    sharded = tmp_path / "best.ckpt"
    sharded.mkdir()
    torch.save({"epoch": 1}, sharded / "meta.pt")
    (sharded / "__0_0.distcp").write_bytes(b"shard")
    cfg = make_cfg(
        tmp_path, [f"ckpt_path={sharded}", "extras.print_config=false"], config_name="eval"
    )
    needle = f"consolidate_checkpoint {sharded}, then pass ckpt_path={sharded}.consolidated"
    fails_with(capsys, eval_task, cfg, needle)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (
            ["model=dcgan", "data.source.size=30"],
            "DCGAN builds square images of 4*2^k or 7*2^k pixels",
        ),
        (["model=dcgan", "model.n_critic=0"], "n_critic must be at least 1"),
        (["model=dcgan", "model.loss=lsgan"], "model.loss must be"),
        (["model=dcgan", "model.generator.latent_dim=0"], "latent_dim and width must be positive"),
        (
            ["model=dcgan", "trainer.strategy=fsdp", "trainer.accelerator=cpu"],
            "on CPU use trainer.strategy=ddp",
        ),
        (["model=dcgan", "callbacks.fid=null"], "comes from callbacks.fid, which is off"),
        (
            ["model=dcgan", "trainer.gradient_clip_val=1.0"],
            "GAN steps its own optimizers (manual optimization), which Lightning does not clip; "
            "set model.gradient_clip_val to clip instead",
        ),
        (
            ["model=dcgan", "trainer.accumulate_grad_batches=2"],
            "which Lightning does not accumulate for; use a larger data.batch_size",
        ),
        (
            ["model=dcgan", "+callbacks.ema._target_=litlab.callbacks.EMA"],
            "keeps its own average of the generator where it has one (the GANs: model.ema_decay)",
        ),
    ],
    ids=[
        "gan-image-size",
        "n-critic",
        "gan-loss",
        "latent-dim",
        "fsdp-on-cpu",
        "fid-off",
        "gan-trainer-clipping",
        "gan-accumulation",
        "gan-ema-callback",
    ],
)
def test_gan_mistakes_in_process(tmp_path, capsys, overrides, needle):
    fails_with(capsys, train_task, make_cfg(tmp_path, [*overrides, *QUIET]), needle)


def test_resuming_a_checkpoint_of_another_model_family(tmp_path, capsys):
    gan = make_cfg(
        tmp_path / "gan",
        [
            "model=dcgan",
            "data=synthetic",
            "data.image_shape=[1,16,16]",
            "data.source.train_size=128",
            "data.batch_size=32",
            "model.generator.width=8",
            "model.discriminator.width=8",
            "trainer.max_epochs=1",
            "test=false",
            *QUIET,
        ],
    )
    train_task(gan)
    last = Path(gan.paths.output_dir) / "checkpoints" / "last.ckpt"
    cfg = make_cfg(tmp_path / "clf", [f"ckpt_path={last}", *QUIET])
    fails_with(
        capsys,
        train_task,
        cfg,
        "holds a litlab.models.GAN but this run builds a litlab.models.ImageClassifier",
    )


def test_a_run_requeued_on_another_kind_of_machine_goes_on_at_its_precision(
    tmp_path, monkeypatch, caplog
):
    """trainer.precision=auto picks by the machine: a job requeued onto another kind of node
    (a partition of mixed nodes) was refused as "a run with another config" (its resolved
    precision differed). Here: trained with native bfloat16, stopped while testing (.trained,
    no .completed), started again on a machine without it."""
    import litlab.hardware

    tiny = ["trainer.max_epochs=1", "model.net.width=4", "trainer.precision=auto", *QUIET]
    monkeypatch.setattr(litlab.hardware, "cpu_has_native_bf16", lambda: True)
    train_task(make_cfg(tmp_path, tiny))
    (tmp_path / "run" / ".completed").unlink()
    monkeypatch.setattr(litlab.hardware, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(make_cfg(tmp_path, tiny))
    assert "trained at bf16-mixed, this machine runs 32-true; continuing at 32-true" in caplog.text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["precision"]["chosen"] == "32-true"


def test_training_over_another_runs_checkpoints(tmp_path, capsys):
    """A run folder that holds another config's checkpoints is never trained over, and a
    continuation refused before it starts leaves the folder's summary.json as it was (the
    completed run's metrics and best checkpoint)."""
    tiny = ["trainer.max_epochs=2", "model.net.width=4", "test=false", *QUIET]
    train_task(make_cfg(tmp_path, tiny))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    summary = tmp_path / "run" / "summary.json"
    written, summarized = last.read_bytes(), summary.read_bytes()
    assert json.loads(summarized)["status"] == "completed"
    other = make_cfg(tmp_path, [*tiny, "model.net.width=8"])  # the same folder, another model
    line = refused(capsys, train_task, other, "already holds checkpoints of a run with another")
    # completed: how to train it further (its plain resume= is refused: walkthrough 186)
    further = f"train that run further with: python train.py resume={tmp_path / 'run'} "
    assert further + "trainer.max_epochs=<more>, or train in a new folder" in line
    assert last.read_bytes() == written and summary.read_bytes() == summarized
    # resume= of a finished run as it was, or asking for fewer epochs than it has
    for epochs in (2, 1):
        past_end = make_cfg(tmp_path, [*tiny, f"ckpt_path={last}", f"trainer.max_epochs={epochs}"])
        needle = f"has already trained 2 epochs and trainer.max_epochs={epochs}"
        refused(capsys, train_task, past_end, needle)
        assert last.read_bytes() == written and summary.read_bytes() == summarized
    # resumed on other data (it continued digits' optimizer, schedule and epochs on them)
    other_data = make_cfg(
        tmp_path,
        [
            *tiny,
            f"ckpt_path={last}",
            "trainer.max_epochs=3",
            "data=synthetic",
            "data.image_shape=[1,8,8]",
        ],
    )
    refused(capsys, train_task, other_data, "trained on other data (data.source._target_:")
    assert last.read_bytes() == written and summary.read_bytes() == summarized
    # other splits of the same data: images that trained would validate or test
    for change, needle in [
        ("data.split_seed=1", "data.split_seed: 0 -> 1"),
        ("data.source.test_fraction=0.4", "data.source.test_fraction: 0.2 -> 0.4"),
        ("data.val_fraction=0.3", "data.val_fraction: 0.1 -> 0.3"),
    ]:
        resplit = make_cfg(tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", change])
        refused(capsys, train_task, resplit, needle)
    assert last.read_bytes() == written and summary.read_bytes() == summarized
    # resumed with optimizer settings that the restored optimizer state would override
    new_lr = make_cfg(
        tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", "model.optimizer.lr=0.03"]
    )
    refused(capsys, train_task, new_lr, "model.optimizer.lr: 0.003 -> 0.03 would not apply")
    no_schedule = make_cfg(
        tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", "model.scheduler=null"]
    )
    refused(
        capsys,
        train_task,
        no_schedule,
        "model.scheduler: torch.optim.lr_scheduler.OneCycleLR -> None",
    )
    # another seed: the rest of a resumed epoch in another order (and a GAN's other noise)
    other_seed = make_cfg(tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", "seed=7"])
    refused(capsys, train_task, other_seed, "seed: 42 -> 7 would change part way")
    flips = make_cfg(
        tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", "+model.tta_flip=true"]
    )
    refused(capsys, train_task, flips, "model.tta_flip: False -> True would change what val/*")
    # another objective: Lightning's best (kept per metric and direction) would start over
    objective = ["objective=accuracy"]  # digits' is val/loss
    rejudged = make_cfg(tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", *objective])
    line = refused(
        capsys, train_task, rejudged, "objective.metric: val/loss -> val/acc, objective.mode:"
    )
    assert "resume with the run's objective (objective.metric=val/loss objective.mode=min;" in line
    other_groups = make_cfg(
        tmp_path,
        [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3", "model.decay_norm_and_bias=false"],
    )
    refused(capsys, train_task, other_groups, "model.decay_norm_and_bias: True -> False")
    assert last.read_bytes() == written and summary.read_bytes() == summarized
    # Continued for real, the run's summary keeps what it said before; refused again, the
    # summary (with its own previous_summary) stays whole.
    train_task(make_cfg(tmp_path, [*tiny, f"ckpt_path={last}", "trainer.max_epochs=3"]))
    now = json.loads(summary.read_text())
    assert now["status"] == "completed" and now["resumed_from"] == str(last)
    assert now["previous_summary"] == json.loads(summarized)
    summarized = summary.read_bytes()
    refused(capsys, train_task, past_end, "has already trained 3 epochs and trainer.max_epochs=1")
    assert summary.read_bytes() == summarized


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_cli(f"paths.log_dir={blocker / 'out'}", "logger=csv")
    assert_one_clear_line(
        result, "litlab: error: cannot write the run folder", "paths.log_dir=<folder>"
    )
    assert result.returncode == 2


def test_unwritable_default_output_folder(tmp_path):
    # The default paths.log_dir is <where you run>/outputs, read through ${hydra:runtime.cwd}.
    (tmp_path / "outputs").write_text("a file where the outputs folder should be")
    result = run_cli("logger=csv", cwd=tmp_path)
    assert "CheckOutputFolder" not in result.stderr  # the check ran instead of being skipped
    assert_one_clear_line(
        result, "litlab: error: cannot write the run folder", "paths.log_dir=<folder>"
    )
    assert result.returncode == 2


@pytest.mark.parametrize("layout", ["not-a-run", "no-checkpoint", "a-checkpoint", "a-sweep"])
def test_resume_of_a_folder_that_cannot_be_resumed(tmp_path, layout):
    folder = tmp_path / "run"
    if layout == "a-sweep":  # its jobs are the run folders (it said "not a litlab run folder")
        (folder / "0" / ".hydra").mkdir(parents=True)
        (folder / "0" / ".hydra" / "config.yaml").write_text("seed: 1\n")
        (folder / "multirun.yaml").write_text("hydra: {}\n")
    elif layout != "not-a-run":
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    given, needle = (
        folder,
        {
            "not-a-run": "is not a litlab run folder",
            "no-checkpoint": "has no checkpoint to resume from",
            "a-checkpoint": f"is a file of the run folder {folder}; pass resume={folder}",
            "a-sweep": f"is a sweep's folder; resume= takes one of its jobs' folders (resume="
            f"{folder / '0'}; jobs: 0)",
        }[layout],
    )
    if layout == "a-checkpoint":  # the run's checkpoint given, not its folder
        given = folder / "checkpoints" / "last.ckpt"
        given.parent.mkdir()
        given.write_bytes(b"")
    result = run_cli(f"resume={given}")
    assert_one_clear_line(result, f"litlab: error: {given}", needle)
    assert result.returncode == 2


def test_image_folder_whose_classes_disagree_with_num_classes(tmp_path, capsys):
    write_png_folder(tmp_path / "images")  # three class folders
    cfg = make_cfg(
        tmp_path,
        [
            "data=image_folder",
            f"data.source.root={tmp_path / 'images'}",
            f"data.source.cache_dir={tmp_path / 'cache'}",
            "data.num_classes=5",
            "model.num_classes=5",
            "data.num_workers=0",
            *QUIET,
        ],
    )
    fails_with(capsys, train_task, cfg, "has 3 classes but data.num_classes is 5")
    # refused from the folder's scan, before its decode (a large folder's takes an hour)
    assert not list((tmp_path / "cache").rglob("images.u8"))


@pytest.mark.parametrize(
    "given", ["+data.source.classes=[cat,dog,fox,emu]", "+data.source.test_all=true"]
)
def test_evals_settings_of_another_folder_are_refused_in_training(tmp_path, capsys, given):
    """eval.py labels another folder by the model's classes and tests all of it; given to
    train.py, classes= let a class without training images pass (review) and test_all would
    test the images trained on."""
    write_png_folder(tmp_path / "images", per_class=4)
    cfg = make_cfg(
        tmp_path, [*small_folder_run(tmp_path), f"data.source.root={tmp_path / 'images'}", given]
    )
    key = given.split("=")[0][1:]
    refused(capsys, train_task, cfg, f"{key} is for eval.py (testing another folder)")


def small_folder_run(tmp_path: Path) -> list[str]:
    """A classifier on a small image folder of three classes (its root given beside)."""
    return [
        "data=image_folder",
        f"data.source.cache_dir={tmp_path / 'cache'}",
        "data.source.size=16",
        "data.image_shape=[3,16,16]",
        "data.num_classes=3",
        "data.batch_size=8",
        "data.num_workers=0",
        "model.net.width=4",
        "model.scheduler=null",
        *QUIET,
    ]


@pytest.mark.parametrize("layout", ["classes", "splits"])
def test_a_resume_on_another_folder_of_other_images_is_refused(tmp_path, capsys, layout):
    """data.source.root is where the images are (a run folder resumed on another machine): it
    was never compared, so resume= with another folder of the same classes trained on and
    tested other images without a word (review). A copy of the folder resumes. The same for
    a folder with train/ and test/ (its checkpoints kept no sample of files: not compared)."""
    import shutil

    import numpy as np
    from PIL import Image

    from litlab.checkpoint import load_checkpoint
    from litlab.resumable import check_resumable

    root, other, copy = (tmp_path / name for name in ("images", "other", "copy"))
    if layout == "classes":
        write_png_folder(root, per_class=8)
    else:
        write_png_folder(root / "train", per_class=8)
        write_png_folder(root / "test", per_class=2)
    shutil.copytree(root, copy)
    shutil.copytree(root, other)
    for path in other.rglob("*.png"):  # the same names and classes, other pixels
        Image.fromarray(255 - np.asarray(Image.open(path))).save(path)
    folder = small_folder_run(tmp_path)
    trained = make_cfg(
        tmp_path / "t", [*folder, f"data.source.root={root}", "trainer.max_epochs=1"]
    )
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    more = [*folder, "trainer.max_epochs=2", f"ckpt_path={last}"]
    elsewhere = make_cfg(tmp_path / "t", [*more, f"data.source.root={other}"])
    refused(capsys, train_task, elsewhere, f"data.source.root: {root} -> {other} holds none of")
    moved = make_cfg(tmp_path / "t", [*more, f"data.source.root={copy}"])
    check_resumable(load_checkpoint(last), moved)  # its files, elsewhere: accepted


def test_a_resume_on_its_folder_changed_since_is_refused(tmp_path, capsys):
    """resume= on the run's own folder after a file moved to another class (as many files: a
    mid-epoch resume's count check passes) or files were added trained and validated on other
    images part way without a word (walkthrough). Refused from the folder's scan, before a
    decode (a changed folder is a new cache: reviewer), the checkpoint as it was; files added
    to test/ change nothing that trains, and the folder put back resumes."""
    from litlab.checkpoint import load_checkpoint

    root, cache = tmp_path / "images", tmp_path / "cache"
    write_png_folder(root / "train", per_class=8)
    write_png_folder(root / "test", per_class=2)
    folder = [*small_folder_run(tmp_path), f"data.source.root={root}"]
    trained = make_cfg(tmp_path / "t", [*folder, "trainer.max_epochs=1"])
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["DataModule"]["files"]["files"] == 24  # train/ (val from it)
    saved, caches = last.read_bytes(), sorted(cache.iterdir())
    resumed = make_cfg(tmp_path / "t", [*folder, "trainer.max_epochs=2", f"ckpt_path={last}"])
    (root / "train" / "dog" / "3.png").rename(root / "train" / "cat" / "moved.png")
    needle = f"image_folder {root} changed since the checkpoint was written (24 training and "
    refused(capsys, train_task, resumed, needle + "validation image files then, 24 now")
    (root / "train" / "cat" / "moved.png").rename(root / "train" / "dog" / "3.png")
    shutil.copy(root / "train" / "fox" / "0.png", root / "train" / "fox" / "new.png")
    refused(capsys, train_task, resumed, needle + "validation image files then, 25 now")
    assert last.read_bytes() == saved and sorted(cache.iterdir()) == caches  # nothing decoded
    (root / "train" / "fox" / "new.png").unlink()  # as it was, and an image more to test
    shutil.copy(root / "test" / "fox" / "0.png", root / "test" / "fox" / "new.png")
    train_task(resumed)


def test_a_resume_goes_on_after_the_unreadable_files_were_removed(tmp_path, capsys):
    """The run, its log and the check tool say to remove files that do not decode; removed,
    the resume was refused as on a folder changed since ("put the folder back as it was",
    review 171): cached, they gave no image, so the images and their order are the same. The
    checkpoint keeps those the decode skipped; a readable file removed is still refused, and
    so are files read as they go (cache=false: each holds a place in the epoch's order and the
    training subset's draw, review 174)."""
    from litlab.checkpoint import load_checkpoint

    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=10)
    write_png_folder(root / "test", per_class=2)
    bad = write_unusual_images(root / "train" / "dog")
    folder = [*small_folder_run(tmp_path), f"data.source.root={root}"]
    trained = make_cfg(tmp_path / "t", [*folder, "trainer.max_epochs=1", "test=false"])
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    without = load_checkpoint(last)["DataModule"]["files"]["without"]
    assert {f"train/dog/{name}" for name in bad} == set(without)
    resumed = make_cfg(
        tmp_path / "t", [*folder, "trainer.max_epochs=2", "test=false", f"ckpt_path={last}"]
    )
    (root / "train" / "cat" / "0.png").rename(tmp_path / "0.png")  # an image gone: refused
    refused(capsys, train_task, resumed, "changed since the checkpoint was written")
    (tmp_path / "0.png").rename(root / "train" / "cat" / "0.png")
    for name in without:
        (root / name).unlink()
    train_task(resumed)
    assert summary_of(resumed)["status"] == "completed"
    # read as they go, the same removal is refused
    for name in bad:
        (root / "train" / "dog" / name).write_bytes(b"not an image")
    files = [*folder, "data.source.cache=false", "test=false"]
    trained = make_cfg(tmp_path / "f", [*files, "trainer.max_epochs=1"])
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert "without" not in load_checkpoint(last)["DataModule"]["files"]
    for name in bad:
        (root / "train" / "dog" / name).unlink()
    resumed = make_cfg(tmp_path / "f", [*files, "trainer.max_epochs=2", f"ckpt_path={last}"])
    refused(capsys, train_task, resumed, "changed since the checkpoint was written")


def test_a_checkpoint_refuses_class_folders_renamed_since(tmp_path, capsys):
    """Labels are the positions of the class folders' sorted names: a folder renamed after
    training (dog -> wolf: cat, fox, wolf) would give other images each label, silently, on
    resume= and in eval.py. Both refuse, naming the labels that moved."""
    root = tmp_path / "images"
    write_png_folder(root, per_class=12)
    folder = [*small_folder_run(tmp_path), f"data.source.root={root}"]
    trained = make_cfg(tmp_path / "t", [*folder, "trainer.max_epochs=1"])
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    (root / "dog").rename(root / "wolf")
    needle = "trained with the classes ['cat', 'dog', 'fox'], this data has ['cat', 'fox', 'wolf']"
    resumed = make_cfg(tmp_path / "t", [*folder, "trainer.max_epochs=2", f"ckpt_path={last}"])
    refused(capsys, train_task, resumed, needle)
    tested = make_cfg(
        tmp_path / "e", [f"ckpt_path={last}", "extras.print_config=false"], config_name="eval"
    )
    refused(capsys, eval_task, tested, needle)
    (root / "wolf").rename(root / "dog")  # the same folders again: tested as trained
    assert 0.0 <= eval_task(tested) <= 1.0
    # an empty class folder added since (walkthrough 150): both named it "4 classes, set
    # data.num_classes=4", then refused that count as not the model's: the folder is named
    (root / "aaa").mkdir()
    new = "class folder(s) ['aaa'] are new (an empty folder is a class too)); use class folders"
    refused(capsys, train_task, resumed, new)
    refused(capsys, eval_task, tested, new)
    # a new run on it: the folder is said to be empty (it read: unreadable, or held out)
    fresh = make_cfg(tmp_path / "n", [*folder, "data.num_classes=4", "trainer.max_epochs=1"])
    line = refused(capsys, train_task, fresh, "class folder(s) ['aaa'] of ")
    assert line.endswith("hold no image file: every class folder is a class, and each needs "
                         "training images; add images to them or remove the folders")  # fmt: skip
    # and where data.num_classes does not count it: that, not "set data.num_classes=4", which
    # was refused next (walkthrough 182)
    fresh = make_cfg(tmp_path / "n3", [*folder, "data.num_classes=3", "trainer.max_epochs=1"])
    refused(capsys, train_task, fresh, "class folder(s) ['aaa'] of ")


def test_eval_of_a_classifier_refuses_before_testing_and_takes_a_data_setting(tmp_path, capsys):
    train = make_cfg(
        tmp_path / "t", ["model.net.width=8", "trainer.max_epochs=1", "test=false", *QUIET]
    )
    train_task(train)
    best = json.loads((Path(train.paths.output_dir) / "summary.json").read_text())
    best = best["best_checkpoint"]

    def evaluated(name: str, *overrides: str):
        args = [f"ckpt_path={best}", *overrides, "extras.print_config=false"]
        return make_cfg(tmp_path / name, args, config_name="eval")

    summary = fails_with(
        capsys,
        eval_task,
        evaluated("e", "data=synthetic"),
        "trained on data.image_shape=[1, 28, 28]",
    )
    assert (
        "(set data.image_shape=[1, 28, 28], and data.source.channels to match)"
        in (summary["error"])
    )
    # generate=N is for GANs, and a count: refused before the test (it ran, then failed, with
    # a key that does not exist in the message, or a traceback for a negative count)
    summary = fails_with(
        capsys,
        eval_task,
        evaluated("g", "generate=5"),
        "generate=N works with GAN models only; set generate=0 for this model",
    )
    assert "test/acc" not in summary["metrics"]
    fails_with(
        capsys,
        eval_task,
        evaluated("n", "generate=-3"),
        "generate=-3: give the number of images to write (0: none)",
    )
    # one setting of the run's own data (it was a KeyError traceback): the same test as without
    # (digits' objective is a loss: summed in other batches, equal to float32's rounding)
    batched = eval_task(evaluated("b", "+data.eval_batch_size=7"))
    assert batched == pytest.approx(eval_task(evaluated("a")), rel=1e-6)


def test_an_objective_the_validation_does_not_log_is_refused_before_the_data(tmp_path, capsys):
    """objective.metric=val/los (a typo) trained a whole epoch, then ended in Lightning's
    MisconfigurationException traceback from the checkpoint (walkthrough); then it was refused
    after the sanity check, in every job of a sweep after its data's setup (walkthrough 136).
    litlab's classifier: one line naming what its validation logs, before the data; a module
    of one's own (a subclass that may log more): after the sanity check's batches."""
    cfg = make_cfg(tmp_path, ["objective.metric=val/los", "objective.mode=min", *QUIET])
    said = refused(capsys, train_task, cfg, "objective.metric=val/los is not logged by this")
    assert "(val/loss, val/acc, val/acc_top5, val/acc_best)" in said
    assert "data" not in summary_of(cfg)  # refused before the data were set up
    few = ["objective.metric=val/acc_top5", "objective.mode=max", "data.num_classes=5"]
    refused(capsys, train_task, make_cfg(tmp_path / "few", few), "(val/loss, val/acc, val/acc_b")
    own = ["objective.metric=val/los", "objective.mode=min", "model._target_=helpers.Classifier"]
    cfg = make_cfg(tmp_path / "own", [*own, *QUIET])
    said = refused(capsys, train_task, cfg, "objective.metric=val/los is not logged by this")
    assert "(val/acc, val/acc_top5, val/loss)" in said
    assert not list(Path(cfg.paths.output_dir).rglob("*.ckpt"))
    # val/acc_best, logged from the first epoch on (not in the sanity check), trains (review)
    best = ["objective.metric=val/acc_best", "objective.mode=max", "trainer.max_epochs=1"]
    best += ["+trainer.limit_train_batches=2", "test=false", *QUIET]
    train_task(make_cfg(tmp_path / "best", best))


def test_a_logger_whose_package_is_missing_is_one_line(tmp_path, capsys, monkeypatch):
    """logger=tensorboard without TensorBoard installed (it is not a dependency of litlab's)
    ended in Hydra's InstantiationException traceback."""
    import importlib.util

    real = importlib.util.find_spec
    hidden = ("tensorboard", "tensorboardX")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a)
    )
    cfg = make_cfg(tmp_path, ["logger=tensorboard"])
    refused(capsys, train_task, cfg, "needs tensorboard, not installed: pip install tensorboard")
