"""An accelerator's latency without the accelerator: a roofline over an ONNX graph's layers, times a fitted efficiency.

For each node of the graph (shapes from ONNX shape inference) :func:`node_costs` counts

* **FLOPs** (a multiply-add is 2): ``Conv``/``ConvTranspose`` ``2 * out_elements * (C_in / group) * kh * kw``,
  ``Gemm``/``MatMul`` ``2 * M * N * K``, pooling ``out_elements * window`` (global pooling: the input's
  elements), ``Softmax`` 3 per element, and one per output element for the other element-wise ops;
* **bytes** moved to and from memory: the node's inputs (weights included) and outputs at the
  precision's element size (FP32 4, FP16 2, INT8 1). Nodes an inference engine fuses into the
  producer that precedes them (activations, BatchNorm, element-wise arithmetic, ``Concat``,
  reshapes) are counted with their FLOPs but no bytes of their own (:data:`FUSED`); TensorRT
  fuses exactly these into the convolution or GEMM kernel before them.

:func:`roofline_ms` gives each node ``max(FLOPs / peak, bytes / bandwidth)`` and sums them: the
time of a perfect engine on :class:`GpuPeak` (the data sheet's dense tensor throughput for the
precision and the memory bandwidth). Real engines reach a fraction of it, so :func:`estimate_ms`
divides by an ``efficiency`` fitted on published figures (``benchmarks/converter/calibration.py``), and adds
a fixed cost per kernel launched (also fitted), which dominates small models on a GPU.

Pure: no GPU and no inference; ``onnx`` (and ONNX Runtime's shape inference) are imported only by
:func:`node_costs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeCost", "GpuPeak", "EngineCost", "clock_share", "node_costs", "with_shapes", "roofline_ms",
           "estimate_ms", "BYTES_PER_ELEMENT", "FUSED", "EFFICIENCY", "PER_KERNEL_US"]

#: TensorRT's fraction of the roofline, and its fixed cost per kernel launched, fitted by
#: ``benchmarks/converter/calibration.py`` on the fit half of the Jetson Orin Nano's published TensorRT figures
#: (``benchmarks/converter/data/published_latency.yaml``: NetsPresso's device matrix, Ultralytics' docs, one blog;
#: none of them NVIDIA's own). Validation half: median |estimate / published - 1| 5.6%, worst 19% (5 figures,
#: FP32/FP16/INT8, ResNet, MobileNetV3, YOLO). One GPU and one engine: other accelerators need their own fit.
EFFICIENCY = 0.38
PER_KERNEL_US = 20.0
#: Bytes per tensor element at each precision an engine may build for.
BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "int8": 1}
#: Ops an inference engine fuses into the kernel before them: FLOPs counted, no bytes of their own.
FUSED = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu", "Selu", "Gelu", "Erf",
    "Mish", "Softplus", "PRelu", "BatchNormalization", "Add", "Sub", "Mul", "Div", "Concat", "Reshape",
    "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Cast", "Shape", "Gather", "Constant",
    "QuantizeLinear", "DequantizeLinear", "Transpose", "Slice", "Split",
})
_HEAVY = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul", "ConvInteger",
                    "MatMulInteger"})


@dataclass(frozen=True)
class NodeCost:
    """The work of one graph node: its FLOPs, the bytes it moves, and whether it runs as a kernel of its own."""

    name: str
    op: str
    flops: float
    bytes: float
    #: False for a node fused into the kernel before it (:data:`FUSED`).
    kernel: bool = True


@dataclass(frozen=True)
class GpuPeak:
    """An accelerator's data-sheet ceilings: dense throughput per precision (TFLOPS or TOPS) and memory bandwidth."""

    tflops: Mapping[str, float]
    memory_gbps: float

    def __post_init__(self) -> None:
        if not self.tflops or any(not v > 0 for v in self.tflops.values()) or not self.memory_gbps > 0:
            raise ValueError(f"GpuPeak needs positive tflops per precision and memory_gbps, got {dict(self.tflops)} "
                             f"and {self.memory_gbps}")

    def peak_flops(self, precision: str) -> float:
        """FLOP/s at ``precision``; a precision the data sheet omits falls back to the nearest wider one."""
        for candidate in _WIDER.get(precision, (precision,)):
            if candidate in self.tflops:
                return self.tflops[candidate] * 1e12
        raise ValueError(f"no peak for {precision!r}: the accelerator lists {sorted(self.tflops)}")


_WIDER = {"int8": ("int8", "fp16", "fp32"), "fp16": ("fp16", "fp32"), "fp32": ("fp32",)}


def node_costs(model: Any, precision: str = "fp32", fuse: bool = True, shaped: bool = False) -> list[NodeCost]:
    """FLOPs and bytes of every node of ``model`` (an ``onnx.ModelProto`` with static input shapes) at ``precision``.

    ``fuse=False`` counts every node as a kernel of its own that reads and writes memory (an engine without
    TensorRT's layer fusion, such as ONNX Runtime's CUDA provider). ``shaped``: ``model`` already went through
    :func:`with_shapes` (costing one graph several ways infers its shapes once).
    """

    if precision not in BYTES_PER_ELEMENT:
        raise ValueError(f"precision {precision!r} is not one of {sorted(BYTES_PER_ELEMENT)}")
    size = BYTES_PER_ELEMENT[precision]
    graph = (model if shaped else with_shapes(model)).graph
    shapes: dict[str, tuple[int, ...]] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    costs = []
    for node in graph.node:
        ins = [shapes.get(name) for name in node.input if name]
        outs = [shapes.get(name) for name in node.output if name]
        flops = _flops(node, ins, outs)
        moved = sum(_elements(s) for s in ins + outs if s is not None) * size
        fused = fuse and node.op_type in FUSED and node.op_type not in _HEAVY
        costs.append(NodeCost(node.name or node.op_type, node.op_type, float(flops), 0.0 if fused else float(moved),
                              kernel=not fused))
    return costs


def with_shapes(model: Any) -> Any:
    """``model`` with every tensor's shape: ONNX Runtime's symbolic inference follows shapes computed inside the
    graph (``Shape`` -> ``Slice`` -> ``Split`` sizes, as exported YOLO heads have), which ONNX's own stops at."""
    import onnx

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # no onnxruntime, or an op its inference does not know: ONNX's own inference
        return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def _attribute(node: Any, name: str, default: Any) -> Any:
    import onnx

    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _flops(node: Any, ins: list[tuple[int, ...] | None], outs: list[tuple[int, ...] | None]) -> int:
    out = outs[0] if outs else None
    if out is None:
        return 0
    op = node.op_type
    if op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv"):
        weight = ins[3] if op == "QLinearConv" and len(ins) > 3 else (ins[1] if len(ins) > 1 else None)
        if weight is None:
            return 0
        kernel = _elements(weight[2:])
        if op == "ConvTranspose":  # weight (C_in, C_out/group, k...): each input element feeds C_out/group * k outputs
            source = ins[0] or ()
            return 2 * _elements(source) * weight[1] * kernel if source else 0
        return 2 * _elements(out) * weight[1] * kernel
    if op in ("Gemm", "MatMul", "MatMulInteger", "QLinearMatMul"):
        first = ins[0] or ()
        if not first:
            return 0
        reduce = first[0] if op == "Gemm" and _attribute(node, "transA", 0) else first[-1]
        return 2 * _elements(out) * reduce
    if op in ("MaxPool", "AveragePool"):
        return _elements(out) * _elements(tuple(_attribute(node, "kernel_shape", [1])))
    if op in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean"):
        return _elements(ins[0]) if ins and ins[0] else 0
    if op == "Softmax":
        return 3 * _elements(out)
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Constant", "Concat", "Split",
              "Slice", "Gather", "Transpose", "Cast", "Dropout"):
        return 0
    return _elements(out)


def roofline_ms(costs: Iterable[NodeCost], peak: GpuPeak, precision: str) -> float:
    """Milliseconds of a perfect engine: each node bound by compute or by memory, whichever is slower, summed."""
    flops_per_s = peak.peak_flops(precision)
    bytes_per_s = peak.memory_gbps * 1e9
    return sum(max(c.flops / flops_per_s, c.bytes / bytes_per_s) for c in costs) * 1e3


def estimate_ms(costs: Iterable[NodeCost], peak: GpuPeak, precision: str, efficiency: float = EFFICIENCY,
                per_kernel_us: float = PER_KERNEL_US) -> float:
    """The roofline divided by ``efficiency`` (0 < e <= 1), plus ``per_kernel_us`` for each kernel launched."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    listed = list(costs)
    kernels = sum(1 for c in listed if c.kernel)
    return roofline_ms(listed, peak, precision) / efficiency + kernels * per_kernel_us / 1e3


@dataclass(frozen=True)
class EngineCost:
    """One model on one accelerator engine: its nodes' costs grouped by the precision each runs at, timed at any
    power mode's accelerator clock (the compute peaks scale with it; the memory bandwidth does not)."""

    accelerator: str
    #: What reports call it: ``TensorRT fp16``, ``CUDA fp32``.
    engine: str
    #: The ONNX Runtime execution provider that builds it (``TensorrtExecutionProvider``).
    provider: str
    #: (precision, the nodes that run at it).
    groups: tuple[tuple[str, tuple[NodeCost, ...]], ...]

    def latency_ms(self, board: Any, power_mode: str) -> float:
        """The estimate on ``board`` (a :class:`~edgesdk.runtime.profiles.DeviceProfile`) in ``power_mode``."""
        acc = next(a for a in board.accelerators if a.name == self.accelerator)
        share = clock_share(board, self.accelerator, power_mode)
        peak = GpuPeak({p: v * share for p, v in acc.peak_tflops.items()}, acc.memory_gbps)
        kernels = sum(1 for _, nodes in self.groups for c in nodes if c.kernel)
        roofline = sum(roofline_ms(nodes, peak, precision) for precision, nodes in self.groups)
        return roofline / EFFICIENCY + kernels * PER_KERNEL_US / 1e3


def clock_share(board: Any, accelerator: str, power_mode: str) -> float:
    """``accelerator``'s clock in ``power_mode`` as a share of the clock its peaks are quoted at (1.0 when the profile
    gives no clocks)."""
    acc = next(a for a in board.accelerators if a.name == accelerator)
    mode = next((m for m in board.power_modes if m.name == power_mode), None)
    if acc.max_mhz is None or mode is None:
        return 1.0
    return min(acc.max_mhz, mode.max_mhz.get(acc.name, acc.max_mhz)) / acc.max_mhz
