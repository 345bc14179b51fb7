"""SmoothQuant-style migration (Xiao et al. 2023): move activation outliers into the weights.

A MatMul or Gemm whose weight is a constant computes ``x @ W``. An activation channel with
outliers forces one per-tensor int8 scale to cover them, and every other channel loses its
resolution. With a per-input-channel ``s = max|x|^alpha / max|w|^(1-alpha)``, ``(x / s) @ (s W)``
is the same product with the outliers halved in the log sense on both sides; the per-channel
weight scales absorb ``s`` in the weights.

The division by ``s`` must cost nothing at run time, so it is folded into the op that makes
``x``: a LayerNormalization's gamma and beta, a Mul or Div by a constant (the tail of a
decomposed LayerNorm), a preceding MatMul's or Gemm's output columns and bias, walking back
through an Add of a constant bias and through Reshape/Flatten/Transpose that keep the channel
axis last. Where it cannot be folded (the input of an MLP's second layer comes from a Swish,
or the tensor has other readers), the layer is left alone and counted: an explicit Mul by
``1/s`` (``insert_mul=True``) keeps the maths but ONNX Runtime quantizes that Mul's input with
the same outliers, so it rarely helps. The result is an FP32 model equal to the input up to
float rounding.

Measured on the PP-OCRv4 recognizer (SVTR neck): 4 of its 9 MatMul inputs fold (LayerNorm ->
qkv and LayerNorm -> MLP); the attention output projection (behind the heads' reshape) and the
layers after a Swish do not. Its static INT8 loss did not move (9.9 points of text agreement
plain, 10.4 smoothed at alpha 0.5, 10.0 at 0.8, on 90 rendered lines): that loss is not in
those four inputs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from edgesdk.converters.quantization.methods import MethodResult
from edgesdk.errors import ConversionError

__all__ = ["smooth", "activation_channel_max"]

#: Ops that move data without mixing channels when their output's last axis is their input's.
_PASS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"})
_FLOOR = 1e-5  # below this a channel's max is treated as empty: its scale stays 1


@dataclass(frozen=True)
class _Edit:
    """A constant scaled per channel: on its last axis if broadcast (``axis`` -1), else ``axis``."""

    name: str
    kind: str  # "divide" (x/s), "multiply" (x*s: a Div's divisor)
    axis: int  # -1: a bias or gamma broadcast along the last axis


@dataclass(frozen=True)
class _Site:
    """An activation, the layers reading it (with their weight's input-channel axis), its folds."""

    tensor: str
    layers: tuple[tuple[str, str, int], ...]  # (node name, weight initializer, input-channel axis)
    folds: tuple[_Edit, ...] | None  # None: cannot be folded upstream


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.inits = {i.name: i for i in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        self.shapes: dict[str, tuple[int, ...]] = {}
        for info in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
            dims = info.type.tensor_type.shape.dim
            self.shapes[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in dims
            )
        for name, init in self.inits.items():
            self.shapes[name] = tuple(init.dims)

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])

    def own_constant(self, name: str) -> bool:
        """A float initializer read by exactly one node (so changing it changes nothing else)."""
        init = self.inits.get(name)
        return (
            init is not None
            and init.data_type == onnx.TensorProto.FLOAT
            and len(self.readers.get(name, [])) == 1
            and name not in self.outputs
        )

    def last_dim(self, name: str) -> int:
        shape = self.shapes.get(name, ())
        return shape[-1] if shape else -1


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _layer(graph: _Graph, node: onnx.NodeProto) -> tuple[str, int] | None:
    """The weight initializer and its input-channel axis, when ``node`` is x @ constant."""
    if node.op_type == "MatMul" and len(node.input) == 2 and graph.own_constant(node.input[1]):
        return (node.input[1], 0) if len(graph.inits[node.input[1]].dims) == 2 else None
    if (
        node.op_type == "Gemm"
        and graph.own_constant(node.input[1])
        and not _attr(node, "transA", 0)
    ):
        return node.input[1], 1 if _attr(node, "transB", 0) else 0
    return None


def _folds(graph: _Graph, tensor: str) -> tuple[_Edit, ...] | None:
    """The constants that divide ``tensor`` by a per-last-axis scale when changed, or None."""
    edits: list[_Edit] = []
    current, channels = tensor, graph.last_dim(tensor)
    while True:
        node = graph.producer.get(current)
        if node is None or channels <= 0:
            return None
        if current != tensor and (
            len(graph.readers.get(current, [])) != 1 or current in graph.outputs
        ):
            return None
        inputs = list(node.input)
        if node.op_type in _PASS:
            if graph.last_dim(inputs[0]) != channels or (
                node.op_type == "Transpose" and not _keeps_last(graph, node)
            ):
                return None
            current = inputs[0]
            continue
        const = [i for i in inputs if graph.own_constant(i)]
        if node.op_type in ("Add", "Sub") and len(inputs) == 2 and len(const) == 1:
            # (x +- c) / s = x / s +- c / s, and c - x likewise: the constant takes 1/s, x goes on
            if not _vector(graph, const[0], channels):
                return None
            edits.append(_Edit(const[0], "divide", -1))
            current = inputs[0] if inputs[1] == const[0] else inputs[1]
            continue
        last = _last_fold(graph, node, channels)
        return None if last is None else (*edits, *last)


def _last_fold(graph: _Graph, node: onnx.NodeProto, channels: int) -> tuple[_Edit, ...] | None:
    """The edits that end a fold at ``node`` (a Mul, Div, LayerNorm or constant-weight layer)."""
    op, inputs = node.op_type, list(node.input)
    const = [i for i in inputs if graph.own_constant(i)]
    if op == "Mul" and len(inputs) == 2 and len(const) == 1:
        return (_Edit(const[0], "divide", -1),) if _vector(graph, const[0], channels) else None
    if op == "Div" and len(inputs) == 2 and const == [inputs[1]]:
        return (_Edit(inputs[1], "multiply", -1),) if _vector(graph, inputs[1], channels) else None
    if op == "LayerNormalization":
        rank = len(graph.shapes.get(inputs[0], ()))
        tail = [i for i in inputs[1:3] if i]
        if _attr(node, "axis", -1) not in (-1, rank - 1) or not all(map(graph.own_constant, tail)):
            return None
        return tuple(_Edit(i, "divide", -1) for i in tail)
    upstream = _layer(graph, node)
    if upstream is None:
        return None
    weight, in_axis = upstream
    bias = [i for i in inputs[2:3] if i]
    if bias and not (graph.own_constant(bias[0]) and _vector(graph, bias[0], channels)):
        return None
    return (_Edit(weight, "divide", 1 - in_axis), *(_Edit(b, "divide", -1) for b in bias))


def _keeps_last(graph: _Graph, node: onnx.NodeProto) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm is not None and perm[-1] == len(perm) - 1


def _vector(graph: _Graph, name: str, channels: int) -> bool:
    """A constant that broadcasts along the last axis only (a bias, a gamma, a scalar)."""
    shape = graph.shapes.get(name, ())
    return all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, channels))


def _sites(graph: _Graph) -> list[_Site]:
    """Every activation read by constant-weight MatMul/Gemm layers, grouped by tensor."""
    sites: list[_Site] = []
    seen: set[str] = set()
    for node in graph.model.graph.node:
        if _layer(graph, node) is None or node.input[0] in seen or node.input[0] in graph.inits:
            continue
        tensor = node.input[0]
        seen.add(tensor)
        readers = graph.readers.get(tensor, [])
        members = [
            (r.name, *layer)
            for r in readers
            if (layer := _layer(graph, r)) and r.input[0] == tensor
        ]
        whole = len(members) == len(readers) and tensor not in graph.outputs
        sites.append(_Site(tensor, tuple(members), _folds(graph, tensor) if whole else None))
    return sites


def activation_channel_max(
    model: onnx.ModelProto, calibration: Mapping[str, np.ndarray], tensors: list[str]
) -> dict[str, np.ndarray]:
    """max |x| per last-axis channel of each named tensor over the samples (ONNX Runtime, CPU)."""
    import onnxruntime as ort

    from edgesdk.converters.quantization.calibrate import batches, model_batch_size

    if not tensors:
        return {}
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    del augmented.graph.output[:]
    augmented.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in tensors)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        augmented.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    found: dict[str, np.ndarray] = {}
    for chunk in batches(calibration, model_batch_size(model) or 8):
        for name, value in zip(tensors, session.run(tensors, chunk)):
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            found[name] = np.maximum(found[name], peak) if name in found else peak
    return found


def _scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    live = (x_max > _FLOOR) & (w_max > _FLOOR)
    s = np.ones_like(x_max, dtype=np.float64)
    s[live] = x_max[live].astype(np.float64) ** alpha / w_max[live].astype(np.float64) ** (
        1 - alpha
    )
    return s


def _apply(graph: _Graph, edit: _Edit, s: np.ndarray) -> None:
    value = graph.array(edit.name).astype(np.float64)
    factor = s if edit.kind == "multiply" else 1 / s
    if edit.axis == -1:
        shape = (*value.shape[:-1], s.size) if value.ndim else (s.size,)
        value = np.broadcast_to(value, shape) * factor
    else:
        value = value * np.expand_dims(factor, 1 - edit.axis)
    graph.inits[edit.name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), edit.name))


def smooth(
    model: onnx.ModelProto,
    calibration: Mapping[str, np.ndarray],
    alpha: float = 0.5,
    *,
    insert_mul: bool = False,
) -> MethodResult:
    """SmoothQuant on an FP32 model: the same function, activation outliers moved into the weights.

    ``changed`` counts the activation tensors smoothed (each may feed several layers, e.g. the
    query, key and value projections after one LayerNorm, which then share one scale). Sites whose
    scale cannot be folded upstream are skipped and counted in the note, unless ``insert_mul``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConversionError(
            f"SmoothQuant alpha must be in [0, 1], got {alpha}; 0.5 is the paper's default"
        )
    started = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = _Graph(out)
    sites = [s for s in _sites(graph) if s.folds is not None or insert_mul]
    skipped = len(_sites(graph)) - len(sites)
    x_max = activation_channel_max(out, calibration, [s.tensor for s in sites])
    layers = inserted = 0
    for site in sites:
        w_max = np.max(
            [np.abs(graph.array(w)).max(axis=1 - axis) for _, w, axis in site.layers], axis=0
        )
        s = _scales(x_max[site.tensor], w_max, alpha)
        for _, weight, axis in site.layers:
            _apply(graph, _Edit(weight, "multiply", axis), s)
        layers += len(site.layers)
        if site.folds is not None:
            for edit in site.folds:
                _apply(graph, edit, s)
        else:
            _insert_mul(graph, site, s)
            inserted += 1
    note = (
        f"SmoothQuant (alpha {alpha}): {len(sites)} MatMul/Gemm input(s) smoothed over "
        f"{layers} layer(s), "
        f"{len(sites) - inserted} folded upstream, {inserted} by an inserted Mul; "
        f"{skipped} left (scale could not be folded)"
    )
    return MethodResult(out, len(sites), note, time.perf_counter() - started)


def _insert_mul(graph: _Graph, site: _Site, s: np.ndarray) -> None:
    scale_name, smoothed = f"{site.tensor}_smooth_scale", f"{site.tensor}_smoothed"
    graph.model.graph.initializer.append(
        numpy_helper.from_array((1 / s).astype(np.float32), scale_name)
    )
    for node in graph.readers[site.tensor]:
        if _layer(graph, node) is not None and node.input[0] == site.tensor:
            node.input[0] = smoothed
    nodes = graph.model.graph.node
    at = min(i for i, n in enumerate(nodes) if n.input and n.input[0] == smoothed)
    nodes.insert(
        at,
        onnx.helper.make_node(
            "Mul", [site.tensor, scale_name], [smoothed], name=f"{site.tensor}_smooth"
        ),
    )
