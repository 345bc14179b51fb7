"""Canary analysis: the figures a stage is judged on, the verdict against its baseline, and the engine acting on it."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState
from edgesdk.ota_server.rollouts.canary import Figures, figures, judge, judge_stage
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB
from tests.unit.test_rollout_engine import Clock, Recorder


def _details(p99: float, count: int = 500, errors: int = 0, local: int = 0, cloud: int = 0) -> dict:
    paths = {}
    if local or cloud:
        paths = {"local": {"count": local, "errors": 0}, "cloud": {"count": cloud, "errors": 0}}
    return {"runtime": {"count": count, "errors": errors, "window": count - errors, "p50_ms": p99 / 3,
                        "p95_ms": p99 / 1.5, "p99_ms": p99, "mean_ms": p99 / 3, "paths": paths, "refused": 0}}


def _reports(version: str, p99s: list[float], **kw) -> list[tuple[str, str, dict]]:
    return [(f"{version}-{i}", version, _details(p99, **kw)) for i, p99 in enumerate(p99s)]


POLICY = RolloutPolicy()


def test_a_stages_p99_is_the_median_of_its_devices_p99s_and_thin_devices_do_not_count():
    got = figures(_reports("2.0.0", [5.0, 6.0, 90.0]) + [("thin", "2.0.0", _details(50.0, count=20))], 100)
    assert (got.devices, got.too_few, got.calls, got.p99_ms) == (3, 1, 1500, 6.0)


def test_a_p99_regression_fails_with_the_figures_in_the_reason():
    stage = figures(_reports("2.0.0", [17.6, 17.5, 18.0]), 100)
    baseline = figures(_reports("1.0.0", [5.39, 5.2, 5.5]), 100)
    passed, reason, checks = judge(stage, baseline, POLICY)
    assert not passed
    assert reason == "canary p99 17.6 ms is 3.3x the baseline's 5.39 ms (> 1.5x)"
    assert checks[0]["name"] == "p99_ratio" and not checks[0]["passed"]


def test_a_release_as_fast_as_the_old_one_passes():
    stage = figures(_reports("2.0.0", [5.5, 5.4]), 100)
    passed, reason, _ = judge(stage, figures(_reports("1.0.0", [5.39, 5.2]), 100), POLICY)
    assert passed and "within the policy" in reason


def test_an_error_rate_increase_over_the_baseline_fails_but_the_baselines_own_rate_does_not():
    baseline = figures(_reports("1.0.0", [5.0], errors=25), 100)  # 5% of the old version's calls fail already
    same = figures(_reports("2.0.0", [5.0], errors=25), 100)
    worse = figures(_reports("2.0.0", [5.0], errors=50), 100)
    assert judge(same, baseline, POLICY)[0]
    passed, reason, _ = judge(worse, baseline, POLICY)
    assert not passed and "error rate 10.00% (50/500 calls)" in reason and "baseline's 5.00%" in reason


def test_more_offload_than_the_baseline_fails():
    baseline = figures(_reports("1.0.0", [5.0], local=90, cloud=10), 100)
    stage = figures(_reports("2.0.0", [5.0], local=40, cloud=60), 100)
    passed, reason, _ = judge(stage, baseline, POLICY)
    assert not passed and "offload share 60%" in reason


def test_the_offload_share_counts_only_requests_since_the_snapshot():
    reports = _reports("2.0.0", [5.0], local=190, cloud=10)
    assert figures(reports, 100, {"2.0.0-0": (90, 10)}).offload_share == 0.0


def test_no_figures_passes_and_says_so():
    stage = figures([("cam0", "2.0.0", {"disk": {}}), ("cam1", "2.0.0", _details(9.0, count=11))], 100)
    passed, reason, checks = judge(stage, None, POLICY)
    assert passed and reason.startswith("no figures") and checks == []


def test_without_old_devices_left_the_stored_baseline_is_used():
    snapshot = {"figures": figures(_reports("1.0.0", [5.0, 5.0]), 100).to_json(), "paths": {}}
    verdict, keep = judge_stage(POLICY, 1, "2.0.0", _reports("2.0.0", [12.0, 12.0]), [], snapshot, time.time())
    assert not verdict["passed"] and verdict["baseline"]["source"] == "snapshot"
    assert verdict["stage"] == 2 and verdict["canary"]["p99_ms"] == 12.0 and keep is None


def test_live_old_devices_are_the_baseline_and_their_figures_are_kept():
    verdict, keep = judge_stage(POLICY, 0, "2.0.0", _reports("2.0.0", [5.1]), _reports("1.0.0", [5.0, 5.2]), None,
                                time.time())
    assert verdict["passed"] and verdict["baseline"]["source"] == "live" and verdict["baseline"]["devices"] == 2
    assert Figures.from_json(keep["figures"]).p99_ms == 5.1


def test_the_policy_checks_its_limits_and_loads_without_them():
    with pytest.raises(EdgeSDKError, match="max p99 ratio 0.5"):
        RolloutPolicy(max_p99_ratio=0.5)
    with pytest.raises(EdgeSDKError, match="max error rate 2"):
        RolloutPolicy(max_error_rate=2)
    old = {k: v for k, v in RolloutPolicy().to_dict().items()
           if k not in ("max_p99_ratio", "max_error_rate", "max_offload_share", "min_calls")}
    assert RolloutPolicy.from_dict(old) == RolloutPolicy()
    assert RolloutPolicy.from_dict(RolloutPolicy(max_p99_ratio=None).to_dict()).max_p99_ratio is None


# the engine --------------------------------------------------------------------------------
@pytest.fixture
def fleet(fleet_location):
    db = FleetDB(fleet_location)
    clock, recorder = Clock(), Recorder()
    for i in range(10):
        _state(db, f"cam{i}", "1.0.0", 5.0)
    yield db, clock, recorder, RolloutEngine(db, recorder, clock, resend_s=3.0)
    db.close()


def _state(db: FleetDB, device: str, version: str, p99: float) -> None:
    db.upsert_devices([DeviceState(device, "cams", "online", "digits", version, (f"digits-{version}",), time.time(),
                                   details=json.dumps(_details(p99)))])


def _canary(db, clock, recorder, engine, policy: RolloutPolicy, p99: float) -> RolloutRecord:
    rid = engine.start("digits", "2.0.0", "cams", policy)
    engine.tick()
    (_, canary), = recorder.stages
    for device in canary:
        engine.on_event(device, "committed", rid, None)
        _state(db, device, "2.0.0", p99)
    engine.tick()  # settles: the health window starts
    clock.now += policy.health_window_s
    engine.tick()
    return engine.status(rid)


def test_a_slower_canary_is_aborted_with_its_verdict(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=30), 12.0)
    assert r.state == RolloutState.ABORTED and "canary p99 12 ms is 2.4x the baseline's 5 ms" in r.reason
    assert r.verdict["passed"] is False and r.verdict["stage"] == 1 and r.to_json()["verdict"] == r.verdict
    assert r.phase == "aborted" and len(recorder.reverts) == 2


def test_a_manual_rollout_waits_for_promote_once_its_canary_passed(fleet):
    db, clock, recorder, engine = fleet
    policy = RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=30, auto_promote=False)
    r = _canary(db, clock, recorder, engine, policy, 5.1)
    assert (r.state, r.phase, r.verdict["passed"]) == (RolloutState.RUNNING, "waiting_for_promote", True)
    assert r.to_json()["phase"] == "waiting_for_promote" and len(recorder.stages) == 1
    engine.promote(r.id)
    assert engine.status(r.id).phase == "deploying"


def test_a_mixed_fleet_is_judged_board_by_board_not_on_the_mix():
    """Issue 37's releases run on several boards: a Jetson canary 1.8x slower than the Jetsons still on the old
    version fails, although the median over the whole mix (Pis at 20 ms, Jetsons at 5 ms) says it is faster."""
    def on(board: str, version: str, p99s: list[float]) -> list[tuple]:
        return [(f"{board}-{version}-{i}", version, _details(p99), board) for i, p99 in enumerate(p99s)]

    new = on("jetson-orin-nano", "2.0.0", [9.0, 9.1, 9.2]) + on("raspberry-pi-5", "2.0.0", [20.0, 20.5])
    old = on("jetson-orin-nano", "1.0.0", [5.0, 5.1]) + on("raspberry-pi-5", "1.0.0", [20.0, 20.2, 20.4, 20.1])
    verdict, _ = judge_stage(POLICY, 0, "2.0.0", new, old, None, 0.0)
    assert verdict["canary"]["p99_ms"] < verdict["baseline"]["p99_ms"], "the mix alone would have passed it"
    assert verdict["passed"] is False and verdict["reason"].startswith("on jetson-orin-nano, canary p99 9.1 ms is 1.8x")
    by_board = {c["board"]: c["passed"] for c in verdict["checks"] if c["name"] == "p99_ratio"}
    assert by_board == {"jetson-orin-nano": False, "raspberry-pi-5": True}
    healthy = on("jetson-orin-nano", "2.0.0", [5.2, 5.0, 5.1]) + on("raspberry-pi-5", "2.0.0", [20.0, 20.5])
    assert judge_stage(POLICY, 0, "2.0.0", healthy, old, None, 0.0)[0]["passed"] is True


def test_an_automatic_rollout_between_its_verdict_and_its_next_stage_is_not_waiting_for_promote(fleet):
    """`push --wait` stops at ``waiting_for_promote``: read between the stored verdict and the next stage's send, an
    automatic rollout said so, and the README's demo exited "still running" (CI of this stop)."""
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=30), 5.1)
    assert r.phase == "deploying" and len(recorder.stages) == 2, "it promoted itself"
    between = replace(r, stage=0, verdict={**r.verdict, "stage": 1})  # as read between the two writes
    assert between.phase == "health_window"
    manual = replace(between, policy=replace(r.policy, auto_promote=False))
    assert manual.phase == "waiting_for_promote"
