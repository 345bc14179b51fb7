"""Static INT8 judged on the board's outputs and on this host's, on one real model (issue 59).

FP32 and static INT8 (min-max calibration, the Raspberry Pi 5 preset) of a model from
benchmarks/shared/models.py run on this host (onnxruntime) and on the emulated Cortex-A76 (the
board's aarch64 onnxruntime under qemu,
:func:`edgesdk.converters.board.board_outputs.board_outputs`) over the same evaluation samples;
prints INT8's drop vs FP32 on the same machine (the model's metric against FP32's outputs), the
host-vs-board difference, and the board run's wall time.

    python benchmarks/converter/board_accuracy.py [--model orientation] [--samples 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.shared.models import DATA, MODELS, fetch  # noqa: E402
from edgesdk import load_profile  # noqa: E402
from edgesdk.converters.board.board_outputs import board_outputs  # noqa: E402
from edgesdk.converters.board.emulate import Emulator  # noqa: E402
from edgesdk.converters.formats import onnx_model  # noqa: E402
from edgesdk.converters.planning.metrics import resolve_metric  # noqa: E402
from edgesdk.converters.quantization import config as qconfig  # noqa: E402
from edgesdk.converters.quantization.calibrate import calibrate  # noqa: E402
from edgesdk.converters.quantization.quantize import quantize_static_int8  # noqa: E402


def _host(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    count = len(next(iter(feeds.values())))
    return np.concatenate(
        [session.run([name], {k: v[i : i + 1] for k, v in feeds.items()})[0] for i in range(count)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="orientation", choices=sorted(MODELS))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--calibration", type=int, default=64)
    args = parser.parse_args()
    spec = MODELS[args.model]
    calibration, evaluation = (
        DATA[args.model](args.calibration, 1),
        DATA[args.model](args.samples, 2),
    )
    metric = resolve_metric(spec.metric, None)
    emulator = Emulator()
    config = qconfig.QuantizationConfig.for_profile(load_profile("raspberry-pi-5"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32 = onnx_model.save_onnx(
            onnx_model.fix_input_shapes(
                onnx_model.load_onnx(fetch(args.model)), {spec.input_name: spec.shape}
            ),
            work / "fp32.onnx",
        )
        ranges = calibrate(
            fp32, {spec.input_name: calibration}, (qconfig.CalibrationMethod.MINMAX,), work / "cal"
        )
        int8 = quantize_static_int8(
            fp32,
            work / "int8.onnx",
            ranges.caches[qconfig.CalibrationMethod.MINMAX],
            config,
            qconfig.CalibrationMethod.MINMAX,
        )
        feeds = {spec.input_name: evaluation}
        host = {name: _host(path, feeds) for name, path in (("fp32", fp32), ("int8", int8))}
        board, seconds = {}, {}
        for name, path in (("fp32", fp32), ("int8", int8)):
            started = time.perf_counter()
            board[name] = board_outputs(
                emulator,
                path,
                feeds,
                "cortex-a76",
                max_samples=args.samples,
                progress=lambda d, t, n=name: print(
                    f"  {n} on the board {d}/{t}", file=sys.stderr, end="\r"
                ),
            ).outputs
            seconds[name] = round(time.perf_counter() - started, 1)
    result = {
        "model": args.model,
        "metric": metric.name,
        "samples": args.samples,
        "board_seconds": seconds,
    }
    for where, outs in (("host", host), ("board", board)):
        result[f"{where}_int8_drop"] = round(metric.drop(outs["fp32"], outs["int8"], None), 3)
    result["fp32_board_vs_host_drop"] = round(metric.drop(host["fp32"], board["fp32"], None), 3)
    result["host_board_max_abs_diff"] = {k: float(np.max(np.abs(host[k] - board[k]))) for k in host}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
