"""ResNet for small images (CIFAR-style stem), built from torchvision's BasicBlock."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock

from litlab.errors import ConfigError


class ResNet(nn.Module):
    """ResNet-18-like by default: 3x3 stem without max-pool, stages of BasicBlocks (w, 2w, 4w, 8w)."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 64,
        depth: Sequence[int] = (2, 2, 2, 2),
    ):
        super().__init__()
        if width < 1 or not depth or min(depth) < 1:
            raise ConfigError(
                f"ResNet needs width >= 1 and a non-empty depth list of positive ints, got {width}, {list(depth)}"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        cin = width
        for i, blocks in enumerate(depth):
            cout, stride = width * 2**i, 1 if i == 0 else 2
            for b in range(blocks):
                s = stride if b == 0 else 1
                downsample = None
                if s != 1 or cin != cout:
                    downsample = nn.Sequential(
                        nn.Conv2d(cin, cout, 1, stride=s, bias=False), nn.BatchNorm2d(cout)
                    )
                stages.append(BasicBlock(cin, cout, stride=s, downsample=downsample))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # Zero-init the last BN of each block: every block starts as identity (Goyal et al. 2017).
        for m in self.stages:
            nn.init.zeros_(m.bn2.weight)

    def forward(self, x: Tensor) -> Tensor:
        # Global average pooling as a mean: unlike AdaptiveAvgPool2d its CUDA backward is
        # deterministic (trainer.deterministic=true).
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))
