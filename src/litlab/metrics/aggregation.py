"""torchmetrics' MeanMetric and MaxMetric whose states stay float32 under half precisions.

torchmetrics keeps a metric's dtype through ``.half()`` and ``.bfloat16()``, but takes a new one
at every other ``Module._apply`` from a zeros tensor made in the default dtype (torchmetrics
1.9), and every update casts its input to that dtype. Lightning's 16-true and bf16-true
precisions convert the module with ``Module.to(dtype)`` and run each step with the default
dtype set to the half one, where Lightning's logging moves a logged metric to the device: from
the step after, a mean's sums added in an 11- or 8-bit mantissa (val/loss nan past 65,504
images in float16, off in the third digit in bfloat16) and a maximum was stored rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import MaxMetric, MeanMetric


class _KeepFloat32:
    """States that a move or conversion (``_apply``) takes to another device only, never to
    another dtype (cast to half and back they would be rounded: a restored best accuracy
    converted with the module), and inputs cast to float32 whatever dtype torchmetrics last
    took from the default one."""

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def _apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def device_only(tensor: torch.Tensor) -> torch.Tensor:
            out = fn(tensor)
            if tensor.is_floating_point() and out.dtype != tensor.dtype:
                return tensor.to(out.device)
            return out

        return super()._apply(device_only, *args, **kwargs)  # type: ignore[misc]


class Mean(_KeepFloat32, MeanMetric):
    """``torchmetrics.MeanMetric``, its sums float32 whatever the module's precision, and NaN
    kept: a NaN loss on any image makes the mean NaN, as an average is. torchmetrics' default
    (``nan_strategy="warn"``) drops NaN values with a warning, a validation loss that looked
    finite while the model gave NaN on some images, and tests ``isnan(x).any()`` in every update:
    a host sync in each evaluation step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"nan_strategy": "disable", **kwargs})


class Max(_KeepFloat32, MaxMetric):
    """``torchmetrics.MaxMetric``, its maximum float32 whatever the module's precision."""
