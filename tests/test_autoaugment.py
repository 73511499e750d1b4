"""Per-image TrivialAugment and RandAugment: torchvision's ops on every image, drawn per image."""

import pytest
import torch
from torchvision.transforms import v2

from conftest import make_cfg
from litlab.config import build
from litlab.data.autoaugment import OPS, SIGNED, RandAugment, TrivialAugment
from litlab.errors import ConfigError

POLICIES = {TrivialAugment: v2.TrivialAugmentWide, RandAugment: v2.RandAugment}


def sample_images(n: int, channels: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """uint8 noise with a different range per image, and one flat image (autocontrast's and
    equalize's edge case), so that every op has work to do."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, 256, (n, channels, height, width), generator=g)
    low = torch.randint(0, 100, (n, 1, 1, 1), generator=g)
    span = torch.randint(1, 156, (n, 1, 1, 1), generator=g)
    images = (low + noise * span // 255).to(torch.uint8)
    images[0] = 77
    return images


def torchvision_op(policy, image: torch.Tensor, op: str, bin: int, negative: bool) -> torch.Tensor:
    """What torchvision's transform does to one uint8 image once it has drawn op, bin and sign.

    Private torchvision internals on purpose: the oracle is the transform's own magnitude table
    and op dispatch, so this test fails if torchvision changes either."""
    magnitudes_fn, signed = policy._AUGMENTATION_SPACE[op]
    magnitudes = magnitudes_fn(policy.num_magnitude_bins, *image.shape[-2:])
    magnitude = 0.0 if magnitudes is None else float(magnitudes[bin])
    if signed and negative:
        magnitude = -magnitude
    return policy._apply_image_or_video_transform(
        image, op, magnitude, interpolation=policy.interpolation, fill=policy._fill
    )


def test_op_names_and_signs_are_torchvisions():
    for ours, theirs in POLICIES.items():
        space = theirs()._AUGMENTATION_SPACE
        assert list(space) == list(OPS), ours
        assert [op for op, (_, signed) in space.items() if signed] == list(SIGNED), ours


@pytest.mark.parametrize("shape", [(3, 24, 32), (1, 32, 32)], ids=["rgb-24x32", "gray-32x32"])
@pytest.mark.parametrize("policy", list(POLICIES), ids=lambda p: p.__name__)
@pytest.mark.parametrize("op", OPS)
def test_each_op_equals_torchvision_on_uint8_images(op, policy, shape):
    # Exact on these images for every op: the affine matrices come from the same double-precision
    # formula and grid as torchvision's, and blends round like its add_(alpha=). The bounds allow
    # one level on a few pixels in case a CPU rounds a blend's multiply-add differently (blending
    # with x * f + y * (1 - f) instead is one level off on up to 9% of the pixels).
    images = sample_images(6, *shape)
    ours, theirs = policy(), POLICIES[policy]()
    n = len(images)
    for bin in (1, 9, 30):  # 30: the largest magnitude (135 degrees, shear 0.99, ...)
        for negative in (False, True):
            expected = torch.stack([torchvision_op(theirs, im, op, bin, negative) for im in images])
            got = ours.apply(
                images.float(),
                torch.full((n,), OPS.index(op)),
                torch.full((n,), bin),
                torch.full((n,), negative),
            )
            difference = (got - expected.float()).abs()
            assert difference.max() <= 1, (op, bin, negative)
            assert (difference > 0).float().mean() <= 0.01, (op, bin, negative)


def test_rotate_by_90_degrees_is_torchvisions_rot90():
    # torchvision turns 90 degrees with torch.rot90, not the grid; bin 20 of 31 is 90 degrees
    images = sample_images(4, 3, 16, 16)
    ours, n = TrivialAugment(), len(images)
    rotate = torch.full((n,), OPS.index("Rotate"))
    for negative, k in ((False, 1), (True, 3)):
        got = ours.apply(images.float(), rotate, torch.full((n,), 20), torch.full((n,), negative))
        assert torch.equal(got, torch.rot90(images, k, dims=(2, 3)).float())


@pytest.mark.parametrize("policy", list(POLICIES), ids=lambda p: p.__name__)
def test_the_accelerator_path_equals_the_cpu_path(policy):
    # On CUDA each op runs on the whole batch and torch.where keeps its images (no host sync);
    # on the CPU each op runs on its own images only. Both must give the same pixels.
    images = sample_images(64, 3, 20, 20).float()
    aug = policy()
    ops, bins, negative = aug.draw(64, images.device, torch.Generator().manual_seed(1))
    for i in range(aug.rounds):
        subset = aug.apply(images, ops[i], bins[i], negative[i], subset=True)
        whole = aug.apply(images, ops[i], bins[i], negative[i], subset=False)
        assert torch.equal(subset, whole)


@pytest.mark.parametrize("policy", list(POLICIES), ids=lambda p: p.__name__)
def test_identical_images_get_different_ops(policy):
    # torchvision's transform on a batch draws one op for all of it: every output would be equal
    aug = policy()
    images = sample_images(2, 3, 32, 32, seed=3)[1:].float().expand(256, -1, -1, -1)
    out = aug(images, torch.Generator().manual_seed(0))
    distinct = torch.unique(out.flatten(1), dim=0)
    assert len(distinct) > 100
    ops, _, _ = aug.draw(256, images.device, torch.Generator().manual_seed(0))
    assert len(torch.unique(ops[0])) == len(OPS)


def test_ops_bins_and_signs_are_drawn_uniformly():
    aug = TrivialAugment()
    ops, bins, negative = aug.draw(4 * 256, torch.device("cpu"), torch.Generator().manual_seed(2))
    # 1024 draws: 73 per op expected, sd 8; the band is about 4 sd wide each side
    assert torch.bincount(ops.flatten(), minlength=len(OPS)).tolist() == pytest.approx(
        [1024 / len(OPS)] * len(OPS), abs=35
    )
    assert torch.bincount(bins.flatten(), minlength=31).min() >= 15  # 33 expected
    assert 0.4 < negative.float().mean() < 0.6


def test_rand_augment_draws_num_ops_ops_at_its_magnitude():
    aug = RandAugment(num_ops=3, magnitude=5)
    ops, bins, _ = aug.draw(512, torch.device("cpu"), torch.Generator().manual_seed(4))
    assert ops.shape == (3, 512) and (bins == 5).all()
    for round_ops in ops:
        counts = torch.bincount(round_ops, minlength=len(OPS))
        assert counts.min() >= 15 and counts.max() <= 60  # 37 expected per op


@pytest.mark.parametrize("policy", list(POLICIES), ids=lambda p: p.__name__)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_seeded_call_repeats_and_keeps_shape_dtype_and_range(policy, channels, dtype):
    images = sample_images(32, channels, 24, 20).to(dtype)
    aug = policy()
    first = aug(images, torch.Generator().manual_seed(5))
    second = aug(images, torch.Generator().manual_seed(5))
    assert torch.equal(first, second)
    assert first.shape == images.shape and first.dtype == dtype and first.device == images.device
    assert first.min() >= 0 and first.max() <= 255 and torch.equal(first, first.round())
    assert not torch.equal(first, aug(images, torch.Generator().manual_seed(6)))


def test_call_applies_the_draws_it_makes():
    images = sample_images(32, 3, 16, 16).float()
    aug = RandAugment()
    ops, bins, negative = aug.draw(32, images.device, torch.Generator().manual_seed(7))
    expected = images
    for i in range(aug.rounds):
        expected = aug.apply(expected, ops[i], bins[i], negative[i])
    assert torch.equal(aug(images, torch.Generator().manual_seed(7)), expected)


def test_input_is_left_untouched():
    images = sample_images(16, 3, 16, 16).float()
    before = images.clone()
    TrivialAugment()(images)
    assert torch.equal(images, before)


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: TrivialAugment(num_magnitude_bins=1), "num_magnitude_bins="),
        (lambda: RandAugment(num_ops=-1), "num_ops="),
        (lambda: RandAugment(num_ops=1.5), "num_ops="),
        (lambda: RandAugment(magnitude=31), "magnitude="),
        (lambda: RandAugment(magnitude=5, num_magnitude_bins=5), "magnitude="),
    ],
)
def test_bad_settings_say_what_to_set(make, setting):
    with pytest.raises(ConfigError, match=f"set {setting}"):
        make()


def test_repr_shows_the_settings():
    assert repr(TrivialAugment()) == "TrivialAugment(num_magnitude_bins=31)"
    assert repr(RandAugment(3, 7)) == "RandAugment(num_ops=3, magnitude=7, num_magnitude_bins=31)"


@pytest.mark.parametrize("group", ["trivial", "rand"])
def test_the_data_augment_option_augments_training_batches_per_image_only(tmp_path, group):
    """``+data/augment=trivial|rand`` reaches the DataModule's batch transform: training
    batches of identical images come out different image by image; evaluation is untouched."""
    cfg = make_cfg(tmp_path, [f"+data/augment={group}"])
    datamodule = build(cfg.data, "data")
    expected = TrivialAugment if group == "trivial" else RandAugment
    assert type(datamodule.transform.augment) is expected
    images = sample_images(2, *cfg.data.image_shape)[1:].repeat(64, 1, 1, 1)  # [0] is flat
    trained = datamodule.transform(images, train=True)
    assert len({t.numpy().tobytes() for t in trained}) > 16  # drawn per image
    evaluated = datamodule.transform(images, train=False)
    assert torch.equal(evaluated, evaluated[:1].expand_as(evaluated))
    plain = build(make_cfg(tmp_path / "plain", []).data, "data").transform(images, train=False)
    assert torch.equal(evaluated, plain)
