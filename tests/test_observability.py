"""Throughput, MFU, memory, profiling and the batch-size / LR finders, on CPU."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count
from omegaconf import OmegaConf
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from conftest import QUIET as FAST
from conftest import TINY_GAN, bare_trainer, make_cfg, refused, summary_of
from litlab.callbacks import ModelSummary
from litlab.callbacks.monitor import mfu, peak_flops, training_flops_per_image
from litlab.config import build
from litlab.errors import ConfigError, OutOfMemory
from litlab.train import train_task
from litlab.tune import oom_message, out_of_memory_explained, tune
from wandb_records import offline_run

PERF = [
    "perf/train_images_per_s",
    "perf/train_batches_per_s",
    "perf/val_images_per_s",
    "perf/test_images_per_s",
    "perf/flops_per_image",
    "mem/rss_gb",
]


def csv_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_every_run_logs_throughput_and_memory(tmp_path):
    cfg = make_cfg(tmp_path, ["logger=wandb", "trainer.max_epochs=2", *FAST])
    train_task(cfg)
    run_dir = Path(cfg.paths.output_dir)
    rows = csv_rows(run_dir)
    for name in PERF:
        assert any(row.get(name) for row in rows), name
    epochs = [row for row in rows if row.get("perf/train_images_per_s")]
    assert len(epochs) == 2 and all(float(r["perf/train_images_per_s"]) > 0 for r in epochs)
    assert "perf/mfu" not in rows[0]  # CPU: no peak FLOPs, images/s only

    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    logged = {key for row in offline_run(wandb_dir)["history"] for key in row}
    assert set(PERF) <= logged

    summary = summary_of(cfg)
    perf, memory = summary["perf"], summary["memory"]
    # one figure per name: the whole run's, not also the last epoch's among the metrics
    assert not [k for k in summary["metrics"] if k.startswith(("perf/", "mem/"))]
    assert perf["device"] == "cpu" and perf["precision"] == "32-true"
    for stage in ("train", "val", "test"):
        assert perf[f"{stage}_images_per_s"] > 0
    assert perf["train_batches_per_s"] > 0 and perf["mfu"] is None and perf["peak_flops"] is None
    net = build(cfg.model.net, "model.net")
    assert perf["flops_per_image"] == training_flops_per_image(net, torch.zeros(1, 1, 28, 28))
    assert 0.05 < memory["rss_gb"] < 64 and "peak_allocated_gb" not in memory


def test_a_runs_peak_rss_is_its_own_not_an_earlier_jobs_in_the_process(tmp_path):
    """A sweep's jobs run in one process, where getrusage's peak RSS is the process's: each
    job reported the largest peak of the jobs before it. Since Linux lets it start again from
    the current RSS, mem/rss_gb is the run's own there."""
    import numpy as np

    from litlab.callbacks.monitor import reset_rss_peak, rss_gb

    if not reset_rss_peak():
        pytest.skip("this OS keeps no resettable peak RSS (/proc/self/clear_refs)")
    transient = np.ones(2**30 // 8)  # 1 GiB touched, then given back, as an earlier job's
    del transient
    before = rss_gb()
    cfg = make_cfg(tmp_path, ["logger=csv", "trainer.max_epochs=1", *FAST])
    train_task(cfg)
    assert summary_of(cfg)["memory"]["rss_gb"] < before - 0.5


def test_training_throughput_counts_training_only(tmp_path):
    """The training clock runs in training batches and stops for validation (a GAN's FID runs
    at its end) and checkpoint saves, whichever the order of the callbacks' hooks."""
    from helpers import ProbeTrainingClock

    probe = ["+callbacks.probe._target_=helpers.ProbeTrainingClock"]
    cfg = make_cfg(tmp_path, ["model.net.width=8", "trainer.max_epochs=2", *FAST, *probe])
    train_task(cfg)
    seen = ProbeTrainingClock.last
    assert seen["batch"] and all(seen["batch"])
    assert len(seen["validation end"]) == 2 and not any(seen["validation end"])
    assert len(seen["saving"]) >= 4 and not any(seen["saving"])


def test_flop_count_matches_the_analytic_count():
    # Linear a->b, ReLU, Linear b->c (no bias), n images: the forward is 2n(ab + bc); the
    # backward computes both weight gradients (2n(ab + bc)) and the input gradient of the
    # second layer only (2n bc): the images need none.
    a, b, c, n = 12, 7, 5, 4
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(a, b, bias=False), nn.ReLU(), nn.Linear(b, c, bias=False)
    )
    flops = training_flops_per_image(net, torch.zeros(n, 1, 3, 4))
    assert flops == 2 * (a * b + b * c) + 2 * (a * b + b * c) + 2 * b * c
    # A 3x3 convolution 1->4 channels on 8x8 (6x6 out): forward and weight gradient only.
    conv = nn.Conv2d(1, 4, 3, bias=False)
    assert training_flops_per_image(conv, torch.zeros(2, 1, 8, 8)) == 2 * (2 * 9 * 4 * 36)
    assert all(p.device.type == "cpu" and p.grad is None for p in conv.parameters())


def counted_forward(net: nn.Module, example: torch.Tensor) -> int:
    """FLOPs of a real forward pass of the real net: the reference for the summary's count."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        net.eval()(example)
    return counter.get_total_flops()


class Uncopyable(nn.Parameter):
    """A weight whose copy fails: what counts FLOPs must not copy weights."""

    def __deepcopy__(self, memo):
        raise AssertionError("a weight was copied")


def test_flops_are_counted_on_a_copy_that_holds_no_weights():
    """The meta copies were deepcopies of the net moved to meta: every weight copied once on
    its device (a GPU's memory) for each callback counting FLOPs, and the count waited on it."""
    from litlab.callbacks.summary import meta_copy

    net = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 26 * 26, 10)
    )
    net[0].weight = Uncopyable(net[0].weight.detach())
    net[3].weight.requires_grad_(False)
    copied = meta_copy(net)
    assert all(t.is_meta for t in [*copied.parameters(), *copied.buffers()])
    assert [p.requires_grad for p in copied.parameters()] == [
        p.requires_grad for p in net.parameters()
    ]
    assert not any(t.is_meta for t in [*net.parameters(), *net.buffers()])  # the net untouched
    images = torch.zeros(2, 1, 28, 28)
    with FlopCounterMode(display=False) as counter:
        net(images).sum().backward()
    assert training_flops_per_image(net, images) == counter.get_total_flops() / 2


@pytest.mark.parametrize("family", ["classifier", "gan"])
def test_the_model_summary_counts_each_nets_forward_pass(tmp_path, capsys, family):
    """Lightning's summary counts FLOPs only with an example_input_array (litlab's modules have
    none: it printed 0 on every row); litlab's counts one example through each net, on meta
    copies: the same numbers as a real forward, every row, and the total their sum."""
    small = ["model.net.width=8"] if family == "classifier" else TINY_GAN
    cfg = make_cfg(tmp_path, small)
    summary = ModelSummary(max_depth=2)
    trainer = bare_trainer(
        accelerator="cpu",
        max_steps=1,
        callbacks=[summary],
        enable_model_summary=True,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    model, data = build(cfg.model, "model"), build(cfg.data, "data")
    trainer.fit(model, data)
    image = torch.zeros(1, *data.image_shape)
    if family == "classifier":
        nets = {"net": (model.net, image)}
    else:
        noise = torch.zeros(1, model.latent_dim)
        nets = {
            "generator": (model.generator, noise),
            "discriminator": (model.discriminator, image),
            "generator_ema": (model.generator_ema, noise),
        }
    # the real nets untouched (meta copies were counted)
    assert all(p.device.type == "cpu" for net, _ in nets.values() for p in net.parameters())
    expected = {name: counted_forward(net, x) for name, (net, x) in nets.items()}
    assert {name: summary.flops[name] for name in nets} == expected and all(expected.values())
    # a row below a net: its own share (max_depth=2), the net's rows adding up to the net
    first = next(iter(nets))
    children = {
        k: v for k, v in summary.flops.items() if k.count(".") == 1 and k.split(".")[0] == first
    }
    assert children and sum(children.values()) == expected[first]
    printed = capsys.readouterr().out
    total = get_human_readable_count(sum(expected.values()))
    assert f"Total FLOPs: {total}" in printed and "Total FLOPs: 0" not in printed


def test_throughput_counts_a_batchs_images_as_lightning_does():
    from lightning.pytorch.utilities.data import extract_batch_size

    from litlab.callbacks.monitor import images_in

    x, y = torch.zeros(7, 1, 8, 8), torch.zeros(7).long()
    for batch in ((x, y), [x, y], x, {"image": x, "label": y}, (torch.tensor(3.0), x)):
        assert images_in(batch) == extract_batch_size(batch)
    assert images_in((x, y)) == 7


def test_mfu_is_achieved_over_peak_flops():
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == 989.4e12
    assert mfu(24.3e9, 5000.0, peak) == pytest.approx(24.3e9 * 5000.0 / 989.4e12)
    assert peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert peak_flops("NVIDIA L40S", "bf16") == 362e12  # not the L4's
    assert peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_flops("Tesla T4", "bf16") is None  # no bfloat16 tensor cores
    assert peak_flops("Some Future GPU", "bf16") is None
    # names as CUDA reports them: a model name whole, a letter after it (A10G) but no digit
    assert peak_flops("NVIDIA RTX A1000 6GB Laptop GPU", "bf16") is None  # not an A100
    assert peak_flops("NVIDIA A10G", "bf16") == peak_flops("NVIDIA A10", "bf16") == 125e12
    assert peak_flops("Tesla V100-SXM2-32GB", "fp16") == 125e12
    assert peak_flops("Tesla V100-SXM3-32GB", "fp16") == 125e12
    assert peak_flops("Tesla V100-PCIE-16GB", "fp16") == 112e12
    assert peak_flops("NVIDIA L4", "bf16") == 121e12 and peak_flops("NVIDIA L40", "fp32") == 90.5e12
    # a MIG slice has a share of the GPU's peak, which the table does not know
    assert peak_flops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16") is None


def test_a_cpu_runs_float32_arithmetic_whatever_torchs_tf32_flags_say():
    """TF32 is a GPU's (Ampere and newer); torch refuses to read its legacy TF32 flags once its
    per-backend ones set them apart, which stopped every 32-true run in Throughput's setup."""
    from litlab.callbacks.monitor import compute_precision

    cpu = torch.device("cpu")
    before = torch.backends.cudnn.conv.fp32_precision
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # TF32 off for convolutions, the new way
    try:
        assert compute_precision("32-true", cpu) == "fp32"
        assert compute_precision("bf16-mixed", cpu) == "bf16"
    finally:
        torch.backends.cudnn.conv.fp32_precision = before


def test_out_of_memory_becomes_one_line():
    line = oom_message(4096, 78.3, 79.6, "32-true")
    assert "data.batch_size=4096" in line and "peak 78.3 GB allocated of 79.6 GB" in line
    assert "tune.batch_size=true" in line and "trainer.precision=bf16-mixed" in line
    assert "\n" not in line
    assert "already bf16-mixed" in oom_message(8, 1.0, None, "bf16-mixed")

    class Stub:
        precision = "32-true"
        strategy = type("S", (), {"root_device": torch.device("cpu")})()

    expected = r"data.batch_size=64 \(peak .* GB allocated\); try"
    with pytest.raises(OutOfMemory, match=expected), out_of_memory_explained(64, Stub()):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(ValueError), out_of_memory_explained(64, Stub()):
        raise ValueError("not memory")


def test_profile_writes_a_chrome_trace_of_three_training_steps(tmp_path):
    """Over several epochs Lightning's schedule reached its window again on validation steps:
    a second trace (named after training_step) of a validation epoch, 4-5 steps in the table,
    and torch's profiler crashing (SIGSEGV) in about half the runs."""
    cfg = make_cfg(tmp_path, ["debug=profile", "logger=csv", *FAST, "trainer.max_epochs=3"])
    train_task(cfg)
    folder = Path(cfg.paths.output_dir) / "profiler"
    traces = list(folder.glob("*.pt.trace.json"))
    assert len(traces) == 1, list(folder.iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = [e.get("name", "") for e in events]
    assert sum(n.startswith("ProfilerStep#") for n in names) == 3
    assert any("training_step" in n for n in names)
    assert not any("validation_step" in n for n in names)
    assert "Self CPU" in (folder / "fit-profile.txt").read_text()


def test_finders_write_their_values_into_the_saved_config(tmp_path):
    run = ["trainer.max_epochs=1", *FAST]
    cfg = make_cfg(
        tmp_path / "tuned",
        [
            *run,
            "logger=wandb",
            "tune.batch_size=true",
            "tune.batch_size_finder.init_val=16",
            "tune.batch_size_finder.max_trials=3",  # 16, 32, 64: each one tried
            "tune.lr=true",
            "tune.lr_finder.num_training=30",
        ],
    )
    run_dir = Path(cfg.paths.output_dir)
    (run_dir / ".hydra").mkdir(parents=True)  # as Hydra writes it before the task starts
    saved_path = run_dir / ".hydra" / "config.yaml"
    OmegaConf.save(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), saved_path)
    train_task(cfg)

    summary = summary_of(cfg)
    tuned = summary["tuned"]
    assert tuned["batch_size"] == 64 and 1e-8 < tuned["lr"] < 1.0
    assert Path(tuned["lr_plot"]) == run_dir / "lr_find.png" and (run_dir / "lr_find.png").is_file()
    checkpoint = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    logged = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    for config in (checkpoint["hyper_parameters"], logged):
        assert config["data"]["batch_size"] == 64
        assert config["model"]["optimizer"]["lr"] == tuned["lr"]
        assert config["model"]["scheduler"]["max_lr"] == tuned["lr"]  # ${model.optimizer.lr}
        assert config["tune"]["batch_size"] is False and config["tune"]["lr"] is False
    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    record = offline_run(wandb_dir)
    assert record["config"]["data.batch_size"] == 64
    assert record["config"]["model.optimizer.lr"] == tuned["lr"]
    logged_keys = {key for row in record["history"] for key in row}
    assert "tune/lr_find/_type" in logged_keys  # the plot, as a W&B image
    saved = OmegaConf.load(saved_path)  # what resume=<run folder> starts from
    assert saved.data.batch_size == 64 and saved.model.optimizer.lr == tuned["lr"]
    assert saved.model.scheduler.max_lr == tuned["lr"] and not saved.tune.lr

    # The values alone reproduce the tuned run exactly: tuning left no trace but them.
    again = make_cfg(
        tmp_path / "again",
        [*run, "logger=csv", "data.batch_size=64", f"model.optimizer.lr={tuned['lr']!r}"],
    )
    train_task(again)
    assert summary_of(again)["metrics"]["test/loss"] == summary["metrics"]["test/loss"]


def test_a_range_test_whose_loss_never_fell_suggests_no_rate(tmp_path, caplog):
    """tune.lr suggested a rate from the longest falling run of a loss that never fell (the
    run's noise; walkthrough 160): here every rate tried is too small to learn anything. The
    configured rate is kept, and why said."""
    cfg = make_cfg(
        tmp_path,
        [
            "tune.lr=true",
            "tune.lr_finder.max_lr=1e-7",
            "tune.lr_finder.num_training=20",
            "logger=csv",
            *FAST,
        ],
    )
    configured = cfg.model.optimizer.lr
    with caplog.at_level("WARNING", logger="litlab"):
        found = tune(cfg, Path(cfg.paths.output_dir))
    assert "lr" not in found and cfg.model.optimizer.lr == configured
    assert (
        "tune.lr: the range test's loss never fell by 2% at any rate from 1e-08 to 1e-07"
        in caplog.text
    )
    assert f"keeping model.optimizer.lr={configured}" in caplog.text


@pytest.mark.parametrize(
    ("switch", "given"),
    [("tune.lr=true", "model.optimizer.lr=0.5"), ("tune.batch_size=true", "data.batch_size=32")],
)
def test_a_finder_refuses_a_value_also_given(tmp_path, capsys, switch, given):
    """tune.lr=true model.optimizer.lr=0.5 trained with the lr found while the run's overrides
    (and a sweep's sampler) said 0.5; now one clear line, before any search."""
    cfg = make_cfg(tmp_path, [switch, given, "logger=csv", *FAST])
    refused(capsys, train_task, cfg, f"which is also given ({given})")
    assert summary_of(cfg)["status"] == "failed" and "tuned" not in summary_of(cfg)


def test_gan_batch_size_scales_and_lr_finder_refuses(tmp_path, capsys):
    cfg = make_cfg(
        tmp_path / "bs",
        [
            *(a for a in TINY_GAN if not a.startswith("data.batch_size=")),  # the finder's
            "tune.batch_size=true",
            "tune.batch_size_finder.init_val=8",
            "tune.batch_size_finder.max_trials=2",
        ],
    )
    assert tune(cfg, Path(cfg.paths.output_dir)) == {"batch_size": 16}
    assert cfg.data.batch_size == 16 and cfg.tune.batch_size is False

    cfg = make_cfg(tmp_path / "lr", [*TINY_GAN, "tune.lr=true", "logger=csv", *FAST])
    with pytest.raises(SystemExit) as exit_info:
        train_task(cfg)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("litlab: error: tune.lr") and "manual optimization" in line
    assert summary_of(cfg)["status"] == "failed"


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["tune.lr_finder.mode=cosine"], "tune.lr_finder.mode must be exponential or linear"),
        (["+tune.lr_finder.nope=1"], "tune.lr_finder.nope is not an option of Tuner.lr_find"),
        (["tune.batch_size_finder.steps_per_trial=0"], "must be at least 1"),
        (["trainer.devices=2", "trainer.strategy=ddp"], "run on one device"),
    ],
)
def test_bad_tune_settings_are_one_line(tmp_path, overrides, needle):
    cfg = make_cfg(tmp_path, ["tune.lr=true", *overrides])
    with pytest.raises(ConfigError, match=needle):
        tune(cfg, tmp_path)


@pytest.mark.parametrize(
    ("extra", "found"),
    [
        ([], 1294),
        (["tune.lr_finder.num_training=10"], 1294),
        (["+trainer.limit_train_batches=0.5"], 647),
    ],
)
def test_the_batch_size_finder_stops_at_the_training_split(tmp_path, caplog, extra, found):
    """README: on a CPU the search ends at the split, 1294 digits (Lightning's power search
    doubles to 2048 and reloads the data before it checks max_val). Its trials all step the
    one-cycle schedule, built for the throwaway trainer's max_steps: with the LR range test's
    10 steps as that, the 11th step raised a ValueError (reviewer). Half an epoch of one batch
    is refused by Lightning: with limit_train_batches=0.5 the cap is half the split. An epoch
    of one batch is said (walkthrough 160: only the size was)."""
    overrides = ["trainer.max_epochs=1", "tune.batch_size=true", "test=false", *extra]
    overrides += ["model.net.width=4"]  # the cap is the split's size, not the net's
    cfg = make_cfg(tmp_path, [*overrides, *FAST])
    with caplog.at_level("INFO", logger="litlab"):
        train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed" and summary["tuned"]["batch_size"] == found
    batches = 1  # (of 2 at 647, trainer.limit_train_batches=0.5 trains one)
    assert f"data.batch_size={found}: {batches} batch(es) an epoch of the 1294 " in caplog.text
    assert f"data.batch_size={found} leaves {batches} batch(es) an epoch" in caplog.text
    assert not list(Path(cfg.paths.output_dir).glob(".scale_batch_size_*.ckpt"))


def test_lightnings_batch_size_line_gives_way_to_litlabs():
    """Lightning's "will continue with full run using batch size 2048" beside litlab's "found
    data.batch_size=1294" (the cap at the digits' training split) told a user two sizes."""
    import inspect

    import lightning.pytorch.tuner.batch_size_scaling as scaling

    import litlab.tune  # noqa: F401  (installs the filter)

    line = "Finished batch size finder, will continue with full run using batch size"
    assert line in inspect.getsource(scaling)  # what Lightning says, where it says it
    logger = logging.getLogger(scaling.__name__)
    said = logging.LogRecord(scaling.__name__, logging.INFO, "", 0, f"{line} 2048", None, None)
    other = logging.LogRecord(
        scaling.__name__, logging.INFO, "", 0, "Batch size 4 succeeded", None, None
    )
    assert not logger.filter(said) and logger.filter(other)


def test_the_lr_finder_suggests_a_rate_that_trains(tmp_path):
    """The default CNN on digits: Lightning's own suggestion (its steepest slope against the
    learning rate itself) was 3.6e-6, and the run stayed at chance (test/acc 0.08)."""
    cfg = make_cfg(tmp_path, ["trainer.max_epochs=2", "tune.lr=true", *FAST])
    train_task(cfg)
    summary = summary_of(cfg)
    assert 1e-3 <= summary["tuned"]["lr"] <= 3e-2 and summary["metrics"]["test/acc"] > 0.9


def test_the_valley_is_half_way_along_the_longest_fall_of_the_loss():
    """fastai's valley: the smoothed loss rises at first (the smoothing's start), falls over
    the longest stretch, then blows up; the suggestion lies half way along the fall."""
    from litlab.tune import longest_fall, valley

    losses = [1.4 + i * 0.04 for i in range(30)] + [2.6 - i * 0.015 for i in range(60)]
    losses += [2.0 + i * 0.5 for i in range(9)] + [float("nan")]
    fall = longest_fall(losses)
    assert (fall[0], fall[-1]) == (30, 89)  # the fall runs from point 30 to 89
    assert valley(fall) == 29 + 30


def test_the_lr_is_logged_at_the_schedules_own_interval(tmp_path):
    """A per-step schedule's LR is in the logs every log_every_n_steps (the one-cycle warm-up is
    a curve, not one point an epoch); a per-epoch one's (plateau) once an epoch."""
    base = ["logger=csv", "data.batch_size=32", "trainer.max_epochs=2", *FAST]
    step_cfg = make_cfg(tmp_path / "step", [*base, "trainer.log_every_n_steps=5"])
    train_task(step_cfg)
    lrs = {
        int(r["step"]): float(r["lr-AdamW"])
        for r in csv_rows(Path(step_cfg.paths.output_dir))
        if r.get("lr-AdamW")
    }
    steps = sorted(lrs)
    per_epoch = max(int(r["step"]) for r in csv_rows(Path(step_cfg.paths.output_dir))) // 2
    assert len([s for s in steps if s < per_epoch]) >= 4, lrs
    warm_up = [lrs[s] for s in steps if s <= 0.25 * 2 * per_epoch]
    assert len(warm_up) >= 2 and warm_up == sorted(warm_up) and warm_up[0] < warm_up[-1], lrs

    epoch_cfg = make_cfg(tmp_path / "epoch", [*base, "model/scheduler=plateau"])
    train_task(epoch_cfg)
    rows = [r for r in csv_rows(Path(epoch_cfg.paths.output_dir)) if r.get("lr-AdamW")]
    assert len(rows) == 2, rows


def test_a_logging_step_is_one_wandb_row_with_its_learning_rate(tmp_path):
    """Lightning's LR monitor hands a logging step's rates to the loggers at the batch's start,
    Lightning the step's metrics at its end: one W&B row (one call) for both, the same values."""
    cfg = make_cfg(
        tmp_path,
        [
            "logger=wandb",
            "data.batch_size=32",
            "trainer.max_epochs=1",
            "trainer.log_every_n_steps=5",
            *FAST,
        ],
    )
    train_task(cfg)
    (run,) = (Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*")
    rows = [r for r in offline_run(run)["history"] if "train/loss_step" in r or "lr-AdamW" in r]
    steps = [r["trainer/global_step"] for r in rows]
    assert len(rows) >= 5 and len(steps) == len(set(steps)), steps
    assert all("lr-AdamW" in r and "train/loss_step" in r for r in rows), rows
    csv_lr = {
        int(r["step"]): float(r["lr-AdamW"])
        for r in csv_rows(run.parent.parent)
        if r.get("lr-AdamW")
    }
    assert {r["trainer/global_step"]: r["lr-AdamW"] for r in rows} == csv_lr


@pytest.mark.parametrize("min_epochs", [None, 2])
def test_the_step_a_run_stops_at_logs_that_steps_loss(tmp_path, min_epochs):
    """A callback stops the run after a training step that is not a logging step (max_time's
    Timer does): Lightning writes that step, with its own loss (it had the last logging step's).
    Where min_epochs keeps the run going, Lightning writes every later step: each its own loss
    (a value logged at the stop from a second hook had won over every later one)."""
    stop = tmp_path / "losses.json"
    cfg = make_cfg(
        tmp_path,
        [
            "logger=csv",
            "data.batch_size=32",
            "trainer.max_epochs=2",
            "trainer.log_every_n_steps=5",
            "+callbacks.stop._target_=helpers.StopAfterBatch",
            "+callbacks.stop.at=6",
            f"+callbacks.stop.path={stop}",
            "test=false",
            *FAST,
            *([f"+trainer.min_epochs={min_epochs}"] if min_epochs else []),
        ],
    )
    train_task(cfg)
    rows = [r for r in csv_rows(Path(cfg.paths.output_dir)) if r.get("train/loss_step")]
    losses = {int(step): loss for step, loss in json.loads(stop.read_text()).items()}
    written = {int(r["step"]): float(r["train/loss_step"]) for r in rows}
    assert written == pytest.approx({step: losses[step] for step in written})
    if min_epochs is None:
        assert sorted(written) == [4, 6], rows
    else:
        assert len(written) > 10 and 7 in written and 8 in written, rows


def test_the_config_tree_keeps_long_lines_whole_in_a_log(capsys):
    """Into a log (not a terminal: SLURM's, ``> run.log``) the printed config's long lines, a
    run's paths above all, are whole; rich cut them at 80 columns."""
    from litlab.run import print_config_tree

    deep = "/scratch/" + "/".join(["a_long_folder_name"] * 8) + "/checkpoints"
    print_config_tree(OmegaConf.create({"paths": {"output_dir": deep}, "seed": 3}), ("seed",))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip().endswith(f"output_dir: {deep}") for line in lines), lines


@pytest.mark.parametrize(
    ("mode", "max_val", "found"),
    [("power", 128, 64), ("power", 96, 96), ("binsearch", 128, 95), ("binsearch", 96, 91)],
)
def test_the_batch_size_finder_returns_a_size_that_trained(
    tmp_path, monkeypatch, mode, max_val, found
):
    """Lightning's power search stops when doubling reaches the cap (max_val or the training
    split) and returned the cap untried: 128 where memory held 100 images. Its first trial ran
    at data.batch_size (64), not init_val (reviewer). A stand-in for a GPU whose memory holds
    100 images: training_step raises CUDA's out-of-memory error above that. binsearch bisects
    up to the cap (100 found, less its 5% margin: 95) where it fell back to the last doubling."""
    from litlab.models.classifier import ImageClassifier

    trained, step = [], ImageClassifier.training_step

    def memory_for_100_images(self, batch, batch_idx):
        if len(batch[0]) > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        trained.append(len(batch[0]))
        return step(self, batch, batch_idx)

    monkeypatch.setattr(ImageClassifier, "training_step", memory_for_100_images)
    finder = ["tune.batch_size_finder.init_val=16", f"tune.batch_size_finder.max_val={max_val}"]
    finder += [f"tune.batch_size_finder.mode={mode}"]
    cfg = make_cfg(tmp_path, ["tune.batch_size=true", *finder, "logger=csv"])
    assert tune(cfg, Path(cfg.paths.output_dir)) == {"batch_size": found}
    fitted = found if mode == "power" else min(max_val, 100)  # binsearch's, before its margin
    assert trained[0] == 16 and fitted in trained and cfg.data.batch_size == found


def test_the_lr_range_test_leaves_nothing_in_the_runs_profile(tmp_path):
    """debug=profile tune.lr=true: the finder's throwaway trainer inherited trainer.profiler, and
    the run's profiler folder held the LR range test's trace and table too (reviewer)."""
    tuned = ["tune.lr=true", "tune.lr_finder.num_training=10"]
    cfg = make_cfg(tmp_path, ["debug=profile", *tuned, "logger=csv", *FAST])
    train_task(cfg)
    folder = Path(cfg.paths.output_dir) / "profiler"
    assert len(list(folder.glob("*.pt.trace.json"))) == 1, sorted(folder.iterdir())
    assert sorted(p.name for p in folder.glob("*.txt")) == ["fit-profile.txt"]
    assert "lr_find" not in (folder / "fit-profile.txt").read_text()


def test_a_run_from_a_tuned_checkpoint_refuses_a_value_also_given_and_records_its_own(
    tmp_path, capsys
):
    """ckpt_path=<tuned run's checkpoint> tune.batch_size=true data.batch_size=32 trained with the
    checkpoint's value silently (the check came after the resume's early return), and the
    summary recorded no "tuned" (reviewer)."""
    first = make_cfg(tmp_path / "first", ["trainer.max_epochs=1", "data.batch_size=16", *FAST])
    train_task(first)
    checkpoint = str(Path(first.paths.output_dir) / "checkpoints" / "best.ckpt")
    resumed = [f"ckpt_path={checkpoint}", "tune.batch_size=true", "trainer.max_epochs=2"]
    given = make_cfg(tmp_path / "given", [*resumed, "data.batch_size=32", "logger=csv", *FAST])
    refused(capsys, train_task, given, "which is also given (data.batch_size=32)")

    cfg = make_cfg(tmp_path / "taken", [*resumed, "test=false", "logger=csv", *FAST])
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed"
    assert summary["tuned"] == {"batch_size": 16, "source": checkpoint}
    assert cfg.data.batch_size == 16 and cfg.tune.batch_size is False


def test_a_run_shorter_than_the_profilers_schedule_says_so(tmp_path, caplog):
    """debug=profile's schedule records its 3 steps after 4 training batches (Lightning asks for
    step 1's action after the first); a run of 3 recorded 2, silently (reviewer)."""
    short = ["trainer.limit_train_batches=3", "model.scheduler=null"]
    cfg = make_cfg(tmp_path, ["debug=profile", *short, "logger=csv", *FAST])
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert "its schedule records after 4 training batches, the run trained 3" in caplog.text
    (trace,) = (Path(cfg.paths.output_dir) / "profiler").glob("*.pt.trace.json")
    names = [e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]]
    assert sum(n.startswith("ProfilerStep#") for n in names) == 2


def test_every_batch_size_trial_of_a_gan_steps_its_generator(tmp_path, monkeypatch):
    """model=dcgan_wgangp (n_critic=5): a trial of 3 optimizer steps held 3 critic steps and no
    generator step, whose memory then went unmeasured (reviewer); a trial takes n_critic + 1
    steps, which always hold one."""
    from conftest import TINY_GAN_DATA
    from litlab.models.gan import GAN

    g_steps, step = {}, GAN.training_step

    def counted(self, batch, batch_idx):
        before = self.g_steps
        out = step(self, batch, batch_idx)
        g_steps[len(batch[0])] = g_steps.get(len(batch[0]), 0) + self.g_steps - before
        return out

    monkeypatch.setattr(GAN, "training_step", counted)
    data = [a for a in TINY_GAN_DATA if not a.startswith("data.batch_size=")]
    finder = ["tune.batch_size_finder.init_val=8", "tune.batch_size_finder.max_val=64"]
    cfg = make_cfg(tmp_path, ["model=dcgan_wgangp", *data, "tune.batch_size=true", *finder])
    assert tune(cfg, Path(cfg.paths.output_dir)) == {"batch_size": 64}
    assert g_steps == {8: 1, 16: 1, 32: 1, 64: 1}, g_steps


def test_the_printed_config_shows_the_values_the_finders_found(tmp_path, capsys):
    """extras.print_config printed the config before the finders ran: data.batch_size 64 for a
    run that trained at the batch size found."""
    overrides = [*FAST, "extras.print_config=true", "trainer.max_epochs=1", "test=false"]
    overrides += ["tune.batch_size=true", "tune.batch_size_finder.init_val=16"]
    overrides += ["tune.batch_size_finder.max_trials=2", "+trainer.limit_train_batches=2"]
    cfg = make_cfg(tmp_path, overrides)
    train_task(cfg)
    found = summary_of(cfg)["tuned"]["batch_size"]
    assert found != 64  # the config's
    printed = capsys.readouterr().out
    data = printed.split("data", 1)[1].split("model", 1)[0]
    assert f"batch_size: {found}\n" in data, data


def test_whole_batches_leaving_much_of_each_epoch_out_are_said(tmp_path, caplog):
    """Training takes whole batches: a small folder's 222 images at the default batch of 128
    trained 128 of them an epoch, not a word (walkthrough 150). Said where more than a tenth
    of the split is left out of each epoch; not for the digits' default run (14 of 1,294)."""
    cfg = make_cfg(tmp_path / "a", [*FAST, "data.batch_size=500", "trainer.max_epochs=1",
                                    "test=false", "model.scheduler=null", "model.net.width=4"])  # fmt: skip
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert (
        "data.batch_size=500 on 1294 training images: 2 batch(es) an epoch, 294 images (23%) "
        "left out of each epoch (other ones each epoch); a smaller data.batch_size trains on "
        "more of them" in caplog.text
    )
    caplog.clear()
    cfg = make_cfg(tmp_path / "b", [*FAST, "trainer.max_epochs=1", "test=false",
                                    "model.net.width=4"])  # fmt: skip
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert "left out of each epoch" not in caplog.text
    # part of each epoch asked for (an int 1 is one batch, though it equals 1.0): not said
    cfg = make_cfg(tmp_path / "c", [*FAST, "data.batch_size=500", "trainer.max_epochs=1",
                                    "+trainer.limit_train_batches=1", "test=false",
                                    "model.scheduler=null", "model.net.width=4"])  # fmt: skip
    with caplog.at_level("WARNING", logger="litlab"):
        train_task(cfg)
    assert "left out of each epoch" not in caplog.text
