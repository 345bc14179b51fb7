"""The ONNX precision variants: FP16, INT8 dynamic, INT8 static (QDQ) and mixed precision.

Each builder takes the simplified FP32 model file and writes one variant file. Static
INT8 reads tensor ranges from one streaming calibration pass (:mod:`.calibrate`); what
mixed precision keeps in float is decided by :mod:`.search`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgesdk.converters.config import CalibrationMethod, QuantizationConfig, QuantType
from edgesdk.converters.onnx_model import save_onnx
from edgesdk.converters.quiet import held_output
from edgesdk.errors import ConversionError
from edgesdk.files import fsync_file

__all__ = ["to_fp16", "quantize_dynamic_int8", "quantize_static_int8"]


def to_fp16(src: Path, dst: Path, config: QuantizationConfig) -> Path:
    """FP16 weights and activations; inputs and outputs stay FP32 when ``fp16_keep_io_types``."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    try:
        with held_output("ONNX Runtime's FP16 converter"):  # it warns for every constant it clamps to the fp16 range
            half = convert_float_to_float16(model, keep_io_types=config.fp16_keep_io_types)
    except Exception as exc:
        raise ConversionError(f"FP16 conversion failed: {type(exc).__name__}: {exc}") from exc
    return save_onnx(half, dst)


def _qtype(kind: QuantType) -> Any:
    from onnxruntime.quantization import QuantType as OrtQuantType

    return OrtQuantType.QUInt8 if kind is QuantType.UINT8 else OrtQuantType.QInt8


def _symmetry(config: QuantizationConfig) -> dict[str, Any]:
    """The quantizer's symmetry options, always given (its defaults depend on the types and have changed before)."""
    return {"ActivationSymmetric": config.activation_symmetric, "WeightSymmetric": config.weight_symmetric}


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
        weight_type=_qtype(config.weight_type), nodes_to_exclude=list(config.nodes_to_exclude),
        extra_options={"WeightSymmetric": config.weight_symmetric}))
    return dst


def quantize_static_int8(
    src: Path,
    dst: Path,
    ranges: Path,
    config: QuantizationConfig,
    method: CalibrationMethod,
    float_nodes: tuple[str, ...] = (),
) -> Path:
    """INT8 QDQ with the tensor ranges of one calibration pass (:mod:`.calibrate`); ``float_nodes`` stay float."""
    from onnxruntime.quantization import CalibrationMethod as OrtMethod
    from onnxruntime.quantization import QuantFormat, quantize_static

    ort_method = {CalibrationMethod.MINMAX: OrtMethod.MinMax, CalibrationMethod.ENTROPY: OrtMethod.Entropy,
                  CalibrationMethod.PERCENTILE: OrtMethod.Percentile}[method]
    # Relu/Clip stay in the graph: ORT removes them before a QuantizeLinear at load time anyway
    # (ReluQuantFusion), and the search (.qdq) needs them to put a block back in float.
    extra: dict[str, Any] = {"QDQKeepRemovableActivations": True, **_symmetry(config)}
    _quantize_atomically(dst, lambda out: quantize_static(
        str(src), out, None, quant_format=QuantFormat.QDQ, per_channel=config.per_channel,
        reduce_range=config.reduce_range, activation_type=_qtype(config.activation_type),
        weight_type=_qtype(config.weight_type), calibrate_method=ort_method,
        op_types_to_quantize=list(config.static_op_types) if config.static_op_types else None,
        nodes_to_exclude=[*config.nodes_to_exclude, *float_nodes], extra_options=extra,
        calibration_cache_path=str(ranges)))
    return dst


def _quantize_atomically(dst: Path, run: Any) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    # A directory of its own: the quantizer writes side files (augmented models) beside its output.
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        out = str(Path(tmp) / dst.name)
        try:
            # It prints, warns and logs advice ("consider pre-processing": this pipeline already simplified);
            # stdout belongs to --json output in any case.
            with contextlib.redirect_stdout(sys.stderr), held_output(f"ONNX Runtime's quantizer ({dst.name})"):
                run(out)
        except Exception as exc:
            raise ConversionError(f"ONNX Runtime quantization failed for {dst.name}: {type(exc).__name__}: {exc}") \
                from exc
        fsync_file(out)
        os.replace(out, dst)
