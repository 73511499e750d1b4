"""Nets with lazy layers (``nn.LazyLinear``, ``nn.LazyConv2d``, ...): sized before the run."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

log = logging.getLogger("litlab")


def has_lazy_tensors(module: nn.Module) -> bool:
    """Whether ``module`` holds a parameter or buffer whose shape is not known yet."""
    tensors = [*module.parameters(), *module.buffers()]
    return any(is_lazy(t) for t in tensors)


def materialize(model: Any, image_shape: tuple[int, ...]) -> None:
    """Size the lazy layers of a module's nets as torch asks (a "dry run"): one forward pass of
    zeros of each net's example input (``model.example_input_shapes(image_shape)``: a
    classifier's net an image of the data's shape, a GAN's generator a latent vector, its
    discriminator an image), in eval mode and without gradients (BatchNorm's statistics and no
    random draw of dropout are touched; the new weights are drawn as their layers' own reset
    draws them; each submodule's train/eval mode is kept as it was). A layer reached in
    training alone (an auxiliary head) is not sized: refused. Before anything reads the
    parameters: the optimizer's groups, weight decay's grouping by shape
    (``parameter_ndims``), the model summary, the strategy's wrapping, the checkpoint's load.
    A module without lazy layers is left untouched."""
    if not has_lazy_tensors(model):
        return
    shapes = getattr(model, "example_input_shapes", None)
    if shapes is None:  # litlab's modules all name their nets' inputs
        raise TypeError(f"{type(model).__name__} names no example inputs for its lazy layers")
    sized = []
    for name, shape in shapes(tuple(image_shape)).items():
        net = getattr(model, name)
        if not has_lazy_tensors(net):
            continue
        modes = {module: module.training for module in net.modules()}  # each its own
        net.eval()
        try:
            with torch.no_grad():
                net(torch.zeros(shape))
        finally:
            for module, training in modes.items():
                module.training = training
        sized.append(f"{name} (input {list(shape)})")
    if hasattr(model, "sized"):  # what a module builds from its sized nets (a GAN's EMA copy)
        model.sized()
    if hasattr(model, "parameter_ndims"):  # taken at construction, from unsized parameters
        from litlab.models.optim import parameter_ndims

        model.parameter_ndims = parameter_ndims(model.named_parameters())
    if has_lazy_tensors(model):
        from litlab.errors import ConfigError

        raise ConfigError(
            "the net's lazy layers are still unsized after one forward pass of "
            + (", ".join(sized) or "its inputs")
            + ": give the layers that pass does not reach their sizes (nn.Linear for "
            "nn.LazyLinear, ...)"
        )
    log.info("lazy layers sized by one forward pass of zeros: %s", ", ".join(sized))
