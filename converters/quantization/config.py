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
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["CalibrationMethod", "QuantType", "QuantizationConfig", "DOT_PRODUCT_CORES"]


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


#: Arm cores with the dot-product instructions (``sdot``/``udot``, Armv8.2 ``asimddp``): ONNX Runtime's
#: symmetric int8 kernels (MLAS ``ConvSym``, ``SymmQgemm``) pick their dot-product variants on them.
DOT_PRODUCT_CORES = frozenset({
    "cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "cortex-a78ae", "cortex-a78c",
    "cortex-a710", "cortex-a715", "cortex-a720", "cortex-x1", "cortex-x2", "cortex-x3", "cortex-x4",
    "neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2"})
_ARM64 = ("aarch64", "arm64")


@dataclass(frozen=True)
class QuantizationConfig:
    """How the INT8 variants are built and how far their accuracy may fall.

    Start from a target's preset (:meth:`for_profile`, or :meth:`arm64`, :meth:`x86_64`,
    :meth:`tensorrt`) and change fields with :func:`dataclasses.replace`.
    """

    #: Per-output-channel weight scales (needs opset >= 13); almost always more accurate.
    per_channel: bool = True
    #: Activations. INT8 activations are symmetric (zero point 0; calibration symmetrizes their ranges).
    #: Which one is fast depends on the target: see the presets.
    activation_type: QuantType = QuantType.UINT8
    weight_type: QuantType = QuantType.INT8
    #: Activations with zero point 0. None: INT8 activations symmetric, UINT8 ones not. Symmetric int8 cannot
    #: hold a ReLU's output range exactly, so ONNX Runtime keeps every Conv -> ReLU's ReLU in float between
    #: a DQ and a Q; asymmetric int8 (zero point -128 after a ReLU) lets it fold, on aarch64 as on x86.
    activation_symmetric: bool | None = None
    #: Weights with zero point 0. ONNX Runtime's symmetric conv/GEMM kernels (MLAS ``ConvSym``, its depthwise
    #: variant and ``SymmQgemm``) need signed weights whose zero points are all 0; other weights take the
    #: slower asymmetric path. (ONNX Runtime's static quantizer makes per-channel weights symmetric whatever
    #: this says, as QLinear ops need one zero point for all channels; it decides per-tensor weights and
    #: dynamic INT8's.)
    weight_symmetric: bool = True
    #: Quantize weights to 7 bits, for x86 CPUs without VNNI where u8*s8 sums can saturate.
    reduce_range: bool = False
    #: Static INT8 rewrites HardSwish, HardSigmoid and Swish into Mul/Add/Clip/Sigmoid before quantizing
    #: (:mod:`.decompose`), ops ONNX Runtime runs as QLinearMul/QLinearAdd/QLinearSigmoid; left whole, they
    #: run in float between a DequantizeLinear and a QuantizeLinear.
    decompose_activations: bool = True
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
    #: Which preset this is and why (shown in reports and saved in manifests).
    preset: str = "default"
    #: Nodes never quantized, whatever the measurement says.
    nodes_to_exclude: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("activation_type", "weight_type"):
            value = getattr(self, name)
            if not isinstance(value, QuantType):
                object.__setattr__(self, name, _enum(QuantType, value, name))
        if self.activation_symmetric is None:
            object.__setattr__(self, "activation_symmetric", self.activation_type is QuantType.INT8)
        for name in ("per_channel", "weight_symmetric", "activation_symmetric", "reduce_range", "decompose_activations",
                     "fp16_keep_io_types"):
            if not isinstance(getattr(self, name), bool):
                raise ConversionError(f"{name} must be True or False, got {getattr(self, name)!r}")
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

    # presets ----------------------------------------------------------------------------------
    @classmethod
    def arm64(cls, dot_product_cores: tuple[str, ...] = ()) -> QuantizationConfig:
        """64-bit Arm CPUs: asymmetric int8 activations, symmetric int8 per-channel weights.

        On aarch64 ONNX Runtime fuses int8 QDQ groups directly (``QDQIsInt8Allowed``): no
        rewrite to uint8, so a tensor read by several nodes does not block QLinearConv. Its
        int8 QLinearConv then uses the symmetric kernels (MLAS ``ConvSym``, the depthwise one,
        ``SymmQgemm``), which need weight zero points of 0, and their ``sdot`` variants on cores
        with the dot product. Activations keep a zero point, so a ReLU after a Conv folds into
        its QuantizeLinear (measured under emulated Cortex-A76 on a residual ReLU net: 0.39x FP32's
        instructions with every ReLU folded, against 0.44x with symmetric activations, which
        leave each ReLU in float). ``dot_product_cores`` only names those cores in :attr:`preset`.
        """
        dot = (f"; sdot on {', '.join(dot_product_cores)}" if dot_product_cores
               else "; no dot product on these cores (NEON widening multiplies)")
        return cls(activation_type=QuantType.INT8, activation_symmetric=False, weight_type=QuantType.INT8,
                   weight_symmetric=True, per_channel=True,
                   preset="aarch64: asymmetric int8 activations (ONNX Runtime fuses int8 QDQ directly on Arm; the "
                          "zero point lets a ReLU fold into its Q), symmetric int8 "
                          f"per-channel weights (the zero-point-0 ConvSym/depthwise/SymmQgemm kernels{dot})")

    @classmethod
    def x86_64(cls) -> QuantizationConfig:
        """x86-64 CPUs: uint8 activations, symmetric int8 per-channel weights.

        ONNX Runtime on x86 fuses a QDQ Conv into QLinearConv only with uint8 activations; int8
        ones are first rewritten to uint8, which needs each QuantizeLinear to have a single
        consumer, so any tensor read twice (a residual, a HardSwish's input) left its Conv in float.
        """
        return cls(activation_type=QuantType.UINT8, weight_type=QuantType.INT8, weight_symmetric=True, per_channel=True,
                   preset="x86_64: uint8 activations (QLinearConv fuses without the int8-to-uint8 rewrite, which "
                          "needs single-consumer QuantizeLinear nodes), symmetric int8 per-channel weights")

    @classmethod
    def tensorrt(cls) -> QuantizationConfig:
        """TensorRT: symmetric int8 activations and weights, activations left whole.

        TensorRT's explicit quantization wants zero points of 0 everywhere. It fuses a
        convolution with the activation after it itself; Q/DQ pairs between the pieces of a
        decomposed HardSwish would only stand in the way of that fusion.
        """
        return cls(activation_type=QuantType.INT8, weight_type=QuantType.INT8, weight_symmetric=True, per_channel=True,
                   decompose_activations=False,
                   preset="tensorrt: symmetric int8 activations and weights; activations left whole (TensorRT fuses "
                          "them into the convolution)")

    @classmethod
    def for_profile(cls, profile: DeviceProfile) -> QuantizationConfig:
        """Preset for a board: its accelerators' needs first, then its CPU architecture."""
        providers = {p for a in profile.accelerators for p in a.onnxruntime_providers}
        if "TensorrtExecutionProvider" in providers:
            return cls.tensorrt()
        if profile.arch in _ARM64:
            cores = tuple(dict.fromkeys(c.microarchitecture for c in profile.clusters
                                        if c.microarchitecture.lower() in DOT_PRODUCT_CORES))
            return cls.arm64(dot_product_cores=cores)
        if profile.arch == "x86_64":
            return cls.x86_64()
        return cls(preset=f"{profile.arch}: uint8 activations, symmetric int8 per-channel weights (ONNX Runtime's "
                          "portable choice; no preset for this architecture)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (enums as their values, tuples as lists): what a manifest's ``quantization`` holds."""
        data = asdict(self)
        data["activation_type"] = self.activation_type.value
        data["weight_type"] = self.weight_type.value
        data["activation_symmetric"] = self.activation_symmetric
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
