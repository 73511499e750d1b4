"""Any torchvision classification model by name (e.g. resnet50 at 224 px)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

from litlab.errors import ConfigError, first_line

log = logging.getLogger(__name__)

AUX_HEADED = ("googlenet", "inception_v3")
# (name, image shape) pairs checked in this process: the run's other builds of the same net (the
# finders' throwaway copies, FSDP's model for the test) skip the blank forward pass
TAKES: set[tuple[str, tuple[int, ...]]] = set()


_FROM_CHECKPOINT: ContextVar[bool] = ContextVar("weights_from_checkpoint", default=False)


@contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Nets built within take none of their pretrained ``weights``: a checkpoint's replace
    every one of them (eval.py, resume=, a test of a checkpoint). They are built as the weights
    would build them (``architecture_of``), and nothing is downloaded: on a machine without
    internet, a fine-tuned checkpoint could be neither tested nor continued."""
    token = _FROM_CHECKPOINT.set(True)
    try:
        yield
    finally:
        _FROM_CHECKPOINT.reset(token)


def architecture_of(name: str, weights: Any) -> nn.Module:
    """The net ``get_model(name, weights=weights)`` builds, without loading the weights: the
    arguments torchvision's builders take from them (torchvision 0.29: the weights' classes;
    GoogLeNet's and Inception v3's input transform and auxiliary heads; a ViT's or MaxViT's
    image size), so that the same state dict fits and the forward pass is the same."""
    kwargs: dict[str, Any] = {"num_classes": len(weights.meta["categories"])}
    if name in AUX_HEADED:
        kwargs.update(transform_input=True, aux_logits=True, init_weights=False)
    if name.startswith("vit_"):
        kwargs["image_size"] = weights.meta["min_size"][0]
    if name.startswith("maxvit_"):
        kwargs["input_size"] = weights.meta["min_size"]
    return torchvision.models.get_model(name, **kwargs)


def pretrained(name: str, weights: Any) -> nn.Module:
    """``get_model(name, weights=weights)``; a download that fails (no internet: a cluster's
    compute node) in one line saying where torch looks for the file first."""
    try:
        return torchvision.models.get_model(name, weights=weights)
    except OSError as e:  # urllib's URLError and HTTPError, a full disk, an unwritable cache
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        raise ConfigError(
            f"could not download {name}'s {weights.name} weights ({first_line(e, 120)}); "
            f"where there is no internet, put {weights.url.rsplit('/', 1)[-1]} (from "
            f"{weights.url}) in {cache}/ (torch's cache, $TORCH_HOME/hub/checkpoints), or "
            "train from scratch with model.net.weights=null"
        ) from e


def drop_auxiliary_heads(model: nn.Module) -> None:
    """GoogLeNet's and Inception v3's auxiliary heads removed, as torchvision itself does after
    loading weights built with them (it requires them for the weights): one output, a tensor,
    which a classifier's loss takes (in training they return a named tuple)."""
    model.aux_logits = False
    for name in ("aux1", "aux2", "AuxLogits"):
        if hasattr(model, name):
            setattr(model, name, None)


def head_of(model: nn.Module, classes: int) -> str:
    """The name of the pretrained head: the last linear or 1x1 convolution giving ``classes``
    outputs (e.g. ImageNet's 1,000); "" where there is none."""
    heads = [
        name
        for name, module in model.named_modules()
        if (isinstance(module, nn.Linear) and module.out_features == classes)
        or (isinstance(module, nn.Conv2d) and module.out_channels == classes)
    ]
    return heads[-1] if heads else ""


def replace_head(model: nn.Module, name: str, num_classes: int) -> None:
    """The pretrained head ``name`` replaced by a new one giving ``num_classes``: fine-tuning
    on one's own classes, the usual reason for pretrained weights."""
    old = model.get_submodule(name)
    parent, _, attr = name.rpartition(".")
    if isinstance(old, nn.Linear):
        new: nn.Module = nn.Linear(old.in_features, num_classes, bias=old.bias is not None)
    else:
        new = nn.Conv2d(old.in_channels, num_classes, old.kernel_size, old.stride, old.padding)
    setattr(model.get_submodule(parent) if parent else model, attr, new)


class TorchvisionNet(nn.Module):
    """Wraps ``torchvision.models.get_model(name)``; 1-channel input is repeated to 3 channels.

    With pretrained ``weights``: the weights' head is replaced when ``num_classes`` differs from
    theirs, and a 1-channel image (normalized with the weights' first channel's mean and std,
    as litlab.config.check_pretrained_normalization asks) reaches each of the 3 inputs
    normalized with that channel's own mean and std, as the weights saw a gray photo."""

    def __init__(
        self,
        name: str,
        in_channels: int,
        num_classes: int,
        weights: str | None = None,
        image_shape: Sequence[int] | None = None,
        freeze_backbone: bool = False,
    ):
        super().__init__()
        available = torchvision.models.list_models(module=torchvision.models)
        if name not in available:
            raise ConfigError(
                f"unknown torchvision model {name!r}; pick one of torchvision.models.list_models(), e.g. resnet18, resnet50"
            )
        if in_channels not in (1, 3):
            raise ConfigError(f"torchvision models take 1 or 3 channels, got {in_channels}")
        self.in_channels = in_channels
        gray = None  # the scale and shift of a repeated channel, for each of the 3 (none)
        head = ""  # the pretrained head's name (none)
        if weights is None:
            # GoogLeNet and Inception v3 train with auxiliary heads by default and then return a
            # named tuple, which a classifier's loss cannot take: built without them
            extra = {"aux_logits": False} if name in AUX_HEADED else {}
            self.model = torchvision.models.get_model(name, num_classes=num_classes, **extra)
        else:
            try:  # IMAGENET1K_V1, DEFAULT, or ResNet18_Weights.IMAGENET1K_V1 (torchvision's own)
                known = torchvision.models.get_model_weights(name).verify(weights)
            except (KeyError, ValueError):
                raise ConfigError(
                    f"{name} has no weights {weights!r}; pick one of "
                    f"{[w.name for w in torchvision.models.get_model_weights(name)]}"
                ) from None
            if not known.meta.get("categories"):  # VGG's IMAGENET1K_FEATURES: a TypeError
                heads = [
                    w.name
                    for w in torchvision.models.get_model_weights(name)
                    if w.meta.get("categories")
                ]
                raise ConfigError(
                    f"{name}'s {known.name} weights are a feature extractor's, without the "
                    f"classifier a head replaces; pick one of {heads}"
                )
            if _FROM_CHECKPOINT.get():
                self.model = architecture_of(name, known)
            else:
                self.model = pretrained(name, known)
            if name in AUX_HEADED:
                drop_auxiliary_heads(self.model)
            classes = len(known.meta["categories"])
            head = head_of(self.model, classes)
            if not head:
                raise ConfigError(
                    f"found no layer giving {name}'s {classes} outputs (its head, which a "
                    f"fine-tune replaces or trains alone); use weights=null"
                )
            if num_classes != classes:
                replace_head(self.model, head, num_classes)
            preset = known.transforms()
            mean, std = (torch.tensor(v, dtype=torch.float32) for v in (preset.mean, preset.std))
            gray = std[0] / std, (mean[0] - mean) / std
        self.gray = gray is not None and in_channels == 1
        # Frozen: every pretrained layer but the head keeps its weights (no gradients, no
        # optimizer state) and its BatchNorm layers their running statistics (kept in eval mode
        # by train(): in train mode they would normalize with each batch's statistics and move
        # the weights' own, changing the features the head learns from). Dropout and stochastic
        # depth train as usual.
        self.freeze_backbone, self.head = freeze_backbone, head
        if freeze_backbone:
            if not head:
                raise ConfigError(
                    "model.net.freeze_backbone=true trains the head alone on a backbone of "
                    "random weights, which would learn little; give pretrained ones "
                    "(model.net.weights=DEFAULT) or set model.net.freeze_backbone=false"
                )
            for key, param in self.model.named_parameters():
                if not self._in_head(key):
                    param.requires_grad_(False)
            if not _FROM_CHECKPOINT.get():  # (said as a run starts; not by eval.py's build)
                trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
                kept = sum(p.numel() for p in self.model.parameters()) - trained
                norms = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.modules())
                log.info(
                    "model.net.freeze_backbone: %s's head (%s) trains, %s parameters; its %s "
                    "pretrained parameters%s are kept",
                    name,
                    head,
                    f"{trained:,}",
                    f"{kept:,}",
                    " and its BatchNorm statistics" if norms else "",
                )
            # in eval mode from the start: Lightning keeps each module's mode as it finds it
            # (it calls no train()); a net built again in the process (a sweep's next job, the
            # finders' copy: check_takes runs once) trained them otherwise (review 164)
            self.train(self.training)
        if self.gray:
            self.register_buffer("gray_scale", gray[0].view(1, 3, 1, 1), persistent=False)
            self.register_buffer("gray_shift", gray[1].view(1, 3, 1, 1), persistent=False)
        if image_shape is not None and (name, tuple(image_shape)) not in TAKES:
            self.check_takes(name, tuple(image_shape))
            TAKES.add((name, tuple(image_shape)))

    def check_takes(self, name: str, shape: tuple[int, ...]) -> None:
        """One forward pass of a blank image (eval mode: no statistics change): a net for large
        images fails on small ones deep inside torch ("Output size is too small" at 28 px for
        VGG, AlexNet, DenseNet; Inception, ConvNeXt, ViT likewise), a traceback at the first
        batch; one line here instead."""
        try:
            with torch.no_grad():
                self.eval()(torch.zeros(1, *shape))
        except (RuntimeError, AssertionError, ValueError) as e:
            raise ConfigError(
                f"torchvision's {name} cannot take {shape[1]}x{shape[2]} images "
                f"({first_line(e, 120)}); give it larger ones (data.image_shape, e.g. "
                "[3,224,224], with data.source.size for an image folder) or take a net for small "
                "images (model=resnet, model=cnn)"
            ) from None
        finally:
            self.train()

    def _in_head(self, name: str) -> bool:
        """Whether a parameter or module of ``self.model``, by name, is (in) the head."""
        return (name + ".").startswith(self.head + ".")

    def train(self, mode: bool = True) -> TorchvisionNet:
        super().train(mode)
        if self.freeze_backbone:  # found by name: SyncBatchNorm (sync_batchnorm) replaces them
            for key, module in self.model.named_modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm) and not self._in_head(key):
                    module.eval()
        return self

    def forward(self, x: Tensor) -> Tensor:
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
            if self.gray:
                x = x * self.gray_scale + self.gray_shift
        return self.model(x)
