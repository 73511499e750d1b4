"""FID feature extractors that work offline: a frozen litlab classifier, or InceptionV3.

FID numbers are only comparable under the same extractor, so every extractor has a tag
(``inception``, ``domain-<hash of its weights>``) that goes into the logged metric name.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.data.transforms import per_channel
from litlab.errors import CheckpointError, ConfigError, first_line
from litlab.files import atomic_file

log = logging.getLogger(__name__)


@contextmanager
def full_precision_matmuls() -> Iterator[None]:
    """float32 matmuls at full precision inside, whatever callbacks.speed.matmul_precision set
    for training: "high" and "medium" compute them in TF32 on GPUs, and "medium" in bfloat16 on
    CPUs with AVX512-BF16/AMX (0.5 off on values of 45), so a classifier extractor's logits (the
    class entropy) and the features of one with Linear layers before its head (the FID) would
    depend on a speed setting. (InceptionV3's pool features have no matmul.)"""
    before = torch.get_float32_matmul_precision()
    if before == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def weights_hash(module: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:8]


class ClassifierFeatures(nn.Module):
    """A frozen classifier net as a feature extractor: the input of its last Linear layer.

    Takes images in [0, 1] and normalizes them the way the classifier was trained.
    """

    def __init__(
        self,
        net: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        image_shape: Sequence[int],
    ):
        super().__init__()
        heads = [m for m in net.modules() if isinstance(m, nn.Linear)]
        if not heads:
            raise ConfigError("the FID extractor net has no Linear layer to take features from")
        self.net = net.eval().requires_grad_(False)
        self.num_features, self.num_classes = heads[-1].in_features, heads[-1].out_features
        self.image_shape = tuple(image_shape)
        self.register_buffer("mean", per_channel(mean))
        self.register_buffer("std", per_channel(std))
        self._captured: Tensor | None = None
        heads[-1].register_forward_hook(self._capture)
        self.tag = f"domain-{weights_hash(net)}"

    def _capture(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        self._captured = inputs[0]

    def train(self, mode: bool = True) -> ClassifierFeatures:
        return super().train(False)  # frozen: BN keeps its running statistics

    @torch.no_grad()
    @full_precision_matmuls()
    def features_and_logits(self, images: Tensor) -> tuple[Tensor, Tensor]:
        # On the grey levels of real images' uint8 pixels (which round-trip exactly), as for
        # InceptionV3: a generator's continuous outputs are measured as the images it would
        # save, not as values between two levels that no real image has.
        images = (images.float() * 255).round().clamp(0, 255) / 255
        logits = self.net((images - self.mean) / self.std)
        return self._captured.flatten(1).float(), logits.float()

    def forward(self, images: Tensor) -> Tensor:
        return self.features_and_logits(images)[0]


def class_histogram(logits: Tensor) -> Tensor:
    """How many images the extractor's classifier puts in each class (float, for summing)."""
    return torch.bincount(logits.argmax(dim=1), minlength=logits.shape[1]).float()


def entropy(counts: Tensor) -> float:
    """Entropy (nats) of a class histogram: low when the generator mode-collapses."""
    p = counts / counts.sum()
    return float(-(p[p > 0] * p[p > 0].log()).sum())


def classifier_from_checkpoint(path: str | Path) -> ClassifierFeatures:
    """A litlab classifier checkpoint (e.g. from experiment=fashion_cnn) as an FID extractor."""
    from litlab.checkpoint import load_checkpoint, stored_config
    from litlab.config import CLASSIFIER, build
    from litlab.nets.torchvision_net import weights_from_checkpoint

    checkpoint = load_checkpoint(path)
    config = stored_config(checkpoint, path)
    if config.model.get("_target_") != CLASSIFIER:
        raise CheckpointError(
            f"{path} is a {config.model.get('_target_')} checkpoint; the FID extractor must be an "
            "image classifier checkpoint (e.g. from python train.py experiment=fashion_cnn)"
        )
    with weights_from_checkpoint():  # (a pretrained net's: the checkpoint's, not downloaded)
        net = build(config.model.net, "model.net")
    prefix = "net."
    net.load_state_dict(
        {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    )
    return ClassifierFeatures(net, config.data.mean, config.data.std, config.data.image_shape)


# How domain_classifier trains its SmallCNN: Adam at lr, batches of batch_size, for
# min(max_epochs, max(min_epochs, ceil(images_seen / N))) epochs. In the cache key: a cached
# classifier trained by another recipe (another litlab version) is another extractor.
RECIPE = {"lr": 2e-3, "batch_size": 256, "min_epochs": 2, "max_epochs": 30, "images_seen": 20_000}


def _training_hash(
    images: Tensor, labels: Tensor, mean: Sequence[float], std: Sequence[float], seed: int
) -> str:
    """What the domain classifier is trained from and how: pixels, labels, normalization, seed
    and RECIPE (a classifier trained under another normalization computes other features)."""
    digest = hashlib.sha256(images.contiguous().numpy().tobytes())
    digest.update(labels.contiguous().numpy().tobytes())
    digest.update(repr(([float(m) for m in mean], [float(s) for s in std], seed)).encode())
    digest.update(repr(sorted(RECIPE.items())).encode())
    return digest.hexdigest()[:16]


def domain_net(channels: int, num_classes: int, width: int = 32, seed: int = 0) -> nn.Module:
    """The domain classifier's net (SmallCNN) as initialized from a random stream of its own: the
    run's random state (and so its results) must not depend on whether the extractor was
    cached, and the cached weights on nothing but what their key names."""
    from litlab.nets import SmallCNN

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SmallCNN(channels, num_classes, width=width)


def domain_features(
    weights: dict[str, Tensor],
    num_classes: int,
    mean: Sequence[float],
    std: Sequence[float],
    image_shape: Sequence[int],
    width: int = 32,
) -> ClassifierFeatures:
    """The domain classifier of these trained ``weights`` as FID extractor."""
    net = domain_net(image_shape[0], num_classes, width)
    net.load_state_dict(weights)
    return ClassifierFeatures(net, mean, std, image_shape)


def domain_classifier(
    images: Tensor,
    labels: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    cache_dir: str | Path,
    width: int = 32,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> ClassifierFeatures:
    """Train (once, cached by a hash of the data) a small CNN on real images as FID extractor."""
    num_classes = int(labels.max()) + 1
    if labels.unique().numel() < 2:  # cross-entropy of one class is 0: the net would stay random
        raise ConfigError(
            "the FID extractor auto trains a classifier, but the training images are of one class: "
            "set data.num_classes=1 (auto then uses InceptionV3) or callbacks.fid.extractor=inception"
        )
    image_shape = tuple(images.shape[1:])
    key = _training_hash(images, labels, mean, std, seed)
    path = Path(cache_dir) / f"fid-classifier-{key}-w{width}.pt"
    if path.is_file():
        log.info("FID extractor: cached domain classifier %s", path)
        weights = torch.load(path, map_location="cpu", weights_only=True)
        return domain_features(weights, num_classes, mean, std, image_shape, width)
    net = domain_net(image_shape[0], num_classes, width, seed)
    log.info(
        "FID extractor: no classifier configured, training a small one on the %d real training "
        "images (cached in %s)",
        len(images),
        path,
    )
    generator = torch.Generator().manual_seed(seed)
    m, s = per_channel(mean, device), per_channel(std, device)
    net.to(device).train()
    images, labels = images.to(device), labels.to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=RECIPE["lr"])
    epochs = math.ceil(RECIPE["images_seen"] / len(images))
    epochs = min(RECIPE["max_epochs"], max(RECIPE["min_epochs"], epochs))
    batch = RECIPE["batch_size"]
    from rich.progress import Progress

    # a bar while it trains (a minute or more on a CPU: a first GAN run looked hung; 145)
    with Progress(transient=True) as progress:
        steps = epochs * math.ceil(len(images) / batch)
        task = progress.add_task(f"training the FID extractor ({epochs} epochs)", total=steps)
        for _ in range(epochs):
            order = torch.randperm(len(images), generator=generator).to(device)
            for start in range(0, len(images), batch):
                idx = order[start : start + batch]
                x = (images[idx].float() / 255 - m) / s
                loss = F.cross_entropy(net(x), labels[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                progress.advance(task)
    net.cpu()
    with atomic_file(path) as f:  # a sweep's jobs may build the same one at once
        torch.save(net.state_dict(), f)
    return ClassifierFeatures(net, mean, std, image_shape)


class InceptionFeatures(nn.Module):
    """torch-fidelity's InceptionV3 (the standard FID network): 2048-d pool features of [0, 1]
    images, resized to 299 px as the published FIDs (TensorFlow 1's bilinear resize)."""

    num_features = 2048
    tag = "inception"

    def __init__(
        self,
        weights_path: str | None = None,
        alternative: str = "use callbacks.fid.extractor=auto",
        weights_key: str = "callbacks.fid.inception_weights",
    ):
        super().__init__()
        try:
            from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3
            from torchmetrics.image.fid import NoTrainInceptionV3
        except ImportError as e:  # torchmetrics imports torch-fidelity lazily
            raise ConfigError(
                "FID with InceptionV3 needs torch-fidelity: pip install torch-fidelity"
            ) from e
        if weights_path is not None and not Path(weights_path).is_file():
            raise ConfigError(
                f"InceptionV3 weights {weights_path} not found; set {weights_key} to the file"
            )
        try:
            # antialias=False: torch-fidelity's TensorFlow-1 bilinear resize, the reference FID's
            # (torchmetrics' default antialiased resize gives other numbers than published ones).
            self.inception = NoTrainInceptionV3(
                name="inception-v3-compat",
                features_list=["2048"],
                feature_extractor_weights_path=weights_path,
                antialias=False,
            )
        except Exception as e:  # the download of the weights failed, or the file is not them
            if weights_path is not None:  # (read as if the file were missing: walkthrough 145)
                raise ConfigError(
                    f"{weights_key}={weights_path} is not InceptionV3's weights "
                    f"for FID ({first_line(e)}): give the file {URL_INCEPTION_V3} downloads, or "
                    f"{alternative}"
                ) from e
            raise ConfigError(
                f"could not get InceptionV3's weights ({first_line(e)}): download {URL_INCEPTION_V3} "
                f"where there is internet and set {weights_key}=<that file>, "
                f"or {alternative}"
            ) from e

    def forward(self, images: Tensor) -> Tensor:
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        # Rounded to the nearest grey level, as real images' pixels are (they round-trip exactly).
        pixels = (images * 255).round().clamp(0, 255).to(torch.uint8)
        return self.inception(pixels).float()
