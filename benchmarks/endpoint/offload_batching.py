"""The batching figures of benchmarks/endpoint/offload.py: a model whose compute batches, with dynamic batching on and off.

Batching pays only where one ONNX Runtime call on N rows costs less than N calls on one.
:func:`batch_gains` measures that in plain onnxruntime (one thread, the endpoint's CPU) for
each real model the benchmarks know, and :func:`pick` takes the one that gains most. Its
repository serves it twice: ``batched`` (dynamic batching with the adaptive queue delay) and
``unbatched``. Then, with tritonclient binary requests:

- 8 clients, closed loop: throughput batched / unbatched per round, and the batch-size
  histogram from the endpoint's ``/metrics``;
- 1 client: per-request latency, p50 batched / unbatched (batching must cost nothing here).

Rounds alternate which of the two runs first.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.endpoint.offload_load import Cloud, triton_infer, triton_throughput
from benchmarks.shared import models
from benchmarks.shared.common import log
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model

__all__ = ["CANDIDATES", "batch_gains", "pick", "run_batching"]

#: Real pretrained models (benchmarks/shared/models.py) with one input and a dynamic batch dim.
CANDIDATES = ("orientation", "ocr_cls", "ocr_rec", "detector", "speaker")
BATCH = 8


def io_names(name: str) -> tuple[str, str]:
    """The model's input name and first output name."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(models.fetch(name)), providers=["CPUExecutionProvider"])
    return session.get_inputs()[0].name, session.get_outputs()[0].name


def batch_gains(samples: dict[str, np.ndarray], rounds: int) -> dict[str, dict[str, float]]:
    """Per model: plain ORT ms per sample at batch 1 and at :data:`BATCH` (one thread), and their ratio."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    gains = {}
    for name in CANDIDATES:
        input_name = io_names(name)[0]
        session = ort.InferenceSession(str(models.fetch(name)), options, providers=["CPUExecutionProvider"])
        one, many = samples[name][:1], samples[name][:BATCH]
        per_sample: dict[int, list[float]] = {1: [], BATCH: []}
        for x in (one, many):
            session.run(None, {input_name: x})
        for r in range(rounds):
            for x in ((one, many) if r % 2 == 0 else (many, one)):
                started = time.perf_counter()
                for _ in range(max(1, BATCH // len(x))):
                    session.run(None, {input_name: x})
                per_sample[len(x)].append((time.perf_counter() - started) / BATCH)
        ms1, msb = statistics.median(per_sample[1]) * 1e3, statistics.median(per_sample[BATCH]) * 1e3
        gains[name] = {"ms_per_sample_batch_1": ms1, f"ms_per_sample_batch_{BATCH}": msb, "compute_gain": ms1 / msb}
        log(f"  {name}: {ms1:.2f} ms/sample alone, {msb:.2f} in batches of {BATCH} ({ms1 / msb:.2f}x)")
    return gains


def pick(gains: dict[str, dict[str, float]]) -> str:
    """The model whose compute gains most from batching."""
    return max(gains, key=lambda name: gains[name]["compute_gain"])


def _repository(root: Path, name: str, sample: np.ndarray) -> tuple[ModelRepository, Path]:
    input_name = io_names(name)[0]
    repo = ModelRepository(root / "batching-repo", allow_unsigned=True)
    for served in ("batched", "unbatched"):
        spec = BundleSpec(served, "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
        repo.add(bundle_from_model(root / "batching-bundles" / served, models.fetch(name), spec,
                                   {input_name: sample}).path)
    config = root / "batching.json"
    config.write_text(json.dumps({"models": [
        {"name": "batched", "preferred_batch_size": BATCH, "max_queue_delay_us": 2000},
        {"name": "unbatched", "batching": False}]}))
    return repo, config


def batch_histogram(url: str, model: str) -> dict[str, float]:
    """Cumulative ``edgesdk_inference_batch_size`` bucket counts of ``model`` from ``/metrics`` (le -> count)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "edgesdk_inference_batch_size":
            return {s.labels["le"]: s.value for s in family.samples
                    if s.name.endswith("_bucket") and s.labels.get("model") == model}
    return {}


def _histogram_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Calls per batch-size bucket between two cumulative snapshots (``"<=8": n``), empty buckets left out."""
    def key(le: str) -> float:
        return float("inf") if le == "+Inf" else float(le)

    out, previous = {}, 0.0
    for le in sorted(after, key=key):
        cumulative = after[le] - before.get(le, 0.0)
        if cumulative - previous:
            out[f"<={le}"] = int(cumulative - previous)
        previous = cumulative
    return out


def _latencies(call: Any, x: np.ndarray, count: int) -> list[float]:
    out = []
    for _ in range(count):
        started = time.perf_counter()
        call(x, True)
        out.append(time.perf_counter() - started)
    return out


def run_batching(work: Path, cpu: int, quick: bool, clients: int, seconds: float) -> dict[str, Any]:
    """Pick the model, serve it on ``cpu``, and measure batching on vs off (see the module doc)."""
    rounds = 1 if quick else 3
    samples = {name: np.ascontiguousarray(models.DATA[name](BATCH, 0)) for name in CANDIDATES}
    log("batching: what ONNX Runtime gains per sample in batches, per model")
    gains = batch_gains(samples, 2 if quick else 5)
    name = pick(gains)
    input_name, output = io_names(name)
    log(f"batching: {name} gains most ({gains[name]['compute_gain']:.2f}x); serving it batched and unbatched")
    repo, config = _repository(work, name, samples[name][:1])
    cloud = Cloud(repo.root, config, cpu, work / "batching.log").start()
    try:
        x = samples[name][:1]
        for served in ("batched", "unbatched"):
            triton_infer(cloud.url, served, output, input_name)(x, True)
        crowd: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
        histogram_before = batch_histogram(cloud.url, "batched")
        for r in range(rounds):
            order = [("on", "batched"), ("off", "unbatched")]
            for mode, served in order if r % 2 == 0 else order[::-1]:
                figures = triton_throughput(cloud.url, served, output, x, clients, seconds, 50_000, input_name)
                crowd[mode].append(figures)
                log(f"  {clients} clients, batching {mode}: {figures['throughput_rps']:.1f} req/s "
                    f"({figures['failed']} failed)")
        histogram = _histogram_delta(histogram_before, batch_histogram(cloud.url, "batched"))
        calls = {"on": triton_infer(cloud.url, "batched", output, input_name),
                 "off": triton_infer(cloud.url, "unbatched", output, input_name)}
        alone: dict[str, list[float]] = {"on": [], "off": []}
        p50_ratios = []
        for r in range(rounds + 2):
            per_round = {}
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                per_round[mode] = _latencies(calls[mode], x, 40 if quick else 150)
                alone[mode] += per_round[mode]
            p50_ratios.append(statistics.median(per_round["on"]) / statistics.median(per_round["off"]))
    finally:
        cloud.stop()
    gain_per_round = [a["throughput_rps"] / b["throughput_rps"] for a, b in zip(crowd["on"], crowd["off"])]
    return {"model": name, "input": input_name, "candidates": gains, "preferred_batch_size": BATCH,
            "max_queue_delay_us": 2000, "adaptive_queue_delay": True, "clients": clients, "crowd": crowd,
            "gain_per_round": gain_per_round, "gain": statistics.median(gain_per_round),
            "batch_size_histogram_calls": histogram,
            "one_client": {mode: {"p50_ms": statistics.median(v) * 1e3, "p99_ms": float(np.percentile(v, 99)) * 1e3,
                                  "requests": len(v)} for mode, v in alone.items()},
            "one_client_p50_ratio_per_round": p50_ratios,
            "one_client_p50_ratio": statistics.median(p50_ratios)}
