"""The ONNX precision variants: FP16, INT8 dynamic, INT8 static (QDQ) and mixed precision.

Each builder takes the simplified FP32 model file and writes one variant file. What is
kept in float for mixed precision is decided by measurement: per-node output error
(SQNR of the quantized model's tensors against the float model's, on the evaluation
inputs), most sensitive first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.config import CalibrationMethod, QuantizationConfig, QuantType
from edgesdk.converters.onnx_model import save_onnx
from edgesdk.errors import ConversionError
from edgesdk.files import fsync_file

__all__ = ["to_fp16", "quantize_dynamic_int8", "quantize_static_int8", "node_sensitivity", "QUANTIZABLE_OPS"]

#: Op types whose outputs are compared for sensitivity (the heavy, weight-bearing ones).
QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def to_fp16(src: Path, dst: Path, config: QuantizationConfig) -> Path:
    """FP16 weights and activations; inputs and outputs stay FP32 when ``fp16_keep_io_types``."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # it warns for every constant it clamps to the fp16 range
            half = convert_float_to_float16(model, keep_io_types=config.fp16_keep_io_types)
    except Exception as exc:
        raise ConversionError(f"FP16 conversion failed: {type(exc).__name__}: {exc}") from exc
    return save_onnx(half, dst)


def _qtype(kind: QuantType) -> Any:
    from onnxruntime.quantization import QuantType as OrtQuantType

    return OrtQuantType.QUInt8 if kind is QuantType.UINT8 else OrtQuantType.QInt8


def quantize_dynamic_int8(src: Path, dst: Path, config: QuantizationConfig) -> Path:
    """INT8 weights, activations quantized at run time, only for ``config.dynamic_op_types``."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    present = {n.op_type for n in onnx.load(str(src), load_external_data=False).graph.node}
    ops = list(config.dynamic_op_types)
    if "Gemm" in ops and "MatMul" not in ops:
        ops.append("MatMul")  # ORT quantizes Gemm by rewriting it as MatMul + Add
    if not present & set(ops):
        raise ConversionError(f"INT8 dynamic: the model has none of the op types it helps ({list(config.dynamic_op_types)})"
                              "; skip this variant")
    _quantize_atomically(dst, lambda out: quantize_dynamic(
        str(src), out, op_types_to_quantize=ops, per_channel=config.per_channel, reduce_range=config.reduce_range,
        weight_type=_qtype(config.weight_type), nodes_to_exclude=list(config.nodes_to_exclude)))
    return dst


class _Reader:
    """Feeds calibration samples to ONNX Runtime's calibrator, in batches the model accepts."""

    def __init__(self, samples: Mapping[str, np.ndarray], batch: int) -> None:
        self._samples, self._batch = samples, batch
        self._iter: Iterator[dict[str, np.ndarray]] = self._batches()

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        n = len(next(iter(self._samples.values())))
        for start in range(0, n - self._batch + 1, self._batch):
            yield {k: v[start:start + self._batch] for k, v in self._samples.items()}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = self._batches()


def _static_batch(src: Path) -> int:
    """The batch size calibration must use: the model's fixed batch, or 32 when it is dynamic."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return dims[0].dim_value if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else 32


def quantize_static_int8(
    src: Path,
    dst: Path,
    calibration: Mapping[str, np.ndarray],
    config: QuantizationConfig,
    method: CalibrationMethod,
    float_nodes: tuple[str, ...] = (),
) -> Path:
    """INT8 QDQ with per-channel weights, calibrated with ``method``; ``float_nodes`` stay float."""
    from onnxruntime.quantization import CalibrationMethod as OrtMethod
    from onnxruntime.quantization import QuantFormat, quantize_static

    n = len(next(iter(calibration.values())))
    limit = min(n, config.max_calibration_samples)
    samples = {k: np.ascontiguousarray(v[:limit]) for k, v in calibration.items()}
    batch = min(_static_batch(src), limit)
    ort_method = {CalibrationMethod.MINMAX: OrtMethod.MinMax, CalibrationMethod.ENTROPY: OrtMethod.Entropy,
                  CalibrationMethod.PERCENTILE: OrtMethod.Percentile}[method]
    extra: dict[str, Any] = {"CalibMovingAverage": False}
    if method is CalibrationMethod.PERCENTILE:
        extra["CalibPercentile"] = config.percentile
    if config.activation_type is QuantType.INT8:
        extra["ActivationSymmetric"] = True
    _quantize_atomically(dst, lambda out: quantize_static(
        str(src), out, _Reader(samples, batch), quant_format=QuantFormat.QDQ, per_channel=config.per_channel,
        reduce_range=config.reduce_range, activation_type=_qtype(config.activation_type),
        weight_type=_qtype(config.weight_type), calibrate_method=ort_method,
        op_types_to_quantize=list(config.static_op_types) if config.static_op_types else None,
        nodes_to_exclude=[*config.nodes_to_exclude, *float_nodes], extra_options=extra))
    return dst


def _quantize_atomically(dst: Path, run: Any) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    # A directory of its own: the quantizer writes side files (augmented models) beside its output.
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        out = str(Path(tmp) / dst.name)
        try:
            # The calibrators print progress to stdout, which belongs to --json output: send it to stderr.
            with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
                warnings.simplefilter("ignore")
                # It also logs "consider pre-processing" on the root logger: this pipeline already simplified.
                logging.disable(logging.WARNING)
                try:
                    run(out)
                finally:
                    logging.disable(logging.NOTSET)
        except Exception as exc:
            raise ConversionError(f"ONNX Runtime quantization failed for {dst.name}: {type(exc).__name__}: {exc}") \
                from exc
        fsync_file(out)
        os.replace(out, dst)


def _with_outputs(path: Path, tensors: list[str], out: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    existing = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in existing:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    onnx.save(model, str(out))


def _run(path: Path, feeds: Mapping[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(names, dict(feeds))


def node_sensitivity(float_model: Path, quantized_model: Path, inputs: Mapping[str, np.ndarray]) -> list[tuple[str, float]]:
    """(node name, SQNR in dB of its output in the quantized model), most sensitive (lowest) first.

    Nodes are paired by name (the QDQ quantizer keeps names) and the same tensor is read
    from both models on the same inputs.
    """
    import onnx

    float_graph = onnx.load(str(float_model), load_external_data=False).graph
    quant_graph = onnx.load(str(quantized_model), load_external_data=False).graph
    float_tensors = {o for n in float_graph.node for o in n.output}
    quant_tensors = {o for n in quant_graph.node for o in n.output}
    quant_by_name = {n.name: n for n in quant_graph.node if n.name}
    consumers: dict[str, list[Any]] = {}
    for n in quant_graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def dequantized(tensor: str) -> str:
        """Follow tensor -> QuantizeLinear -> DequantizeLinear: the value the next node really sees."""
        q = next((n for n in consumers.get(tensor, []) if n.op_type == "QuantizeLinear"), None)
        dq = next((n for n in consumers.get(q.output[0], []) if n.op_type == "DequantizeLinear"), None) if q else None
        return dq.output[0] if dq else tensor

    nodes = []  # (node name, float tensor, quantized tensor)
    for node in float_graph.node:
        twin = quant_by_name.get(node.name)
        if node.op_type not in QUANTIZABLE_OPS or twin is None:
            continue
        # A fused activation (Conv+Relu) makes the quantized node emit the activation's tensor.
        if twin.output[0] in float_tensors:
            nodes.append((node.name, twin.output[0], dequantized(twin.output[0])))
        elif node.output[0] in quant_tensors:
            nodes.append((node.name, node.output[0], node.output[0]))
    if not nodes:
        return []
    float_names, quant_names = [f for _, f, _ in nodes], [q for _, _, q in nodes]
    with tempfile.TemporaryDirectory() as tmp:
        f_path, q_path = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        _with_outputs(float_model, float_names, f_path)
        _with_outputs(quantized_model, quant_names, q_path)
        reference = _run(f_path, inputs, float_names)
        quantized = _run(q_path, inputs, quant_names)
    scores = []
    for (name, _, _), ref, q in zip(nodes, reference, quantized):
        noise = float(np.mean((ref.astype(np.float64) - q) ** 2))
        signal = float(np.mean(ref.astype(np.float64) ** 2))
        sqnr = 10 * np.log10(signal / noise) if noise > 0 else float("inf")
        scores.append((name, float(sqnr)))
    return sorted(scores, key=lambda item: item[1])
