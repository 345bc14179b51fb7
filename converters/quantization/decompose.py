"""Activations without int8 kernels, rewritten before static quantization into ops that have them.

ONNX Runtime's QDQ quantizer has no rule for HardSwish or HardSigmoid: it wraps them in
DequantizeLinear -> float op -> QuantizeLinear, so every MobileNetV3-style block leaves int8
twice. Mul, Add and Sigmoid it quantizes, and ONNX Runtime runs them as QLinearMul,
QLinearAdd and QLinearSigmoid; a Clip(0, 1) right before a QuantizeLinear whose range lies
inside [0, 1] is folded into it (ClipQuantFusion). So, before quantizing, this module
rewrites (the ONNX definitions' own arithmetic, so the float graph computes the same values):

    HardSigmoid(x; alpha, beta) -> Clip(Add(Mul(x, alpha), beta), 0, 1)
    HardSwish(x)                -> Mul(x, Clip(Add(Mul(x, 1/6), 1/2), 0, 1))
    Swish(x; alpha) (opset 24)  -> Mul(x, Sigmoid(Mul(x, alpha)))      (no inner Mul when alpha is 1)

SiLU exported as ``Sigmoid`` + ``Mul`` is already in that form and is left as it is. PyTorch's
exporter writes ``hardswish`` as HardSigmoid + Mul, so the HardSigmoid rule is the one most
PyTorch models meet.

Measured on ONNX Runtime 1.32's optimized graphs of the block in
``tests/integration/test_quantize_targets.py`` (conv, HardSwish, depthwise conv, HardSigmoid
gate, 1x1 conv, SiLU, 1x1 conv), on this x86 host for the x86-64 preset and under qemu
(cortex-a76, the aarch64 wheel) for the arm64 one. Left whole, HardSwish (as HardSigmoid +
Mul) and the HardSigmoid gate stay in float between DequantizeLinear and QuantizeLinear (3
float ops, 3 Q and 3 DQ nodes) on both; rewritten, the graph is integer from its one
QuantizeLinear to its one DequantizeLinear (4 QLinearConv, 2 QLinearAdd, 5 QLinearMul,
1 QLinearSigmoid, no Clip left), on both. The int8 arm64 model optimized *for x86* is another
story (1 of 4 Convs fused, 2 without the rewrite): x86 turns int8 groups into uint8 ones only
where a QuantizeLinear has a single consumer, and the rewrite reads ``x`` twice, as SiLU and
residuals do; that is why the x86 preset quantizes activations to uint8.

Symmetric int8 activations need one more thing, which :class:`Decomposition` carries: the
Clip's output (and every Sigmoid's) lies in [0, 1], and a symmetric range [-1, 1] there both
wastes half the levels and keeps the Clip from folding (its QuantizeLinear could hold
negative values). Those tensors, and the Clip's input, are listed in
:attr:`Decomposition.unit_interval`, to be quantized over [0, 1] whatever the activations:
then the Clip folds and the two QuantizeLinear nodes around it are alike, so ONNX Runtime on
aarch64 drops the DequantizeLinear -> QuantizeLinear pair left between QLinearAdd and QLinearMul
(with only the output overridden, that requantization stayed, measured).

The tensors the rewrite adds were not seen by calibration. Their ranges follow from the
ranges of the activation's input (scaling, shifting, clipping and the sigmoid are monotonic),
so :meth:`Decomposition.ranges` derives them instead of calibrating again.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Decomposition", "Derived", "RangeStep", "Rewritten", "decompose_activations", "DECOMPOSED_OPS"]

#: Op types (default ONNX domain) the rewrite replaces.
DECOMPOSED_OPS = ("HardSwish", "HardSigmoid", "Swish")
#: Clip takes its bounds as inputs from opset 11 on; older models are left as they are.
_MIN_OPSET = 11


class RangeStep(str, enum.Enum):
    """How a derived tensor's range follows from its source's."""

    SCALE = "scale"
    SHIFT = "shift"
    CLIP_UNIT = "clip to [0, 1]"
    SIGMOID = "sigmoid"


@dataclass(frozen=True)
class Derived:
    """A tensor the rewrite added: ``step(source)``, with ``value`` the factor or offset of SCALE and SHIFT."""

    tensor: str
    source: str
    step: RangeStep
    value: float = 0.0

    def apply(self, low: float, high: float) -> tuple[float, float]:
        """The range of :attr:`tensor` when :attr:`source` spans [low, high]."""
        if self.step is RangeStep.SCALE:
            a, b = low * self.value, high * self.value
            return (min(a, b), max(a, b))
        if self.step is RangeStep.SHIFT:
            return (low + self.value, high + self.value)
        if self.step is RangeStep.CLIP_UNIT:
            return (min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0))
        return (_sigmoid(low), _sigmoid(high))


@dataclass(frozen=True)
class Rewritten:
    """One node the rewrite replaced, and the nodes that stand for it."""

    name: str
    op_type: str
    replacement: tuple[str, ...]


@dataclass(frozen=True)
class Decomposition:
    """The rewritten model and what quantizing it needs to know."""

    #: An ``onnx.ModelProto``; the caller's model is not modified.
    model: Any
    rewritten: tuple[Rewritten, ...]
    #: Added tensors in the order their ranges can be derived (a source comes before what it feeds).
    derived: tuple[Derived, ...]
    #: Tensors to quantize within [0, 1] (asymmetrically, whatever the activations), each with the tensor whose
    #: range it takes: Clip and Sigmoid outputs their own, each Clip's input its output's (a QuantizeLinear
    #: over that range saturates exactly as the Clip does, and the two QuantizeLinear nodes are then alike).
    unit_interval: tuple[tuple[str, str], ...]

    def ranges(self, known: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        """Ranges of the added tensors from the calibrated ranges ``known`` (those whose source is unknown are left out)."""
        found: dict[str, tuple[float, float]] = {}
        for d in self.derived:
            source = found.get(d.source) or known.get(d.source)
            if source is not None:
                found[d.tensor] = d.apply(float(source[0]), float(source[1]))
        return found


def _sigmoid(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-value)) if value >= 0 else math.exp(value) / (1.0 + math.exp(value))


def decompose_activations(model: Any, keep: Iterable[str] = ()) -> Decomposition:
    """HardSwish, HardSigmoid and Swish nodes of ``model``'s main graph rewritten (see the module's doc).

    Nodes named in ``keep`` stay as they are (so a node excluded from quantization keeps its
    name and its meaning). A model whose default-domain opset is below 11 is returned unchanged.
    """
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    unit = [(n.output[0], n.output[0]) for n in graph.node if n.op_type == "Sigmoid" and n.domain in ("", "ai.onnx")]
    opset = next((o.version for o in copy.opset_import if o.domain in ("", "ai.onnx")), 0)
    kept = set(keep)
    targets = [i for i, n in enumerate(graph.node)
               if n.op_type in DECOMPOSED_OPS and n.domain in ("", "ai.onnx") and n.name not in kept]
    if opset < _MIN_OPSET or not targets:
        return Decomposition(copy, (), (), tuple(unit))

    builder = _Builder(graph)
    rewritten: list[Rewritten] = []
    derived: list[Derived] = []
    new_nodes: list[Any] = []
    chosen = set(targets)
    for index, node in enumerate(graph.node):
        if index not in chosen:
            new_nodes.append(node)
            continue
        made, node_derived, bounded = builder.rewrite(node)
        new_nodes.extend(made)
        derived.extend(node_derived)
        unit.extend(bounded)
        rewritten.append(Rewritten(node.name, node.op_type, tuple(n.name for n in made)))
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(builder.initializers)
    return Decomposition(copy, tuple(rewritten), tuple(derived), tuple(dict.fromkeys(unit)))


class _Builder:
    """Makes the replacement nodes of one graph: fresh names, shared scalar constants."""

    def __init__(self, graph: Any) -> None:
        self.names = _Names(graph)
        self.constants: dict[float, str] = {}
        self.initializers: list[Any] = []

    def constant(self, value: float) -> str:
        import onnx

        value = float(np.float32(value))
        if value not in self.constants:
            name = self.names.fresh(f"edgesdk_decompose_{value:g}".replace("-", "minus").replace(".", "_"))
            self.initializers.append(onnx.numpy_helper.from_array(np.array(value, np.float32), name))
            self.constants[value] = name
        return self.constants[value]

    def rewrite(self, node: Any) -> tuple[list[Any], list[Derived], tuple[tuple[str, str], ...]]:
        """The nodes standing for ``node``, its added tensors' ranges, and its tensors to quantize over [0, 1]."""
        import onnx

        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        x, y = node.input[0], node.output[0]
        base = node.name or f"{node.op_type}_{y}"
        made: list[Any] = []

        def add(op: str, inputs: list[str], output: str, suffix: str) -> str:
            made.append(onnx.helper.make_node(op, inputs, [output], name=self.names.fresh(f"{base}/{suffix}")))
            return output

        derived: list[Derived] = []
        if node.op_type in ("HardSwish", "HardSigmoid"):
            hard_sigmoid = node.op_type == "HardSigmoid"
            alpha = float(attrs.get("alpha", 0.2)) if hard_sigmoid else 1.0 / 6.0
            beta = float(attrs.get("beta", 0.5)) if hard_sigmoid else 0.5
            u = add("Mul", [x, self.constant(alpha)], self.names.fresh(f"{base}/alpha_x"), "mul_alpha")
            v = add("Add", [u, self.constant(beta)], self.names.fresh(f"{base}/alpha_x_beta"), "add_beta")
            s = add("Clip", [v, self.constant(0.0), self.constant(1.0)],
                    y if hard_sigmoid else self.names.fresh(f"{base}/hard_sigmoid"), "clip")
            derived += [Derived(u, x, RangeStep.SCALE, float(np.float32(alpha))),
                        Derived(v, u, RangeStep.SHIFT, float(np.float32(beta)))]
            if not hard_sigmoid:
                derived.append(Derived(s, v, RangeStep.CLIP_UNIT))
                add("Mul", [x, s], y, "mul_x")
            return made, derived, ((v, s), (s, s))
        alpha = float(attrs.get("alpha", 1.0))  # Swish
        u = x
        if alpha != 1.0:
            u = add("Mul", [x, self.constant(alpha)], self.names.fresh(f"{base}/alpha_x"), "mul_alpha")
            derived.append(Derived(u, x, RangeStep.SCALE, float(np.float32(alpha))))
        s = add("Sigmoid", [u], self.names.fresh(f"{base}/sigmoid"), "sigmoid")
        derived.append(Derived(s, u, RangeStep.SIGMOID))
        add("Mul", [x, s], y, "mul_x")
        return made, derived, ((s, s),)


class _Names:
    """Names not yet used by any node, tensor or initializer of a graph."""

    def __init__(self, graph: Any) -> None:
        self.used = {n.name for n in graph.node}
        self.used |= {t for n in graph.node for t in (*n.input, *n.output)}
        self.used |= {i.name for i in graph.initializer} | {v.name for v in (*graph.input, *graph.output,
                                                                              *graph.value_info)}

    def fresh(self, wanted: str) -> str:
        name, n = wanted, 1
        while name in self.used:
            n += 1
            name = f"{wanted}_{n}"
        self.used.add(name)
        return name
