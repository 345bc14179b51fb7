"""The rollout engine acting on canary verdicts: a real fleet store, a fake clock, a recording dispatcher, devices'
``traffic`` written to the store as the server's ingest writes it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.rollouts.stage_gate import REJUDGE_EVERY_S
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB
from tests.unit.test_canary import traffic
from tests.unit.test_rollout_engine import Clock, Recorder

WINDOW = 30.0
POLICY = RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=WINDOW, evidence_grace_s=60)


def _state(db: FleetDB, clock: Clock, device: str, version: str, p99: float | None = 5.0, calls: int = 500,
           status: str = "online") -> None:
    details = {"traffic": {**traffic(version, p99, calls=calls), "at": clock.now}} if p99 or calls else {}
    for entry in details.get("traffic", {}).get("versions", {}).values():
        entry.update({"from": clock.now - 60, "to": clock.now})
    db.upsert_devices([DeviceState(device, "cams", status, "digits", version, (f"digits-{version}",), clock.now,
                                   reported=clock.now, details=json.dumps(details) if details else None)])


@pytest.fixture
def fleet(fleet_location):
    db = FleetDB(fleet_location)
    clock, recorder = Clock(), Recorder()
    for i in range(10):
        _state(db, clock, f"cam{i}", "1.0.0")
    yield db, clock, recorder, RolloutEngine(db, recorder, clock, resend_s=3.0)
    db.close()


def _canary(db, clock, recorder, engine, policy: RolloutPolicy, p99: float | None, calls: int = 500) -> RolloutRecord:
    """Start a rollout, commit its canary devices with the given figures, run to the end of the health window."""
    rid = engine.start("digits", "2.0.0", "cams", policy)
    engine.tick()
    (_, canary), = recorder.stages
    for device in canary:
        engine.on_event(device, "committed", rid, None)
        _state(db, clock, device, "2.0.0", p99, calls)
    engine.tick()  # settles: the health window starts
    clock.now += policy.health_window_s
    for device in canary:
        _state(db, clock, device, "2.0.0", p99, calls)
    engine.tick()
    return engine.status(rid)


def test_a_slower_canary_is_aborted_with_its_verdict(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, POLICY, 12.0)
    assert r.state == RolloutState.ABORTED and "p99 12 ms is 2.4x the live baseline's" in r.reason
    assert (r.verdict["outcome"], r.verdict["stage"]) == ("failed", 1) and r.to_json()["verdict"] == r.verdict
    assert r.phase == "aborted" and len(recorder.reverts) == 2


def test_a_manual_rollout_waits_for_promote_once_its_canary_passed(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, replace(POLICY, auto_promote=False), 5.1)
    assert (r.state, r.phase, r.verdict["outcome"]) == (RolloutState.RUNNING, "waiting_for_promote", "passed")
    engine.promote(r.id)
    assert engine.status(r.id).phase == "deploying"


def test_thin_evidence_waits_then_pauses_and_promote_past_it_completes_the_last_stage(fleet):
    db, clock, recorder, engine = fleet
    policy = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=WINDOW, evidence_grace_s=60)
    r = _canary(db, clock, recorder, engine, policy, 5.0, calls=20)
    assert r.phase == "waiting_for_evidence" and r.verdict["outcome"] == "waiting"
    assert "0 of 10 devices have evidence, 5 needed" in r.verdict["reason"]
    clock.now += 60 + REJUDGE_EVERY_S
    for device in recorder.stages[0][1]:  # still reporting, still thin
        _state(db, clock, device, "2.0.0", 5.0, calls=20)
    engine.tick()
    r = engine.status(r.id)
    assert (r.state, r.phase, r.verdict["outcome"]) == (RolloutState.RUNNING, "waiting_for_promote", "inconclusive")
    assert [e.type for e in db.events(r.id)].count("stage_verdict") == 1
    clock.now += 3600
    engine.tick()
    assert engine.status(r.id).state == RolloutState.RUNNING, "an inconclusive stage waits for the operator"
    engine.promote(r.id)
    done = engine.status(r.id)
    assert done.state == RolloutState.COMPLETED and "past a verdict inconclusive" in done.reason
    with pytest.raises(ConflictError):
        engine.promote(r.id)


def test_evidence_arriving_before_the_deadline_passes_the_stage(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, replace(POLICY, auto_promote=False), 5.0, calls=20)
    assert r.phase == "waiting_for_evidence"
    clock.now += REJUDGE_EVERY_S
    for device in recorder.stages[0][1]:
        _state(db, clock, device, "2.0.0", 5.0, calls=400)
    engine.tick()
    assert engine.status(r.id).verdict["outcome"] == "passed"


def test_an_inconclusive_stage_aborts_when_the_policy_says_so(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, replace(POLICY, on_inconclusive="abort", evidence_grace_s=0), None,
                calls=0)
    assert r.state == RolloutState.ABORTED and "was inconclusive in its canary analysis" in r.reason


def test_a_push_while_the_whole_group_is_offline_waits_for_its_devices_and_canaries_the_first_back(fleet):
    db, clock, recorder, engine = fleet
    for i in range(10):
        _state(db, clock, f"cam{i}", "1.0.0", status="offline")
    rid = engine.start("digits", "2.0.0", "cams", POLICY)
    for _ in range(3):
        engine.tick()
        clock.now += WINDOW + 60 + REJUDGE_EVERY_S
    r = engine.status(rid)
    assert (r.state, r.phase) == (RolloutState.RUNNING, "waiting_for_evidence"), "nothing judged, nothing completed"
    assert "waiting for the canary's devices: 0 of the 1 needed were sent" in r.verdict["reason"]
    canaries = [t.device_id for t in r.targets if t.stage == 0]
    for device in canaries:  # they come back: the reconciler sends them the canary
        _state(db, clock, device, "1.0.0")
    engine.tick()
    sent = {d for d, _ in recorder.late}
    assert sent == set(canaries)
    for device in canaries:
        engine.on_event(device, "committed", rid, None)
        _state(db, clock, device, "2.0.0", 30.0)
    for device in {f"cam{i}" for i in range(10)} - set(canaries):  # the rest of the group is back on 1.0.0
        _state(db, clock, device, "1.0.0")
    engine.tick()
    clock.now += WINDOW
    for device in canaries:
        _state(db, clock, device, "2.0.0", 30.0)
    engine.tick()
    r = engine.status(rid)
    assert r.state == RolloutState.ABORTED and r.verdict["outcome"] == "failed", r.verdict


def test_a_later_stage_whose_devices_are_all_offline_waits_for_them_and_is_judged_on_those_back(fleet):
    """No stage passes on devices that were not there: a later stage whose devices all went away before taking the
    release waits for them (the operator may accept it as it is), and is judged on the first back."""
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, POLICY, 5.0)
    assert r.verdict["outcome"] == "passed" and len(recorder.stages) == 2, r.verdict
    rest = recorder.stages[1][1]
    for device in rest:  # gone before they answered: deferred
        _state(db, clock, device, "1.0.0", status="offline")
    for _ in range(3):  # deferred (looked at once a second)
        clock.now += 1
        engine.tick()
    clock.now += WINDOW + 120 + REJUDGE_EVERY_S
    engine.tick()
    r = engine.status(r.id)
    assert (r.state, r.phase) == (RolloutState.RUNNING, "waiting_for_evidence"), r.verdict
    assert r.verdict["reason"].startswith("waiting for stage 2's devices: 0 of the 4 needed were sent, 8 are offline")
    back = rest[:4]
    for device in back:  # four come back: the reconciler sends them their stage
        _state(db, clock, device, "1.0.0")
    clock.now += engine.reconcile_s
    engine.tick()
    assert {d for d, _ in recorder.late} == set(back)
    for device in back:
        engine.on_event(device, "committed", r.id, None)
        _state(db, clock, device, "2.0.0", 5.0)
    clock.now += 1
    engine.tick()  # settles on the four
    clock.now += WINDOW
    for device in back:
        _state(db, clock, device, "2.0.0", 5.0)
    engine.tick()
    r = engine.status(r.id)
    assert r.state == RolloutState.COMPLETED and r.verdict["outcome"] == "passed", r.verdict
    assert r.verdict["canary"]["devices"] == 4 and r.deferred == 4


def test_an_operator_may_accept_a_last_stage_still_waiting_for_its_devices(fleet):
    db, clock, recorder, engine = fleet
    r = _canary(db, clock, recorder, engine, POLICY, 5.0)
    for device in recorder.stages[1][1]:
        _state(db, clock, device, "1.0.0", status="offline")
    for _ in range(3):
        clock.now += 1
        engine.tick()
    assert engine.status(r.id).phase == "waiting_for_evidence"
    engine.promote(r.id)
    done = engine.status(r.id)
    assert done.state == RolloutState.COMPLETED and "past a verdict waiting: waiting for stage 2's devices" in \
        done.reason
