"""What every accuracy-keeping quantization method returns, so a recipe can chain them and a report can say what ran.

Two kinds of method, each a function of ONNX models in memory:

* **before quantizing** (the FP32 model rewritten into an equivalent FP32 model that quantizes better):
  cross-layer equalization (:mod:`.equalize`), SmoothQuant-style migration (:mod:`.smoothquant`);
* **after quantizing** (a QDQ model's weights or biases changed, its graph kept): bias correction
  (:mod:`.bias_correction`), adaptive rounding (:mod:`.adaround`).

Each returns a :class:`MethodResult`: the new model, how many places it changed (0 means it did
nothing on this model, and a recipe built on it is not worth measuring) and one line for the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

__all__ = ["MethodResult"]


@dataclass(frozen=True)
class MethodResult:
    """The model a method made, how many layers (pairs, blocks, weights) it changed, and what it did in words."""

    model: onnx.ModelProto
    #: Layers (or layer pairs) changed; 0 when the method found nothing to do on this model.
    changed: int
    #: One line for the report, e.g. ``"cross-layer equalization: 23 conv pairs rescaled"``.
    note: str
    #: Wall seconds the method took (a bounded method says here what it spent).
    seconds: float = 0.0
