"""GPU tier: precision, FSDP and compile for both model families. Skipped without CUDA.

Run on a GPU machine with `pytest -m gpu tests/test_gpu.py` (scripts/gpu_check.sh does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import QUIET_CSV, REPO, make_cfg, needs_cuda, summary_of
from helpers import resumed_adam
from litlab.evaluate import eval_task
from litlab.train import train_task

pytestmark = [pytest.mark.gpu, needs_cuda]

QUIET = [*QUIET_CSV, "trainer=gpu"]
CLF = [
    "data=synthetic",
    "data.image_shape=[3,32,32]",
    "data.source.train_size=2048",
    "trainer.max_epochs=2",
    "model=resnet",
    "model.net.width=16",
    "model.net.depth=[1,1,1,1]",
]
GAN = [
    "model=dcgan",
    "data=synthetic",
    "data.image_shape=[3,32,32]",
    "data.source.train_size=2048",
    "data.batch_size=64",
    "trainer.max_epochs=2",
    "callbacks.fid.num_samples=512",
]


def completed(cfg) -> dict:
    summary = summary_of(cfg)
    assert summary["status"] == "completed", summary.get("error")
    return summary["metrics"]


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_classifier_mixed_precision(tmp_path, precision):
    cfg = make_cfg(
        tmp_path,
        [*CLF, *QUIET, f"trainer.precision={precision}", "callbacks.speed.channels_last=true"],
    )
    train_task(cfg)
    metrics = completed(cfg)
    assert metrics["test/acc"] > 0.5 and torch.isfinite(torch.tensor(metrics["train/loss"]))


@pytest.mark.parametrize(
    "model, precision",
    [
        ("dcgan", "bf16-mixed"),
        ("dcgan", "16-mixed"),
        ("dcgan_wgangp", "16-mixed"),
        ("dcgan_hinge", "bf16-mixed"),
    ],
)
def test_gan_mixed_precision_with_manual_optimization(tmp_path, model, precision):
    cfg = make_cfg(
        tmp_path,
        [
            *GAN,
            f"model={model}",
            *QUIET,
            f"trainer.precision={precision}",
            "model.gradient_clip_val=1.0",
        ],
    )
    train_task(cfg)
    metrics = completed(cfg)
    for name in ("d/loss", "val/fid", "test/fid"):
        assert metrics[name] is not None and torch.isfinite(torch.tensor(metrics[name])), name


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_fsdp_classifier_trains_checkpoints_and_evaluates(tmp_path, state_dict_type):
    cfg = make_cfg(
        tmp_path / "fsdp",
        [
            *CLF,
            *QUIET,
            "trainer=fsdp",
            "trainer.devices=1",
            f"trainer.strategy.state_dict_type={state_dict_type}",
        ],
    )
    train_task(cfg)
    metrics = completed(cfg)
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)  # trainer=fsdp: auto
    assert summary_of(cfg)["precision"]["chosen"] == ("bf16-mixed" if native_bf16 else "16-mixed")
    best = Path(summary_of(cfg)["best_checkpoint"])
    if state_dict_type == "sharded":
        assert best.is_dir()  # one shard per rank; consolidate into one file for eval
        subprocess.run(
            [sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(best)],
            check=True,
            cwd=REPO,
        )
        best = best.with_name(best.name + ".consolidated")
    evaluated = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={best}", "extras.print_config=false", "trainer=gpu"],
        config_name="eval",
    )
    assert eval_task(evaluated) == pytest.approx(metrics["test/acc"], abs=0.02)


@pytest.mark.compile
@pytest.mark.parametrize("family", ["classifier", "gan", "gan_wgangp"])
def test_compiled_training_checkpoints_load_without_compile(tmp_path, family):
    base = {"classifier": CLF, "gan": GAN, "gan_wgangp": [*GAN, "model=dcgan_wgangp"]}[family]
    cfg = make_cfg(
        tmp_path / "compiled",
        [*base, *QUIET, "callbacks.speed.compile=true", "trainer.max_epochs=1"],
    )
    train_task(cfg)
    metrics = completed(cfg)
    checkpoint = torch.load(summary_of(cfg)["best_checkpoint"], weights_only=True)
    assert not any(
        "_orig_mod" in key for key in checkpoint["state_dict"]
    )  # keys as without compile
    evaluated = make_cfg(
        tmp_path / "eval",
        [
            f"ckpt_path={summary_of(cfg)['best_checkpoint']}",
            "extras.print_config=false",
            "trainer=gpu",
        ],
        config_name="eval",
    )
    value = eval_task(evaluated)
    expected = metrics["test/acc"] if family == "classifier" else None
    if expected is not None:
        assert value == pytest.approx(expected, abs=0.02)


def test_deterministic_on_gpu(tmp_path):
    states = []
    for name in ("a", "b"):
        cfg = make_cfg(
            tmp_path / name,
            [*CLF, *QUIET, "trainer.deterministic=true", "trainer.max_epochs=1", "test=false"],
        )
        train_task(cfg)
        completed(cfg)
        states.append(
            torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
        )
    for key, value in states[0]["state_dict"].items():
        assert torch.equal(value, states[1]["state_dict"][key]), key


def test_the_average_of_the_weights_updates_without_a_host_sync():
    """The GAN's EMA generator and callbacks=ema's average (AveragedCopy) queue their update
    without waiting for the GPU (torch's AveragedModel reads its count on the host twice). Built
    as the GAN builds it: on the CPU with the module, then moved to the GPU with it (built from
    a net already on the GPU without device=, torch leaves the count on the CPU: a copy to the
    GPU, and so a sync, at every update; the EMA callback passes the device)."""
    from torch import nn

    from litlab.models.gan import AveragedCopy, ema_with_warmup

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    average = AveragedCopy(net, multi_avg_fn=ema_with_warmup(0.999), use_buffers=True).cuda()
    net.cuda()
    average.update_parameters(net)  # the first reads the count once
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            average.update_parameters(net)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(average.n_averaged) == 4


def test_the_ema_callbacks_average_lives_on_the_training_device(tmp_path):
    """callbacks=ema on a GPU keeps its average, and its count, on the GPU with the module.
    Lightning builds the average at setup on the module's device, which is still the CPU then
    (the strategy moves the module later): each step would copy every weight to the host."""
    where = tmp_path / "where.json"
    cfg = make_cfg(
        tmp_path / "ema",
        [
            *CLF,
            *QUIET,
            "callbacks=ema",
            "trainer.max_epochs=1",
            "+callbacks.where._target_=helpers.RecordAverageDevice",
            f"+callbacks.where.path={where}",
        ],
    )
    train_task(cfg)
    completed(cfg)
    assert json.loads(where.read_text()) == {"average": ["cuda"], "count": "cuda", "module": "cuda"}


def test_ranks_agree_on_a_flag_without_a_host_sync_in_the_step(tmp_path):
    """Preemption's agreement under NCCL (one process: a world of one) queues its all-reduce and
    the copy to the host without waiting for the GPU; the answer comes at the next call."""
    import torch.distributed as dist

    from litlab.distributed.agree import AnyRank

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        agreed = AnyRank(torch.device("cuda", 0))
        x = torch.randn(2048, 2048, device="cuda")
        # NCCL makes its communicator at the first collective (a run's setup does that, not its
        # steps), which may wait for the device: once before the steps are watched
        assert agreed.now(False) is False
        torch.cuda.set_sync_debug_mode("error")
        try:
            told = []
            for call in range(3):
                x = x @ x.T / 2048  # a step's work on the GPU
                told.append(agreed.later(call == 1))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert told == [False, False, True]
        assert agreed.now(False) is False
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("saved, built", [(None, True), (True, None)])
def test_a_resumed_optimizers_step_counts_go_where_the_built_implementation_keeps_them(
    saved, built
):
    """On CUDA torch's default Adam (foreach) keeps its step counts on the CPU, the fused one
    on the parameters' device. A state saved by one and loaded into the other (litlab steps
    as it built the optimizer, not as the checkpoint was saved) has its counts where the built
    one keeps them, and continues the saved optimizer's update."""
    run = resumed_adam(saved, built, device="cuda")
    assert {c.device.type for c in run["counts"]} == {"cuda" if built else "cpu"}
    assert all(c.dtype == torch.float32 and float(c) == 5 for c in run["counts"])
    for a, b in zip(run["saved"], run["loaded"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_training_and_validation_share_one_copy_of_the_data_on_the_gpu():
    """The device loader moves an in-memory array to the GPU once: training and validation
    are rows of one array, and each loader's own copy took twice its memory (a review; a
    100,000-image cache at 176 px is 9.3 GB)."""
    import lightning as L

    from litlab.data import DataModule
    from litlab.data.sources import Synthetic

    datamodule = DataModule(
        Synthetic((3, 32, 32), train_size=4096, test_size=256), [3, 32, 32], 10, [0.5], [0.25],
        batch_size=64, loader="device",
    )  # fmt: skip
    datamodule.trainer = L.Trainer(accelerator="gpu", devices=1, logger=False)
    datamodule.setup()
    train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
    next(iter(train)), next(iter(val))
    assert train.images.is_cuda and train.images is val.images
    assert train.labels is val.labels


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook"])
def test_a_forking_strategy_on_gpus_is_refused_before_cuda_starts(tmp_path, strategy):
    """litlab asks CUDA about the GPU (precision) before Lightning launches the ranks: forked
    ranks then die at their first CUDA call. One line instead, naming the strategy to use."""
    from litlab.errors import ConfigError
    from litlab.hardware import check_hardware

    cfg = make_cfg(tmp_path, ["trainer=gpu", f"trainer.strategy={strategy}"])
    with pytest.raises(ConfigError, match=r"use trainer\.strategy=ddp "):
        check_hardware(cfg.trainer)


def test_a_ranks_saved_random_state_is_its_own_gpus():
    """RNGState keeps the state of the rank's own GPU: each DDP rank sees every GPU of its node,
    and one state per visible GPU did not restore where fewer are visible (resumed on fewer
    GPUs, or one per task under SLURM). A checkpoint written so still restores here."""
    from litlab.callbacks.preemption import _capture, _restore

    torch.zeros(1, device="cuda")  # CUDA started, as in a run
    state = _capture()
    assert isinstance(state["cuda"], torch.Tensor)
    first = torch.rand(4, device="cuda")
    _restore(state)
    assert torch.equal(torch.rand(4, device="cuda"), first)
    torch.rand(4, device="cuda")  # another state, for the other GPUs' entries
    older = [torch.cuda.get_rng_state()] * (torch.cuda.device_count() + 1)  # more than GPUs here
    older[torch.cuda.current_device()] = state["cuda"]  # this GPU's own
    _restore({**state, "cuda": older})
    assert torch.equal(torch.rand(4, device="cuda"), first)


def test_centre_crops_and_affine_augmentation_make_no_host_copy_a_batch():
    """The evaluation crop's boxes (and a training batch's where there is no random crop) and
    TrivialAugment/RandAugment's warps took a tensor made from host values at every batch: a
    host-to-device copy, which waits for the GPU's queue."""
    from litlab.data.autoaugment import affine
    from litlab.data.transforms import centre_boxes

    images = torch.rand(4, 3, 36, 36, device="cuda")
    theta = torch.eye(3, device="cuda")[:2].expand(4, 2, 3).contiguous()
    torch.cuda.set_sync_debug_mode("error")
    try:
        boxes = centre_boxes(4, 36, 36, 0.875, images.device)
        warped = affine(images, theta)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert boxes[0].tolist() == [2.0, 2.0, 34.0, 34.0]  # round(36 * 0.875) = 32, centred
    assert torch.equal(warped, images)  # the identity warp
