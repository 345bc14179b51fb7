"""Empirical bias correction: each quantized layer's mean output error taken back out of its bias.

Rounding a layer's weights to 8 bits shifts its output on average, not only spreads it:
``E[W_q x] - E[W x] = E[(W_q - W) x]``, per output channel, is rarely zero (small layers,
skewed inputs; Nagel et al. 2019 measured it as the main error of depthwise MobileNets), and
the next layers carry the shift on. NNCF's fast bias correction measures that shift on
calibration samples and subtracts it from the bias; so does this module:

1. every Conv and Gemm of the QDQ model whose weight is a DequantizeLinear of an int8
   initializer and which has a bias is matched, by node name, with its FP32 layer;
2. a probe model (the FP32 graph plus, per layer, the same op applied to the layer's FP32
   input with ``W_q - W`` as weights and no bias) runs on the calibration samples; the mean
   of each probe over samples and positions is that layer's mean output error per channel
   (the op is linear, so this is the quantized-weight layer minus the float layer on the
   same float input);
3. the error is subtracted from the bias. ONNX Runtime's quantizer stores a bias as int32 with
   scale ``s_input * s_weight``: the int32 values are shifted (that scale is fine enough that
   rounding the correction costs nothing).

Weight error only: the error the layer's quantized *input* brings is left to the mixed search.
:func:`empirical_bias_correction` takes that too (Nagel et al.'s empirical variant): the mean of
each layer's output in the QDQ model itself (quantized inputs and weights) minus FP32's, taken
out of the bias; as a correction upstream changes what a layer downstream sees, it is measured
again after each pass (a few passes). Layers without a bias are not given one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesdk.converters.quantization.calibrate import batches, model_batch_size
from edgesdk.converters.quantization.methods import MethodResult
from edgesdk.errors import ConversionError

__all__ = ["bias_correction", "empirical_bias_correction"]

_LAYERS = ("Conv", "Gemm")
#: Calibration samples the mean error is taken over.
DEFAULT_SAMPLES = 64


@dataclass(frozen=True)
class _Layer:
    """One quantized layer: its name, FP32 input tensor, weight error and where its bias lives."""

    name: str
    op_type: str
    source: str
    error: np.ndarray
    bias: onnx.TensorProto
    bias_scale: np.ndarray | None


def bias_correction(qdq: onnx.ModelProto, fp32: onnx.ModelProto, calibration: Mapping[str, np.ndarray],
                    max_samples: int = DEFAULT_SAMPLES, batch: int = 8) -> MethodResult:
    """A copy of ``qdq`` whose quantized Conv/Gemm biases are shifted by minus their mean output error.

    ``fp32`` is the float model ``qdq`` was quantized from (its layers keep their names).
    """
    started = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    layers = _layers(out, fp32)
    if not layers:
        return MethodResult(out, 0, "bias correction: no quantized Conv/Gemm with a bias",
                            time.perf_counter() - started)
    means = _weight_errors(fp32, layers, calibration, max_samples, batch)
    changed = 0
    for layer in layers:
        if _shift(layer, means[layer.name]):
            changed += 1
    used = min(max_samples, len(next(iter(calibration.values()))))
    return MethodResult(out, changed, f"bias correction: {changed} of {len(layers)} quantized Conv/Gemm biases "
                        f"shifted by their mean weight-rounding error on {used} calibration samples",
                        time.perf_counter() - started)


def _array(initializers: Mapping[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    return numpy_helper.to_array(initializers[name]) if name in initializers else None


def _dequantized(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> np.ndarray | None:
    """The float value a DequantizeLinear of initializers gives, or None when its input is not one."""
    values = [_array(inits, n) if n else None for n in node.input]
    if values[0] is None or values[1] is None:
        return None
    q, scale = values[0].astype(np.float64), values[1].astype(np.float64)
    zero = values[2].astype(np.float64) if len(values) > 2 and values[2] is not None else np.zeros_like(scale)
    if scale.ndim == 1 and q.ndim > 1:
        axis = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        shape[axis % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (q - zero) * scale


def _layers(qdq: onnx.ModelProto, fp32: onnx.ModelProto) -> list[_Layer]:
    """The QDQ model's quantized Conv/Gemm nodes with a bias, each with its weight error vs ``fp32``."""
    inits = {i.name: i for i in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    float_inits = {i.name: i for i in fp32.graph.initializer}
    float_nodes = {n.name: n for n in fp32.graph.node if n.name}
    layers = []
    for node in qdq.graph.node:
        if node.op_type not in _LAYERS or len(node.input) < 3 or not node.input[2] or node.name not in float_nodes:
            continue
        original = float_nodes[node.name]
        weight_dq = producer.get(node.input[1])
        float_weight = _array(float_inits, original.input[1]) if len(original.input) > 1 else None
        if weight_dq is None or weight_dq.op_type != "DequantizeLinear" or float_weight is None:
            continue
        quantized = _dequantized(weight_dq, inits)
        if quantized is None or quantized.shape != float_weight.shape:
            continue
        bias, scale = _bias_store(node.input[2], producer, inits)
        if bias is None:
            continue
        layers.append(_Layer(node.name, node.op_type, original.input[0],
                             (quantized - float_weight.astype(np.float64)).astype(np.float32), bias, scale))
    return layers


def _bias_store(name: str, producer: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto]
                ) -> tuple[onnx.TensorProto | None, np.ndarray | None]:
    """The initializer holding a bias and, for an int32 one behind a DequantizeLinear, its scale."""
    if name in inits:
        return inits[name], None
    node = producer.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.input[0] not in inits:
        return None, None
    stored = inits[node.input[0]]
    if stored.data_type != onnx.TensorProto.INT32 or node.input[1] not in inits:
        return None, None
    zero = _array(inits, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if zero is not None and np.any(zero != 0):
        return None, None
    return stored, numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)


def _weight_errors(fp32: onnx.ModelProto, layers: list[_Layer], calibration: Mapping[str, np.ndarray],
                  max_samples: int, batch: int) -> dict[str, np.ndarray]:
    """Per layer, the mean over samples and positions of ``op(x, W_q - W)`` per output channel."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(fp32)
    del probe.graph.output[:]
    originals = {n.name: n for n in fp32.graph.node}
    for k, layer in enumerate(layers):
        error_name, out_name = f"_bias_correction_dw_{k}", f"_bias_correction_out_{k}"
        probe.graph.initializer.append(numpy_helper.from_array(layer.error, error_name))
        attrs = {a.name: helper.get_attribute_value(a) for a in originals[layer.name].attribute}
        attrs.pop("beta", None)
        probe.graph.node.append(helper.make_node(layer.op_type, [layer.source, error_name], [out_name],
                                                 name=f"_bias_correction_{k}", **attrs))
        probe.graph.output.append(helper.make_tensor_value_info(out_name, onnx.TensorProto.FLOAT, None))
    names = [o.name for o in probe.graph.output]
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    sums = [np.zeros(layer.error.shape[0 if layer.op_type == "Conv" else _gemm_axis(originals[layer.name])])
            for layer in layers]
    seen, fixed = 0, model_batch_size(fp32)
    total = min(max_samples, len(next(iter(calibration.values()))))
    if fixed is not None:
        batch, total = fixed, max(total - total % fixed, fixed)
    try:
        for chunk in batches(calibration, batch, total):
            size = len(next(iter(chunk.values())))
            for k, value in enumerate(session.run(names, chunk)):
                # Conv: N, C, spatial...; Gemm: rows (samples x tokens), C. Mean over all but C, per sample.
                axes = tuple(i for i in range(value.ndim) if i != 1)
                sums[k] += value.astype(np.float64).mean(axis=axes) * size
            seen += size
    except Exception as exc:  # onnxruntime raises its own types
        raise ConversionError(f"bias correction: the probe model failed on the calibration data: "
                              f"{str(exc).splitlines()[0]}") from exc
    return {layer.name: s / max(seen, 1) for layer, s in zip(layers, sums)}


def _gemm_axis(node: onnx.NodeProto) -> int:
    """The axis of a Gemm's B that indexes its output columns."""
    trans_b = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "transB"), 0)
    return 0 if trans_b else 1


def _shift(layer: _Layer, error: np.ndarray) -> bool:
    """Subtract ``error`` from the layer's bias in place; True when any stored value moved."""
    stored = numpy_helper.to_array(layer.bias)
    if stored.shape != error.shape:
        return False
    if layer.bias_scale is None:
        new = (stored.astype(np.float64) - error).astype(stored.dtype)
    else:
        steps = np.rint(error / np.broadcast_to(layer.bias_scale, error.shape))
        new = np.clip(stored.astype(np.int64) - steps, np.iinfo(np.int32).min, np.iinfo(np.int32).max)
        new = new.astype(np.int32)
    if np.array_equal(new, stored):
        return False
    layer.bias.CopyFrom(numpy_helper.from_array(new, layer.bias.name))
    return True


def empirical_bias_correction(qdq: onnx.ModelProto, fp32: onnx.ModelProto, calibration: Mapping[str, np.ndarray],
                              max_samples: int = 32) -> MethodResult:
    """A copy of ``qdq`` whose Conv/Gemm biases take out the mean output error of the QDQ model up to them.

    Layer by layer in graph order (a correction upstream changes what a layer downstream sees):
    the QDQ model, with the corrections so far, runs to the layer on the samples, and its mean
    output per channel minus FP32's comes out of its bias.
    """
    started = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    layers = _layers(out, fp32)
    if not layers:
        return MethodResult(out, 0, "empirical bias correction: no quantized Conv/Gemm with a bias",
                            time.perf_counter() - started)
    float_outputs = {n.name: n.output[0] for n in fp32.graph.node}
    reference = _channel_means(fp32, [float_outputs[x.name] for x in layers], calibration, max_samples)
    probe = _ProbeWithBiases(out, layers)
    chunks = probe.chunks(calibration, max_samples)
    changed = 0
    for layer, ref in zip(layers, reference):
        current = probe.mean(layer, chunks)
        if _shift(layer, current - ref):
            changed += 1
    used = sum(len(next(iter(c.values()))) for c in chunks)
    return MethodResult(out, changed, f"empirical bias correction: {changed} of {len(layers)} quantized Conv/Gemm "
                        f"biases shifted, layer by layer, by the QDQ model's mean output error on {used} "
                        "calibration samples", time.perf_counter() - started)


def _session(model: onnx.ModelProto, tensors: list[str]) -> Any:
    """A session with ``tensors`` as its outputs, no fusion: each layer's float output stays a tensor."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    for name in tensors:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _chunks(model: onnx.ModelProto, calibration: Mapping[str, np.ndarray],
            max_samples: int) -> list[dict[str, np.ndarray]]:
    fixed = model_batch_size(model)
    total = min(max_samples, len(next(iter(calibration.values()))))
    if fixed is not None:
        total = max(total - total % fixed, fixed)
    return list(batches(calibration, fixed or 8, total))


def _means(session: Any, tensors: list[str], chunks: list[dict[str, np.ndarray]],
           extra: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Per tensor, its mean per channel (axis 1) over samples and positions."""
    sums = [np.zeros(0)] * len(tensors)
    seen = 0
    for chunk in chunks:
        size = len(next(iter(chunk.values())))
        for k, value in enumerate(session.run(tensors, {**chunk, **(extra or {})})):
            axes = tuple(i for i in range(value.ndim) if i != 1)
            mean = value.astype(np.float64).mean(axis=axes) * size
            sums[k] = mean if seen == 0 else sums[k] + mean
        seen += size
    return [s / max(seen, 1) for s in sums]


def _channel_means(model: onnx.ModelProto, tensors: list[str], calibration: Mapping[str, np.ndarray],
                   max_samples: int) -> list[np.ndarray]:
    return _means(_session(model, tensors), tensors, _chunks(model, calibration, max_samples))


class _ProbeWithBiases:
    """The QDQ model once in a session, its layers' biases fed as inputs so corrections need no new session."""

    def __init__(self, model: onnx.ModelProto, layers: list[_Layer]) -> None:
        self.model, self.layers = model, layers
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        fed = {layer.bias.name for layer in layers}
        kept = [i for i in probe.graph.initializer if i.name not in fed]
        del probe.graph.initializer[:]
        probe.graph.initializer.extend(kept)
        for layer in layers:
            probe.graph.input.append(helper.make_tensor_value_info(layer.bias.name, layer.bias.data_type,
                                                                   list(layer.bias.dims)))
        self.outputs = {n.name: n.output[0] for n in model.graph.node}
        self.session = _session(probe, [self.outputs[x.name] for x in layers])

    def chunks(self, calibration: Mapping[str, np.ndarray], max_samples: int) -> list[dict[str, np.ndarray]]:
        return _chunks(self.model, calibration, max_samples)

    def mean(self, layer: _Layer, chunks: list[dict[str, np.ndarray]]) -> np.ndarray:
        """The layer's mean output per channel with every bias as it is now."""
        biases = {x.bias.name: numpy_helper.to_array(x.bias) for x in self.layers}
        return _means(self.session, [self.outputs[layer.name]], chunks, biases)[0]
