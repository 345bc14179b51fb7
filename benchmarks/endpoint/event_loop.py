"""The endpoint's event loop while a long request runs: does health still answer within 5 ms? (issue 39)

A model whose cost grows with the square of its sequence length (``edgesdk.testing.write_attention_onnx``,
width 256) is served unbatched by ``edgesdk server inference`` in a subprocess pinned to one CPU.
The endpoint first sees short requests (length 16, microseconds: the kind it may run on its loop),
then a request of length 4,096 (binary tensors, about 65,000 times the work). While each long
request is in flight, this process polls ``GET /v2/health/live`` on a keep-alive connection and
times every answer. Before issue 39 the long request ran on the loop (one row, and rows had been
cheap) and health waited for all of it.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.endpoint.offload_load import Cloud
from benchmarks.shared.common import summary
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import write_attention_onnx

WIDTH = 256
SHORT, LONG = 16, 4096


def _tokens(length: int) -> np.ndarray:
    return np.random.default_rng(length).standard_normal((1, length, WIDTH)).astype(np.float32)


def _infer(url: str, x: np.ndarray) -> float:
    """One binary-tensor request through tritonclient; its seconds."""
    import tritonclient.http as triton

    with triton.InferenceServerClient(url.removeprefix("http://"), connection_timeout=120, network_timeout=120) as client:
        tensor = triton.InferInput("tokens", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        started = time.perf_counter()
        client.infer("attention", [tensor])
        return time.perf_counter() - started


def run_event_loop(work: Path, cpu: int, quick: bool) -> dict[str, Any]:
    """Health latency (ms) while long requests run, and the long requests' own time."""
    model = write_attention_onnx(work / "attention.onnx", width=WIDTH)
    repo = ModelRepository(work / "attention-repo", allow_unsigned=True)
    spec = BundleSpec("attention", "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
    repo.add(bundle_from_model(work / "attention-bundle", model, spec, {"tokens": _tokens(SHORT)}).path)
    config = work / "attention.json"
    config.write_text(json.dumps({"models": [{"name": "attention", "batching": False}]}))
    server = Cloud(repo.root, config, cpu, work / "attention.log").start()
    health: list[float] = []
    long_s: list[float] = []
    try:
        for _ in range(20):
            _infer(server.url, _tokens(SHORT))
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for _ in range(2 if quick else 5):
            done = threading.Event()

            def long_request(done: threading.Event = done) -> None:
                long_s.append(_infer(server.url, _tokens(LONG)))
                done.set()

            runner = threading.Thread(target=long_request)
            runner.start()
            while not done.is_set():
                started = time.perf_counter()
                connection.request("GET", "/v2/health/live")
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"health answered {response.status}")
                if not done.is_set():
                    health.append(time.perf_counter() - started)
            runner.join()
        connection.close()
    finally:
        server.stop()
    return {"model": f"tokens[1, L, {WIDTH}] -> (tokens @ tokens^T).sum(-1)", "short_length": SHORT,
            "long_length": LONG, "long_request_ms": summary(long_s), "health_answers": len(health),
            "health_during_long_ms": {"p50": statistics.median(health) * 1e3,
                                      "p99": float(np.percentile(health, 99)) * 1e3, "max": max(health) * 1e3}}
