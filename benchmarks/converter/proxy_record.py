"""Record the proxy check's (model, variant) pairs as data: what the ratio band is measured on.

For each real model, the variants the converter builds (FP32 simplified with fixed input shapes,
FP16, INT8 dynamic, INT8 static QDQ with the aarch64 preset the Raspberry Pi 5 gets and with the
x86-64 preset this host would get, MinMax ranges from 32 of the model's own calibration samples),
each counted under ``qemu-x86_64 -cpu Haswell`` and timed for real on this CPU, single-threaded,
interleaved (:func:`benchmarks.converter.quantization_proxy.proxy_pairs`). Each pair's error is
``count ratio to FP32 / time ratio to FP32 - 1``: how far the converter's method (a ratio of
instruction counts of the same runtime's kernels) is from the ratio of real times where both can
be measured. ``calibration_fit.proxy_ratio_band`` turns the held-out half into a ratio band,
which ``calibration.py --recorded`` reports (and the converter does not ship: its module doc says
why).

    python benchmarks/converter/proxy_record.py [--models orientation,ocr_cls] [--rounds 5]

writes ``benchmarks/converter/data/proxy_pairs.yaml`` (models already in it are kept unless named).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.converter.quantization_proxy import proxy_pairs  # noqa: E402
from benchmarks.shared.common import log  # noqa: E402
from benchmarks.shared.models import DATA, MODELS, fetch  # noqa: E402
from edgesdk.converters.board.emulate import Emulator  # noqa: E402
from edgesdk.converters.formats.onnx_model import (  # noqa: E402
    fix_input_shapes,
    load_onnx,
    save_onnx,
    simplify,
)
from edgesdk.converters.quantization.calibrate import calibrate  # noqa: E402
from edgesdk.converters.quantization.config import (  # noqa: E402
    CalibrationMethod,
    QuantizationConfig,
)
from edgesdk.converters.quantization.quantize import (  # noqa: E402
    quantize_dynamic_int8,
    quantize_static_int8,
    to_fp16,
)
from edgesdk.errors import ConversionError  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "proxy_pairs.yaml"
HEADER = (
    "# Count ratio to FP32 (instructions under qemu-x86_64 -cpu Haswell) against time ratio to\n"
    "# FP32 (this CPU, one thread, interleaved rounds) of real models' variants: written by\n"
    "# `benchmarks/converter/proxy_record.py`, read by `benchmarks/converter/calibration.py` and\n"
    "# tests/unit/test_calibration_constants.py (the proxy's ratio band, measured and not\n"
    "# shipped: benchmarks/converter/calibration_fit.py says why).\n"
)
CALIBRATION_SAMPLES = 32


def variants(name: str, work: Path) -> dict[str, Path]:
    """The converter's ONNX variants of ``MODELS[name]`` in ``work`` (FP32 named ``onnx-fp32``)."""
    spec = MODELS[name]
    fp32 = save_onnx(
        simplify(fix_input_shapes(load_onnx(fetch(name)), {spec.input_name: spec.shape})),
        work / "fp32.onnx",
    )
    out = {"onnx-fp32": fp32, "onnx-fp16": to_fp16(fp32, work / "fp16.onnx", QuantizationConfig())}
    try:
        out["onnx-int8-dynamic"] = quantize_dynamic_int8(
            fp32, work / "dynamic.onnx", QuantizationConfig.arm64()
        )
    except ConversionError as exc:  # no MatMul/Gemm: the converter skips this variant too
        log(f"  {name}: {exc}")
    samples = {spec.input_name: DATA[name](CALIBRATION_SAMPLES, 1)}
    minmax = CalibrationMethod.MINMAX
    presets = (("arm64", QuantizationConfig.arm64()), ("x86", QuantizationConfig.x86_64()))
    for preset, config in presets:
        ranges = calibrate(
            fp32, samples, (minmax,), work / f"ranges-{preset}",
            symmetric=bool(config.activation_symmetric),
        ).caches[minmax]
        out[f"onnx-int8-static-{preset}"] = quantize_static_int8(
            fp32, work / f"static-{preset}.onnx", ranges, config, minmax
        )
    return out


def host() -> dict[str, str]:
    """The CPU and library versions the pairs were measured with."""
    import onnxruntime

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )
    flags = Path("/proc/cpuinfo").read_text()
    return {
        "cpu": cpu,
        "avx512_vnni": str("avx512_vnni" in flags).lower(),
        "emulated_cpu": "qemu-x86_64 -cpu Haswell (AVX2, FMA; no AVX-512)",
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="orientation,ocr_cls")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    recorded = yaml.safe_load(OUT.read_text()) if OUT.is_file() else {"pairs": []}
    pairs = [p for p in recorded["pairs"] if p["model"] not in names]
    emulator = Emulator(require_userland=False)
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"proxy-{name}-") as tmp:
            log(f"{name}: building variants")
            built = variants(name, Path(tmp))
            sample = {MODELS[name].input_name: DATA[name](1, 2)}
            for row in proxy_pairs(name, built, sample, emulator, rounds=args.rounds):
                if row["variant"] == "onnx-fp32":
                    continue
                pairs.append({
                    "model": name, "variant": row["variant"], "rounds": args.rounds,
                    "count_ratio": round(row["plain_ratio"], 4),
                    "time_ratio": round(row["measured_ratio"], 4),
                    "instructions": int(row["instructions"]),
                    "measured_ms": round(row["measured_ms"], 3),
                })
                log(f"  {name}/{row['variant']}: count {row['plain_ratio']:.3f}, "
                    f"time {row['measured_ratio']:.3f}")
    data = {"host": host(), "pairs": sorted(pairs, key=lambda p: (p["model"], p["variant"]))}
    OUT.write_text(HEADER + yaml.safe_dump(data, sort_keys=False, width=110))
    log(f"wrote {OUT}")


if __name__ == "__main__":
    main()
