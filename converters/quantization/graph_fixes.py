"""Known traps of static INT8, found in the graph and its calibrated ranges, and what to keep in float.

**Mixed-range Concat at the outputs.** A detector that concatenates its boxes (pixels, 0-320)
with its class scores (0-1) into one output, as YOLOv8's head does, gets one quantization
scale for both: 8 bits over 0-320 is a step of 1.25, and every score rounds to 0 or 1.25 (no
detection survives the 0.25 threshold, or all do). ONNX Runtime's QDQ quantizer gives a Concat
one scale for its inputs and output. Such a Concat is found where its output reaches a graph
output through layout ops only and the calibrated magnitudes of its inputs differ by more than
a factor (16: the smaller input would keep fewer than 4 of its 8 bits). The fix keeps nodes
in float, two ways:

* ``"concat"``: the Concat and the layout ops after it. Its inputs keep their own Q/DQ (each
  producer's output is quantized with its own scale), only the join is float;
* ``"head"``: also everything between the Concat and the last weight-bearing layers before it
  (the box decoding: reshapes, splits, softmax, sigmoid, the arithmetic of dist2bbox), as
  keeping YOLOv8's post-processing head in float is usually advised.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["GraphFix", "find_traps", "ranges_from_cache", "RANGE_RATIO", "STRATEGIES"]

#: Inputs of one Concat whose magnitudes differ by more than this get separate scales (4 bits lost).
RANGE_RATIO = 16.0
STRATEGIES = ("concat", "head")
_LAYOUT = ("Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Cast")
_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: How many layout ops may stand between the Concat and a graph output.
_NEAR = 3


@dataclass(frozen=True)
class GraphFix:
    """Nodes to keep in float against the traps found, and one line saying why."""

    float_nodes: tuple[str, ...]
    #: The Concat nodes found (empty: no trap in this model).
    concats: tuple[str, ...]
    note: str


def ranges_from_cache(path: Path) -> dict[str, tuple[float, float]]:
    """Tensor ranges from an ONNX Runtime calibration cache (as :mod:`.calibrate` writes)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(path)
    return {name: (float(np.asarray(t.range_value[0])), float(np.asarray(t.range_value[1])))
            for name, t in data.items()}


def find_traps(model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]], strategy: str = "concat",
               ratio: float = RANGE_RATIO) -> GraphFix:
    """Concats near the outputs whose inputs' ranges differ by more than ``ratio``; what to keep in float."""
    if strategy not in STRATEGIES:
        from edgesdk.errors import ConversionError

        raise ConversionError(f"graph fix strategy {strategy!r} is not one of {STRATEGIES}")
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    producer = {o: n for n in graph.node for o in n.output}
    constants = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    found: list[tuple[onnx.NodeProto, list[onnx.NodeProto], float]] = []
    for node in graph.node:
        if node.op_type != "Concat":
            continue
        after = _to_output(node, consumers, outputs)
        if after is None:
            continue
        spans = [_span(name, ranges, constants) for name in node.input]
        known = [s for s in spans if s is not None and s > 0]
        if len(known) >= 2 and max(known) / min(known) > ratio:
            found.append((node, after, max(known) / min(known)))
    if not found:
        return GraphFix((), (), "graph fixes: no output Concat of mixed ranges")
    keep: dict[str, None] = {}
    for node, after, _ in found:
        if strategy == "head":
            keep.update(dict.fromkeys(_head(node, producer)))
        keep.update(dict.fromkeys([node.name, *(n.name for n in after)]))
    names = tuple(n for n in keep if n)
    which = ", ".join(f"{n.name} (input ranges {r:.0f}x apart)" for n, _, r in found)
    how = ("its inputs keep separate scales" if strategy == "concat"
           else "the head after the last weighted layers kept in float")
    return GraphFix(names, tuple(n.name for n, _, _ in found),
                    f"graph fixes: output Concat {which}: {how} ({len(names)} node(s) in float)")


def _to_output(node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]],
               outputs: set[str]) -> list[onnx.NodeProto] | None:
    """The layout ops between ``node`` and a graph output, or None when it does not reach one so."""
    path: list[onnx.NodeProto] = []
    tensor = node.output[0]
    for _ in range(_NEAR + 1):
        if tensor in outputs:
            return path
        readers = consumers.get(tensor, [])
        if len(readers) != 1 or readers[0].op_type not in _LAYOUT:
            return None
        path.append(readers[0])
        tensor = readers[0].output[0]
    return None


def _span(name: str, ranges: Mapping[str, tuple[float, float]],
          constants: Mapping[str, onnx.TensorProto]) -> float | None:
    """The largest magnitude a tensor takes (calibrated, or an initializer's own values)."""
    if name in ranges:
        low, high = ranges[name]
        return max(abs(low), abs(high))
    if name in constants:
        values = numpy_helper.to_array(constants[name])
        return float(np.abs(values).max()) if values.size else None
    return None


def _head(concat: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto]) -> list[str]:
    """Every node between ``concat`` and the weighted layers before it (those layers excluded)."""
    seen: dict[str, None] = {}
    stack = list(concat.input)
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.op_type in _WEIGHTED or node.name in seen:
            continue
        seen[node.name] = None
        stack.extend(node.input)
    return list(seen)
