"""A small, fast CNN for 28-32 px images."""

from __future__ import annotations

from torch import Tensor, nn

from litlab.errors import ConfigError


def conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Module):
    """Three stages of ``depth`` conv-BN-ReLU layers (widths w, 2w, 4w), 2x2 max-pool between,
    global max-pool, linear head."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 32,
        depth: int = 1,
        dropout: float = 0.0,
    ):
        super().__init__()
        if width < 1 or depth < 1 or not 0.0 <= dropout < 1.0:
            raise ConfigError(
                f"SmallCNN needs width >= 1, depth >= 1, 0 <= dropout < 1; got {width}, {depth}, {dropout}"
            )
        layers: list[nn.Module] = []
        cin = in_channels
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            if stage:
                layers.append(nn.MaxPool2d(2))
            for _ in range(depth):
                layers += conv_bn_relu(cin, cout)
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(cin, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        # Global max pooling as amax: unlike AdaptiveMaxPool2d its CUDA backward is deterministic.
        return self.head(self.features(x).amax(dim=(2, 3)))
