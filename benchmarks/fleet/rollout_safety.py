"""Rollout safety benchmark (issue 37): canary analysis on the devices' own figures, and releases for mixed boards.

    python benchmarks/fleet/rollout_safety.py [--quick] [--part canary|boards|all] [--runs N] [--devices N]

Part ``canary``:

- **Real latencies.** A small MLP (the tests' digits model) is loaded in a real :class:`edgesdk.Runtime` on this
  host and timed call by call (3,000 calls after a fresh load, the first one cold, as a device's health check
  sees it). Each simulated device draws its calls from that recording, resampled, times its own speed factor
  (seeded lognormal noise, sigma 0.15: boards of one model differ), times the release's factor: 1 for the old
  version and a healthy release, 2 for a bad one (its p99, and every other percentile, 2x the old's).
- **The real engine and store.** 200 simulated devices in one group, a real :class:`RolloutEngine` over a real
  :class:`FleetDB` (SQLite in a temporary folder), a fake clock ticking each second and a dispatcher that records
  what it was asked to send. A device sent its stage commits 2 to 6 s later (its ``committed`` event through
  :meth:`RolloutEngine.on_event`, as the server's ingest does), swaps (its statistics restart, the 11 calls of the
  bundle's health check first), serves 20 calls a second (a camera at 20 fps) and writes its state,
  ``details["runtime"]`` as a ManagedRuntime reports it, to the store every report interval (10 s, each device at
  its own phase), as the server writes retained states. Policy: canary 10% (20 devices), waves 50,100, health
  window 60 s, defaults otherwise (max p99 ratio 1.5, min 100 calls a device).
- **Goals.** A bad release is aborted at the canary in >= 19 of 20 seeded runs; a healthy one with the same noise
  is promoted to completion in 20 of 20; the time from a stage settling to its verdict is at most the health
  window plus one report interval in every run.

Part ``boards`` is ``run_boards(args)`` of ``benchmarks/fleet/rollout_boards.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy, RolloutState  # noqa: E402
from edgesdk.ota_server.rollouts.engine import RolloutEngine  # noqa: E402
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB  # noqa: E402

HEALTH_WINDOW_S = 60.0
REPORT_S = 10.0
CALLS_PER_S = 20  # a camera at 20 frames a second: its 1,000-call window fills within the health window
HEALTH_CHECK_CALLS = 11  # the sample, 5 warm-up runs, 5 timed runs (edgesdk.agent.managed.health_check)
POLICY = RolloutPolicy(canary=0.1, waves=(0.5, 1.0), health_window_s=HEALTH_WINDOW_S, deploy_timeout_s=120)


def record_latencies(calls: int = 3000) -> tuple[np.ndarray, float]:
    """Per-call latencies (ms) of the digits MLP in a real Runtime on this host, and its first (cold) call's."""
    from edgesdk.runtime.runtime import Runtime
    from edgesdk.testing import random_mlp, write_mlp_onnx

    with tempfile.TemporaryDirectory() as folder:
        model = write_mlp_onnx(random_mlp([64, 32, 10], seed=1), Path(folder) / "digits.onnx")
        runtime = Runtime(model, profile="generic-x86_64")
        x = np.ones((1, 64), np.float32)
        latencies = np.empty(calls)
        for i in range(calls):
            started = time.perf_counter_ns()
            runtime.predict(x)
            latencies[i] = (time.perf_counter_ns() - started) / 1e6
        runtime.close()
    return latencies[1:], float(latencies[0])


class Recorder:
    """The engine's dispatcher: remembers the stages it was asked to send."""

    def __init__(self) -> None:
        self.stages: list[tuple[int, list[str]]] = []

    def send_stage(self, rollout: Any, stage: int, targets: list[Any]) -> None:
        self.stages.append((stage, [t.device_id for t in targets]))

    def resend(self, rollout: Any, stage: int, device_ids: list[str]) -> list[str]:
        return device_ids

    def busy(self) -> bool:
        return False

    def send_revert(self, rollout: Any, target: Any) -> None:
        pass

    def finish(self, rollout_id: str) -> None:
        pass

    def send_late(self, rollout: Any, targets: list[Any]) -> None:
        pass


class Device:
    """A simulated device: its version, its ManagedRuntime's statistics since the last swap, its speed."""

    def __init__(self, device_id: str, speed: float, phase: float, rng: np.random.Generator) -> None:
        self.id, self.speed, self.next_report, self.rng = device_id, speed, phase, rng
        self.version, self.count = "1.0.0", 0
        self.window: deque[float] = deque(maxlen=1000)
        self.commit_at: float | None = None

    def swap(self, version: str, cold_ms: float, recorded: np.ndarray, factor: float) -> None:
        self.version, self.count = version, 0
        self.window.clear()
        self.serve(HEALTH_CHECK_CALLS, recorded, factor, cold_ms)

    def serve(self, calls: int, recorded: np.ndarray, factor: float, cold_ms: float | None = None) -> None:
        drawn = self.rng.choice(recorded, calls) * self.speed * factor
        if cold_ms is not None:
            drawn[0] = cold_ms * self.speed * factor
        self.window.extend(drawn.tolist())
        self.count += calls

    def state(self, now: float) -> DeviceState:
        samples = np.fromiter(self.window, float)
        p50, p95, p99 = (float(v) for v in np.percentile(samples, [50, 95, 99]))
        runtime = {"count": self.count, "errors": 0, "window": len(samples), "p50_ms": p50, "p95_ms": p95,
                   "p99_ms": p99, "mean_ms": float(samples.mean()), "paths": {}, "refused": 0, "fallbacks": 0,
                   "breaker": None}
        return DeviceState(self.id, "cams", "online", "digits", self.version, (f"digits-{self.version}",), now,
                           reported=now, details=json.dumps({"runtime": runtime}))


def run_canary(seed: int, bad: bool, devices: int, recorded: np.ndarray, cold_ms: float) -> dict[str, Any]:
    """One seeded rollout of 2.0.0 (``bad``: 2x slower) over ``devices`` simulated devices; its outcome."""
    rng = np.random.default_rng(seed)
    now = 1_000_000.0
    with tempfile.TemporaryDirectory() as folder:
        db = FleetDB(Path(folder) / "fleet.db")
        fleet = [Device(f"cam{i:03d}", float(rng.lognormal(0, 0.15)), now + float(rng.uniform(0, REPORT_S)),
                        np.random.default_rng([seed, i])) for i in range(devices)]
        factor = {"1.0.0": 1.0, "2.0.0": 2.0 if bad else 1.0}
        for d in fleet:  # each device has served the old version a while
            d.swap("1.0.0", cold_ms, recorded, 1.0)
            d.serve(600, recorded, 1.0)
        db.upsert_devices([d.state(now) for d in fleet])
        clock = [now]
        recorder = Recorder()
        engine = RolloutEngine(db, recorder, lambda: clock[0], resend_s=3.0)
        rollout_id = engine.start("digits", "2.0.0", "cams", POLICY)
        by_id = {d.id: d for d in fleet}
        sent = 0
        verdict_delays: list[float] = []
        settled: dict[int, float] = {}  # stage (1-based) -> when all its devices had reported
        last_verdict = None
        r = engine.status(rollout_id, targets=False)
        while r.state == RolloutState.RUNNING and clock[0] - now < 3600:
            engine.tick()
            for _, ids in recorder.stages[sent:]:
                for device_id in ids:
                    by_id[device_id].commit_at = clock[0] + float(rng.uniform(2, 6))
            sent = len(recorder.stages)
            clock[0] += 1.0
            states = []
            for d in fleet:
                if d.commit_at is not None and clock[0] >= d.commit_at:
                    d.commit_at = None
                    d.swap("2.0.0", cold_ms, recorded, factor["2.0.0"])
                    engine.on_event(d.id, "committed", rollout_id, None)
                    states.append(d.state(clock[0]))  # the agent reports its new state on the change
                if clock[0] >= d.next_report:
                    d.serve(int(CALLS_PER_S * REPORT_S), recorded, factor[d.version])
                    d.next_report += REPORT_S
                    states.append(d.state(clock[0]))
            if states:
                db.upsert_devices(states)
            r = engine.status(rollout_id, targets=False)
            if r.stage_settled is not None:
                settled[r.stage + 1] = r.stage_settled
            if r.verdict and r.verdict != last_verdict:  # judged at the last tick, at clock - 1 s
                last_verdict = r.verdict
                verdict_delays.append(clock[0] - 1.0 - settled[r.verdict["stage"]])
        final = engine.status(rollout_id, targets=False)
        db.close()
    verdict = final.verdict or {}
    return {"seed": seed, "bad": bad, "state": final.state.value, "stage": final.stage + 1,
            "aborted_at_canary": final.state == RolloutState.ABORTED and verdict.get("stage") == 1
            and not verdict.get("passed"),
            "completed": final.state == RolloutState.COMPLETED, "verdict_delays_s": verdict_delays,
            "reason": final.reason, "canary_p99_ms": (verdict.get("canary") or {}).get("p99_ms"),
            "baseline_p99_ms": (verdict.get("baseline") or {}).get("p99_ms")}


def canary_part(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The canary part's results and goals."""
    recorded, cold_ms = record_latencies()
    log(f"recorded {recorded.size} calls: p50 {np.percentile(recorded, 50):.4f} ms, p99 "
        f"{np.percentile(recorded, 99):.4f} ms, cold first call {cold_ms:.3f} ms")
    runs = args.runs or (5 if args.quick else 20)
    outcomes: dict[str, list[dict[str, Any]]] = {"bad": [], "healthy": []}
    for seed in range(runs):
        for kind in ("bad", "healthy") if seed % 2 == 0 else ("healthy", "bad"):
            started = time.perf_counter()
            outcome = run_canary(seed, kind == "bad", args.devices, recorded, cold_ms)
            outcomes[kind].append(outcome)
            log(f"seed {seed} {kind}: {outcome['state']} at stage {outcome['stage']} "
                f"({time.perf_counter() - started:.1f} s): {outcome['reason']}")
    caught = sum(o["aborted_at_canary"] for o in outcomes["bad"])
    promoted = sum(o["completed"] for o in outcomes["healthy"])
    delays = [d for o in outcomes["bad"] + outcomes["healthy"] for d in o["verdict_delays_s"]]
    bound = HEALTH_WINDOW_S + REPORT_S
    results = {"recorded_latency_ms": {"calls": int(recorded.size), "p50": float(np.percentile(recorded, 50)),
                                       "p99": float(np.percentile(recorded, 99)), "cold_first_call": cold_ms},
               "runs": runs, "devices": args.devices, "bad_aborted_at_canary": caught,
               "healthy_completed": promoted, "verdict_delay_s": {"max": max(delays), "min": min(delays),
                                                                  "bound": bound},
               "outcomes": outcomes}
    goals = [goal(f"a release with 2x the p99, aborted at the canary (of {runs})", f">= {runs - runs // 20}",
                  caught, caught >= runs - runs // 20),
             goal(f"a healthy release with the same noise, promoted to completion (of {runs})", f"{runs}",
                  promoted, promoted == runs),
             goal("time from a stage settling to its verdict, worst (s; health window + one report interval)",
                  f"<= {bound:g}", max(delays), max(delays) <= bound)]
    return results, goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 seeded runs of each release instead of 20")
    parser.add_argument("--part", default="all", choices=["canary", "boards", "all"])
    parser.add_argument("--runs", type=int, help="seeded runs of each release (default 20; quick 5)")
    parser.add_argument("--devices", type=int, default=200, help="simulated devices (default 200)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    goals: list[dict[str, Any]] = []
    if args.part in ("canary", "all"):
        log("part canary")
        results["canary"], canary_goals = canary_part(args)
        goals += canary_goals
    if args.part in ("boards", "all"):
        from benchmarks.fleet.rollout_boards import run_boards

        part = run_boards(args)
        results["boards"] = part["results"]
        goals += list(part["goals"].values()) if isinstance(part["goals"], dict) else part["goals"]
    emit("rollout_safety", {"quick": args.quick, "part": args.part, "runs": args.runs, "devices": args.devices},
         results, goals)


if __name__ == "__main__":
    main()
