"""Variants edgesdk convert builds, against ONNX Runtime's quantize_static with its defaults.

Two models: (a) a CNN trained on scikit-learn's digits (accuracy with labels), (b) an
untrained MobileNetV2-shaped CNN at 224x224 (speed; accuracy = top-1 agreement with its
own FP32 outputs). For each: every variant's size, host latency and accuracy drop from
``convert()``; then FP32, the chosen variant, the best INT8/mixed variant and the
ORT-defaults model timed interleaved in one process for the latency ratios.

    python benchmarks/quantization.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, goal, interleaved, log, summary  # noqa: E402

from edgesdk import Runtime, load_profile  # noqa: E402
from edgesdk.converters.measure import measure_variant  # noqa: E402
from edgesdk.converters.metrics import resolve_metric  # noqa: E402
from edgesdk.converters.onnx_model import export_torch  # noqa: E402
from edgesdk.converters.pipeline import convert  # noqa: E402
from edgesdk.testing import digits_cnn, load_digits_data, mobilenet_v2_shaped  # noqa: E402

PROFILE = "rk3588"


def ort_defaults(src: Path, dst: Path, calibration: np.ndarray, input_name: str) -> Path:
    """Plain onnxruntime.quantization.quantize_static with its defaults, one sample per call."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration[i:i + 1] for i in range(len(calibration)))

        def get_next(self):  # type: ignore[no-untyped-def]
            sample = next(self.samples, None)
            return None if sample is None else {input_name: sample}

    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        quantize_static(str(src), str(dst), Reader())
        logging.disable(logging.NOTSET)
    return dst


def run_case(name: str, onnx_path: Path, calibration: np.ndarray, evaluation: np.ndarray, labels, work: Path,
             rounds: int) -> dict:
    profile = load_profile(PROFILE)
    log(f"{name}: convert() for {PROFILE}")
    report = convert(onnx_path, profile, calibration={"input": calibration}, evaluation={"input": evaluation},
                     labels=labels, out_dir=work / f"{name}-out", name=name,
                     progress=lambda stage, done, total: log(f"  {stage}"))
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32")
    quantized = [c for c in report.plan.candidates if c.precision in ("int8_static", "mixed")]
    best_q = min((c for c in quantized if c.accuracy_drop <= report.max_accuracy_drop),
                 key=lambda c: c.measurement.latency_p50_ms, default=min(quantized, key=lambda c: c.accuracy_drop))
    log(f"{name}: ORT quantize_static defaults")
    default_path = ort_defaults(onnx_path, work / f"{name}-ort-defaults.onnx", calibration, "input")
    threads = fp32.measurement.threads
    default_m = measure_variant(default_path, profile, "latency", threads, {"input": evaluation})
    metric = resolve_metric(report.metric, labels)
    default_drop = metric.drop(fp32.measurement.outputs, default_m.outputs, labels)

    log(f"{name}: interleaved timing")
    runtimes = {"fp32": Runtime(fp32.path, profile=profile, threads=threads),
                "chosen": Runtime(report.plan.chosen.path, profile=profile, threads=threads),
                "best_int8": Runtime(best_q.path, profile=profile, threads=threads),
                "ort_defaults": Runtime(default_path, profile=profile, threads=threads)}
    x = evaluation[:1]
    probe = interleaved({"fp32": lambda: runtimes["fp32"].predict(x)}, rounds=1, calls=5, warmup=3)["fp32"][0]
    calls = max(3, int(0.3 / probe))
    samples = interleaved({k: (lambda rt=rt: rt.predict(x)) for k, rt in runtimes.items()}, rounds=rounds, calls=calls,
                          warmup=5)
    for rt in runtimes.values():
        rt.close()

    def ratio(key: str) -> float:
        return statistics.median(a / b for a, b in zip(samples[key], samples["fp32"]))

    fp32_size = fp32.measurement.size_bytes
    return {
        "metric": report.metric, "metric_unit": report.metric_unit, "chosen": report.plan.chosen.name,
        "chosen_reason": report.plan.reason, "best_int8": best_q.name,
        "variants": {c.name: {"size_ratio": c.measurement.size_bytes / fp32_size,
                              "host_latency_ratio_sequential": c.measurement.latency_p50_ms / fp32.measurement.latency_p50_ms,
                              "accuracy_drop": c.accuracy_drop, "rejected": list(c.rejected), "notes": list(c.notes)}
                     for c in report.plan.candidates},
        "ort_defaults": {"size_ratio": default_m.size_bytes / fp32_size, "accuracy_drop": default_drop},
        "interleaved_latency_ms": {k: summary(v) for k, v in samples.items()},
        "latency_ratio_vs_fp32": {k: ratio(k) for k in ("chosen", "best_int8", "ort_defaults")},
        "best_int8_accuracy_drop": best_q.accuracy_drop,
        "best_int8_size_ratio": best_q.measurement.size_bytes / fp32_size,
        "fp32_accuracy": None if labels is None else float(np.mean(fp32.measurement.outputs.argmax(1) == labels) * 100),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import torch

    rounds = 5 if args.quick else 15
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = load_digits_data()
        log("digits: training the CNN")
        cnn = digits_cnn(data, epochs=10 if args.quick else 30)
        cnn_path = export_torch(cnn, [torch.zeros(1, 1, 8, 8)], work / "digits_cnn.onnx", output_names=["logits"],
                                dynamic_batch=True)
        results["digits_cnn"] = run_case("digits_cnn", cnn_path, data.x_train.reshape(-1, 1, 8, 8)[:512],
                                         data.x_test.reshape(-1, 1, 8, 8), data.y_test, work, rounds)
        log("mobilenet_v2_shaped: exporting")
        rng = np.random.default_rng(0)
        mb_path = export_torch(mobilenet_v2_shaped(), [torch.zeros(1, 3, 224, 224)], work / "mobilenet_v2.onnx",
                               output_names=["logits"])
        n_cal, n_eval = (8, 8) if args.quick else (32, 32)
        images = rng.uniform(-1, 1, (n_cal + n_eval, 3, 224, 224)).astype(np.float32)
        results["mobilenet_v2_224"] = run_case("mobilenet_v2_224", mb_path, images[:n_cal], images[n_cal:], None, work,
                                               max(3, rounds // 3))
    digits, mb = results["digits_cnn"], results["mobilenet_v2_224"]
    goals = [
        goal("MobileNetV2-shaped: best INT8/mixed variant size / FP32", "<= 0.30", mb["best_int8_size_ratio"],
             mb["best_int8_size_ratio"] <= 0.30),
        goal("MobileNetV2-shaped: best INT8/mixed variant latency / FP32 (interleaved)", "<= 0.75",
             mb["latency_ratio_vs_fp32"]["best_int8"], mb["latency_ratio_vs_fp32"]["best_int8"] <= 0.75),
        goal("digits CNN: best INT8/mixed top-1 drop (points)", "<= 0.5", digits["best_int8_accuracy_drop"],
             digits["best_int8_accuracy_drop"] <= 0.5),
        goal("digits CNN: accuracy drop of ours minus ORT defaults (points)", "<= 0",
             digits["best_int8_accuracy_drop"] - digits["ort_defaults"]["accuracy_drop"],
             digits["best_int8_accuracy_drop"] <= digits["ort_defaults"]["accuracy_drop"]),
        goal("MobileNetV2-shaped: latency of ours / ORT defaults (interleaved)", "<= 1.0",
             mb["latency_ratio_vs_fp32"]["best_int8"] / mb["latency_ratio_vs_fp32"]["ort_defaults"],
             mb["latency_ratio_vs_fp32"]["best_int8"] <= mb["latency_ratio_vs_fp32"]["ort_defaults"] * 1.0),
        goal("MobileNetV2-shaped: agreement drop of ours minus ORT defaults (points)", "<= 0",
             mb["best_int8_accuracy_drop"] - mb["ort_defaults"]["accuracy_drop"],
             mb["best_int8_accuracy_drop"] <= mb["ort_defaults"]["accuracy_drop"]),
    ]
    emit("quantization", {"profile": PROFILE, "mode": "latency", "quick": args.quick, "rounds": rounds}, results, goals)


if __name__ == "__main__":
    main()
