"""The ONNX precision variants: FP16, INT8 dynamic, INT8 static (QDQ) and mixed precision.

Each builder takes the simplified FP32 model file and writes one variant file. Static
INT8 reads tensor ranges from one streaming calibration pass (:mod:`.calibrate`); what
mixed precision keeps in float is decided by :mod:`.search`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgesdk.converters.formats.onnx_model import save_onnx
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig, QuantType
from edgesdk.converters.quantization.decompose import decompose_activations
from edgesdk.converters.quiet import held_output
from edgesdk.errors import ConversionError
from edgesdk.files import fsync_file

__all__ = ["to_fp16", "quantize_dynamic_int8", "quantize_static_int8"]

log = logging.getLogger(__name__)


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
    """INT8 QDQ with the tensor ranges of one calibration pass (:mod:`.calibrate`); ``float_nodes`` stay float.

    With ``config.decompose_activations``, HardSwish, HardSigmoid and Swish are first rewritten
    into ops with int8 kernels (:mod:`.decompose`); the tensors that adds get ranges derived
    from the calibrated ones, so ``ranges`` (calibrated on ``src``) still serves.
    """
    from onnxruntime.quantization import CalibrationMethod as OrtMethod
    from onnxruntime.quantization import QuantFormat, quantize_static

    ort_method = {CalibrationMethod.MINMAX: OrtMethod.MinMax, CalibrationMethod.ENTROPY: OrtMethod.Entropy,
                  CalibrationMethod.PERCENTILE: OrtMethod.Percentile}[method]
    excluded = [*config.nodes_to_exclude, *float_nodes]
    # Relu/Clip stay in the graph: ORT removes them before a QuantizeLinear at load time anyway
    # (ReluQuantFusion, ClipQuantFusion), and the search (.qdq) needs them to put a block back in float.
    extra: dict[str, Any] = {"QDQKeepRemovableActivations": True, **_symmetry(config)}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.decomposed.") as tmp:
        source, cache = src, ranges
        if config.decompose_activations and _quantizes(config, ("Mul", "Add")):
            source, cache, overrides = _decomposed(src, ranges, config, excluded, Path(tmp))
            if overrides:
                extra["TensorQuantOverrides"] = overrides
        _quantize_atomically(dst, lambda out: quantize_static(
            str(source), out, None, quant_format=QuantFormat.QDQ, per_channel=config.per_channel,
            reduce_range=config.reduce_range, activation_type=_qtype(config.activation_type),
            weight_type=_qtype(config.weight_type), calibrate_method=ort_method,
            op_types_to_quantize=list(config.static_op_types) if config.static_op_types else None,
            nodes_to_exclude=excluded, extra_options=extra, calibration_cache_path=str(cache)))
    return dst


def _quantizes(config: QuantizationConfig, ops: tuple[str, ...]) -> bool:
    return config.static_op_types is None or set(ops) <= set(config.static_op_types)


def _decomposed(src: Path, ranges: Path, config: QuantizationConfig, excluded: list[str],
                work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The decomposed model, a calibration cache with its added tensors' ranges, and tensor overrides (in ``work``).

    Returns ``src`` and ``ranges`` themselves when there is nothing to rewrite.
    """
    import numpy as np
    import onnx
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, load_tensors_data, save_tensors_data

    model = onnx.load(str(src))
    rewrite = decompose_activations(model, keep=excluded)
    del model
    if not rewrite.rewritten:
        return src, ranges, {}
    data = load_tensors_data(ranges)
    known = {name: (float(np.asarray(t.range_value[0])), float(np.asarray(t.range_value[1])))
             for name, t in data.items()}
    derived = rewrite.ranges(known)
    missing = [d.tensor for d in rewrite.derived if d.tensor not in derived]
    if missing:
        log.warning("decomposed activations: no calibrated range behind %s; they stay in float", missing)
    merged = dict(data.items())
    for name, (low, high) in derived.items():
        merged[name] = TensorData(lowest=np.array(low, np.float32), highest=np.array(high, np.float32))
    cache = work / ranges.name
    save_tensors_data(TensorsData(data.calibration_method, merged), cache)
    source = save_onnx(rewrite.model, work / src.name)
    overrides: dict[str, Any] = {}
    if config.activation_symmetric:
        # Tensors in [0, 1] (Clip, Sigmoid outputs) quantized over [0, 1], not a symmetrized [-1, 1]: all 256
        # levels, and the Clip before them folds into their QuantizeLinear (its range then lies inside the Clip's).
        for name, range_of in rewrite.unit_interval:
            if name in merged and range_of in merged:
                low, high = (float(np.asarray(v)) for v in merged[range_of].range_value)
                overrides[name] = [{"symmetric": False, "rmin": np.float32(min(max(low, 0.0), 1.0)),
                                    "rmax": np.float32(min(max(high, 0.0), 1.0))}]
    log.info("decomposed %d activation(s) for int8 kernels: %s", len(rewrite.rewritten),
             ", ".join(sorted({r.op_type for r in rewrite.rewritten})))
    return source, cache, overrides


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
