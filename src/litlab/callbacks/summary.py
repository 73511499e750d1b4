"""Lightning's rich model summary with its FLOPs column counted."""

from __future__ import annotations

import copy
import itertools
import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as LayerTable
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)


def forward_flops(
    module: nn.Module, name: str, input_shape: tuple[int, ...], depth: int
) -> dict[str, int]:
    """FLOPs of one forward pass of an input of ``input_shape`` through ``module`` (a child of
    the LightningModule called ``name``) and through each of its layers down to ``depth``
    levels below the LightningModule, keyed by the layer's name there ("net", "net.features").
    Counted by torch.utils.flop_counter on a meta-device copy, in eval mode: no memory, no
    arithmetic, no change to the real module (a copy is never compiled: torch drops an in-place
    compile's call when it copies a module)."""
    meta = meta_copy(module).eval()
    counter = FlopCounterMode(display=False, depth=depth)
    with torch.no_grad(), counter:
        meta(torch.empty(input_shape, device="meta"))
    root = type(meta).__name__
    return {
        name + key[len(root) :]: sum(ops.values())
        for key, ops in counter.get_flop_counts().items()
        if key == root or key.startswith(root + ".")
    }


class _CountedLayerTable(LayerTable):
    """Lightning's layer table, its FLOPs those counted by ``forward_flops`` (Lightning's own
    count needs the module's ``example_input_array`` and a forward pass of the real module)."""

    def __init__(self, model: L.LightningModule, max_depth: int, flops: dict[str, int]) -> None:
        self._counted = flops
        super().__init__(model, max_depth)

    @property
    def total_flops(self) -> int:
        return sum(n for name, n in self._counted.items() if "." not in name)

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        return {name: {"forward": self._counted.get(name, 0)} for name in self.layer_names}


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` on the meta device (shapes, no memory), made without copying its
    weights: a deepcopy moved to meta held a second copy of every weight on the module's device
    for a moment (on a GPU: its memory), for each callback that counts FLOPs."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(module, memo)


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary, with the FLOPs of litlab's nets.

    Lightning counts a summary's FLOPs by running the module's ``example_input_array`` through
    it at fit start, on every rank; litlab's modules have none (that pass would run on weights
    that a strategy has already sharded, FSDP, and compile a compiled net), so its column read 0
    on every row and "Total FLOPs: 0". Here the nets that a module names in
    ``example_input_shapes(image_shape)`` (a classifier's net: one image of the data's
    ``image_shape``; a GAN's generator and its average: one latent vector; its discriminator:
    one image) are counted at setup on rank 0, before a strategy wraps them, on meta-device
    copies. Each row's FLOPs are one example's forward pass through that layer; "Total FLOPs"
    their sum.
    (Training FLOPs per image, forward and backward: ``perf/flops_per_image``, Throughput.)
    A module with an ``example_input_array`` keeps Lightning's count; without a data module
    that has an ``image_shape``, or a module that names its inputs, Lightning's summary as is.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        super().__init__(max_depth, **summarize_kwargs)
        self.flops: dict[str, int] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        self.flops = None
        if stage != "fit" or not self._max_depth or pl_module.example_input_array is not None:
            return
        # rank 0 prints the summary (a copy of each net is made, in host memory, to count);
        # DeepSpeed's ZeRO-3 summary is DeepSpeed's own table
        if not trainer.is_global_zero or isinstance(trainer.strategy, DeepSpeedStrategy):
            return
        image_shape = getattr(trainer.datamodule, "image_shape", None)
        shapes = getattr(pl_module, "example_input_shapes", None)
        if image_shape is None or shapes is None:
            return
        # Lightning's depth counts the LightningModule as level 0 (-1: every level)
        depth = 999 if self._max_depth < 0 else self._max_depth
        flops: dict[str, int] = {}
        try:
            for name, shape in shapes(tuple(image_shape)).items():
                flops.update(forward_flops(getattr(pl_module, name), name, shape, depth))
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            # a summary must never stop a run: without a count, Lightning's column
            log.info("the model summary's FLOPs were not counted (%s)", e)
            return
        self.flops = flops

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        if self.flops is None:
            return super()._summary(trainer, pl_module)
        return _CountedLayerTable(pl_module, self._max_depth, self.flops)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if self.flops is not None and self._max_depth and trainer.is_global_zero:
            log.info(
                "FLOPs: one example's forward pass (an image; a generator's: one latent vector)"
            )
