"""A net from the user's own module, as the per-step overhead benchmark trains it (P1):

    PYTHONPATH=scripts python train.py data=fashion_mnist model/net=custom model.net._target_=tiny_mlp.TinyMLP

(the folder that holds the module on PYTHONPATH). A step of this net takes about a millisecond on a CPU, so what a
framework adds to every step shows.
"""

from __future__ import annotations

import itertools

from torch import Tensor, nn


class TinyMLP(nn.Module):
    """784-64-128-64-10 with BatchNorm after each hidden layer, for 28x28 grayscale images."""

    def __init__(self, in_features: int = 784, num_classes: int = 10) -> None:
        super().__init__()
        widths = [in_features, 64, 128, 64]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(widths[-1], num_classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)


class OneLayer(nn.Module):
    """784-10, one Linear layer: a step that is nearly all framework (the per-step floor)."""

    def __init__(self, in_features: int = 784, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)
