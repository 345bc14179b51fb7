"""Rollout safety benchmark (issues 37, 58): canaries judged on the apps' real traffic, failing
closed; releases for mixed boards.

    python benchmarks/fleet/rollout_safety.py [--quick] [--part canary|boards|all] [--runs N]
                                              [--devices N] [--scenarios NAME,...]

Part ``canary`` (issue 58): 20 seeded runs of 200 devices over 4 boards (raspberry-pi-5,
raspberry-pi-4, jetson-orin-nano, rk3588; 50 each, shuffled by the seed, each board with its own
base speed) for each scenario of :data:`benchmarks.fleet.rollout_scenarios.SCENARIOS`, with the
real engine, the real store and the default agent cadence (how:
:mod:`benchmarks.fleet.rollout_scenarios`, :mod:`benchmarks.fleet.rollout_fleet_sim`):

- **bad releases** (must be stopped: aborted, or paused on an inconclusive verdict; never
  completed): 2x p99; +2 points of errors; a crash loop; 2x on one board only; canaries that go
  silent after committing; a liar hiding errors (+2 points everywhere, one device per stage
  claiming the format's maximum calls and no error); a 2x release pushed while the whole group is
  offline, its devices returning within 10 minutes;
- **healthy releases with liars** (must complete): one device per stage claiming awful figures;
  that liar and the hiding one together;
- **thin evidence** (must end inconclusive, never pass): apps serving ~0.15 calls/s, with a
  healthy and a 2x release;
- **controls** (reported, no goal): a healthy release without liars; one pushed to an all-offline
  group; one whose apps serve ~20 calls/s (windows that are not thin).

**Thin windows: the call rates.** Every device's app serves its own lognormal rate, median
5 calls/s, sigma 0.6 (about 1 to 20 calls/s). A stage's health window is 60 s, its deadline 120 s
later. A device passes only with ``min_calls`` (100) calls and once its error rate is within the
baseline's (0.1%) + 1 point with 95% confidence (the Wilson bound: about 270 calls without an
error, 450 with one). The app writes its file every 10 s and the agent reports every 10 s, so at
the first verdict (60 s after the stage settled) a device has reported ~40-50 s of calls: devices
under ~2 calls/s (about 7%) are below ``min_calls`` and most others are still thin on the error
rule; by the deadline ~160 s of calls are reported and all but ~5% have evidence. So a healthy
stage can pass on evidence, after waiting for it, and the evidence is thin where the window is.
The thin-evidence scenarios serve median 0.15 calls/s (sigma 0.5): a device at the median has
~27 calls by the deadline and under 1% of devices reach 100, so no board has evidence, while the
baseline devices (900 s of calls, ~135 at the median) mostly do.

Goals (the issue's): each bad release stopped in at least 19 of 20 runs; the healthy releases
with liars completed in 20 of 20; the thin-evidence ones inconclusive, never passed, in 20 of 20.
The JSON has, per scenario, every run's outcome, the stage it stopped at, the deciding verdict's
outcome and reason, the time from push to that verdict, and every final stage verdict with its
boards' figures and its failed devices (the rule each failed, its calls and p99). Besides: the
recording's tail, and how often the p99 of n calls drawn from it is over 1.5x the recording's
(the chance that a healthy device fails the p99 rule on sampling alone).

Part ``boards`` is ``run_boards(args)`` of ``benchmarks/fleet/rollout_boards.py``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.fleet.rollout_fleet_sim import BOARDS, record_latencies  # noqa: E402
from benchmarks.fleet.rollout_scenarios import (  # noqa: E402
    JUDGE_S,
    POLICY,
    SCENARIOS,
    Scenario,
    run_scenario,
)
from benchmarks.shared.common import emit, goal, log  # noqa: E402

#: Calls in a device's window for which the p99 sampling noise is reported.
NOISE_CALLS = (100, 150, 300, 600, 1200, 4500)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarise(scenario: Scenario, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's figures over its runs: how they ended, where they stopped, how long verdicts
    took, and how its devices fared in every final verdict."""
    delays = [r["push_to_verdict_s"] for r in runs if r["push_to_verdict_s"] is not None]
    after_settle = [r["settle_to_verdict_s"] for r in runs if r["settle_to_verdict_s"] is not None]
    judged = [v for r in runs for v in r["stages"]]
    devices = {k: sum((v["canary"] or {}).get(k, 0) for v in judged)
               for k in ("passed", "failed", "thin")}
    return {"kind": scenario.kind, "what": scenario.what, "runs": len(runs),
            "call_rates": {"median_per_s": scenario.call_rates[0], "sigma": scenario.call_rates[1]},
            "states": dict(Counter(r["state"] for r in runs)),
            "stopped": sum(r["stopped"] for r in runs),
            "completed": sum(r["state"] == "completed" for r in runs),
            "inconclusive": sum((r["verdict"] or {}).get("outcome") == "inconclusive"
                                for r in runs),
            "any_stage_passed": sum(r["passed_stages"] > 0 for r in runs),
            "stopped_at_stage": dict(Counter(str(r["stage"]) for r in runs if r["stopped"])),
            "deciding_outcomes": dict(Counter((r["verdict"] or {}).get("outcome", "none")
                                              for r in runs)),
            "push_to_verdict_s": _spread(delays), "settle_to_verdict_s": _spread(after_settle),
            "device_verdicts": devices,
            "failed_devices_by_rule": dict(Counter(d["why"] for v in judged
                                                   for d in v["failed_devices"])),
            "outcomes": runs}


def scenario_goals(summaries: dict[str, dict[str, Any]], runs: int) -> list[dict[str, Any]]:
    """The issue's goals, per scenario (controls have none)."""
    least = runs - runs // 20  # 19 of 20
    goals = []
    for name, s in summaries.items():
        if s["kind"] == "bad":
            goals.append(goal(f"{name} ({s['what']}): stopped, aborted or paused inconclusive, "
                              f"never completed (of {runs})", f">= {least}", s["stopped"],
                              s["stopped"] >= least))
        elif s["kind"] == "healthy":
            goals.append(goal(f"{name} ({s['what']}): promoted to completion (of {runs})",
                              f"{runs}", s["completed"], s["completed"] == runs))
        elif s["kind"] == "thin":
            fine = sum(r["state"] == "paused" and r["passed_stages"] == 0 for r in s["outcomes"])
            goals.append(goal(f"{name} ({s['what']}): inconclusive (paused), no stage passed "
                              f"(of {runs})", f"{runs}", fine, fine == runs))
    return goals


def recording_figures(recorded: np.ndarray) -> dict[str, Any]:
    """The recording's tail, and P(p99 of n calls drawn from it > 1.5x its p99) for each n."""
    rng = np.random.default_rng(0)
    p99 = float(np.percentile(recorded, 99))
    noise = {str(n): float(np.mean([np.percentile(rng.choice(recorded, n), 99) > 1.5 * p99
                                    for _ in range(2000)])) for n in NOISE_CALLS}
    return {"calls": int(recorded.size), "p50": float(np.percentile(recorded, 50)), "p99": p99,
            "p99_9": float(np.percentile(recorded, 99.9)), "max": float(recorded.max()),
            "share_over_1_5x_p99": float(np.mean(recorded > 1.5 * p99)),
            "p99_of_n_calls_over_1_5x": noise}


def _run_all(chosen: list[Scenario], runs: int, devices: int,
             recorded: np.ndarray) -> dict[str, list[dict[str, Any]]]:
    """Every seeded run of every chosen scenario; the scenarios' order rotates with the seed, so
    drift on this host hits them alike."""
    outcomes: dict[str, list[dict[str, Any]]] = {s.name: [] for s in chosen}
    for seed in range(runs):
        shift = seed % len(chosen)
        for scenario in chosen[shift:] + chosen[:shift]:
            outcome = run_scenario(scenario, seed, devices, recorded)
            outcomes[scenario.name].append(outcome)
            verdict = outcome["verdict"] or {}
            log(f"seed {seed} {scenario.name}: {outcome['state']} at stage {outcome['stage']} "
                f"after {outcome['simulated_s']:.0f} s simulated ({outcome['wall_s']:.1f} s): "
                f"{verdict.get('outcome')}: {str(verdict.get('reason'))[:160]}")
    for found in outcomes.values():
        found.sort(key=lambda o: o["seed"])
    return outcomes


def canary_part(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The canary part's results and goals."""
    recorded = record_latencies()
    figures = recording_figures(recorded)
    log(f"recorded {recorded.size} calls: p50 {figures['p50']:.4f} ms, p99 "
        f"{figures['p99']:.4f} ms, p99.9 {figures['p99_9']:.4f} ms")
    runs = args.runs or (2 if args.quick else 20)
    devices = args.devices or (100 if args.quick else 200)
    chosen = [s for s in SCENARIOS if not args.scenarios or s.name in args.scenarios.split(",")]
    started = time.perf_counter()
    outcomes = _run_all(chosen, runs, devices, recorded)
    wall = time.perf_counter() - started
    summaries = {s.name: summarise(s, outcomes[s.name]) for s in chosen}
    wall_each = [o["wall_s"] for found in outcomes.values() for o in found]
    results = {"recorded_latency_ms": figures, "runs": runs, "devices": devices,
               "boards": [list(b) for b in BOARDS], "policy": POLICY.to_dict(), "judge_s": JUDGE_S,
               "wall_s": {"total": round(wall, 1), "per_run": _spread(wall_each)},
               "scenarios": summaries}
    return results, scenario_goals(summaries, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 seeded runs of 100 devices per scenario")
    parser.add_argument("--part", default="all", choices=["canary", "boards", "all"])
    parser.add_argument("--runs", type=int,
                        help="seeded runs of each scenario (default 20; quick 2)")
    parser.add_argument("--devices", type=int, help="simulated devices (default 200; quick 100)")
    parser.add_argument("--scenarios", help="comma-separated scenario names (default: all)")
    args = parser.parse_args()
    # The engine logs each abort and pause as a warning; the benchmark prints a line per run.
    logging.getLogger("edgesdk.ota_server.server").addHandler(logging.NullHandler())
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
    emit("rollout_safety", {"quick": args.quick, "part": args.part, "runs": args.runs,
                            "devices": args.devices, "scenarios": args.scenarios}, results, goals)


if __name__ == "__main__":
    main()
