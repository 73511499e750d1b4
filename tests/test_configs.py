"""Every option file in conf/ composes and instantiates; the CLI prints help and config."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from conftest import (
    QUIET_CSV,
    REPO,
    make_cfg,
    refused,
    run_cli,
    summary_of,
    write_cifar_batches,
    write_idx_dataset,
    write_png_folder,
)
from litlab.checkpoint import load_checkpoint
from litlab.config import build, check_all
from litlab.data import DataModule
from litlab.errors import ConfigError
from litlab.hardware import check_hardware, cpu_flags, cpu_has_native_bf16, resolve_precision
from litlab.models import GAN, ImageClassifier
from litlab.nets.torchvision_net import weights_from_checkpoint
from litlab.run import build_list
from litlab.train import train_task
from litlab.tune import finder_options

CONF = REPO / "conf"
GROUPS = [
    "hparams_search",
    "data",
    "model",
    "trainer",
    "logger",
    "callbacks",
    "paths",
    "extras",
    "objective",
    "hydra",
    "debug",
    "experiment",
    "tune",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_folder_is_listed_here():
    on_disk = {p.name for p in CONF.iterdir() if p.is_dir()}
    assert on_disk <= set(GROUPS), f"add tests for new config groups: {on_disk - set(GROUPS)}"


def data_fixture(option: str, tmp_path: Path) -> list[str]:
    """Write the real on-disk format a data option reads; return the overrides that point at it."""
    data = tmp_path / "data"
    if option in ("mnist", "fashion_mnist"):
        write_idx_dataset(data)
        return ["data.source.download=false", "data.batch_size=16"] + (
            ["data.source.system_dir=null"] if option == "fashion_mnist" else []
        )
    if option == "cifar10":
        write_cifar_batches(data)
        return ["data.source.download=false", "data.batch_size=16"]
    if option == "image_folder":
        write_png_folder(tmp_path / "images")
        return [
            f"data.source.root={tmp_path / 'images'}",
            f"data.source.cache_dir={tmp_path / 'cache'}",
            "data.num_classes=3",
            "data.batch_size=4",
            "data.num_workers=0",
        ]
    if option == "streaming":
        from litlab.data.optimize import convert

        write_png_folder(tmp_path / "images")
        convert(tmp_path / "images", str(tmp_path / "chunks"), workers=1)
        return [
            f"data.source.input_dir={tmp_path / 'chunks'}",
            "data.num_classes=3",
            "data.batch_size=4",
            "data.num_workers=0",
        ]
    return []


@pytest.mark.parametrize("option", options("data"))
def test_data_option_instantiates_and_loads(option, tmp_path):
    cfg = make_cfg(tmp_path, [f"data={option}", *data_fixture(option, tmp_path)])
    check_all(cfg)
    dm = build(cfg.data, "data")
    assert isinstance(dm, DataModule)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))  # files: and a count of unreadable ones
    images, labels = batch[:2]
    assert images.dtype == torch.uint8 and images.shape[1] == cfg.data.image_shape[0]
    assert int(labels.max()) < cfg.data.num_classes
    # The model reads the image shape and class count from the data config: no number written
    # twice; images stored larger (an image folder's) reach it at that shape.
    model = build(cfg.model, "model")
    x, _ = dm.on_after_batch_transfer(batch, 0)
    assert tuple(x.shape[1:]) == tuple(cfg.data.image_shape) and x.dtype == torch.float32
    assert model(x).shape == (images.shape[0], cfg.data.num_classes)


@pytest.mark.parametrize("option", options("model"))
def test_model_option_instantiates_and_runs(option, tmp_path):
    cfg = make_cfg(tmp_path, [f"model={option}", "data=synthetic", "data.image_shape=[3,32,32]"])
    check_all(cfg)
    model = build(cfg.model, "model")
    if isinstance(model, GAN):
        assert cfg.objective.metric == "val/fid" and "fid" in cfg.callbacks  # the model picks both
        assert model.sample(model.fixed_noise[:2]).shape == (2, 3, 32, 32)
    else:
        assert isinstance(model, ImageClassifier) and cfg.objective.metric == "val/acc"  # data's
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize(
    "overrides, metric, mode",
    [
        ([], "val/loss", "min"),  # digits: 144 validation images, val/acc saturates at 1.0
        (["objective=accuracy"], "val/acc", "max"),  # the command line wins over the data's
        (["data=fashion_mnist"], "val/acc", "max"),
        (["data=synthetic"], "val/acc", "max"),
        (["model=dcgan"], "val/fid", "min"),  # a GAN's, on digits too
        (["experiment=digits_dcgan"], "val/fid", "min"),
        (["model=resnet"], "val/loss", "min"),
    ],
)
def test_the_objective_comes_from_the_model_then_the_data(tmp_path, overrides, metric, mode):
    """What checkpoints, early stopping and sweeps go by, and what every part reading it sees."""
    cfg = make_cfg(tmp_path, overrides)
    assert (cfg.objective.metric, cfg.objective.mode) == (metric, mode)
    assert cfg.callbacks.model_checkpoint.monitor == metric
    assert cfg.callbacks.model_checkpoint.mode == mode


def test_eval_composes_with_a_data_option_that_chooses_an_objective(tmp_path):
    """eval.py data=digits: the digits config overrides the objective group, which eval's
    defaults must hold (Hydra: "Could not override 'objective'") though eval records the
    trained run's objective."""
    cfg = make_cfg(tmp_path, ["ckpt_path=x.ckpt", "data=digits"], config_name="eval")
    assert cfg.data.source._target_ == "litlab.data.Digits"


@pytest.mark.parametrize("given", ["objective=accuracy", "objective=loss"])
def test_eval_refuses_an_objective_it_would_ignore(tmp_path, capsys, given):
    """The slot took objective=... on eval's command line without a word (it records the
    trained run's objective); before the slot, Hydra refused it."""
    from litlab.evaluate import eval_task

    cfg = make_cfg(tmp_path, ["ckpt_path=x.ckpt", given], config_name="eval")
    refused(capsys, eval_task, cfg, f"{given}: eval.py records the objective the run trained")


def test_logger_none_is_a_setting_of_either_task(tmp_path):
    """logger=none set callbacks.lr_monitor=null, which eval.py refused ("callbacks is not a
    setting of the eval task"); the LR monitor is left out of a run without loggers instead."""
    from litlab.config import check_top_level

    for task in ("train", "eval"):
        check_top_level(make_cfg(tmp_path, ["ckpt_path=x.ckpt", "logger=none"], task), task)


@pytest.mark.parametrize(
    "group", ["trainer", "callbacks", "logger", "paths", "extras", "objective", "hydra"]
)
def test_plumbing_options_instantiate(group, tmp_path, caplog):
    for option in options(group):
        cfg = make_cfg(tmp_path, [f"{group}={option}"] if group != "hydra" else [])
        with caplog.at_level("INFO", logger="litlab"):
            resolve_precision(cfg.trainer)  # as the tasks do: precision=auto -> this machine's
        check_all(cfg)
        if group == "trainer" and option in ("gpu", "fsdp") and not torch.cuda.is_available():
            with pytest.raises(
                ConfigError, match=r"has none; on CPU use trainer=|no CUDA GPU; use"
            ):
                check_hardware(cfg.trainer)
            # nothing said of a precision for it before the refusal (walkthrough 142: "32-true
            # (no measured faster precision on accelerator=gpu)", then the refusal)
            assert "trainer.precision" not in caplog.text
            continue
        check_hardware(cfg.trainer)
        callbacks = build_list(cfg.get("callbacks"), "callbacks")
        loggers = build_list(cfg.get("logger"), "logger")
        trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers)
        assert isinstance(trainer, L.Trainer)
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


@pytest.mark.parametrize("option", options("debug") + options("experiment"))
def test_overlays_compose_and_instantiate(option, tmp_path):
    group = "debug" if option in options("debug") else "experiment"
    folder = data_fixture("image_folder", tmp_path) if option.startswith("folder_") else []
    cfg = make_cfg(tmp_path, [f"{group}={option}", *folder])
    resolve_precision(cfg.trainer)
    check_all(cfg)
    build(cfg.data, "data")
    # pretrained weights (folder_finetune): built as a checkpoint's would be, without the
    # download (tests/test_nets.py loads them from torch's cache)
    with weights_from_checkpoint():
        build(cfg.model, "model")
    build(cfg.trainer, "trainer", callbacks=build_list(cfg.callbacks, "callbacks"), logger=False)


def test_experiments_select_their_recipe(tmp_path):
    cfg = make_cfg(tmp_path, ["experiment=fashion_resnet"])
    assert cfg.data.source._target_.endswith("FashionMNIST")
    assert cfg.model.net._target_.endswith("ResNet")
    assert "fashion_mnist" in cfg.tags


def test_eval_config_composes(tmp_path):
    from omegaconf import OmegaConf

    from litlab.evaluate import trained_precision

    cfg = make_cfg(tmp_path, ["ckpt_path=x.ckpt"], config_name="eval")
    assert cfg.trainer.precision == "trained"  # evaluate() puts the run's own in its place
    trained_precision(cfg.trainer, OmegaConf.create({"trainer": {"precision": "bf16-mixed"}}))
    check_all(cfg)
    assert cfg.task_name == "eval" and cfg.get("data") is None
    assert cfg.trainer.precision == "bf16-mixed"


def test_cli_help_lists_groups_and_cfg_prints_config():
    help_text = run_cli("--help")
    assert help_text.returncode == 0, help_text.stderr
    for group in ("data:", "model:", "trainer:", "logger:", "experiment:"):
        assert group in help_text.stdout
    assert (
        "fashion_mnist" in help_text.stdout
        and "python train.py experiment=fashion_resnet" in help_text.stdout
    )
    # eval.py's own (it printed train.py's usage and sweep line: walkthrough 182)
    eval_help = run_cli("--help", script="eval.py")
    assert eval_help.returncode == 0, eval_help.stderr
    assert "Usage: python eval.py ckpt_path=<checkpoint>" in eval_help.stdout
    assert "python train.py" not in eval_help.stdout
    assert "pick one option each" not in eval_help.stdout  # (model=, experiment= refused)
    job = run_cli("--cfg", "job", "data=fashion_mnist", "model=resnet")
    assert job.returncode == 0, job.stderr
    printed = OmegaConf.create(job.stdout)
    assert printed.model.net._target_ == "litlab.nets.ResNet"
    assert printed.data.source._target_ == "litlab.data.FashionMNIST"


@pytest.mark.parametrize("option", options("hparams_search"))
def test_search_spaces_compose_with_the_optuna_sweeper(option, tmp_path):
    cfg = make_cfg(tmp_path, [f"hparams_search={option}"])
    check_all(cfg)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.sampler.seed == cfg.seed
    assert sweeper.direction == {"max": "maximize", "min": "minimize"}[cfg.objective.mode]
    assert sweeper.storage.startswith("sqlite:///") and sweeper.params
    for key in sweeper.params:  # every searched key exists in the composed config
        assert OmegaConf.select(cfg, key, default="missing") != "missing", key
    build(cfg.model, "model")


@pytest.mark.parametrize("option", options("tune"))
def test_tune_options_compose(option, tmp_path):
    cfg = make_cfg(tmp_path, [f"tune={option}"])
    check_all(cfg)
    assert cfg.tune.batch_size is False and cfg.tune.lr is False  # the finders are opt-in
    for finder in ("batch_size_finder", "lr_finder"):  # arguments of Lightning's Tuner
        assert finder_options(cfg, finder) == OmegaConf.to_container(cfg.tune[finder])


@pytest.mark.parametrize("option", options("model/scheduler"))
def test_every_lr_schedule_option_trains(option, tmp_path):
    cfg = make_cfg(
        tmp_path,
        [
            f"model/scheduler={option}",
            "model.net.width=8",
            "trainer.max_epochs=2",
            "trainer.check_val_every_n_epoch=2",  # plateau steps after validations only
            "test=false",
            "logger=csv",
            "extras.print_config=false",
            "callbacks.progress_bar=null",
        ],
    )
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"


@pytest.mark.parametrize(
    ("option", "limits"),
    [
        ("cosine", ["trainer.max_steps=60", "trainer.max_epochs=20"]),
        ("cosine", ["trainer.max_steps=60", "trainer.max_epochs=-1"]),
        ("cosine", ["trainer.max_steps=50"]),  # into a third epoch
        ("one_cycle", ["trainer.max_steps=60", "trainer.max_epochs=20"]),
    ],
)
def test_a_schedule_stepped_every_epoch_ends_where_max_steps_ends_the_run(option, limits, tmp_path):
    """model.scheduler_interval=epoch with trainer.max_steps: the schedule runs over the epochs
    that the steps reach into (digits: 20 batches an epoch, 60 steps: 3 epochs), not over
    max_epochs (before: T_max=20, the LR barely lowered at the run's end; -1: T_max=-1)."""
    cfg = make_cfg(
        tmp_path,
        [
            f"model/scheduler={option}",
            "model.scheduler_interval=epoch",
            *limits,
            "model.net.width=8",
            "test=false",
            *QUIET_CSV,
        ],
    )
    train_task(cfg)
    saved = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    schedule = saved["lr_schedulers"][0]
    assert schedule.get("T_max", schedule.get("total_steps")) == 3
    if option == "cosine" and saved["global_step"] == 60:  # three epoch ends: at eta_min
        assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.0)


def test_recipes_ask_for_the_fastest_precision_this_machine_runs_natively(tmp_path):
    for option in options("experiment"):
        assert make_cfg(tmp_path, [f"experiment={option}"]).trainer.precision == "auto", option
    cfg = make_cfg(tmp_path, ["experiment=fashion_fast", "trainer.accelerator=cpu"])
    chosen = resolve_precision(cfg.trainer)
    native = cpu_has_native_bf16()
    assert cfg.trainer.precision == chosen["chosen"] == ("bf16-mixed" if native else "32-true")
    assert chosen["requested"] == "auto" and chosen["why"]
    # litlab reads /proc/cpuinfo; torch's own probes agree
    probes = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    if cpu_flags() is not None:
        assert native == probes


def test_your_own_net_from_your_own_module(tmp_path, monkeypatch):
    """README's bring-your-own-net line: a class on PYTHONPATH, named on the command line."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # tiny_mlp.TinyMLP, a user's module
    cfg = make_cfg(
        tmp_path,
        [
            "data=synthetic",
            "data.image_shape=[1,28,28]",
            "model/net=custom",
            "model.net._target_=tiny_mlp.TinyMLP",
            "trainer.max_epochs=1",
            "logger=csv",
            "extras.print_config=false",
            "callbacks.progress_bar=null",
        ],
    )
    assert set(cfg.model.net) == {"_target_"}  # nothing of the default net is left over
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"


def test_your_own_net_with_lazy_layers_trains_and_evaluates(tmp_path, capsys):
    """A net written with nn.LazyConv2d/LazyBatchNorm2d/LazyLinear (walkthrough 136: the run
    failed in a traceback, "Attempted to use an uninitialized parameter", in the throughput
    callback) is sized for the data's images before anything reads its parameters: weight
    decay's grouping by shape too (an unsized weight reads as 1-D: it went undecayed), and
    eval.py of its checkpoint tests it as the run did (eval.py sizes the net before loading
    the weights; torch's lazy load hook would size it from the state dict alone too)."""
    from litlab.evaluate import eval_task

    args = ["data=synthetic", "data.image_shape=[1,12,12]", "model/net=custom"]
    args += ["model.net._target_=helpers.LazyNet", "model.decay_norm_and_bias=false"]
    args += ["trainer.max_epochs=1", "trainer.max_steps=3", "model.scheduler=null", *QUIET_CSV]
    cfg = make_cfg(tmp_path, args)
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary.get("error")
    checkpoint = load_checkpoint(summary["best_checkpoint"])
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    sizes = {g["name"]: len(g["params"]) for g in groups}
    # decayed: the conv kernel and the linear weight; spared: conv bias, BN scale and shift,
    # linear bias
    assert sizes == {"decay": 2, "no_decay": 4}
    assert checkpoint["state_dict"]["net.head.1.weight"].shape == (10, 8 * 4 * 4)
    tested = summary["metrics"]["test/acc"]
    capsys.readouterr()
    ckpt = summary["best_checkpoint"]
    evaluated = make_cfg(tmp_path / "eval", [f"ckpt_path={ckpt}"], config_name="eval")
    assert eval_task(evaluated) == pytest.approx(tested, abs=1e-7)

    unreached = make_cfg(tmp_path / "b", [*args, "+model.net.reach_all=false"])
    refused(capsys, train_task, unreached, "lazy layers are still unsized after one forward")


def test_a_gan_of_lazy_nets_trains_its_ema_from_the_sized_generator(tmp_path):
    """A GAN whose generator and discriminator have lazy layers: its EMA generator, a copy of
    the generator, could not be made of unsized layers (the model failed to build: review
    138); it is made once they are sized, with the generator's weights. A submodule the user
    keeps in eval mode stays so through the sizing; wgan_gp refuses a lazy batch norm in D as
    it refuses any other."""
    from litlab.config import build_model
    from litlab.models.lazy import has_lazy_tensors

    args = ["model=dcgan", "data=synthetic", "data.image_shape=[1,8,8]", "~model.generator"]
    args += ["+model.generator._target_=helpers.LazyGenerator"]
    args += ["+model.generator.image_shape=${data.image_shape}", "~model.discriminator"]
    args += ["+model.discriminator._target_=helpers.LazyNet", "+model.discriminator.num_classes=1"]
    args += ["+model.discriminator.frozen=true", "data.source.train_size=256"]
    args += ["data.batch_size=32", "trainer.max_epochs=1", "trainer.max_steps=2", "test=false"]
    cfg = make_cfg(tmp_path, [*args, *QUIET_CSV])
    model = build_model(cfg.model, build(cfg.data, "data"))
    assert not has_lazy_tensors(model)
    generator, average = model.generator.state_dict(), model.generator_ema.module.state_dict()
    assert generator.keys() == average.keys()
    assert all(torch.equal(generator[k], average[k]) for k in generator)
    assert not model.discriminator.body[1].training and model.discriminator.head.training
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"
    with pytest.raises(ConfigError, match="batch norm in the discriminator"):
        build(make_cfg(tmp_path / "w", [*args, "model.loss=wgan_gp"]).model, "model")


def test_your_own_net_must_be_named(tmp_path):
    cfg = make_cfg(tmp_path, ["model/net=custom"])
    with pytest.raises(ConfigError, match=r"model.net._target_ must be set"):
        check_all(cfg)


def test_epochs_that_train_after_the_last_validation_are_named(tmp_path, caplog):
    """best.ckpt (what the test measures) cannot come from epochs trained after the last
    validation: the run says how many there are (check_val_every_n_epoch=2, max_epochs=3)."""
    from litlab.config import check_objective

    cfg = make_cfg(tmp_path, ["trainer.max_epochs=3", "trainer.check_val_every_n_epoch=2"])
    with caplog.at_level("WARNING", logger="litlab"):
        check_objective(cfg)
    assert "the last 1 epoch(s) train without validation" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        check_objective(
            make_cfg(tmp_path, ["trainer.max_epochs=4", "trainer.check_val_every_n_epoch=2"])
        )
    assert "without validation" not in caplog.text


@pytest.mark.parametrize(
    ("trained", "on_cpu"),
    [
        ("16-true", "16-true"),
        ("16-mixed", "32-true"),
        ("16", "32-true"),
        ("bf16-true", "bf16-true"),
    ],
)
def test_eval_tests_in_the_trained_precision_where_this_machine_runs_it(tmp_path, trained, on_cpu):
    """eval.py on a CPU: float16 autocast (16-mixed) runs on GPUs only and becomes 32-true;
    16-true runs on a CPU (emulated), as the run did, and stays (it became 32-true: other
    figures than the run's)."""
    from omegaconf import OmegaConf

    from litlab.evaluate import trained_precision

    cfg = make_cfg(tmp_path, ["ckpt_path=x.ckpt", "trainer.accelerator=cpu"], config_name="eval")
    trained_precision(cfg.trainer, OmegaConf.create({"trainer": {"precision": trained}}))
    assert cfg.trainer.precision == on_cpu


def test_readme_concepts_table_names_every_config_group_and_option():
    """README's Concepts table is how users learn what they can pick: every group folder under
    conf/ and every option file in it is named there (a group added without a row, or an
    option without its name, fails here)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Concepts", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    rows = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for group in cells[0].replace("`", "").split(","):
            rows[group.strip()] = cells[1]
    missing = []
    for folder in sorted(p for p in CONF.rglob("*") if p.is_dir() and any(p.glob("*.yaml"))):
        group = folder.relative_to(CONF).as_posix()
        if group not in rows:
            missing.append(f"group {group}")
            continue
        for option in sorted(folder.glob("*.yaml")):
            if f"`{option.stem}`" not in rows[group]:
                missing.append(f"{group}={option.stem}")
    assert not missing, f"README's Concepts table lacks: {missing}"


@pytest.mark.parametrize("precision", ["16-mixed", "16", "16-true"])
def test_float16_on_a_cpu_is_warned_of_only_where_it_runs(precision, caplog):
    """16-mixed on a CPU was warned of as emulated (naming bf16's slowdown), then refused: two
    contradicting lines. Refused precisions (float16 autocast) get the refusal alone."""
    trainer = OmegaConf.create({"precision": precision, "accelerator": "cpu"})
    with caplog.at_level("WARNING", logger="litlab"):
        resolve_precision(trainer)
    warned = any("torch emulates it" in r.getMessage() for r in caplog.records)
    assert warned == (precision == "16-true")  # it runs there, emulated


def test_the_summarys_precision_says_what_ran_and_why():
    """summary.json's precision: an explicit one emulated on this CPU says so; null is
    Lightning's default, 32-true (it read "None": walkthrough 178)."""
    cpu = {"accelerator": "cpu"}
    emulated = resolve_precision(OmegaConf.create({**cpu, "precision": "16-true"}))
    assert emulated == {"requested": "16-true", "chosen": "16-true", "why": "as configured, "
                        "emulated on this CPU"}  # fmt: skip
    null = OmegaConf.create({**cpu, "precision": None})
    default = resolve_precision(null)
    assert default["chosen"] == "32-true" and default["why"] == "as configured"
    assert null.precision == "32-true"  # kept so: eval's "trained" read "None" (review 180)


def test_a_source_of_your_own_replaces_the_data_options_and_trains(tmp_path):
    """data.source._target_=<your class> alone keeps the data option's source keys (walkthrough
    173's model.net case, for sources): said, with the way to start from none ("known options: "
    with nothing after it before); removing the node leaves data.image_shape's
    ${data.source.size} unresolved: said in one line (OmegaConf's three, naming no fix)."""
    own = ["data.num_classes=3", "data.batch_size=16", "trainer.max_epochs=1", *QUIET_CSV]
    kept = make_cfg(tmp_path / "a", [*own, "data.source._target_=helpers.Ramp"])
    with pytest.raises(ConfigError) as told:
        check_all(kept)
    assert str(told.value) == (
        "data.source.size is not an option of helpers.Ramp; helpers.Ramp takes none (size came "
        "with the data option, which data.source._target_ alone keeps: for a source of your "
        "own, '~data.source' '+data.source={_target_: helpers.Ramp}')"
    )
    mine = [*own, "~data.source", "+data.source={_target_: helpers.Ramp}"]
    with pytest.raises(ConfigError) as told:
        check_all(make_cfg(tmp_path / "b", mine))
    assert str(told.value) == (
        "data.image_shape[1] is set from data.source.size, which is not in the config: set "
        "data.image_shape yourself (or +data.source.size=...)"
    )
    cfg = make_cfg(tmp_path / "c", [*mine, "data.image_shape=[1,8,8]"])
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"


def test_float16_weights_train_with_the_eps_their_refusal_names(tmp_path):
    """trainer.precision=16-true with AdamW's default eps (1e-8: 0 in float16) diverged at
    step 20 and blamed the learning rate; it is refused (test_bad_input), and the eps the
    refusal names trains: a finite loss that falls."""
    args = ["trainer.precision=16-true", "+model.optimizer.eps=1e-4", "trainer.max_epochs=2"]
    cfg = make_cfg(tmp_path, [*args, *QUIET_CSV])
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary.get("error")
    assert summary["precision"]["chosen"] == "16-true"
    assert math.log(10) > summary["metrics"]["val/loss"] > 0
