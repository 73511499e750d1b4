"""Speed switches change how fast a model computes, never what: compile and channels_last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import QUIET_CSV as QUIET
from conftest import TINY_GAN_DATA, make_cfg, summary_of
from litlab.evaluate import eval_task
from litlab.train import train_task

SMALL = [
    "data=synthetic",
    "data.image_shape=[3,16,16]",
    "data.source.train_size=256",
    "data.batch_size=32",
    "model.net.width=8",
    "trainer.max_epochs=1",
]


@pytest.mark.slow
def test_compiled_and_eager_checkpoints_are_interchangeable(tmp_path):
    compiled = make_cfg(tmp_path / "compiled", [*SMALL, *QUIET, "callbacks.speed.compile=true"])
    train_task(compiled)
    best = summary_of(compiled)["best_checkpoint"]
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not any("_orig_mod" in key for key in state)  # compiled in place: same parameter names
    # An evaluation's first batch may compile (the test's, in evaluation mode): not timed, so a
    # test of one batch has no rate, not its compilation's (walkthrough 142: the test rate read
    # 55 images/s beside validation's 527; here 35 beside 2437)
    assert "test_images_per_s" not in summary_of(compiled)["perf"]
    evaluated = make_cfg(
        tmp_path / "eval", [f"ckpt_path={best}", "extras.print_config=false"], config_name="eval"
    )
    assert eval_task(evaluated) == pytest.approx(
        summary_of(compiled)["metrics"]["test/acc"], abs=1e-6
    )
    # An eager checkpoint continues with compile on.
    eager = make_cfg(tmp_path / "eager", [*SMALL, *QUIET, "test=false", "model.scheduler=null"])
    train_task(eager)
    last = Path(eager.paths.output_dir) / "checkpoints" / "last.ckpt"
    resumed = make_cfg(
        tmp_path / "resumed",
        [
            *SMALL,
            *QUIET,
            "trainer.max_epochs=2",
            f"ckpt_path={last}",
            "model.scheduler=null",
            "callbacks.speed.compile=true",
        ],
    )
    train_task(resumed)
    assert summary_of(resumed)["status"] == "completed"


def test_every_fit_compiles_its_nets_also_many_and_late_in_a_sweep():
    """Every net compiled in place goes through one function of torch's, which it compiles at
    most recompile_limit (8) times a process, then runs eagerly: a GAN's nets in training and
    evaluation took 6 of the 8, and the jobs of a sweep (one process) added theirs, so later
    nets ran uncompiled, logged as compiled. Each fit now starts afresh under a cap of 64, put
    back at teardown."""
    import lightning as L
    from torch import nn
    from torch._dynamo.utils import counters

    from litlab.callbacks import Speed

    limit = torch._dynamo.config.recompile_limit

    def job(widths: range) -> tuple[L.LightningModule, Speed]:
        module, speed = L.LightningModule(), Speed(compile=True)
        for width in widths:  # nets of other shapes: a graph each
            setattr(module, f"net{width}", nn.Linear(4, width))
        speed.setup(None, module, "fit")
        graphs = counters["stats"]["unique_graphs"]
        for width in widths:
            getattr(module, f"net{width}")(torch.zeros(2, 4))
        assert counters["stats"]["unique_graphs"] == graphs + len(widths)  # none ran eagerly
        return module, speed

    try:
        first, speed = job(range(1, 11))  # ten nets, one job
        speed.teardown(None, first, "fit")
        assert torch._dynamo.config.recompile_limit == limit
        _, speed = job(range(11, 12))  # the next job of the sweep
        graphs = counters["stats"]["unique_graphs"]
        first.net1(torch.zeros(2, 4))  # compiled afresh: the first job's graphs were dropped
        assert counters["stats"]["unique_graphs"] == graphs + 1
        speed.teardown(None, first, "fit")
    finally:
        torch.compiler.reset()


def test_channels_last_computes_the_same_training(tmp_path):
    losses = {}
    for switch in ("false", "true"):
        cfg = make_cfg(
            tmp_path / switch,
            [*SMALL, *QUIET, f"callbacks.speed.channels_last={switch}", "test=false"],
        )
        train_task(cfg)
        losses[switch] = summary_of(cfg)["metrics"]["train/loss"]
    assert losses["true"] == pytest.approx(losses["false"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["dcgan", "dcgan_wgangp"])
def test_compiled_gan_trains_and_its_checkpoint_resumes_eager(tmp_path, model):
    # Both nets compiled in place: G runs in D's step (no grad) and in G's step (with grad);
    # on the GPU these once shared a graph and G's loss lost its grad_fn.
    gan = [
        f"model={model}",
        *TINY_GAN_DATA,
        "callbacks.fid=null",
        "callbacks.model_checkpoint=null",  # no FID, no best: last.ckpt is the one kept
        "callbacks.samples=null",
        "test=false",
        *QUIET,
    ]
    compiled = make_cfg(
        tmp_path / "compiled", [*gan, "trainer.max_epochs=1", "callbacks.speed.compile=true"]
    )
    train_task(compiled)
    summary = summary_of(compiled)
    assert summary["status"] == "completed"
    assert all(
        torch.isfinite(torch.tensor(v)) for k, v in summary["metrics"].items() if "loss" in k
    )
    last = Path(compiled.paths.output_dir) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])
    resumed = make_cfg(tmp_path / "eager", [*gan, "trainer.max_epochs=2", f"ckpt_path={last}"])
    train_task(resumed)
    assert summary_of(resumed)["status"] == "completed"


def test_the_default_profiler_records_nothing_at_no_per_call_cost_and_real_ones_still_work(
    tmp_path,
):
    """Lightning wraps ~95 hook calls a step in profiler.profile(); litlab's default hands out
    one shared null context (its pass-through makes a generator each time), and
    trainer.profiler=simple still profiles."""
    from lightning.pytorch.profilers import SimpleProfiler

    from litlab.config import build
    from litlab.profiler import NoProfiler

    trainer = build(make_cfg(tmp_path, QUIET).trainer, "trainer", logger=False)
    assert isinstance(trainer.profiler, NoProfiler)
    first, second = trainer.profiler.profile("a"), trainer.profiler.profile("b")
    assert first is second
    with first, second:  # reentrant: Lightning nests hook calls
        pass
    simple = make_cfg(tmp_path / "simple", [*QUIET, "trainer.profiler=simple"]).trainer
    profiler = build(simple, "trainer", logger=False).profiler
    assert isinstance(profiler, SimpleProfiler)
    with profiler.profile("a step"):
        pass
    assert "a step" in profiler.recorded_durations


def test_a_runs_matmul_precision_is_its_own(tmp_path):
    """callbacks.speed.matmul_precision is torch's process-wide setting: a sweep's jobs run in
    one process, and a job that set "medium" left it to every later job (TF32/bf16 matmuls
    where none was asked for); it is put back when the run ends."""
    before = torch.get_float32_matmul_precision()
    seen = tmp_path / "seen.txt"
    cfg = make_cfg(
        tmp_path,
        [
            *SMALL,
            *QUIET,
            "callbacks.speed.matmul_precision=medium",
            "+callbacks.spy._target_=helpers.RecordMatmulPrecision",
            f"+callbacks.spy.path={seen}",
        ],
    )
    train_task(cfg)
    assert seen.read_text() == "medium"  # in the run
    assert torch.get_float32_matmul_precision() == before == "highest"  # after it
    # eval.py tests in the run's matmul precision, so that its figures are the run's (before:
    # "highest", other figures where "medium" computes otherwise, as on CPUs with bfloat16)
    from litlab.evaluate import eval_task, trained_numerics

    (speed,) = trained_numerics(cfg)  # what eval.py builds from the stored config
    assert speed.matmul_precision == "medium" and not speed.compile
    wide = make_cfg(
        tmp_path / "wide",
        [*SMALL, *QUIET, "model.net.width=64", "callbacks.speed.matmul_precision=medium"],
    )
    train_task(wide)
    best = Path(wide.paths.output_dir) / "checkpoints" / "best.ckpt"
    tested = make_cfg(
        tmp_path / "eval", [f"ckpt_path={best}", "extras.print_config=false"], config_name="eval"
    )
    eval_task(tested)
    assert summary_of(tested)["metrics"]["test/loss"] == summary_of(wide)["metrics"]["test/loss"]
    assert torch.get_float32_matmul_precision() == "highest"
    # a job that fails (Lightning calls no teardown then) puts it back too
    poisoned = make_cfg(
        tmp_path / "failed",
        [
            *SMALL,
            *QUIET,
            "callbacks.speed.matmul_precision=medium",
            "+callbacks.nan._target_=helpers.InjectNaN",
            "+callbacks.nan.at_batch=1",
            "+callbacks.nan.module=net",
        ],
    )
    with pytest.raises(SystemExit):  # the divergence guard's one line
        train_task(poisoned)
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("model", ["cnn", "dcgan"])
def test_a_training_step_copies_nothing_to_the_host_between_its_logging_steps(tmp_path, model):
    """No value goes from the device to the host in a training batch (step, callbacks and
    Lightning's per-batch logging) except in those that log (every trainer.log_every_n_steps)
    and an epoch's last (validation): on a GPU each such copy waits for the device, and the
    host can no longer queue the next step while this one runs. Before: train/loss_step, logged
    with prog_bar=True, was copied by Lightning's logger connector after every batch that
    followed its first logging step."""
    record = tmp_path / "copies.json"
    if model == "cnn":
        overrides = [*SMALL, "data.source.train_size=512"]
    else:
        overrides = ["model=dcgan", *TINY_GAN_DATA, "data.source.train_size=512"]
        overrides += ["callbacks.fid.num_samples=64"]
    overrides += ["trainer.max_epochs=2", "test=false"]
    overrides += [
        "trainer.log_every_n_steps=5",
        "+callbacks.copies._target_=helpers.RecordHostCopies",
    ]
    cfg = make_cfg(tmp_path, [*overrides, f"+callbacks.copies.path={record}", *QUIET])
    train_task(cfg)
    windows = json.loads(record.read_text())  # [batch_idx, copies], batch by batch
    last = max(batch for batch, _ in windows)
    logging = [copies for n, (_, copies) in enumerate(windows) if (n + 1) % 5 == 0]
    quiet = [
        copies
        for n, (batch, copies) in enumerate(windows)
        if n and (n + 1) % 5 and batch != last  # not the run's first batch (setup), nor these
    ]
    assert len(quiet) >= 16 and not any(quiet), windows
    assert all(logging), windows  # the logging steps' own copies: the test can see them


@pytest.mark.parametrize("model", ["cnn", "dcgan"])
def test_the_progress_bar_shows_the_latest_step_losses(tmp_path, model):
    """litlab's bar (the default) reads the step curves when it redraws, now that they are not
    logged with prog_bar=True (test above): the classifier's train/loss_step, a GAN's d/loss
    and g/loss."""
    record = tmp_path / "bar.json"
    if model == "cnn":
        overrides = [*SMALL]
    else:
        overrides = ["model=dcgan", *TINY_GAN_DATA, "callbacks.fid.num_samples=64"]
    overrides += ["test=false", "extras.print_config=false", "logger=csv"]
    overrides += [
        "+callbacks.bar._target_=helpers.RecordBarMetrics",
        f"+callbacks.bar.path={record}",
    ]
    train_task(make_cfg(tmp_path, overrides))
    shown = json.loads(record.read_text())
    losses = ["train/loss_step"] if model == "cnn" else ["d/loss", "g/loss"]
    assert all(isinstance(shown.get(name), float) for name in losses), shown


def test_eval_takes_the_runs_memory_format(tmp_path):
    """channels_last picks other convolution kernels, which under bf16 round otherwise: eval.py
    left the run's memory format out, and its test of experiment=fashion_resnet's bf16 checkpoint
    was one image of 10,000 apart from the run's (0.8320 vs 0.8321; with it: the run's figures
    to the last digit, a README walkthrough on 2026-12-05). The tiny nets here round alike either
    way, so the run's memory format is checked where eval.py takes it."""
    from litlab.evaluate import trained_numerics

    run = make_cfg(tmp_path, [*SMALL, "callbacks.speed.channels_last=true"])
    (speed,) = trained_numerics(run)
    assert speed.channels_last and speed.matmul_precision is None and not speed.compile
    assert trained_numerics(make_cfg(tmp_path, SMALL)) == []


@pytest.mark.parametrize(
    "overrides, bar",
    [
        ([], "ProgressBar"),  # litlab's: redraws a few times a second
        (["callbacks.progress_bar=null"], None),  # batch jobs, benchmarks: none
        (["callbacks.progress_bar=null", "+trainer.enable_progress_bar=true"], "RichProgressBar"),
        (["callbacks=none"], "RichProgressBar"),  # Lightning's defaults
    ],
)
def test_callbacks_progress_bar_null_means_no_bar(tmp_path, overrides, bar):
    """README's switch for batch jobs: without litlab's bar, Lightning put in its own, which
    reads the metrics (a device sync) and redraws at every batch: the costlier bar, not none."""
    from litlab.config import build
    from litlab.train import build_trainer

    cfg = make_cfg(tmp_path, [*SMALL, "logger=none", *overrides])
    trainer = build_trainer(cfg, build(cfg.model, "model"), {})
    shown = trainer.progress_bar_callback
    assert (type(shown).__name__ if shown is not None else None) == bar


def test_the_default_runs_callbacks_get_only_the_batch_hooks_they_have(tmp_path):
    """build_trainer leaves Lightning nothing to call at a batch on a callback whose class
    keeps Callback's no-op there (compat.skip_batch_hooks_left_to_the_base_class)."""
    from litlab.config import build
    from litlab.train import build_trainer

    cfg = make_cfg(tmp_path, [*SMALL, "logger=none"])
    trainer = build_trainer(cfg, build(cfg.model, "model"), {})
    by_name = {type(cb).__name__: cb for cb in trainer.callbacks}
    assert by_name["RNGState"].on_train_batch_end is None
    assert by_name["ModelSummary"].on_before_backward is None
    assert callable(by_name["ProgressBar"].on_train_batch_end)
    assert callable(by_name["DivergenceGuard"].on_train_batch_end)


@pytest.mark.slow
def test_the_progress_bar_ends_on_the_last_batch_trained(tmp_path, monkeypatch):
    """A fit that ends within an epoch (trainer.max_steps here; a GAN's max_g_steps, a stop
    signal) left the bar on the last batch it had drawn (it draws a few times a second), with
    that batch's loss: 34/161 after 37 steps. It draws the newest batch when the epoch ends
    (here the bar's clock stands still: only the first batch is due)."""
    from litlab.callbacks import progress

    monkeypatch.setattr(progress, "monotonic", lambda: 0.0)
    record = tmp_path / "bar.json"
    overrides = [*SMALL, "data.source.train_size=1024", "trainer.max_steps=20", "test=false"]
    overrides += ["extras.print_config=false", "+trainer.limit_val_batches=1"]
    overrides += ["logger=csv", "callbacks.progress_bar.refresh_rate=1"]
    overrides += [
        "+callbacks.bar._target_=helpers.RecordBarMetrics",
        f"+callbacks.bar.path={record}",
    ]
    train_task(make_cfg(tmp_path, overrides))
    shown = json.loads(record.read_text())
    assert shown["batches"] == 20 and shown["bar_batches"] == 20, shown
