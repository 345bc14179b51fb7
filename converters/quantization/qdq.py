"""Editing a QDQ model: put any set of its nodes back in float without quantizing again.

ONNX Runtime's static quantizer writes every quantized tensor as ``QuantizeLinear ->
DequantizeLinear`` and every weight as ``int8 initializer -> DequantizeLinear``. A node
is put back in float by feeding it the tensor *before* its input's Q/DQ pair and the
original float weights; pairs nobody reads any more are pruned. This makes "only these
nodes quantized" and "all but these" models in milliseconds, from one quantizer run, so
the search can measure many of them.

Nodes are grouped into **blocks**: each weight-bearing node (Conv, MatMul, Gemm, ...)
starts one, and a node without weights (activation, normalization, residual add) joins
the block of the node that produces its first input. Quantization error behaves per
block (a Conv and the HardSwish after it round together), and a block's cost in
multiply-accumulates says what keeping it in float gives up. The Q/DQ pairs on the
graph's outputs form a block of their own ("graph outputs"): quantizing a softmax's
probabilities to 8 bits can flip an argmax by itself.

:func:`fusion_counts` reads ONNX Runtime's *optimized* graph of a QDQ model (for this host:
:func:`host_optimized_model`; for a board's architecture: :mod:`edgesdk.converters.board.emulate`) and counts which
Convs and MatMuls became integer kernels and which were left as DequantizeLinear -> float
-> QuantizeLinear.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Block", "QdqGraph", "OUTPUTS_BLOCK", "FusionCounts", "fusion_counts", "host_optimized_model"]

OUTPUTS_BLOCK = "graph outputs"
_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Block:
    """Nodes that are kept in float or quantized together."""

    name: str
    #: Indices of the QDQ model's compute nodes in this block.
    nodes: tuple[int, ...]
    #: Multiply-accumulates of its weight-bearing node per sample (0 when unknown or none).
    macs: float


class QdqGraph:
    """A QDQ model and its float source, ready to make partly-float copies."""

    def __init__(self, qdq_path: Path, float_path: Path) -> None:
        import onnx

        self.model = onnx.load(str(qdq_path))
        float_model = onnx.shape_inference.infer_shapes(onnx.load(str(float_path)), strict_mode=False)
        self._float_weights = {i.name: i for i in float_model.graph.initializer}
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in (*float_model.graph.value_info, *float_model.graph.output)}
        graph = self.model.graph
        self._initializers = {i.name: i for i in graph.initializer}
        self._producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
        self.compute = [i for i, n in enumerate(graph.node) if n.op_type not in _QDQ]
        self._output_pairs = [o.name for o in graph.output
                              if self._kind(o.name) == "activation"]
        self.blocks = self._group(shapes)

    # what feeds a node -------------------------------------------------------------------
    def _kind(self, tensor: str) -> str:
        """"weight" (DQ of an initializer), "activation" (DQ of a Q) or "float"."""
        index = self._producer.get(tensor)
        if index is None or self.model.graph.node[index].op_type != "DequantizeLinear":
            return "float"
        source = self.model.graph.node[index].input[0]
        if source in self._initializers:
            return "weight"
        q = self._producer.get(source)
        return "activation" if q is not None and self.model.graph.node[q].op_type == "QuantizeLinear" else "float"

    def _float_input(self, tensor: str) -> str:
        """The float tensor behind an activation's Q/DQ pair."""
        dq = self.model.graph.node[self._producer[tensor]]
        return str(self.model.graph.node[self._producer[dq.input[0]]].input[0])

    def _source(self, tensor: str) -> int | None:
        """The compute node that produces ``tensor``, looking through a Q/DQ pair."""
        if self._kind(tensor) == "activation":
            tensor = self._float_input(tensor)
        index = self._producer.get(tensor)
        return index if index is not None and self.model.graph.node[index].op_type not in _QDQ else None

    def _group(self, shapes: dict[str, list[int]]) -> list[Block]:
        nodes = self.model.graph.node
        block_of: dict[int, str] = {}
        members: dict[str, list[int]] = {}
        macs: dict[str, float] = {}
        for index in self.compute:
            node = nodes[index]
            weights = [t for t in node.input if self._kind(t) == "weight"]
            big = [w for w in weights if self._weight_rank(w) >= 2]  # not biases or scalars
            if big:
                name = node.name or f"{node.op_type}#{index}"
                macs[name] = self._macs(node, big[0], shapes)
            else:
                sources = [s for s in (self._source(t) for t in node.input if t) if s is not None and s in block_of]
                name = block_of[sources[0]] if sources else (node.name or f"{node.op_type}#{index}")
                macs.setdefault(name, 0.0)
            block_of[index] = name
            members.setdefault(name, []).append(index)
        blocks = [Block(name, tuple(idx), macs[name]) for name, idx in members.items()
                  if any(self._kind(t) in ("weight", "activation") for i in idx for t in nodes[i].input)]
        if self._output_pairs:
            blocks.append(Block(OUTPUTS_BLOCK, (), 0.0))
        return blocks

    def _weight_rank(self, tensor: str) -> int:
        dq = self.model.graph.node[self._producer[tensor]]
        return len(self._initializers[dq.input[0]].dims)

    def _macs(self, node: Any, weight: str, shapes: dict[str, list[int]]) -> float:
        dims = list(self._initializers[self.model.graph.node[self._producer[weight]].input[0]].dims)
        out_shape = shapes.get(node.output[0], [])
        out_numel = float(np.prod(out_shape[1:])) if out_shape and all(d > 0 for d in out_shape[1:]) else 0.0
        if not out_numel:
            return float(np.prod(dims))
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        out_channels = dims[0] if node.op_type in ("Conv", "ConvTranspose") or trans_b else dims[-1]
        return out_numel * float(np.prod(dims)) / max(out_channels, 1)

    # partly-float copies -------------------------------------------------------------------
    def node_names(self, blocks: Iterable[Block]) -> list[str]:
        """The names of ``blocks``' nodes (``OpType#index`` for an unnamed node)."""
        nodes = self.model.graph.node
        return [nodes[i].name or f"{nodes[i].op_type}#{i}" for b in blocks for i in b.nodes]

    def with_float(self, blocks: Iterable[Block]) -> Any:
        """A copy of the QDQ model in which ``blocks`` run in float (everything else as quantized)."""
        import onnx
        from onnx import numpy_helper

        chosen = list(blocks)
        floated = {i for b in chosen for i in b.nodes}
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        added: set[str] = set()
        for index in floated:
            node = graph.node[index]
            for position, tensor in enumerate(node.input):
                kind = self._kind(tensor)
                if kind == "activation":
                    node.input[position] = self._float_input(tensor)
                elif kind == "weight":
                    node.input[position] = self._float_weight(tensor, graph, added, numpy_helper)
        if any(b.name == OUTPUTS_BLOCK for b in chosen):
            for name in self._output_pairs:
                dq_index = self._producer[name]
                graph.node[dq_index].CopyFrom(onnx.helper.make_node("Identity", [self._float_input(name)], [name],
                                                                    name=f"{name}_float_output"))
        _prune(graph)
        return model

    def _float_weight(self, tensor: str, graph: Any, added: set[str], numpy_helper: Any) -> str:
        dq = self.model.graph.node[self._producer[tensor]]
        stored = dq.input[0]
        original = stored[: -len("_quantized")] if stored.endswith("_quantized") else stored
        name = f"{original}__float"
        if name not in added:
            if original in self._float_weights:
                value = numpy_helper.to_array(self._float_weights[original])
            else:  # not found by name: dequantize what is stored (keeps the weight's rounding)
                value = _dequantize(dq, self._initializers, numpy_helper)
            graph.initializer.append(numpy_helper.from_array(value, name))
            added.add(name)
        return name


def _dequantize(dq: Any, initializers: dict[str, Any], numpy_helper: Any) -> np.ndarray:
    q = numpy_helper.to_array(initializers[dq.input[0]]).astype(np.float32)
    scale = numpy_helper.to_array(initializers[dq.input[1]]).astype(np.float32)
    zero = numpy_helper.to_array(initializers[dq.input[2]]).astype(np.float32) if len(dq.input) > 2 else np.float32(0)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and q.ndim > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.ndim(zero) else zero
    return ((q - zero) * scale).astype(np.float32)


def _prune(graph: Any) -> None:
    """Remove nodes whose outputs nobody reads, then initializers nobody reads."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {t for n in graph.node for t in n.input} | outputs
        dead = [i for i, n in enumerate(graph.node) if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for i in reversed(dead):
            del graph.node[i]
    read = {t for n in graph.node for t in n.input}
    keep = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)


# ONNX Runtime's optimized graph: what ran as integer kernels -------------------------------------
#: Convolutions and matrix products run by integer kernels (ONNX and com.microsoft ops).
INT8_KERNELS = frozenset({"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "QGemm",
                          "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention", "DynamicQuantizeLSTM"})
#: Convolutions and matrix products in float (ONNX, and what ONNX Runtime's float fusions turn them into).
FLOAT_KERNELS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm",
                           "NchwcConv"})
#: Ops that only move or relabel data: looked through when asking where an input comes from.
_LAYOUT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "ReorderInput",
                     "ReorderOutput"})


@dataclass(frozen=True)
class FusionCounts:
    """What ONNX Runtime's optimizer made of a QDQ model: integer kernels, or float between Q/DQ.

    Counted over an optimized graph (``SessionOptions.optimized_model_filepath``), which
    depends on the architecture and execution provider that optimized it.
    """

    #: Convolutions and matrix products run as integer kernels (QLinearConv, QLinearMatMul, MatMulInteger, ...).
    int8_kernels: int
    #: Convolutions and matrix products run in float on a DequantizeLinear's output: "DQ -> float -> Q".
    dq_float_q: int
    #: Convolutions and matrix products in float with no dequantized input (never quantized).
    float_kernels: int
    #: The other QLinear ops (QLinearAdd, QLinearMul, QLinearSigmoid, pooling, ...).
    qlinear_elementwise: int
    #: Other float ops that read a DequantizeLinear's output or feed a QuantizeLinear (layout ops aside).
    float_islands: int
    #: Every op type in the graph and how many nodes have it.
    op_types: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"int8_kernels": self.int8_kernels, "dq_float_q": self.dq_float_q, "float_kernels": self.float_kernels,
                "qlinear_elementwise": self.qlinear_elementwise, "float_islands": self.float_islands,
                "op_types": dict(sorted(self.op_types.items()))}


def fusion_counts(model: Any) -> FusionCounts:
    """Count an (optimized) model's integer kernels and what was left in float; ``model`` is a ModelProto or a path.

    Only the main graph is counted (not the bodies of If/Loop nodes). The model is read, never run.
    """
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output if o}
    consumers: dict[str, list[Any]] = {}
    for n in nodes:
        for t in n.input:
            consumers.setdefault(t, []).append(n)

    def from_dq(tensor: str) -> bool:
        for _ in range(8):  # a chain of layout ops is short
            node = producer.get(tensor)
            if node is None:
                return False
            if node.op_type == "DequantizeLinear":
                return True
            if node.op_type not in _LAYOUT or not node.input:
                return False
            tensor = node.input[0]
        return False

    int8 = dq_float = float_only = qlinear = islands = 0
    for n in nodes:
        op = n.op_type
        if op in INT8_KERNELS:
            int8 += 1
        elif op in FLOAT_KERNELS:
            if any(from_dq(t) for t in n.input if t):
                dq_float += 1
            else:
                float_only += 1
        elif op.startswith("QLinear"):
            qlinear += 1
        elif op not in _QDQ and op not in _LAYOUT and (
                any(from_dq(t) for t in n.input if t)
                or any(c.op_type == "QuantizeLinear" for o in n.output for c in consumers.get(o, []))):
            islands += 1
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return FusionCounts(int8, dq_float, float_only, qlinear, islands, counts)


def host_optimized_model(src: Path, dst: Path) -> Path:
    """ONNX Runtime's optimized graph of ``src`` for this host's CPU, written to ``dst`` (for :func:`fusion_counts`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(dst)
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # it warns that an NCHWc graph is specific to this machine: that is the point
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return dst


# units: blocks that only make sense together ------------------------------------------------------
def units(graph: QdqGraph, max_blocks: int = 12) -> list[tuple[Block, ...]]:
    """Runs of blocks between two tensors every path goes through (residual or attention units).

    Walking the compute nodes in graph order, a tensor is a *cut* when it is the only value
    still waiting to be read: everything before it reaches everything after it through it
    alone. The blocks between two cuts form one unit (a residual block with its Add, an
    attention block from its projections to its output). Errors inside a unit can need
    each other to matter (a skip connection carries what one branch loses); the search
    offers each unit of 2 to ``max_blocks`` blocks as one option besides its blocks.
    """
    nodes = graph.model.graph.node
    position = {index: p for p, index in enumerate(graph.compute)}
    last_use: dict[int, int] = {}  # producer position -> its last reader's (-1: the graph inputs)
    for p, index in enumerate(graph.compute):
        for tensor in nodes[index].input:
            if not tensor or graph._kind(tensor) == "weight" or tensor in graph._initializers:
                continue
            source = graph._source(tensor)
            if source is not None and nodes[source].op_type == "Constant":
                continue  # a constant waits for no one
            producer = position[source] if source is not None else -1
            last_use[producer] = max(last_use.get(producer, p), p)
    for output in graph.model.graph.output:  # a graph output is read after the last node
        source = graph._source(output.name)
        if source is not None:
            last_use[position[source]] = len(graph.compute)
    segment: dict[int, int] = {}
    current = 0
    for p in range(len(graph.compute)):
        segment[graph.compute[p]] = current
        live = [q for q, last in last_use.items() if q <= p < last]
        if live == [p]:
            current += 1
    grouped: dict[int, list[Block]] = {}
    for block in graph.blocks:
        if block.nodes:
            first = min(block.nodes, key=lambda i: position[i])
            grouped.setdefault(segment[first], []).append(block)
    return [tuple(blocks) for blocks in grouped.values() if 2 <= len(blocks) <= max_blocks]
