"""edgesdk convert on real pretrained models, against FP32 and ONNX Runtime's quantize_static defaults.

Models and data come from benchmarks/models.py (pinned wheels, SHA-256 checked; real
photographs and rendered text). Per model: ``convert()`` with a 1-point bound on the
model's task metric; ORT ``quantize_static`` with its defaults; then FP32, our chosen
variant, our fastest variant within 1 point, and the ORT-defaults model timed
interleaved in one process (A B C D, the order rotating every round). A CNN trained on
scikit-learn's digits checks accuracy against real labels. Then the 10.9 MB
OCR model is converted by the ``edgesdk convert`` command with 32 and with 512
calibration samples (.npy files) to show peak RSS and wall time do not grow with them.

    python benchmarks/quantization.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, goal, interleaved, log, summary  # noqa: E402
from models import DATA, MODELS, fetch  # noqa: E402

from edgesdk import Runtime, load_profile  # noqa: E402
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert  # noqa: E402
from edgesdk.converters.config import QuantizationConfig  # noqa: E402
from edgesdk.converters.measure import measure_variant  # noqa: E402
from edgesdk.converters.metrics import resolve_metric  # noqa: E402
from edgesdk.converters.onnx_model import fix_input_shapes, load_onnx, save_onnx  # noqa: E402

PROFILE = "rk3588"
BOUND = 1.0
EVAL = {"orientation": 128, "detector": 200, "ocr_rec": 128}


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


def run_model(name: str, work: Path, n_cal: int, n_eval: int, rounds: int, config: QuantizationConfig) -> dict:
    spec = MODELS[name]
    source = fetch(name)
    profile = load_profile(PROFILE)
    log(f"{name}: data ({n_cal} calibration, {n_eval} evaluation samples)")
    calibration, evaluation = DATA[name](n_cal, 1), DATA[name](n_eval, 2)
    feeds_cal, feeds_eval = {spec.input_name: calibration}, {spec.input_name: evaluation}
    metric_name = spec.metric if isinstance(spec.metric, str) else spec.metric.__name__
    log(f"{name}: convert() for {PROFILE}, bound {BOUND} point(s) of {metric_name}")
    started = time.perf_counter()
    request = ConversionRequest(Source(source, input_shapes={spec.input_name: spec.shape}), Target(profile),
                                Data(feeds_cal, feeds_eval, metric=spec.metric), Output(work / f"{name}-out", name=name),
                                Bounds(max_accuracy_drop=BOUND), quantization=config)
    report = convert(request, progress=lambda stage, done, total: log(f"  {stage}") if done == 0 else None)
    convert_s = time.perf_counter() - started
    candidates = {c.name: c for c in report.plan.candidates}
    fp32 = candidates["onnx-fp32"]
    within = [c for c in report.plan.candidates if c.accuracy_drop <= BOUND and c.name != "onnx-fp32"]
    fastest_within = min(within, key=lambda c: c.measurement.latency_p50_ms, default=None)

    log(f"{name}: ORT quantize_static defaults (32 calibration samples: it keeps all of them in memory)")
    fixed = save_onnx(fix_input_shapes(load_onnx(source), {spec.input_name: spec.shape}), work / f"{name}-fixed.onnx")
    default_path = ort_defaults(fixed, work / f"{name}-ort-defaults.onnx", calibration[:32], spec.input_name)
    default_m = measure_variant(default_path, profile, "latency", fp32.measurement.threads, feeds_eval)
    metric = resolve_metric(spec.metric, None)
    default_drop = metric.drop(fp32.measurement.outputs, default_m.outputs, None)

    log(f"{name}: interleaved timing")
    paths = {"fp32": fp32.path, "chosen": report.plan.chosen.path, "ort_defaults": default_path}
    if fastest_within is not None:
        paths["fastest_within_1pt"] = fastest_within.path
    runtimes = {k: Runtime(p, profile=profile, threads=fp32.measurement.threads) for k, p in paths.items()}
    x = {spec.input_name: evaluation[:1]}
    probe = interleaved({"fp32": lambda: runtimes["fp32"].predict(x)}, rounds=1, calls=5, warmup=5)["fp32"][0]
    samples = interleaved({k: (lambda rt=rt: rt.predict(x)) for k, rt in runtimes.items()}, rounds=rounds,
                          calls=max(3, int(0.25 / probe)), warmup=5)
    for rt in runtimes.values():
        rt.close()

    def ratio(key: str) -> float:
        if paths[key] == paths["fp32"]:
            return 1.0  # the same file: FP32 was chosen
        return statistics.median(a / b for a, b in zip(samples[key], samples["fp32"]))

    return {
        "model": {"package": spec.package, "version": spec.version, "file": spec.member, "sha256": spec.sha256,
                  "input": {spec.input_name: list(spec.shape)}},
        "metric": report.metric, "metric_unit": report.metric_unit, "chosen": report.plan.chosen.name,
        "chosen_reason": report.plan.reason, "chosen_accuracy_drop": report.plan.chosen.accuracy_drop,
        "fastest_within_1pt": None if fastest_within is None else fastest_within.name,
        "fastest_within_1pt_drop": None if fastest_within is None else fastest_within.accuracy_drop,
        "convert_wall_s": round(convert_s, 1), "calibration": report.to_dict()["calibration"],
        "search": report.to_dict()["search"],
        "variants": {c.name: {"size_ratio": round(c.measurement.size_bytes / fp32.measurement.size_bytes, 4),
                              "latency_ratio_sequential": round(c.measurement.latency_p50_ms
                                                                / fp32.measurement.latency_p50_ms, 4),
                              "accuracy_drop": round(c.accuracy_drop, 4), "rejected": list(c.rejected)}
                     for c in report.plan.candidates},
        "ort_defaults": {"accuracy_drop": round(default_drop, 4),
                         "size_ratio": round(default_m.size_bytes / fp32.measurement.size_bytes, 4)},
        "interleaved_latency_ms": {k: summary(v) for k, v in samples.items()},
        "latency_ratio_vs_fp32": {k: round(ratio(k), 4) for k in paths if k != "fp32"},
    }


def run_digits(work: Path, config: QuantizationConfig, epochs: int) -> dict:
    """A CNN trained on scikit-learn's digits: accuracy against real labels, not agreement."""
    import torch

    from edgesdk.converters.onnx_model import export_torch
    from edgesdk.testing import digits_cnn, load_digits_data

    data = load_digits_data()
    log("digits_cnn: training")
    path = export_torch(digits_cnn(data, epochs=epochs), [torch.zeros(1, 1, 8, 8)], work / "digits_cnn.onnx",
                        output_names=["logits"], dynamic_batch=True)
    report = convert(ConversionRequest(
        Source(path), Target(load_profile(PROFILE)),
        Data({"input": data.x_train.reshape(-1, 1, 8, 8)[:512]}, {"input": data.x_test.reshape(-1, 1, 8, 8)},
             labels=data.y_test),
        Output(work / "digits-out"), quantization=config))
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32")
    return {"metric": report.metric, "chosen": report.plan.chosen.name,
            "fp32_accuracy": float(np.mean(fp32.measurement.outputs.argmax(1) == data.y_test) * 100),
            "variants": {c.name: {"accuracy_drop": round(c.accuracy_drop, 4), "rejected": list(c.rejected)}
                         for c in report.plan.candidates},
            "best_static_int8_drop": min(c.accuracy_drop for c in report.plan.candidates
                                         if c.precision == "int8_static")}


def convert_cli_rss(name: str, work: Path, n_cal: int, n_eval: int) -> dict:
    """Peak RSS (VmHWM of the edgesdk convert process itself) and wall time with n_cal samples in a .npy file."""
    spec = MODELS[name]
    source = fetch(name)
    folder = work / f"rss-{n_cal}"
    folder.mkdir()
    np.save(folder / "cal.npy", DATA[name](n_cal, 3))
    np.save(folder / "eval.npy", DATA[name](n_eval, 4))
    hwm = folder / "hwm"
    code = ("import atexit, sys; from edgesdk.memory import peak_rss_mb; "
            f"atexit.register(lambda: open({str(hwm)!r}, 'w').write(str(peak_rss_mb()))); "
            "from edgesdk.cli import main; sys.argv = ['edgesdk'] + sys.argv[1:]; main()")
    args = [sys.executable, "-c", code, "convert", str(source), "--profile", PROFILE, "--calibration",
            str(folder / "cal.npy"), "--eval", str(folder / "eval.npy"), "--out", str(folder / "out"), "--input-shape",
            f"{spec.input_name}={','.join(map(str, spec.shape))}", "--metric", "cosine", "--max-accuracy-drop",
            "0.001", "--json"]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"edgesdk convert failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"calibration_samples": n_cal, "peak_rss_mb": round(float(hwm.read_text()), 1), "wall_s": round(wall, 1),
            "calibrated_samples": report["calibration"]["samples"], "chosen": report["chosen"],
            "calibration_file_mb": round((folder / "cal.npy").stat().st_size / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model, few samples, no RSS runs (CI smoke)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    args = parser.parse_args()
    names = ["orientation"] if args.quick else [n.strip() for n in args.models.split(",") if n.strip()]
    config = QuantizationConfig(max_search_candidates=3) if args.quick else QuantizationConfig()
    results: dict = {}
    goals = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            n_cal, n_eval = (16, 24) if args.quick else (128, EVAL[name])
            r = results[name] = run_model(name, work, n_cal, n_eval, 3 if args.quick else 15, config)
            ours, default = r["latency_ratio_vs_fp32"]["chosen"], r["latency_ratio_vs_fp32"]["ort_defaults"]
            goals.append(goal(f"{name}: chosen variant latency / FP32 (interleaved)", "<= 1.0", ours, ours <= 1.0))
            goals.append(goal(f"{name}: chosen variant accuracy drop ({r['metric_unit']})", f"<= {BOUND}",
                              r["chosen_accuracy_drop"], r["chosen_accuracy_drop"] <= BOUND))
            if r["ort_defaults"]["accuracy_drop"] <= BOUND:
                goals.append(goal(f"{name}: ORT defaults meet the bound; ours / ORT defaults latency", "<= 1.0",
                                  ours / default, ours <= default))
                goals.append(goal(f"{name}: ORT defaults meet the bound; our drop minus theirs", "<= 0",
                                  r["chosen_accuracy_drop"] - r["ort_defaults"]["accuracy_drop"],
                                  r["chosen_accuracy_drop"] <= r["ort_defaults"]["accuracy_drop"]))
        digits = results["digits_cnn"] = run_digits(work, config, 5 if args.quick else 30)
        goals.append(goal("digits CNN: best static INT8 top-1 accuracy drop vs labels (points)", "<= 0.5",
                          digits["best_static_int8_drop"], digits["best_static_int8_drop"] <= 0.5))
        fast_and_accurate = [n for n, r in results.items() if n in MODELS
                             if r["fastest_within_1pt"] and r["latency_ratio_vs_fp32"]["fastest_within_1pt"] <= 0.75]
        goals.append(goal("models with a variant within 1 point of FP32 at <= 0.75x its latency (names in results)",
                          ">= 2 of 3", len(fast_and_accurate), len(fast_and_accurate) >= 2))
        results["fast_and_accurate_models"] = fast_and_accurate
        if not args.quick:
            log("ocr_rec: edgesdk convert with 32 and 512 calibration samples")
            small, large = convert_cli_rss("ocr_rec", work, 32, 32), convert_cli_rss("ocr_rec", work, 512, 32)
            results["memory"] = {"model": "ocr_rec (10.9 MB)", "32": small, "512": large}
            growth = large["peak_rss_mb"] / small["peak_rss_mb"]
            goals.append(goal("ocr_rec: convert peak RSS 512 / 32 calibration samples", "<= 1.2", growth, growth <= 1.2))
            goals.append(goal("ocr_rec: convert peak RSS at 512 samples (MB)", "<= 2048", large["peak_rss_mb"],
                              large["peak_rss_mb"] <= 2048))
            wall = results["ocr_rec"]["convert_wall_s"] if "ocr_rec" in results else float("nan")
            goals.append(goal("ocr_rec: convert wall time, 128 samples, ONNX only (s)", "<= 300", wall, wall <= 300))
    emit("quantization", {"profile": PROFILE, "mode": "latency", "quick": args.quick, "bound_points": BOUND,
                          "models": names}, results, goals)


if __name__ == "__main__":
    main()
