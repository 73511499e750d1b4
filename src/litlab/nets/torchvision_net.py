"""Any torchvision classification model by name (e.g. resnet50 at 224 px)."""

from __future__ import annotations

import torchvision
from torch import Tensor, nn

from litlab.errors import ConfigError

AUX_HEADED = ("googlenet", "inception_v3")


class TorchvisionNet(nn.Module):
    """Wraps ``torchvision.models.get_model(name)``; 1-channel input is repeated to 3 channels."""

    def __init__(self, name: str, in_channels: int, num_classes: int, weights: str | None = None):
        super().__init__()
        available = torchvision.models.list_models(module=torchvision.models)
        if name not in available:
            raise ConfigError(
                f"unknown torchvision model {name!r}; pick one of torchvision.models.list_models(), e.g. resnet18, resnet50"
            )
        if in_channels not in (1, 3):
            raise ConfigError(f"torchvision models take 1 or 3 channels, got {in_channels}")
        self.in_channels = in_channels
        # GoogLeNet and Inception v3 train with auxiliary heads by default and then return a
        # named tuple, which a classifier's loss cannot take: built without them (one output)
        extra = {"aux_logits": False} if name in AUX_HEADED else {}
        self.model = torchvision.models.get_model(
            name, weights=weights, num_classes=num_classes, **extra
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.model(x)
