"""The simulated devices of benchmarks/fleet/rollout_safety.py: what they report is the agent's
traffic format, its figures are those of the calls they served, and they keep the agent's cadence
(no database, no clock but their own)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.fleet.rollout_fleet_sim import (
    HORIZON_S,
    NEW,
    OLD,
    STATE_EVERY_S,
    TRAFFIC_EVERY_S,
    Release,
    SimDevice,
    make_fleet,
)
from edgesdk.fleet.traffic import MAX_CALLS_PER_S, parse_traffic

T0 = 1_000_000.0
RECORDED = np.random.default_rng(0).lognormal(np.log(0.05), 0.5, 3000)
JUDGE_S = 480.0


HEALTHY = Release()


def device(release: Release = HEALTHY, rate: float = 5.0, seed: int = 1) -> SimDevice:
    d = SimDevice("cam001", "rk3588", 5.0, rate, np.random.default_rng(seed), RECORDED, release,
                  T0 - 3600)
    d.journal = []
    return d


def commit(d: SimDevice, at: float) -> float:
    """Send ``d`` the release at ``at``, step it second by second to its commit; when it
    committed."""
    d.told(at, JUDGE_S)
    now = at
    while True:
        now += 1.0
        committed, state = d.step(now)
        if committed:
            if not d.release.silent:
                assert state is not None and state.version == NEW, "it reports its new state"
            return now


def served(d: SimDevice, version: str, lo: float, to: float) -> tuple[int, int, np.ndarray]:
    """(calls, errors, successful latencies) of ``version`` that ``d`` drew in [lo, to], from its
    journal."""
    calls = errors = 0
    good = []
    for times, v, failed, latencies in d.journal or []:
        if v != version:
            continue
        slot_start = np.floor(times / 60.0) * 60.0
        inside = (slot_start >= lo) & (times <= to)
        calls += int(inside.sum())
        errors += int((inside & failed).sum())
        good.append(latencies[inside & ~failed])
    return calls, errors, np.concatenate(good) if good else np.empty(0)


def test_the_traffic_a_device_reports_parses_and_its_figures_are_those_of_its_calls():
    d = device(Release(errors=0.05))
    d.next_report = T0
    committed = commit(d, T0)
    now = committed + 95.0
    traffic = d.traffic(now)
    checked = parse_traffic(json.loads(json.dumps(traffic)))
    assert set(checked["versions"]) == {OLD, NEW}
    for version, entry in checked["versions"].items():
        calls, errors, good = served(d, version, entry["to"] - HORIZON_S, entry["to"])
        assert (entry["calls"], entry["errors"]) == (calls, errors) and calls > 0
        assert [entry["p50_ms"], entry["p95_ms"], entry["p99_ms"]] == pytest.approx(
            np.percentile(good, [50, 95, 99]).tolist())
    new = checked["versions"][NEW]
    assert new["from"] == committed, "the new version's window starts at its activation"
    assert now - 10 < new["to"] <= now, "the figures are what the app last wrote (every 10 s)"
    assert (new["apps"], new["starts"], new["restarts"]) == (1, 1, 0)
    assert checked["versions"][OLD]["starts"] == 0


def test_a_crash_looping_app_reports_its_restarts_and_few_calls():
    healthy, looping = device(), device(Release(crash_loop=True))
    for d in (healthy, looping):
        committed = commit(d, T0)
    entry = parse_traffic(looping.traffic(committed + 60))["versions"][NEW]
    assert entry["restarts"] >= 3 and entry["starts"] == entry["restarts"] + 1
    assert entry["apps"] == entry["starts"]
    served_healthy = parse_traffic(healthy.traffic(committed + 60))["versions"][NEW]["calls"]
    assert entry["calls"] < served_healthy / 2


def test_the_agent_reports_every_10_s_while_judged_then_every_300_s_and_a_silent_one_never():
    d = device()
    committed = commit(d, T0)
    reports = [t for t in np.arange(committed + 1, committed + JUDGE_S + 1000)
               if d.step(float(t))[1] is not None]
    fast = [t for t in reports if t < d.judge_until]  # commit + the command's judge_s
    assert fast[0] == committed + TRAFFIC_EVERY_S and fast[-1] >= d.judge_until - TRAFFIC_EVERY_S
    assert np.diff(fast).tolist() == [TRAFFIC_EVERY_S] * (len(fast) - 1)
    assert np.diff(reports[len(fast):]).tolist() == [STATE_EVERY_S] * (len(reports) - len(fast) - 1)
    silent = device(Release(silent=True))
    commit(silent, T0)
    assert not any(silent.step(T0 + t)[1] for t in range(10, 1000))


@pytest.mark.parametrize("how", ["hide", "abort"])
def test_a_liars_figures_are_within_the_formats_rules(how):
    d = device(Release(errors=0.02))
    committed = commit(d, T0)
    d.lie = how
    entry = parse_traffic(d.traffic(committed + 30))["versions"][NEW]
    most = (entry["to"] - entry["from"] + 1) * MAX_CALLS_PER_S
    if how == "hide":
        assert entry["calls"] == int(most) and entry["errors"] == 0
    else:
        assert entry["errors"] == entry["calls"] // 2 and entry["p99_ms"] == 1000.0


def test_a_fleet_is_spread_evenly_over_the_boards_and_is_the_same_for_every_scenario_of_a_seed():
    fleet = make_fleet(3, 200, RECORDED, Release(), (5.0, 0.6), T0)
    assert {b: sum(d.board == b for d in fleet) for b in {d.board for d in fleet}} == {
        "raspberry-pi-5": 50, "raspberry-pi-4": 50, "jetson-orin-nano": 50, "rk3588": 50}
    again = make_fleet(3, 200, RECORDED, Release(latency=2.0), (5.0, 0.6), T0)
    assert [(d.board, d.speed, d.rate) for d in fleet] == [
        (d.board, d.speed, d.rate) for d in again]


def test_the_simulated_histogram_is_the_agents_bucket_by_bucket():
    """The simulation computes its devices' latency histograms with numpy; each bucket must be the one the agent's
    LatencyStats counts a call in, or the judge's p99 bounds would be read off the wrong buckets."""
    from benchmarks.fleet.rollout_fleet_sim import histogram
    from edgesdk.runtime.latency_histogram import bucket_of, merge

    latencies = np.random.default_rng(3).lognormal(-3.0, 1.5, 5000)
    expected = merge([[[bucket_of(int(round(ms * 1e6))), 1]] for ms in latencies])
    assert histogram(latencies) == expected and sum(c for _, c in expected) == latencies.size
