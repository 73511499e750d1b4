"""Nets are plain nn.Modules sized by their arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from litlab.errors import ConfigError
from litlab.nets import ResNet, SmallCNN, TorchvisionNet


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 64, 64)])
@pytest.mark.parametrize("net_cls", [SmallCNN, ResNet])
def test_small_image_nets_map_images_to_logits(net_cls, shape):
    kwargs = {"width": 8} if net_cls is SmallCNN else {"width": 8, "depth": [1, 1]}
    net = net_cls(in_channels=shape[0], num_classes=7, **kwargs)
    assert net(torch.randn(3, *shape)).shape == (3, 7)


def test_width_and_depth_are_real_knobs():
    small = sum(p.numel() for p in SmallCNN(1, 10, width=8).parameters())
    wide = sum(p.numel() for p in SmallCNN(1, 10, width=16).parameters())
    deep = sum(p.numel() for p in SmallCNN(1, 10, width=8, depth=2).parameters())
    assert wide > 3 * small and deep > small
    r18 = ResNet(3, 10)
    assert 11_000_000 < sum(p.numel() for p in r18.parameters()) < 11_300_000  # ResNet-18 size


def test_torchvision_net_by_name_with_grayscale_input():
    net = TorchvisionNet("resnet18", in_channels=1, num_classes=5)
    assert net(torch.randn(2, 1, 64, 64)).shape == (2, 5)


@pytest.mark.parametrize(("name", "size"), [("googlenet", 64), ("inception_v3", 75)])
def test_torchvision_nets_with_auxiliary_heads_train_with_one_output(name, size):
    """GoogLeNet and Inception v3 (auxiliary heads by default) give a classifier's loss plain
    logits in training too (their named tuple was a TypeError in the loss), and every
    parameter takes part (no unused auxiliary heads under DDP)."""
    net = TorchvisionNet(name, in_channels=3, num_classes=5).train()
    logits = net(torch.randn(2, 3, size, size))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 5)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1])).backward()
    assert all(p.grad is not None for p in net.parameters())


def cached_weights(torch_home, name: str, weights: str, **built) -> dict:
    """A state dict of torchvision's ``name`` (randomly initialized, as the weights' model is
    built: ``built``) where torchvision's download keeps ``weights`` (TORCH_HOME's hub cache):
    the weights' real loading path, offline. Returns it."""
    import torchvision

    known = torchvision.models.get_model_weights(name)[weights]
    state = torchvision.models.get_model(name, num_classes=1000, **built).state_dict()
    folder = torch_home / "hub" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / known.url.rsplit("/", 1)[-1])
    return state


@pytest.mark.parametrize(
    ("name", "weights", "built", "size"),
    [
        ("resnet18", "IMAGENET1K_V1", {}, 32),
        ("googlenet", "DEFAULT", {"aux_logits": True, "init_weights": False}, 64),
        ("squeezenet1_0", "DEFAULT", {}, 64),  # a 1x1 convolution for a head
    ],
)
def test_pretrained_weights_fine_tune_on_other_classes(
    tmp_path, monkeypatch, name, weights, built, size
):
    """Pretrained weights with data.num_classes other than their 1,000 were refused by
    torchvision (num_classes expected 1000), GoogLeNet's at any count (aux_logits expected
    True): the weights load, their head is replaced, one plain output in training."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state = cached_weights(tmp_path, name, weights, **built)
    net = TorchvisionNet(name, in_channels=3, num_classes=7, weights=weights).train()
    loaded = net.model.state_dict()
    first = next(iter(loaded))  # the stem's weights: the file's
    assert torch.equal(loaded[first], state[first])
    logits = net(torch.randn(2, 3, size, size))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 7)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 6])).backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(
    ("name", "weights", "built", "size"),
    [
        ("resnet18", "IMAGENET1K_V1", {}, 32),
        ("googlenet", "DEFAULT", {"aux_logits": True, "init_weights": False}, 64),  # its input
        ("squeezenet1_0", "DEFAULT", {}, 64),  # transform (transform_input) comes with weights
    ],
)
def test_a_net_whose_weights_a_checkpoint_gives_is_built_as_the_weights_build_it(
    tmp_path, monkeypatch, name, weights, built, size
):
    """eval.py, resume= and a test of a checkpoint downloaded the pretrained weights (which
    the checkpoint's then replace): on a machine without internet a fine-tuned checkpoint could
    be neither tested nor continued. Built without them, the net takes the same state dict and
    computes the same outputs (a gray image's input scaling, GoogLeNet's input transform)."""
    from litlab.nets.torchvision_net import weights_from_checkpoint

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "cached"))
    cached_weights(tmp_path / "cached", name, weights, **built)
    tuned = TorchvisionNet(name, in_channels=1, num_classes=7, weights=weights).eval()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "nothing"))
    (tmp_path / "nothing").write_text("a file: torch's hub cannot be made there")
    with weights_from_checkpoint():
        rebuilt = TorchvisionNet(name, in_channels=1, num_classes=7, weights=weights).eval()
    rebuilt.load_state_dict(tuned.state_dict())  # strict: the same parameters and buffers
    images = torch.randn(2, 1, size, size)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images), tuned(images), rtol=0, atol=0)
    # outside, the weights are downloaded: torch's cache cannot be made, in one line saying
    # where the file goes on a machine without internet
    with pytest.raises(ConfigError, match=r"could not download .* weights .*; where there is no"):
        TorchvisionNet(name, in_channels=1, num_classes=7, weights=weights)


# A fine-tune of resnet18's ImageNet weights on small synthetic images, through train.py
FINE_TUNE = [
    "data=synthetic",
    "data.image_shape=[3,32,32]",
    "data.source.train_size=96",
    "data.source.test_size=32",
    "data.batch_size=32",
    "model=torchvision",
    "model.net.weights=IMAGENET1K_V1",
    "model.scheduler=null",  # (a one-cycle warm-up of 6 steps is refused)
    "data.mean=[0.485,0.456,0.406]",
    "data.std=[0.229,0.224,0.225]",
]


def test_a_fine_tuned_checkpoint_is_tested_and_continued_without_internet(tmp_path, monkeypatch):
    """A fine-tune of pretrained weights (torch's cache filled, as by a download), then eval.py
    and resume= where torch's cache holds nothing and nothing can be downloaded."""
    from conftest import QUIET_CSV, run_cli

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "cached"))
    cached_weights(tmp_path / "cached", "resnet18", "IMAGENET1K_V1")
    small = [*FINE_TUNE, *QUIET_CSV]
    result = run_cli(*small, "trainer.max_epochs=1", f"paths.log_dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr[-3000:]
    (trained,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("summary.json")]
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "nothing"))
    (tmp_path / "nothing").write_text("a file: torch's hub cannot be made there")
    tested = run_cli(
        f"ckpt_path={trained['best_checkpoint']}",
        "extras.print_config=false",
        f"paths.log_dir={tmp_path / 'eval'}",
        script="eval.py",
    )
    assert tested.returncode == 0, tested.stderr[-3000:]
    (evaluation,) = [json.loads(p.read_text()) for p in (tmp_path / "eval").rglob("summary.json")]
    assert evaluation["metrics"]["test/acc"] == trained["metrics"]["test/acc"]
    assert (
        evaluation["checkpoint_step"] == trained["tested_checkpoint_step"] == trained["global_step"]
    )
    resumed = run_cli(f"resume={trained['run_dir']}", "trainer.max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    continued = json.loads((Path(trained["run_dir"]) / "summary.json").read_text())
    assert continued["status"] == "completed"
    assert continued["global_step"] == 2 * trained["global_step"] > 0  # (one epoch more)


def test_a_frozen_backbone_keeps_its_weights_and_statistics_and_the_head_trains(
    tmp_path, monkeypatch
):
    """model.net.freeze_backbone=true (a linear probe): the optimizer holds the head alone
    (either weight-decay layout), and a training step leaves every pretrained parameter and
    BatchNorm statistic as the weights' file has them (BatchNorm in train mode would have
    moved its running statistics, and normalized with each batch's) while the head learns."""
    from litlab.models.optim import optimized_parameters

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state = cached_weights(tmp_path, "resnet18", "IMAGENET1K_V1")
    nets = [  # the second built as a sweep's next job or the finders' copy build it (review
        TorchvisionNet(  # 164: the first alone, checked for its image shape, was set)
            "resnet18", 3, 5, "IMAGENET1K_V1", image_shape=(3, 32, 32), freeze_backbone=True
        )
        for _ in range(2)
    ]
    for built in nets:  # Lightning calls no train(): it keeps each module's mode as built
        assert built.training and built.model.fc.training and not built.model.bn1.training
    net = nets[1]
    head = [net.model.fc.weight, net.model.fc.bias]
    assert optimized_parameters(net.named_parameters(), True) == head
    groups = optimized_parameters(net.named_parameters(), False)
    assert [g["params"] for g in groups] == [head[:1], head[1:]]
    net.eval().train()  # and so does a train() of the whole
    assert net.training and net.model.fc.training and not net.model.bn1.training
    optimizer = torch.optim.SGD(optimized_parameters(net.named_parameters(), True), lr=0.5)
    before = net.model.fc.weight.detach().clone()
    loss = torch.nn.functional.cross_entropy(net(torch.randn(8, 3, 32, 32)), torch.arange(8) % 5)
    loss.backward()
    optimizer.step()
    after = net.model.state_dict()
    backbone = [key for key in state if not key.startswith("fc.")]
    assert len(backbone) > 100  # weights, biases, running means, variances, batch counts
    for key in backbone:
        assert torch.equal(after[key], state[key]), key
    assert not torch.equal(net.model.fc.weight, before)
    # unfrozen (the default), BatchNorm trains: the same step moves its statistics
    tuned = TorchvisionNet("resnet18", in_channels=3, num_classes=5, weights="IMAGENET1K_V1")
    tuned.train()(torch.randn(8, 3, 32, 32))
    assert not torch.equal(tuned.model.bn1.running_mean, state["bn1.running_mean"])


def test_a_frozen_backbone_without_pretrained_weights_is_refused():
    with pytest.raises(ConfigError, match=r"freeze_backbone=true .* random weights"):
        TorchvisionNet("resnet18", in_channels=3, num_classes=5, freeze_backbone=True)


def test_a_linear_probe_through_train_py_trains_the_head_alone(tmp_path, monkeypatch):
    """The README's fine-tune with the backbone frozen, as a user runs it: after a fit (its
    validation and test between epochs), the checkpoint's backbone is the weights' file, to the
    bit, BatchNorm statistics included; the head trained."""
    from conftest import QUIET_CSV, run_cli
    from litlab.checkpoint import load_checkpoint

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state = cached_weights(tmp_path, "resnet18", "IMAGENET1K_V1")
    result = run_cli(
        *FINE_TUNE,
        *QUIET_CSV,
        "model.net.freeze_backbone=true",
        "callbacks=ema",  # (the checkpoint's weights are the average: walkthrough 165)
        "tune.lr=true",  # (its range test builds the net first: review 164)
        "tune.lr_finder.num_training=20",
        "trainer.max_epochs=2",
        f"paths.log_dir={tmp_path / 'out'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = "model.net.freeze_backbone: resnet18's head (fc) trains, 5,130 parameters; its"
    assert said in result.stdout + result.stderr  # (in train.log too: walkthrough 165)
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("summary.json")]
    checkpoint = load_checkpoint(Path(summary["run_dir"]) / "checkpoints" / "last.ckpt")
    saved = checkpoint["state_dict"]
    assert saved["net.model.fc.weight"].shape == (10, 512)  # synthetic's 10 classes
    for key, value in state.items():
        if not key.startswith("fc."):
            assert torch.equal(saved[f"net.model.{key}"], value), key
    # the optimizer holds the head's weight and bias alone, and stepped them (their momentum)
    (group,) = checkpoint["optimizer_states"][0]["param_groups"]
    assert len(group["params"]) == 2
    moments = checkpoint["optimizer_states"][0]["state"].values()
    assert sorted(tuple(m["momentum_buffer"].shape) for m in moments) == [(10,), (10, 512)]


def test_a_gray_image_reaches_pretrained_weights_as_a_gray_photo(tmp_path, monkeypatch):
    """One channel normalized with the weights' first channel's mean and std (what the
    normalization check asks) was copied to all three inputs: green and blue were off their
    own statistics (blue by about 0.35 std). Each input is now normalized as the weights saw."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cached_weights(tmp_path, "resnet18", "IMAGENET1K_V1")
    net = TorchvisionNet("resnet18", in_channels=1, num_classes=1000, weights="IMAGENET1K_V1")
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    pixels = torch.rand(2, 1, 32, 32)
    seen = []
    net.model.conv1.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    net((pixels - mean[0]) / std[0])
    expected = (pixels.expand(-1, 3, -1, -1) - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    torch.testing.assert_close(seen[0], expected)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: SmallCNN(1, 10, width=0), "width >= 1"),
        (lambda: ResNet(1, 10, depth=[]), "non-empty depth"),
        (lambda: TorchvisionNet("resnet9000", 3, 10), "unknown torchvision model"),
        (  # (review 159: a TypeError)
            lambda: TorchvisionNet("vgg16", 3, 10, weights="IMAGENET1K_FEATURES"),
            r"a feature extractor's, .* pick one of \['IMAGENET1K_V1'\]",
        ),
    ],
)
def test_bad_arguments_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_pretrained_weights_on_data_normalized_otherwise_get_one_warning(tmp_path, caplog):
    """model.net.weights (ImageNet's, normalized with its mean and std) on data normalized
    otherwise fine-tuned silently from inputs the net never saw: one warning naming the values
    to set; none when the data's are the weights' (per channel, one channel too)."""
    from conftest import make_cfg
    from litlab.config import check_pretrained_normalization

    net = ["model/net=torchvision", "model.net.weights=IMAGENET1K_V1"]
    with caplog.at_level("WARNING", logger="litlab"):
        check_pretrained_normalization(make_cfg(tmp_path, net))  # digits: mean 0.306, std 0.325
    assert "set data.mean=[0.485] data.std=[0.229]" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        check_pretrained_normalization(
            make_cfg(tmp_path, [*net, "data.mean=[0.485]", "data.std=[0.229]"])
        )
        check_pretrained_normalization(make_cfg(tmp_path, ["model/net=torchvision"]))  # no weights
        imagenet = ["data.mean=[0.485,0.456,0.406]", "data.std=[0.229,0.224,0.225]"]
        check_pretrained_normalization(make_cfg(tmp_path, [*net, "data=image_folder", *imagenet]))
    assert not caplog.text
    # RGB images normalized with one value for every channel: red's statistics on green and
    # blue too (the check compared the first channel alone, reviewer)
    with caplog.at_level("WARNING", logger="litlab"):
        red = ["data.mean=[0.485]", "data.std=[0.229]"]
        check_pretrained_normalization(make_cfg(tmp_path, [*net, "data=image_folder", *red]))
    assert "set data.mean=[0.485, 0.456, 0.406] data.std=[0.229, 0.224, 0.225]" in caplog.text
