"""Runtime.predict against the raw backend call, on the same model in one process.

For each backend (onnxruntime, LiteRT) and two models (a tiny one, where the per-call
overhead is measurable in microseconds, and one of >= 1 ms per call, where the ratio
matters) it times ``Runtime.predict`` and the raw library call interleaved, with the
same thread count, and prints one JSON object.

    python benchmarks/runtime/runtime_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.shared.common import emit, goal, interleaved, log, summary  # noqa: E402
from edgesdk import Runtime, detect_device  # noqa: E402
from edgesdk.runtime.backends.litert import import_litert  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx, write_mlp_tflite  # noqa: E402

MODELS = {"tiny": [64, 64, 10], "large": [1024, 4096, 4096, 1024, 10]}


def raw_onnxruntime(path: Path, threads: int, x: np.ndarray):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feeds)[0]


def raw_litert(path: Path, threads: int, x: np.ndarray):
    interpreter = import_litert().interpreter(model_path=str(path), num_threads=threads)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0]["index"], interpreter.get_output_details()[0]["index"]

    def run():
        interpreter.set_tensor(inp, x)
        interpreter.invoke()
        return interpreter.get_tensor(out)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI smoke run)")
    args = parser.parse_args()
    rounds, budget_s = (5, 0.05) if args.quick else (21, 0.25)
    profile = detect_device()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_name, widths in MODELS.items():
            weights = random_mlp(widths)
            x = np.random.default_rng(0).standard_normal((1, widths[0])).astype(np.float32)
            paths = {"onnxruntime": write_mlp_onnx(weights, Path(tmp) / f"{model_name}.onnx"),
                     "litert": write_mlp_tflite(weights, Path(tmp) / f"{model_name}.tflite")}
            for backend, path in paths.items():
                rt = Runtime(path, profile=profile, mode="latency")
                raw = (raw_onnxruntime if backend == "onnxruntime" else raw_litert)(path, rt.info.threads, x)
                ours = lambda rt=rt, x=x: rt.predict(x)  # noqa: E731
                np.testing.assert_allclose(ours(), raw(), rtol=1e-4, atol=1e-6)
                probe = interleaved({"raw": raw}, rounds=1, calls=20, warmup=5)["raw"][0]
                calls = max(10, int(budget_s / max(probe, 1e-6)))
                log(f"{model_name}/{backend}: {probe * 1e3:.3f} ms per call, {rounds} rounds x {calls} calls")
                samples = interleaved({"edgesdk": ours, "raw": raw}, rounds=rounds, calls=calls)
                ratios = [a / b for a, b in zip(samples["edgesdk"], samples["raw"])]
                added_us = [(a - b) * 1e6 for a, b in zip(samples["edgesdk"], samples["raw"])]
                results[f"{model_name}/{backend}"] = {
                    "raw_ms": summary(samples["raw"]),
                    "edgesdk_ms": summary(samples["edgesdk"]),
                    "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
                    "added_us": {"min": min(added_us), "median": statistics.median(added_us), "max": max(added_us)},
                    "threads": rt.info.threads,
                    "accelerator": rt.info.accelerator,
                    "calls_per_round": calls,
                }
                rt.close()
    goals = []
    for backend in ("onnxruntime", "litert"):
        large, tiny = results[f"large/{backend}"], results[f"tiny/{backend}"]
        goals.append(goal(f"{backend}: predict / raw, median, model of {large['raw_ms']['median']:.2f} ms",
                          "<= 1.03", large["ratio"]["median"],
                          large["ratio"]["median"] <= 1.03 and large["raw_ms"]["median"] >= 1.0))
        goals.append(goal(f"{backend}: added per call, median (tiny model)", "<= 30 us",
                          tiny["added_us"]["median"], tiny["added_us"]["median"] <= 30))
    emit("runtime_overhead", {"rounds": rounds, "round_budget_s": budget_s, "profile": profile.name,
                              "mode": "latency", "models": MODELS, "batch": 1}, results, goals)


if __name__ == "__main__":
    main()
