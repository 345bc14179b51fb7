"""Typed quantization settings with per-profile presets.

Every option is a field (no string-keyed ``extra_options``); configs are frozen, so
derive variants with :func:`dataclasses.replace`. The config that made a variant is
saved in its bundle's manifest.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from edgesdk.errors import ConversionError
from edgesdk.profiles import DeviceProfile

__all__ = ["CalibrationMethod", "QuantType", "QuantizationConfig"]


class CalibrationMethod(str, enum.Enum):
    """How static INT8 picks each activation's range from the calibration data."""

    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class QuantType(str, enum.Enum):
    """An 8-bit integer type: uint8 (asymmetric) or int8 (symmetric)."""

    UINT8 = "uint8"
    INT8 = "int8"


#: Op types whose dynamic (runtime-computed activation scale) INT8 kernels beat FP32 on CPUs.
#: Conv is left out on purpose: ConvInteger measured 3-6x slower than FP32 Conv here.
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention", "LSTM", "GRU")


@dataclass(frozen=True)
class QuantizationConfig:
    """How the INT8 variants are built and how far their accuracy may fall."""

    #: Per-output-channel weight scales (needs opset >= 13); almost always more accurate.
    per_channel: bool = True
    #: Activations: uint8 (asymmetric) ran 2x faster than int8 with int8 weights on x86 and
    #: is what Arm's kernels prefer; TensorRT needs int8 (symmetric).
    activation_type: QuantType = QuantType.UINT8
    weight_type: QuantType = QuantType.INT8
    #: Quantize weights to 7 bits, for x86 CPUs without VNNI where u8*s8 sums can saturate.
    reduce_range: bool = False
    #: Calibration methods tried for static INT8; the most accurate on the evaluation data wins.
    calibration_methods: tuple[CalibrationMethod, ...] = (
        CalibrationMethod.MINMAX, CalibrationMethod.ENTROPY, CalibrationMethod.PERCENTILE)
    percentile: float = 99.999
    #: At most this many calibration samples are used (more costs time, not memory: calibration streams).
    max_calibration_samples: int = 512
    dynamic_op_types: tuple[str, ...] = DYNAMIC_OPS
    #: Op types static INT8 quantizes; None lets ONNX Runtime's quantizer choose (all it supports).
    static_op_types: tuple[str, ...] | None = None
    #: Mixed precision: at most this many candidates are measured by the search (0 turns it off).
    max_search_candidates: int = 12
    #: Calibration samples the per-block sensitivity runs on (never evaluation data).
    sensitivity_samples: int = 32
    #: FP16 keeps model inputs and outputs FP32 so applications feed the same arrays.
    fp16_keep_io_types: bool = True
    #: Why the preset was chosen (shown in reports and saved in manifests).
    preset: str = "default"
    #: Nodes never quantized, whatever the measurement says.
    nodes_to_exclude: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("activation_type", "weight_type"):
            value = getattr(self, name)
            if not isinstance(value, QuantType):
                object.__setattr__(self, name, _enum(QuantType, value, name))
        methods = tuple(_enum(CalibrationMethod, m, "calibration_methods") for m in self.calibration_methods)
        object.__setattr__(self, "calibration_methods", methods)
        if not methods:
            raise ConversionError("calibration_methods is empty; give at least one of minmax, entropy, percentile")
        if not 90.0 <= self.percentile < 100.0:
            raise ConversionError(f"percentile must be in [90, 100), got {self.percentile}")
        if self.max_calibration_samples < 1 or self.max_search_candidates < 0 or self.sensitivity_samples < 1:
            raise ConversionError(
                f"max_calibration_samples and sensitivity_samples must be >= 1 and max_search_candidates >= 0, got "
                f"{self.max_calibration_samples}, {self.sensitivity_samples} and {self.max_search_candidates}")

    @classmethod
    def for_profile(cls, profile: DeviceProfile) -> QuantizationConfig:
        """Preset for a board: its accelerators' needs first, then its CPU architecture."""
        providers = {p for a in profile.accelerators for p in a.onnxruntime_providers}
        if "TensorrtExecutionProvider" in providers:
            return cls(activation_type=QuantType.INT8, preset="tensorrt: symmetric int8 activations and weights")
        if profile.arch == "x86_64":
            return cls(preset="x86_64: uint8 activations, int8 per-channel weights")
        return cls(preset=f"{profile.arch} CPU (Arm NEON): uint8 activations, int8 per-channel weights")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (enums as their values, tuples as lists): what a manifest's ``quantization`` holds."""
        data = asdict(self)
        data["activation_type"] = self.activation_type.value
        data["weight_type"] = self.weight_type.value
        data["calibration_methods"] = [m.value for m in self.calibration_methods]
        data["dynamic_op_types"] = list(self.dynamic_op_types)
        data["nodes_to_exclude"] = list(self.nodes_to_exclude)
        data["static_op_types"] = list(self.static_op_types) if self.static_op_types is not None else None
        return data


def _enum(kind: type[enum.Enum], value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ConversionError(f"{name}: {value!r} is not one of {[k.value for k in kind]}") from None
