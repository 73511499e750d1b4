"""TrivialAugment and RandAugment with the operation and magnitude drawn per image of a batch.

torchvision's v2 auto-augment draws once per call, so a batched tensor gets one op for all its
images (pytorch/vision#8484); kornia's also picks one op per batch. Here each image draws its own,
on the batch's device, with torchvision's ops and magnitudes (equal results on uint8 pixels).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.errors import ConfigError

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
BLENDS = ("Brightness", "Color", "Contrast", "Sharpness")
OPS = ("Identity", *GEOMETRIC, *BLENDS, "Posterize", "Solarize", "AutoContrast", "Equalize")
SIGNED = GEOMETRIC + BLENDS  # drawn with a random sign
# Largest magnitude as (TrivialAugmentWide, RandAugment); the bins are linspace(0, largest).
LARGEST = {
    "ShearX": (0.99, 0.3),
    "ShearY": (0.99, 0.3),
    "TranslateX": (32.0, 150.0 / 331.0),  # RandAugment's is this fraction of the width
    "TranslateY": (32.0, 150.0 / 331.0),  # ... and of the height
    "Rotate": (135.0, 30.0),
    **dict.fromkeys(BLENDS, (0.99, 0.9)),
}


def magnitudes(op: str, bins: int, height: int, width: int, wide: bool) -> list[float]:
    """torchvision's magnitude of ``op`` per bin: TrivialAugmentWide's if ``wide``, else RandAugment's."""
    if op == "Posterize":  # bits, from 8 down to 2 (wide) or 4
        return (8 - torch.arange(bins) / ((bins - 1) / (6 if wide else 4))).round().tolist()
    if op == "Solarize":
        return torch.linspace(1.0, 0.0, bins).tolist()
    if op not in LARGEST:
        return [0.0] * bins
    largest = LARGEST[op][0 if wide else 1]
    if not wide and op in ("TranslateX", "TranslateY"):
        largest *= width if op == "TranslateX" else height
    # float32 linspace, as torchvision's, so that each bin is the same number
    return torch.linspace(0.0, largest, bins).tolist()


def inverse_affine(op: str, magnitude: float, height: int, width: int) -> list[float]:
    """torchvision's inverse affine matrix (pixels, origin at the image centre) for an op, in double
    precision from the arguments F.affine and F.rotate get; the identity for non-geometric ops."""
    angle, translate, shear, center = 0.0, (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)
    if op in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = (degrees, 0.0) if op == "ShearX" else (0.0, degrees)
        center = (-width * 0.5, -height * 0.5)  # torchvision shears about the top-left corner
    elif op == "TranslateX":
        translate = (float(int(magnitude)), 0.0)  # int(): whole pixels, truncated as torchvision
    elif op == "TranslateY":
        translate = (0.0, float(int(magnitude)))
    elif op == "Rotate":
        angle = -(magnitude % 360)  # F.rotate turns the other way from F.affine
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    x, y = center[0] + translate[0], center[1] + translate[1]
    return [d, -b, center[0] - d * x + b * y, -c, a, center[1] + c * x - a * y]


def op_parameters(op: str, magnitude: float) -> tuple[float, float]:
    """The two numbers an op's kernel takes: a blend's factor and 1 - factor (both rounded from
    double precision, as torchvision's scalars), posterize's step, solarize's threshold."""
    if op == "Posterize":
        return 2.0 ** (8 - int(magnitude)), 0.0
    if op == "Solarize":
        return 255.0 * magnitude, 0.0
    return 1.0 + magnitude, 1.0 - (1.0 + magnitude)


def affine(x: Tensor, theta: Tensor) -> Tensor:
    """Warp each image by its inverse matrix on torchvision's grid: pixel-centred coordinates
    normalised after theta, so nearest sampling picks the pixels torchvision picks (F.affine_grid
    normalises first and moves rounding ties)."""
    n, _, h, w = x.shape
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, device=x.device)
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, device=x.device)
    base = torch.stack(
        [xs.expand(h, w), ys[:, None].expand(h, w), torch.ones_like(xs).expand(h, w)], -1
    )
    # the divisor filled from Python scalars on the device: a tensor made from host values
    # there is a copy (a sync) a batch; a Python divisor is a product by its reciprocal on CUDA
    half = torch.empty(2, device=x.device)
    half[0], half[1] = 0.5 * w, 0.5 * h
    scaled = theta.transpose(1, 2) / half
    grid = (base.view(1, h * w, 3) @ scaled).view(n, h, w, 2)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def to_uint8(x: Tensor) -> Tensor:
    """Clamp and truncate, as torchvision's cast of a float result back to uint8."""
    return x.clamp(0, 255).floor()


def blend(x: Tensor, other: Tensor, p: Tensor) -> Tensor:
    """x * factor + other * (1 - factor); addcmul rounds as torchvision's add_(alpha=) does."""
    return to_uint8(torch.addcmul(x * p[:, :1], other, p[:, 1:]))


def grayscale(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).floor_().unsqueeze(1)


def brightness(x: Tensor, p: Tensor) -> Tensor:
    return to_uint8(x * p[:, :1])


def color(x: Tensor, p: Tensor) -> Tensor:
    return x if x.shape[1] == 1 else blend(x, grayscale(x), p)


def contrast(x: Tensor, p: Tensor) -> Tensor:
    gray = grayscale(x) if x.shape[1] == 3 else x
    return blend(x, gray.mean((1, 2, 3), keepdim=True), p)


def sharpness(x: Tensor, p: Tensor) -> Tensor:
    """Blend with a 3x3 blur (rounded) inside the image; the one-pixel border is kept."""
    c, h, w = x.shape[1:]
    if h <= 2 or w <= 2:
        return x
    kernel = torch.full((3, 3), 1.0 / 13.0, device=x.device)
    kernel[1, 1] = 5.0 / 13.0
    blurred = F.conv2d(x, kernel.expand(c, 1, 3, 3), groups=c).round()
    inner = x[:, :, 1:-1, 1:-1]
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = torch.addcmul(inner, blurred - inner, p[:, 1:])
    return to_uint8(out)


def posterize(x: Tensor, p: Tensor) -> Tensor:
    """Keep the top bits: floor to a multiple of the step 2 ** (8 - bits)."""
    step = p[:, :1]
    return (x / step).floor() * step


def solarize(x: Tensor, p: Tensor) -> Tensor:
    return torch.where(x >= p[:, :1], 255 - x, x)


def autocontrast(x: Tensor, _: Tensor) -> Tensor:
    """Stretch each channel to 0..255 (a flat channel is kept)."""
    low, high = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)
    flat = high == low
    scale = torch.where(flat, 1.0, (high - low) * (1.0 / 255))
    return to_uint8((x - torch.where(flat, 0.0, low)) / scale)


def equalize(x: Tensor, _: Tensor) -> Tensor:
    """PIL's histogram equalisation per channel, as torchvision: the step leaves out the pixels of
    the last nonzero bin; a channel whose step is 0 is kept."""
    flat = x.flatten(2).long()
    hist = torch.zeros(*flat.shape[:2], 256, dtype=torch.long, device=x.device)
    hist.scatter_add_(2, flat, torch.ones_like(flat))
    cumulative = hist.cumsum(2)
    last = hist.gather(2, cumulative.argmax(2, keepdim=True))  # argmax: the first maximum
    step = (flat.shape[2] - last) // 255
    lut = ((cumulative[..., :-1] + step // 2) // step.clamp(min=1)).clamp(0, 255)
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut], 2)
    equalized = lut.gather(2, flat).view_as(x).to(x.dtype)
    return torch.where((step > 0)[..., None], equalized, x)


KERNELS = {
    "Brightness": brightness,
    "Color": color,
    "Contrast": contrast,
    "Sharpness": sharpness,
    "Posterize": posterize,
    "Solarize": solarize,
    "AutoContrast": autocontrast,
    "Equalize": equalize,
}


def masked(kernel: Callable, mask: Tensor, x: Tensor, parameter: Tensor, subset: bool) -> Tensor:
    """``kernel(x, parameter)`` on the images ``mask`` selects, the others kept. With ``subset``
    only those are computed, written into ``x`` in place; otherwise all are, and torch.where keeps
    the selected ones (no nonzero(), which is a host sync on an accelerator)."""
    if subset:
        index = mask.nonzero().squeeze(1)
        return x.index_copy_(0, index, kernel(x[index], parameter[index])) if len(index) else x
    return torch.where(mask[:, None, None, None], kernel(x, parameter), x)


class PerImageAugment:
    """The ops of torchvision's TrivialAugmentWide (``wide``) or RandAugment, one per image."""

    wide = True
    rounds = 1

    def __init__(self, num_magnitude_bins: int = 31):
        if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
            raise ConfigError(
                f"{type(self).__name__} num_magnitude_bins must be a whole number >= 2, got "
                f"{num_magnitude_bins!r}; set num_magnitude_bins=31 (torchvision's default)"
            )
        self.num_magnitude_bins = num_magnitude_bins
        self._tables: dict[tuple, tuple[Tensor, Tensor]] = {}

    def tables(self, height: int, width: int, device: torch.device):
        """Per (op, bin, negative): the inverse affine matrix [.., 2, 3] and the kernel's two numbers,
        computed once per image size on the host in double precision, as torchvision does."""
        key = (height, width, device)
        if key not in self._tables:
            thetas, parameters = [], []
            for op in OPS:
                for m in magnitudes(op, self.num_magnitude_bins, height, width, self.wide):
                    for signed in (m, -m if op in SIGNED else m):
                        thetas.append(inverse_affine(op, signed, height, width))
                        parameters.append(op_parameters(op, signed))
            shape = (len(OPS), self.num_magnitude_bins, 2)
            self._tables[key] = (
                torch.tensor(thetas, device=device).view(*shape, 2, 3),
                torch.tensor(parameters, device=device).view(*shape, 2),
            )
        return self._tables[key]

    def draw(self, n: int, device: torch.device, generator: torch.Generator | None = None):
        """Op, magnitude bin and sign (True: negative) per round and image, each [rounds, n]."""
        shape = (self.rounds, n)
        ops = torch.randint(len(OPS), shape, device=device, generator=generator)
        bins = torch.randint(self.num_magnitude_bins, shape, device=device, generator=generator)
        negative = torch.rand(shape, device=device, generator=generator) <= 0.5
        return ops, bins, negative

    def apply(
        self,
        images: Tensor,
        ops: Tensor,
        bins: Tensor,
        negative: Tensor,
        subset: bool | None = None,
    ) -> Tensor:
        """One op per image, given as [N] indices into OPS, magnitude bins and signs; float
        [N, C, H, W] pixels in 0..255 in and out, rounded to whole levels as uint8 would hold them.
        ``subset``: compute each op on its own images only (default on the CPU, where it is faster)."""
        subset = images.device.type == "cpu" if subset is None else subset
        theta, parameter = self.tables(images.shape[2], images.shape[3], images.device)
        negative = negative.long()
        theta = theta[ops, bins, negative]
        parameter = parameter[ops, bins, negative][..., None, None]
        x = images.float().round().clamp_(0, 255)  # a new tensor: masked() may write into it
        geometric = (ops >= OPS.index("ShearX")) & (ops <= OPS.index("Rotate"))
        x = masked(affine, geometric, x, theta, subset)
        for name, kernel in KERNELS.items():
            x = masked(kernel, ops == OPS.index(name), x, parameter, subset)
        return x.to(images.dtype)

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment float [N, C, H, W] pixels in 0..255 (C is 1 or 3); ``generator`` on their device."""
        ops, bins, negative = self.draw(images.shape[0], images.device, generator)
        for i in range(self.rounds):
            images = self.apply(images, ops[i], bins[i], negative[i])
        return images


class TrivialAugment(PerImageAugment):
    """TrivialAugmentWide (Müller & Hutter 2021): one op at a random magnitude per image."""

    def __repr__(self) -> str:
        return f"TrivialAugment(num_magnitude_bins={self.num_magnitude_bins})"


class RandAugment(PerImageAugment):
    """RandAugment (Cubuk et al. 2020): ``num_ops`` ops per image, each at bin ``magnitude``."""

    wide = False

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31):
        super().__init__(num_magnitude_bins)
        if not isinstance(num_ops, int) or num_ops < 0:
            raise ConfigError(
                f"RandAugment num_ops must be a whole number >= 0, got {num_ops!r}; "
                "set num_ops=2 (torchvision's default)"
            )
        if not isinstance(magnitude, int) or not 0 <= magnitude < num_magnitude_bins:
            raise ConfigError(
                f"RandAugment magnitude must be a bin from 0 to {num_magnitude_bins - 1}, got "
                f"{magnitude!r}; set magnitude=9 (torchvision's default) or raise num_magnitude_bins"
            )
        self.rounds, self.magnitude = num_ops, magnitude

    def draw(self, n: int, device: torch.device, generator: torch.Generator | None = None):
        ops, _, negative = super().draw(n, device, generator)
        return ops, torch.full_like(ops, self.magnitude), negative

    def __repr__(self) -> str:
        return (
            f"RandAugment(num_ops={self.rounds}, magnitude={self.magnitude}, "
            f"num_magnitude_bins={self.num_magnitude_bins})"
        )
