"""The P3' recipes and what they add to the classifier: test-time flip, per-image random
erasing, mixup/cutmix, EMA of the weights; and their first epoch on real Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

from conftest import QUIET_CSV, make_cfg, needs_fashion, refused, summary_of
from litlab.checkpoint import load_checkpoint
from litlab.config import build
from litlab.models import ImageClassifier
from litlab.models.augment import random_erasing
from litlab.nets import SmallCNN
from litlab.train import train_task

# A classifier small enough for seconds on a CPU, on learnable synthetic images.
TINY = [
    "data=synthetic",
    "data.source.train_size=256",
    "data.source.test_size=64",
    "data.batch_size=32",
    "model.net.width=4",
    "+trainer.num_sanity_val_steps=0",
    *QUIET_CSV,
]


def classifier(**options) -> ImageClassifier:
    torch.manual_seed(0)
    net = SmallCNN(in_channels=1, num_classes=10, width=4)
    return ImageClassifier(net, torch.optim.SGD, num_classes=10, **options).eval()


def test_tta_flip_averages_the_logits_of_an_image_and_its_mirror():
    images = torch.randn(6, 1, 28, 28)
    plain, tta = classifier(), classifier(tta_flip=True)
    with torch.no_grad():
        assert torch.equal(plain.evaluate(images), plain(images))  # off by default
        expected = (plain(images) + plain(images.flip(3))) / 2
        torch.testing.assert_close(tta.evaluate(images), expected)
        assert not torch.allclose(tta.evaluate(images), plain(images))
        symmetric = torch.cat([images[..., :14], images[..., :14].flip(3)], dim=3)
        torch.testing.assert_close(tta.evaluate(symmetric), plain(symmetric))
        # an empty batch (every file unreadable; a rank's padding under FSDP) goes through too
        assert tta.evaluate(images[:0]).shape == (0, 10)


@pytest.mark.parametrize("kind", ["MixUp", "CutMix"])
def test_mixing_draws_once_per_batch_and_mixes_labels_as_it_mixes_images(kind, tmp_path):
    """fashion_best's mixers: image i is mixed with image i-1 by one weight (one box) for the
    whole batch, and its target gives each label the share of that image it holds."""
    cfg = make_cfg(tmp_path, ["experiment=fashion_best"])
    (choice,) = build(cfg.model.mix, "model.mix").transforms
    (mixer,) = [t for t in choice.transforms if type(t).__name__ == kind]
    n = 10
    # seeded: MixUp's weight (Beta(0.2, 0.2)) lies within 1e-6 of 1 for 3% of draws, where
    # float32 rounding leaves some pixels unchanged and the all-or-none check below fails
    torch.manual_seed(0)
    images = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 28, 28)
    labels = torch.randperm(n)  # every image its own class
    mixed, targets = mixer(images.clone(), labels)
    assert targets.shape == (n, 10)
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(n))
    partner = torch.arange(n).roll(1)
    own_share = targets[torch.arange(n), labels]
    partner_share = targets[torch.arange(n), labels[partner]]
    torch.testing.assert_close(own_share + partner_share, torch.ones(n))
    assert torch.unique(own_share).numel() == 1  # one draw for the batch
    # the pixels: a share of each image comes from its partner, the share its target says
    from_partner = (mixed - images) / (images[partner] - images)
    torch.testing.assert_close(from_partner.mean(dim=(1, 2, 3)), partner_share)
    changed = mixed != images  # MixUp: every pixel (or none); CutMix: one box for all images
    assert (changed == changed[0]).all()


def test_random_erasing_draws_a_box_per_image():
    images = torch.ones(400, 1, 28, 28)
    erased = random_erasing(images, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0) == 0
    hit = erased.flatten(1).any(dim=1)
    assert 0.4 < hit.float().mean() < 0.6  # about p of the images
    areas = erased[hit].flatten(1).float().mean(dim=1)
    assert areas.unique().numel() > 20  # a box of its own for each image
    assert areas.min() >= 0.01 and areas.max() <= 0.4
    for mask in erased[hit][:20, 0]:  # each a filled rectangle
        rows, cols = mask.any(dim=1).nonzero(), mask.any(dim=0).nonzero()
        assert mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()
    assert torch.equal(random_erasing(images, p=0.0), images)
    noisy = random_erasing(images, p=1.0, value=None)
    assert (noisy != 1).any(dim=(1, 2, 3)).all() and noisy.std() > 0


@pytest.mark.parametrize(("height", "width"), [(28, 28), (32, 64)])
@pytest.mark.parametrize("scale", [(0.02, 0.33), (0.1, 0.6)])
def test_random_erasing_boxes_are_distributed_as_torchvisions(height, width, scale):
    """Areas, aspects (h/w) and the share of images erased as torchvision's
    RandomErasing.get_params: 10 draws, the first smaller than the image, else none erased."""
    from torchvision.transforms import RandomErasing

    n, ratio = 4000, (0.3, 3.3)
    images = torch.ones(n, 1, height, width)
    generator = torch.Generator().manual_seed(0)
    erased = random_erasing(images, 1.0, scale, ratio, value=0.0, generator=generator) == 0
    rows, cols = erased[:, 0].any(dim=2).sum(dim=1), erased[:, 0].any(dim=1).sum(dim=1)
    hit = rows > 0
    ours = [hit.float().mean(), (rows * cols)[hit] / (height * width), (rows / cols)[hit].log()]
    torch.manual_seed(0)
    image = torch.ones(1, height, width)
    params = [RandomErasing.get_params(image, scale, ratio, value=[0.0]) for _ in range(n)]
    h = torch.tensor([p[2] for p in params], dtype=torch.float)
    w = torch.tensor([p[3] for p in params], dtype=torch.float)
    done = (h < height) | (w < width)  # get_params returns the whole image when none fits
    theirs = [done.float().mean(), (h * w)[done] / (height * width), (h / w)[done].log()]
    for a, b, tolerance in zip(ours, theirs, (0.01, 0.01, 0.05), strict=True):
        assert abs(float(a.mean()) - float(b.float().mean())) < tolerance, (ours, theirs)


def test_ema_weights_are_the_ones_validated_checkpointed_and_tested(tmp_path):
    cfg = make_cfg(
        tmp_path,
        [
            *TINY,
            "callbacks=ema",
            "callbacks.ema.decay=0.9",
            "trainer.max_epochs=1",
            "+callbacks.seen._target_=helpers.RecordEvalWeights",
            f"+callbacks.seen.path={tmp_path / 'seen.pt'}",
        ],
    )
    train_task(cfg)
    folder = Path(cfg.paths.output_dir)
    seen = torch.load(tmp_path / "seen.pt")
    last = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)
    best = torch.load(folder / "checkpoints" / "best.ckpt", weights_only=False)
    averaged, raw = last["state_dict"], last["current_model_state"]
    for name, value in seen["validate"].items():  # the last validation ran on the average
        assert torch.equal(value, averaged[name]), name
    assert any(not torch.equal(averaged[n], raw[n]) for n in seen["validate"])
    for name, value in seen["test"].items():  # the test, on the best checkpoint's average
        assert torch.equal(value, best["state_dict"][name]), name
    assert int(last["averaging_state"]["n_averaged"]) == last["global_step"]
    # the run's other state is the module's as it is, not the copy the average made at setup
    # (the best validation accuracy so far was -inf there: a resume would forget the best)
    for ckpt in (last, best):
        best_acc = ckpt["state_dict"]["val_acc_best.max_value"]
        assert torch.equal(best_acc, ckpt["current_model_state"]["val_acc_best.max_value"])
        assert 0 < float(best_acc) <= 1


def test_the_default_ema_decay_ramps_up_so_a_short_run_is_not_its_initial_weights(tmp_path):
    """decay 0.999 (conf/callbacks/ema.yaml) over a 60-step run: a constant decay would keep
    0.999^60 = 94% of the random initial weights in the average (test/acc near chance)."""
    cfg = make_cfg(tmp_path, [*QUIET_CSV, "callbacks=ema", "trainer.max_epochs=3"])
    train_task(cfg)
    assert summary_of(cfg)["metrics"]["test/acc"] > 0.85


def test_the_average_of_16_bit_weights_is_float32(tmp_path):
    """callbacks=ema under trainer.precision=bf16-true: 16-bit weights averaged into a float32
    copy (a lerp of the two types failed at the second update: review 166)."""
    overrides = ["callbacks=ema", "trainer.precision=bf16-true", "trainer.max_epochs=1"]
    cfg = make_cfg(tmp_path, [*QUIET_CSV, *overrides, "+trainer.limit_train_batches=5"])
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"
    saved = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    # the weights the checkpoint holds are the average's; the raw ones ride along
    assert {t.dtype for t in saved["current_model_state"].values()} >= {torch.bfloat16}
    average = [t for k, t in saved["state_dict"].items() if k.endswith("weight")]
    assert average and all(t.dtype == torch.float32 for t in average)


def test_before_its_first_update_the_average_is_the_weights_as_they_are(tmp_path):
    """update_starting_at_step past the run's end: validation, checkpoints and the test score
    the trained weights, as a run without EMA does (not the copy made at setup)."""

    def run(folder: str, *overrides: str) -> tuple[dict, dict]:
        cfg = make_cfg(tmp_path / folder, [*TINY, "trainer.max_epochs=1", *overrides])
        train_task(cfg)
        best = torch.load(
            Path(cfg.paths.output_dir) / "checkpoints" / "best.ckpt", weights_only=True
        )
        return summary_of(cfg)["metrics"], best["state_dict"]

    plain, plain_best = run("plain")
    late, late_best = run("late", "callbacks=ema", "callbacks.ema.update_starting_at_step=10000")
    for metric in ("val/acc", "test/acc", "test/loss"):
        assert late[metric] == plain[metric], metric
    weights = [name for name in plain_best if name.startswith("net.")]
    assert weights and all(torch.equal(plain_best[name], late_best[name]) for name in weights)


def test_a_resumed_fit_continues_the_ema_bit_identically(tmp_path, capsys):
    """Two epochs straight, or one and then resumed from its last checkpoint: the same averaged
    and raw weights (constant LR: a one-epoch run's schedule would end after one epoch)."""
    common = [*TINY, "callbacks=ema", "callbacks.ema.decay=0.9", "model.scheduler=null"]
    common += ["test=false", "+model.erasing._target_=litlab.models.augment.RandomErasing"]

    def last_checkpoint(folder: str, overrides: list[str]) -> Path:
        cfg = make_cfg(tmp_path / folder, [*common, *overrides])
        train_task(cfg)  # (its folder read now: the next make_cfg moves paths.output_dir)
        return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"

    a = load_checkpoint(last_checkpoint("straight", ["trainer.max_epochs=2"]))
    first = last_checkpoint("first", ["trainer.max_epochs=1"])
    b = load_checkpoint(last_checkpoint("resumed", ["trainer.max_epochs=2", f"ckpt_path={first}"]))
    assert load_checkpoint(first)["global_step"] * 2 == a["global_step"]
    assert a["global_step"] == b["global_step"] > 0
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)
    # without the callback, Lightning would train on from the averaged weights (with the raw
    # ones' optimizer state) after a warning: refused in one line
    plain = [*(o for o in common if o != "callbacks=ema" and "callbacks.ema" not in o)]
    cfg = make_cfg(tmp_path / "without", [*plain, "trainer.max_epochs=2", f"ckpt_path={first}"])
    refused(capsys, train_task, cfg, "was written with callbacks.ema")


def test_validating_does_not_round_the_float32_average_of_16_bit_weights(tmp_path):
    """trainer.precision=bf16-true: the module's weights are bfloat16, the average float32.
    A run that validates after every epoch must average exactly what one that never validates
    does (the swap around validation rounded the average to 16 bits each time)."""
    common = [*TINY, "callbacks=ema", "callbacks.ema.decay=0.9", "model.scheduler=null"]
    common += ["trainer.precision=bf16-true", "trainer.max_epochs=3", "test=false"]

    def averaged(folder: str, *overrides: str) -> dict:
        cfg = make_cfg(tmp_path / folder, [*common, *overrides])
        train_task(cfg)
        last = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
        return last["state_dict"]

    validated = averaged("validated")
    blind = averaged("blind", "+trainer.limit_val_batches=0")
    weights = [n for n in validated if n.startswith("net.") and validated[n].is_floating_point()]
    assert weights and all(validated[name].dtype == torch.float32 for name in weights)
    for name in weights:
        assert torch.equal(validated[name], blind[name]), name
    # the average is not a copy of 16-bit values (which the rounding would leave)
    assert any(not torch.equal(validated[n], validated[n].bfloat16().float()) for n in weights)


def test_recipes_config_what_they_promise(tmp_path):
    sprint = make_cfg(tmp_path, ["experiment=fashion_sprint"])
    assert sprint.model.tta_flip and sprint.model.label_smoothing > 0
    assert sprint.trainer.check_val_every_n_epoch == sprint.trainer.max_epochs
    best = make_cfg(tmp_path, ["experiment=fashion_best"])
    model = build(best.model, "model")
    assert model.tta_flip and model.erasing is not None
    assert isinstance(model.mix, v2.RandomApply)
    assert best.callbacks.ema._target_ == "litlab.callbacks.EMA"
    plain = build(make_cfg(tmp_path, ["model=resnet"]).model, "model")
    assert not plain.tta_flip and plain.erasing is None and plain.mix is None  # off by default


@pytest.mark.slow
@needs_fashion
@pytest.mark.parametrize(
    "recipe, smaller, bar",
    [
        ("fashion_sprint", ["model.net.width=16", "data.train_fraction=0.1"], 0.65),  # 0.754 here
        (
            "fashion_best",
            [
                "model.net.width=8",
                "model.net.depth=[1,1,1,1]",
                "data.train_fraction=0.25",
                "callbacks.ema.decay=0.9",  # 0.999 averages over more steps than this run has
            ],
            0.35,  # 0.51 here (float32): one-cycle SGD under erasing and mixing starts slowly
        ),
    ],
)
def test_recipe_first_epoch_on_real_fashion_mnist(tmp_path, recipe, smaller, bar):
    """Each recipe's first epoch end to end (augmentation, EMA, test-time flip, checkpoints,
    test), narrower and on a fraction of the training split (the whole validation and test
    sets), in batches of 128 for enough steps (about 15 s each on 2 cores); the CPU tries at
    larger sizes are in docs/benchmarks.md (P3' recipes)."""
    cfg = make_cfg(
        tmp_path,
        [
            f"experiment={recipe}",
            *smaller,
            "data.batch_size=128",
            "trainer.max_epochs=1",
            *QUIET_CSV,
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed"
    assert summary["metrics"]["test/acc"] >= bar
