"""Is an instruction count a fair stand-in for time? Checked on this host, where both can be measured.

For every variant of a model: instructions per inference under ``qemu-x86_64 -cpu Haswell``
(the method the converter applies to Arm cores, here applied to this host's ISA) and real
single-thread latency on this CPU, interleaved in one process. Each (model, variant) pair
gives a predicted and a measured ratio to FP32; the error is predicted / measured - 1.

Two forms of the prediction are reported:

* ``plain``: the ratio of total instruction counts (what the converter uses);
* ``classes``: time as a weighted sum of vector/FP, load/store and other instructions, the
  weights fitted by non-negative least squares on the *other* models' variants (leave one
  model out), so no pair is predicted by weights fitted on itself.

A known limit, measured rather than assumed: qemu's TCG has no AVX-512, so the emulated
core runs ONNX Runtime's AVX2 kernels while this CPU (when it has AVX-512/VNNI) runs its
AVX-512 ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from benchmarks.shared.common import interleaved, log
from edgesdk.converters.board.emulate import Emulator, InstructionCount

__all__ = ["proxy_pairs", "fit_errors"]


def _session(path: Path):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def proxy_pairs(model: str, variants: Mapping[str, Path], inputs: Mapping[str, np.ndarray], emulator: Emulator,
                rounds: int = 5) -> list[dict]:
    """One row per variant of ``model`` (FP32 named ``onnx-fp32``): counts, measured ms, ratios to FP32."""
    counts: dict[str, InstructionCount] = {}
    for name, path in variants.items():
        log(f"  {model}/{name}: counting on emulated haswell")
        counts[name] = emulator.count(path, inputs, "haswell")
    runners = {}
    for name, path in variants.items():
        if path.suffix == ".onnx":
            session = _session(path)
            runners[name] = (lambda s=session: s.run(None, dict(inputs)))
        else:  # TFLite, through edgesdk's Runtime (NHWC inputs for onnx2tf's models)
            from edgesdk import Runtime
            from edgesdk.runtime.tensors import adapt_layout

            runtime = Runtime(path, threads=1)
            feed = adapt_layout(dict(inputs), runtime.inputs)
            runners[name] = (lambda r=runtime, f=feed: r.predict(f))
    probe = interleaved({"fp32": runners["onnx-fp32"]}, rounds=1, calls=3, warmup=3)["fp32"][0]
    log(f"  {model}: timing {len(runners)} variants interleaved, {rounds} rounds")
    samples = interleaved(runners, rounds=rounds, calls=max(3, int(0.3 / probe)), warmup=5)
    fp32 = counts["onnx-fp32"]
    rows = []
    for name in variants:
        measured = statistics.median(a / b for a, b in zip(samples[name], samples["onnx-fp32"]))
        c = counts[name]
        rows.append({"model": model, "variant": name, "instructions": c.instructions, "simd": c.simd,
                     "memory": c.memory, "measured_ms": statistics.median(samples[name]) * 1e3,
                     "measured_ratio": measured, "plain_ratio": c.instructions / fp32.instructions,
                     "count_seconds": round(c.seconds, 1), "count_cached": c.cached})
    return rows


def _features(row: Mapping[str, float]) -> np.ndarray:
    simd, memory = row["simd"], row["memory"]
    return np.array([simd, memory, max(row["instructions"] - simd - memory, 0.0)])


def fit_errors(rows: list[dict]) -> dict:
    """Plain and class-weighted (leave-one-model-out) errors for every non-FP32 row; adds them to ``rows``."""
    from scipy.optimize import nnls

    models = sorted({r["model"] for r in rows})
    fp32 = {r["model"]: r for r in rows if r["variant"] == "onnx-fp32"}
    for held in models:
        train = [r for r in rows if r["model"] != held]
        weights = None
        if train:
            a = np.stack([_features(r) for r in train])
            b = np.array([r["measured_ms"] for r in train])
            weights, _ = nnls(a, b)
        for r in (r for r in rows if r["model"] == held):
            r["plain_error"] = r["plain_ratio"] / r["measured_ratio"] - 1
            if weights is not None and float(_features(fp32[held]) @ weights) > 0:
                r["classes_ratio"] = float(_features(r) @ weights) / float(_features(fp32[held]) @ weights)
                r["classes_error"] = r["classes_ratio"] / r["measured_ratio"] - 1
    judged = [r for r in rows if r["variant"] != "onnx-fp32"]

    def share_within(key: str) -> float | None:
        errors = [r[key] for r in judged if key in r]
        return None if not errors else sum(abs(e) <= 0.20 for e in errors) / len(errors)

    return {"pairs": len(judged), "plain_within_20pct": share_within("plain_error"),
            "classes_within_20pct": share_within("classes_error")}
