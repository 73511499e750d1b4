"""DCGAN generator and discriminator after Radford et al. (2016), sized from the image shape.

Square images of base * 2**k pixels with base 4 or 7 (16, 28, 32, 56, 64, 128, ...): the
generator projects the latent vector to base x base and doubles k times; the discriminator
mirrors it. Strided convolutions, no pooling; BatchNorm except in G's output and D's input
layer; ReLU/Tanh in G, LeakyReLU(0.2) in D; weights drawn from N(0, 0.02).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from litlab.errors import ConfigError

Norm = Literal["batch", "layer", "spectral", "none"]


def dcgan_layout(image_shape: Sequence[int]) -> tuple[int, int]:
    """(base, number of doublings) for a square image, or a ConfigError saying which sizes work."""
    if len(image_shape) != 3:
        raise ConfigError(f"image_shape must be [C, H, W], got {list(image_shape)}")
    _, h, w = image_shape
    for base in (4, 7):
        k = 0
        while base * 2**k < h:
            k += 1
        if h == w and base * 2**k == h and k >= 2:
            return base, k
    raise ConfigError(
        f"DCGAN builds square images of 4*2^k or 7*2^k pixels (16, 28, 32, 56, 64, 128, ...), "
        f"got {h}x{w}; pick another data.image_shape (e.g. data.source.size=28 or 32)"
    )


def dcgan_init(module: nn.Module) -> None:
    """N(0, 0.02) for convolutions, N(1, 0.02) for norm scales, zero biases (Radford et al.)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.Linear):
            # With spectral norm, `weight` is computed: initialise the raw parameter behind it.
            parametrized = nn.utils.parametrize.is_parametrized(m, "weight")
            nn.init.normal_(
                m.parametrizations.weight.original if parametrized else m.weight, 0.0, 0.02
            )
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


class Generator(nn.Module):
    """z [N, latent_dim] -> image [N, C, H, W] in [-1, 1]."""

    def __init__(self, image_shape: Sequence[int], latent_dim: int = 100, width: int = 64):
        super().__init__()
        if latent_dim < 1 or width < 1:
            raise ConfigError(
                f"latent_dim and width must be positive, got {latent_dim} and {width}"
            )
        base, k = dcgan_layout(image_shape)
        self.latent_dim = latent_dim
        channels = width * 2 ** (k - 1)
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(latent_dim, channels, base, 1, 0, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
        ]
        for _ in range(k - 1):
            layers += [
                nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1, bias=False),
                nn.BatchNorm2d(channels // 2),
                nn.ReLU(inplace=True),
            ]
            channels //= 2
        layers += [nn.ConvTranspose2d(channels, image_shape[0], 4, 2, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        dcgan_init(self)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z.view(z.shape[0], -1, 1, 1))


def _norm(kind: Norm, channels: int) -> list[nn.Module]:
    if kind == "batch":
        return [nn.BatchNorm2d(channels)]
    if kind == "layer":  # LayerNorm over (C, H, W): per-sample, so valid with a gradient penalty
        return [nn.GroupNorm(1, channels)]
    return []


class Discriminator(nn.Module):
    """image [N, C, H, W] -> one real/fake logit per image [N].

    ``norm``: "batch" (DCGAN), "layer" (WGAN-GP: batch norm would couple the samples the
    gradient penalty treats independently), "spectral" (spectral norm on every conv, for the
    hinge loss) or "none".
    """

    def __init__(self, image_shape: Sequence[int], width: int = 64, norm: Norm = "batch"):
        super().__init__()
        if width < 1:
            raise ConfigError(f"width must be positive, got {width}")
        if norm not in ("batch", "layer", "spectral", "none"):
            raise ConfigError(f"norm must be batch, layer, spectral or none, got {norm!r}")
        base, k = dcgan_layout(image_shape)
        self.norm = norm
        layers: list[nn.Module] = [
            nn.Conv2d(image_shape[0], width, 4, 2, 1),
            nn.LeakyReLU(0.2, inplace=True),
        ]
        channels = width
        for _ in range(k - 1):
            layers += [
                nn.Conv2d(channels, channels * 2, 4, 2, 1, bias=norm not in ("batch", "layer")),
                *_norm(norm, channels * 2),
                nn.LeakyReLU(0.2, inplace=True),
            ]
            channels *= 2
        layers.append(nn.Conv2d(channels, 1, base, 1, 0))
        self.net = nn.Sequential(*layers)
        dcgan_init(self)
        if norm == "spectral":
            # after the initialization: spectral norm estimates each weight's largest singular
            # value as it is wrapped (15 power iterations); wrapped before, its estimate was the
            # default initialization's, and the first steps' discriminator was not 1-Lipschitz
            # (norms 12 to 670 in eval mode, about 1.3 a layer in training, for some 20 steps)
            for conv in self.net:
                if isinstance(conv, nn.Conv2d):
                    nn.utils.parametrizations.spectral_norm(conv)

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images).flatten()
