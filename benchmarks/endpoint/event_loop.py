"""The endpoint's event loop under requests that used to stall it: does health still answer within 5
ms?

``edgesdk server inference`` runs in a subprocess pinned to one CPU (``--threads 1``); this process,
pinned to another, polls ``GET /v2/health/live`` on a keep-alive connection while one heavy request
is in flight and times every answer that came back before the request ended. Absolute milliseconds
on a shared 2-core host: the goals are the issue's (p99 <= 5 ms), the figures are distorted by
whatever else runs here. So each case also gives, from the same run, health with nothing in flight
(the host's own p99) and the CPU the server's loop thread accrued during each health answer
(``/proc/PID/task/TID/schedstat``: what the loop spent running rather than waiting for a CPU; the
kernel updates it at switches and ticks, so a sample can hold up to a tick of CPU from before the
request: an upper bound, not a timer).

1. A long request (issue 39; also run by benchmarks/endpoint/offload.py, whose names it keeps):
   a model whose cost grows with the square of its sequence length
   (``edgesdk.testing.write_attention_onnx``, width 256, unbatched) first sees short requests
   (length 16, the kind it may run on its loop), then requests of length 4,096 (binary tensors,
   about 65,000 times the work), sent by tritonclient from a thread of this process.
2. A 10^6-float JSON answer: ``y = x^T x`` of a ``[1, 1000]`` input, asked for as JSON (the V2
   default). Before issue 61 it was one ``json.dumps`` on the loop (about 1 s here); now it is
   written in slices that yield to the loop (ota_server/inference/json_encode.py). This and the
   next request are sent by another process (reading 11 MB or sending 32 MiB from a thread here
   would hold the poller's GIL), which reads the answer without parsing it.
3. A 32 MiB JSON request: the sum of a ``[1, L]`` input sent as JSON numbers. Before, it was parsed
   in a thread holding the GIL for the whole parse; now in a niced worker process
   (ota_server/inference/json_worker.py).
4. 500 concurrent slow uploads: 500 connections each announce a 1 MiB JSON body and trickle 1 KiB
   per socket every 100 ms. Measured: the server's RSS (``/proc/PID/status`` VmRSS, sampled every 50
   ms) over its RSS before, against the bound the transport limits state: ``min(max_buffered_bytes,
   max_concurrent_requests x 1 MiB)`` of bodies plus 64 KiB per connection (socket and protocol
   buffers); how many uploads were refused (503) or held; and every health answer during the trickle
   (all must be 200).

    python benchmarks/endpoint/event_loop.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.endpoint.event_loop_health import (  # noqa: E402
    LoopCpu,
    PostingProcess,
    health_beside,
    health_during,
    post,
)
from benchmarks.endpoint.event_loop_uploads import (  # noqa: E402
    TRICKLE_BYTES,
    TRICKLE_S,
    UPLOAD_BYTES,
    UPLOADS,
    run_slow_uploads,
)
from benchmarks.endpoint.offload_load import Cloud, pin_two_cpus  # noqa: E402
from benchmarks.shared.common import emit, goal, log, summary  # noqa: E402
from edgesdk.ota_server.repository import ModelRepository  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.testing import write_attention_onnx  # noqa: E402

WIDTH = 256
SHORT, LONG = 16, 4096
SIDE = 1000  # x^T x of a [1, SIDE] input: SIDE**2 = 10^6 floats
BODY_BYTES = 32 * 1024 * 1024


def _tokens(length: int) -> np.ndarray:
    return np.random.default_rng(length).standard_normal((1, length, WIDTH)).astype(np.float32)


def _infer(url: str, x: np.ndarray) -> float:
    """One binary-tensor request through tritonclient; its seconds."""
    import tritonclient.http as triton

    with triton.InferenceServerClient(
        url.removeprefix("http://"), connection_timeout=120, network_timeout=120
    ) as client:
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
    bundle = bundle_from_model(work / "attention-bundle", model, spec, {"tokens": _tokens(SHORT)})
    repo.add(bundle.path)
    config = work / "attention.json"
    config.write_text(json.dumps({"models": [{"name": "attention", "batching": False}]}))
    server = Cloud(repo.root, config, cpu, work / "attention.log").start()
    try:
        for _ in range(20):
            _infer(server.url, _tokens(SHORT))
        assert server.process is not None
        measured = health_during(server.port, lambda: _infer(server.url, _tokens(LONG)),
                                 2 if quick else 5, LoopCpu(server.process.pid, server.port))
    finally:
        server.stop()
    health = measured.pop("health_ms")
    return {
        "model": f"tokens[1, L, {WIDTH}] -> (tokens @ tokens^T).sum(-1)",
        "short_length": SHORT,
        "long_length": LONG,
        "long_request_ms": summary(measured.pop("heavy_s")),
        "health_answers": health.get("answers", 0),
        "health_during_long_ms": {k: health[k] for k in ("p50", "p99", "max") if k in health},
        **measured,
    }


def _onnx(
    path: Path, nodes: list[Any], x_shape: list[Any], y_shape: list[Any], axis: Any = None
) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [axis] if axis is not None else [],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def json_server(work: Path, cpu: int) -> Cloud:
    """The endpoint serving ``outer`` (x^T x, a 10^6-float answer) and ``total`` (the sum of any
    length)."""
    from onnx import TensorProto, helper

    repo = ModelRepository(work / "json-repo", allow_unsigned=True)
    outer = _onnx(
        work / "outer.onnx",
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            helper.make_node("MatMul", ["xt", "x"], ["y"]),
        ],
        [1, SIDE],
        [SIDE, SIDE],
    )
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [-1])
    total = _onnx(
        work / "total.onnx",
        [helper.make_node("ReduceSum", ["x", "axis"], ["y"], keepdims=0)],
        [1, "length"],
        [1],
        axis,
    )
    for name, path, x in (
        ("outer", outer, np.ones((1, SIDE), np.float32)),
        ("total", total, np.ones((1, 8), np.float32)),
    ):
        spec = BundleSpec(name, "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
        repo.add(bundle_from_model(work / f"{name}-bundle", path, spec, {"x": x}).path)
    config = work / "json.json"
    config.write_text(
        json.dumps(
            {"models": [{"name": "outer", "batching": False}, {"name": "total", "batching": False}]}
        )
    )
    return Cloud(repo.root, config, cpu, work / "json.log").start()


def _json_request(x: np.ndarray) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }
    ).encode()


def run_big_answer(
    server: Cloud, client: PostingProcess, work: Path, rounds: int
) -> dict[str, Any]:
    """Health while a 10^6-float JSON answer is written (its values checked once, before timing),
    and, interleaved, while the same answer is sent as binary data (the floor: a big answer in
    flight with nothing to write)."""
    x = np.linspace(-1, 1, SIDE, dtype=np.float32)[None]
    body, path = _json_request(x), "/v2/models/outer/infer"
    answer = post(server.port, path, body)
    y = np.array(json.loads(answer)["outputs"][0]["data"], np.float32).reshape(SIDE, SIDE)
    np.testing.assert_allclose(y, x.T @ x, rtol=1e-6)
    files = {"json": work / "outer-request.json", "binary": work / "outer-binary.json"}
    files["json"].write_bytes(body)
    request = json.loads(body)
    request["parameters"] = {"binary_data_output": True}
    files["binary"].write_bytes(json.dumps(request).encode())
    assert server.process is not None
    measured = health_beside(
        server.port, {name: (lambda f=f: client.post(server.port, path, f))
                      for name, f in files.items()},
        rounds, LoopCpu(server.process.pid, server.port))
    out: dict[str, Any] = {"answer_bytes": len(answer), "values": SIDE * SIDE,
                           "request_ms": summary(measured["json"].pop("heavy_s"))}
    out.update({k: v for k, v in measured["json"].items()})
    out["health_idle_ms"] = measured["idle"]["health_ms"]
    out["loop_cpu_per_health_idle_ms"] = measured["idle"]["loop_cpu_per_health_ms"]
    binary = measured["binary"]
    out["binary_answer"] = {"request_ms": summary(binary.pop("heavy_s")), **binary}
    return out


def run_big_body(server: Cloud, client: PostingProcess, work: Path, rounds: int) -> dict[str, Any]:
    """Health while a 32 MiB JSON request is received, parsed and run (its answer checked once)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, BODY_BYTES // 20)).astype(np.float32)
    body = _json_request(x)
    x = x[:, : int(x.shape[1] * BODY_BYTES / len(body))]
    body = _json_request(x)
    path = "/v2/models/total/infer"
    answer = json.loads(post(server.port, path, body))["outputs"][0]["data"][0]
    if not np.isclose(answer, float(x.astype(np.float64).sum()), rtol=1e-3, atol=1e-1):
        raise RuntimeError(f"the sum came back as {answer}, not {x.sum()}")
    body_file = work / "total-request.json"
    body_file.write_bytes(body)
    assert server.process is not None
    measured = health_during(server.port, lambda: client.post(server.port, path, body_file),
                             rounds, LoopCpu(server.process.pid, server.port))
    heavy = measured.pop("heavy_s")
    return {"body_mib": len(body) / 2**20, "values": int(x.size), "request_ms": summary(heavy),
            **measured}


def goals_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals: health p99 <= 5 ms in each case; RSS within the stated bound, health
    answering."""
    out = []
    cases = [
        ("long_request", "while a request of length 4096 runs (model cost ~ length^2)"),
        ("big_answer", "while a 10^6-float JSON answer is written"),
        ("big_body", "while a 32 MiB JSON request is parsed"),
    ]
    for key, what in cases:
        if key == "long_request":
            p99 = results[key]["health_during_long_ms"]["p99"]
        else:
            p99 = results[key]["health_ms"].get(
                "p99", float("inf")
            )  # no answer: no evidence, not met
        idle = results[key]["health_idle_ms"].get("p99", float("nan"))
        if key == "big_answer":
            floor = results[key]["binary_answer"]
            binary = floor["health_ms"].get("p99", float("nan"))
            what += (f" (the same answer as binary data: {binary:.2f} ms over "
                     f"{floor['health_ms']['answers']} answers, the request "
                     f"{floor['request_ms']['median']:.1f} ms)")
        cpu = results[key].get("loop_cpu_per_health_ms", {}).get("p99", float("nan"))
        out.append(goal(f"event loop: health p99 ms {what} (same run: {idle:.2f} ms with nothing "
                        f"in flight; the loop thread's CPU per health answer p99 {cpu:.2f} ms)",
                        "<= 5", p99, p99 <= 5.0))
    uploads = results["slow_uploads"]
    growth, bound = uploads["rss_growth_mib"], uploads["stated_bound_mib"]
    out.append(
        goal(
            f"{UPLOADS} concurrent slow uploads: server RSS growth MiB vs the stated bound "
            f"({bound:.1f} MiB)",
            f"<= {bound:.1f}",
            growth,
            growth <= bound,
        )
    )
    answers = uploads["health_ms"]["answers"]
    out.append(
        goal(
            f"{UPLOADS} concurrent slow uploads: health answered 200 (answers; p99 "
            f"{uploads['health_ms'].get('p99', float('nan')):.2f} ms)",
            "> 0, all 200",
            answers,
            answers > 0,
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds, shorter trickle (CI smoke run)"
    )
    args = parser.parse_args()
    client_cpu, server_cpu = pin_two_cpus("client", "server")
    rounds, seconds = (3, 5.0) if args.quick else (10, 30.0)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="event-loop-") as tmp:
        work = Path(tmp)
        server, client = json_server(work, server_cpu), PostingProcess()
        try:
            log(f"{UPLOADS} slow uploads for {seconds:.0f} s")
            results["slow_uploads"] = run_slow_uploads(server, seconds)
            log("10^6-float JSON answers")
            results["big_answer"] = run_big_answer(server, client, work, rounds)
            log("32 MiB JSON requests")
            results["big_body"] = run_big_body(server, client, work, rounds)
        finally:
            client.close()
            server.stop()
        log("long requests")
        results["long_request"] = run_event_loop(work, server_cpu, args.quick)
    params = {
        "quick": args.quick,
        "rounds": rounds,
        "client_cpu": client_cpu,
        "server_cpu": server_cpu,
        "uploads": UPLOADS,
        "upload_bytes": UPLOAD_BYTES,
        "trickle": f"{TRICKLE_BYTES} B / {TRICKLE_S} s",
        "trickle_s": seconds,
    }
    emit("endpoint_event_loop", params, results, goals_of(results))


if __name__ == "__main__":
    main()
