"""Cross-layer equalization: the FP32 model rescaled so each channel's weights quantize alike (data-free).

Per-channel weight scales help a Conv whose output channels differ in range, but the *next*
layer's input channels (and the activation between them, one scale for all channels) still
see those differences. Nagel et al. 2019 ("Data-Free Quantization Through Weight Equalization
and Bias Correction"), as AIMET does it: for two convolutions in a row with a positively
homogeneous function between them (``f(s x) = s f(x)`` for ``s > 0``: ReLU, LeakyReLU, a Clip
without an upper bound, or nothing), output channel ``i`` of the first is divided by ``s_i``
(weights and bias) and input channel ``i`` of the second multiplied by ``s_i``; the model
computes the same function. With ``s_i = sqrt(r1_i / r2_i)`` (``r1_i`` the largest weight of
output channel ``i`` of the first, ``r2_i`` the largest weight reading input channel ``i`` in
the second) both become ``sqrt(r1_i r2_i)``: the ranges meet in the middle. Chains of more than
two are equalized pair by pair until the scales settle.

Depthwise convolutions (and any grouped one) are handled: a grouped second conv's input
channel ``c`` is read only by its group's output channels. Not done here: ReLU6 and
HardSwish (``Clip(0, 6)`` or a bounded Clip is not homogeneous: AIMET replaces ReLU6 by
ReLU, which changes the model), high-bias absorption, and Gemm/MatMul pairs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from edgesdk.converters.quantization.methods import MethodResult

__all__ = ["equalize", "equalization_pairs", "ConvPair"]

#: Ops between the two convs that commute with a positive per-channel scale.
_HOMOGENEOUS = ("Relu", "LeakyRelu", "Clip", "Identity")
#: A scale this close to 1 everywhere means the pairs have settled.
_SETTLED = 1e-4
_MAX_ROUNDS = 20


@dataclass(frozen=True)
class ConvPair:
    """Two convolutions whose shared channels can be rescaled: ``first``'s outputs feed ``second``."""

    first: str
    second: str
    #: The op between them ("" when the first's output goes straight into the second).
    between: str


def equalize(model: onnx.ModelProto) -> MethodResult:
    """A copy of ``model`` with every equalizable conv pair rescaled; its outputs are unchanged.

    ``changed`` counts the pairs rescaled (pairs whose ranges were already equal, to 0.01%,
    are not counted).
    """
    started = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pairs = equalization_pairs(out)
    if not pairs:
        return MethodResult(out, 0, "cross-layer equalization: no Conv -> (ReLU | nothing) -> Conv pair",
                            time.perf_counter() - started)
    nodes = {n.name: n for n in out.graph.node}
    inits = {i.name: i for i in out.graph.initializer}
    used = {name for p in pairs for n in (nodes[p.first], nodes[p.second]) for name in n.input[1:] if name}
    weights = {name: numpy_helper.to_array(inits[name]).astype(np.float32) for name in used}
    moved = np.zeros(len(pairs))
    for _ in range(_MAX_ROUNDS):
        largest = 0.0
        for k, pair in enumerate(pairs):
            shift = _rescale(nodes[pair.first], nodes[pair.second], weights)
            moved[k] = max(moved[k], shift)
            largest = max(largest, shift)
        if largest < _SETTLED:
            break
    for name in used:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(inits[name].data_type)
        inits[name].CopyFrom(numpy_helper.from_array(weights[name].astype(dtype), name))
    changed = int((moved > 1e-4).sum())
    ops = sorted({p.between or "direct" for p in pairs})
    return MethodResult(out, changed, f"cross-layer equalization: {changed} of {len(pairs)} conv pair(s) "
                        f"rescaled (between them: {', '.join(ops)})", time.perf_counter() - started)


def equalization_pairs(model: onnx.ModelProto) -> list[ConvPair]:
    """The conv pairs of ``model`` that can be equalized without changing what it computes."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    outputs = {o.name for o in graph.output}
    uses: dict[str, int] = defaultdict(int)
    for node in graph.node:
        for name in node.input:
            uses[name] += 1
    pairs = []
    for first in graph.node:
        if not _rescalable_conv(first, inits, uses):
            continue
        tensor, between = first.output[0], ""
        readers = consumers[tensor]
        if len(readers) == 1 and tensor not in outputs and readers[0].op_type in _HOMOGENEOUS:
            if not _homogeneous(readers[0], inits, graph):
                continue
            between, tensor = readers[0].op_type, readers[0].output[0]
            readers = consumers[tensor]
        if len(readers) != 1 or tensor in outputs:
            continue
        second = readers[0]
        if second.input[0] == tensor and _rescalable_conv(second, inits, uses) and first.name and second.name:
            pairs.append(ConvPair(first.name, second.name, between))
    return pairs


def _rescalable_conv(node: onnx.NodeProto, inits: set[str], uses: dict[str, int]) -> bool:
    """A Conv whose weight (and bias) are initializers it alone reads."""
    if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
        return False
    own = [n for n in node.input[1:] if n]
    return all(n in inits and uses[n] == 1 for n in own)


def _homogeneous(node: onnx.NodeProto, inits: set[str], graph: onnx.GraphProto) -> bool:
    """Whether ``node`` commutes with a positive per-channel scale (a Clip only without an upper bound)."""
    if node.op_type != "Clip":
        return True
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    low, high = attrs.get("min"), attrs.get("max")
    values = {i.name: i for i in graph.initializer}
    for position, name in ((1, "min"), (2, "max")):
        if len(node.input) > position and node.input[position]:
            if node.input[position] not in inits:
                return False
            value = float(numpy_helper.to_array(values[node.input[position]]))
            low, high = (value, high) if name == "min" else (low, value)
    return (low is None or low == 0.0 or np.isneginf(low)) and (high is None or np.isposinf(high))


def _rescale(first: onnx.NodeProto, second: onnx.NodeProto, weights: dict[str, np.ndarray]) -> float:
    """Equalize one pair in ``weights``; return the largest |log s| applied."""
    w1, w2 = weights[first.input[1]], weights[second.input[1]]
    groups = next((int(onnx.helper.get_attribute_value(a)) for a in second.attribute if a.name == "group"), 1)
    channels = w1.shape[0]
    per_group = w2.shape[1]
    if per_group * groups != channels:
        return 0.0
    r1 = np.abs(w1.reshape(channels, -1)).max(axis=1)
    grouped = np.abs(w2).reshape(groups, w2.shape[0] // groups, per_group, -1)
    r2 = grouped.max(axis=(1, 3)).reshape(channels)
    valid = (r1 > 1e-12) & (r2 > 1e-12)
    scale = np.ones(channels, np.float64)
    scale[valid] = np.sqrt(r1[valid] / r2[valid])
    shape1 = (channels,) + (1,) * (w1.ndim - 1)
    weights[first.input[1]] = (w1 / scale.reshape(shape1)).astype(np.float32)
    if len(first.input) > 2 and first.input[2]:
        weights[first.input[2]] = (weights[first.input[2]] / scale).astype(np.float32)
    factor = scale.reshape(groups, 1, per_group, *([1] * (w2.ndim - 2)))
    w2g = w2.reshape(groups, w2.shape[0] // groups, per_group, *w2.shape[2:]) * factor
    weights[second.input[1]] = w2g.reshape(w2.shape).astype(np.float32)
    return float(np.abs(np.log(scale)).max())
