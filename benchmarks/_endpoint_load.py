"""Closed-loop KServe V2 HTTP load from client processes pinned to one CPU (for benchmarks/endpoint.py).

Each client is a process of its own (no GIL shared between clients) holding one keep-alive
``http.client`` connection. The request body is encoded once, before the window, by
tritonclient's ``InferenceServerClient.generate_request_body`` (JSON or binary tensors, exactly
what ``tritonclient.http`` would send), and every response is decoded by tritonclient's
``parse_response_body`` and its output read with ``as_numpy``. Encoding a 1x3x224x224 tensor
as JSON costs the client more than the server's decode; doing it per request would let the
client CPU, not the server, set every server's pace alike.

The window opens for all clients at once, after each has sent a warm-up request; a client stops
at the window's end or after its share of ``max_requests`` (answered or failed). Figures:
completed requests per second, latency percentiles over all clients, failures with their first
messages, the clients' CPU per second of window (near 1.0 on one CPU: the clients set the pace)
and the server's.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Request", "encode_request", "closed_loop", "percentiles", "tree_cpu_s"]


@dataclass(frozen=True)
class Request:
    """One pre-encoded infer request: where it goes, its body and headers, the output to read back."""

    host: str
    port: int
    path: str
    body: bytes
    headers: dict[str, str]
    output: str


def encode_request(url: str, model: str, input_name: str, x: np.ndarray, output: str, binary: bool) -> Request:
    """The request tritonclient.http would send for ``x`` (outputs asked back binary or JSON like the inputs)."""
    import tritonclient.http as triton

    tensor = triton.InferInput(input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=[triton.InferRequestedOutput(output, binary_data=binary)])
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    host, _, port = url.removeprefix("http://").partition(":")
    return Request(host, int(port), f"/v2/models/{model}/infer", body, headers, output)


def _call(connection: http.client.HTTPConnection, request: Request) -> np.ndarray:
    import tritonclient.http as triton

    connection.request("POST", request.path, request.body, request.headers)
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
    length = response.getheader("Inference-Header-Content-Length")
    result = triton.InferenceServerClient.parse_response_body(body, header_length=None if length is None else int(length))
    return result.as_numpy(request.output)


def _client(request: Request, cpu: int | None, ready: Any, go: Any, start_at: Any, seconds: float, limit: int,
            results: Any) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    latencies: list[float] = []
    errors: list[str] = []
    failed = 0
    connection = http.client.HTTPConnection(request.host, request.port, timeout=60)
    try:
        _call(connection, request)  # warm-up: connection open, first response decoded
    except Exception as exc:
        errors.append(f"warm-up: {type(exc).__name__}: {exc}"[:300])
    ready.wait()
    go.wait()
    stop = start_at.value + seconds
    cpu_before = time.process_time()
    while time.monotonic() < stop and len(latencies) + failed < limit:
        started = time.perf_counter()
        try:
            _call(connection, request)
            latencies.append(time.perf_counter() - started)
        except Exception as exc:  # counted; the figure is completed requests
            failed += 1
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            connection.close()
            connection = http.client.HTTPConnection(request.host, request.port, timeout=60)
    results.put((latencies, failed, errors[:3], time.process_time() - cpu_before, time.monotonic()))


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of latencies in seconds, as milliseconds."""
    values = np.asarray(seconds) * 1e3
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children so far (0.0 if it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        total = 0.0
        for process in [root, *root.children(recursive=True)]:
            times = process.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0


def closed_loop(request: Request, clients: int, seconds: float, max_requests: int, client_cpu: int | None,
                server_pid: int | None = None) -> dict[str, Any]:
    """``clients`` processes (pinned to ``client_cpu``) sending ``request`` back to back for ``seconds``."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Barrier(clients + 1), context.Event()
    start_at = context.Value("d", 0.0)
    results = context.Queue()
    processes = [context.Process(target=_client, args=(request, client_cpu, ready, go, start_at, seconds,
                                                       max(1, max_requests // clients), results), daemon=True)
                 for _ in range(clients)]
    for process in processes:
        process.start()
    ready.wait(120)
    server_before = tree_cpu_s(server_pid) if server_pid else 0.0
    start_at.value = time.monotonic()
    go.set()
    gathered = [results.get(timeout=seconds + 120) for _ in processes]
    elapsed = max(g[4] for g in gathered) - start_at.value  # to the last client's last answer
    server_cpu = (tree_cpu_s(server_pid) - server_before) if server_pid else None
    for process in processes:
        process.join(30)
    latencies = [t for g in gathered for t in g[0]]
    completed = len(latencies)
    return {"clients": clients, "requests": completed, "failed": sum(g[1] for g in gathered),
            "seconds": elapsed, "throughput_rps": completed / elapsed,
            "latency_ms": percentiles(latencies) if latencies else None,
            "client_cpu_per_s": round(sum(g[3] for g in gathered) / elapsed, 3),
            "server_cpu_per_s": None if server_cpu is None else round(server_cpu / elapsed, 3),
            "server_cpu_ms_per_request": None if server_cpu is None or not completed else 1e3 * server_cpu / completed,
            "errors": sorted({e for g in gathered for e in g[2]})[:3]}
