"""Issue 58, late releases staged and gated: devices back online fill a canary short of its size, a group only
provisioned is canaried as its devices report, a newcomer on a newer version is recorded ``ahead``, and a flagged
release sends nothing more until the operator resumes it. A real fleet store (SQLite and PostgreSQL), a fake clock
and a dispatcher that records; no broker (tests/ota/ has the real-agent versions)."""

from __future__ import annotations

import pytest

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB
from tests.unit.test_reconciler import FAST, _commit, _complete, _settle
from tests.unit.test_rollout_engine import Clock, Recorder

#: A judged canary of 2 devices of 10, then the rest: what a push to a fleet with analysis looks like.
JUDGED = RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=0)


def _all_offline(db, n=10):
    for i in range(n):
        db.upsert_device(f"cam{i}", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])


def _back(db, *devices, version="1.0.0"):
    for device in devices:
        db.upsert_device(device, "cams", "online", "digits", version, [f"digits-{version}"])


def _targets(engine, rollout_id):
    return {t.device_id: t for t in engine.status(rollout_id).targets}


def test_devices_back_online_are_pulled_into_a_canary_short_of_its_size_first_come_first_canaried(ten_cams):
    """The whole group was offline at the push: the canary (2 devices) waits, nothing sent. The first devices to
    return, though planned for the second stage, are moved into the canary and sent, one pass or the next; once it
    has its 2, the next one back waits for the second stage."""
    db, clock, recorder, engine = ten_cams
    _all_offline(db)
    rid = engine.start("digits", "2.0.0", "cams", JUDGED)
    _settle(engine, clock, 3)
    r = engine.status(rid)
    assert (r.state, r.stage, r.count(TargetStatus.DEFERRED), recorder.stages) == (RolloutState.RUNNING, 0, 2, [])
    later = sorted(t.device_id for t in r.targets if t.stage == 1)
    _back(db, later[3])
    _settle(engine, clock, 1)
    assert recorder.late == [(later[3], 0)], "the first device back is canaried"
    _back(db, later[1], later[5])  # two more in one pass: the canary takes one (by id)
    _settle(engine, clock, 1)
    assert recorder.late == [(later[3], 0), (later[1], 0)]
    targets = _targets(engine, rid)
    assert {d for d, t in targets.items() if t.stage == 0 and t.status == TargetStatus.SENT} == {later[3], later[1]}
    assert (targets[later[5]].stage, targets[later[5]].status) == (1, TargetStatus.PENDING), "it waits for stage 2"
    assert sum(t.stage == 0 for t in targets.values()) == 4, "the canary's own two stay in it, deferred"
    assert engine.status(rid, targets=False).stage_sizes == (2, 10), "the stages keep their sizes"
    moved = [e.payload["devices"] for e in db.events(rid) if e.type == "pulled_forward"]
    assert moved == [[later[3]], [later[1]]]
    planned = sorted(d for d, t in targets.items() if t.stage == 0 and t.status == TargetStatus.DEFERRED)
    _back(db, planned[0])  # planned for the canary, back once it has its two: it goes with the next stage
    _settle(engine, clock, 1)
    assert len(recorder.late) == 2 and _targets(engine, rid)[planned[0]].stage == 1
    assert _targets(engine, rid)[planned[0]].status == TargetStatus.PENDING
    assert engine.status(rid).stage == 0 and [s for s, _ in recorder.stages] == [], "no stage sent meanwhile"


def test_a_device_joining_while_the_canary_is_short_is_canaried_and_one_joining_later_waits(ten_cams):
    db, clock, recorder, engine = ten_cams
    _all_offline(db)
    rid = engine.start("digits", "2.0.0", "cams", JUDGED)
    _settle(engine, clock, 2)
    db.upsert_device("new0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    db.upsert_device("new1", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    db.upsert_device("new2", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    assert recorder.late == [("new0", 0), ("new1", 0)]
    targets = _targets(engine, rid)
    assert targets["new0"].late and targets["new0"].stage == 0 and targets["new2"].stage == 1
    assert targets["new2"].status == TargetStatus.PENDING


def test_a_canary_with_its_devices_online_takes_no_device_from_a_later_stage(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = engine.start("digits", "2.0.0", "cams", JUDGED)  # cam0-cam6 online: the canary is sent to two of them
    engine.tick()
    (_, canary), = recorder.stages
    offline_later = [d for d, t in _targets(engine, rid).items() if t.stage == 1 and d in ("cam7", "cam8", "cam9")]
    _back(db, offline_later[0])
    _settle(engine, clock, 1)
    assert recorder.late == [] and _targets(engine, rid)[offline_later[0]].stage == 1
    assert len(canary) == 2


def test_a_provisioned_device_gets_its_boards_artifact_and_version_from_its_first_report(fleet_location):
    """Planned before any device reported, a target has no artifact: the release's artifact for the board the device
    reports is taken then (a board the release has none for is ``no_artifact``, never sent)."""
    db = FleetDB(fleet_location)
    try:
        clock, recorder = Clock(), Recorder()
        engine = RolloutEngine(db, recorder, clock, artifacts=lambda name, version: ["generic-x86_64",
                                                                                    "raspberry-pi-5"])
        db.provision({"door0": "doors", "door1": "doors"}, "devices file")
        rid = engine.start("digits", "2.0.0", "doors", RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0))
        _settle(engine, clock, 2)
        db.upsert_devices([DeviceState("door0", "doors", "online", "digits", "1.0.0", ("digits-1.0.0",), 1.0,
                                       profile="raspberry-pi-5", arch="aarch64"),
                           DeviceState("door1", "doors", "online", "digits", "1.0.0", ("digits-1.0.0",), 1.0,
                                       profile="visionfive-2", arch="riscv64")])
        _settle(engine, clock, 1)
        targets = _targets(engine, rid)
        assert recorder.late == [("door0", 0)]
        assert (targets["door0"].artifact, targets["door0"].previous_version) == ("raspberry-pi-5", "1.0.0")
        assert targets["door1"].status == TargetStatus.NO_ARTIFACT and targets["door1"].previous_version == "1.0.0"
    finally:
        db.close()


def test_a_newcomer_on_a_newer_version_is_recorded_ahead_and_not_sent_a_downgrade(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)  # release 2.0.0; cam7-cam9 offline, deferred
    db.upsert_device("cam10", "cams", "online", "digits", "3.0.0", ["digits-3.0.0"])  # joins on 3.0.0
    _back(db, "cam8", version="3.0.0")  # back, and someone installed 3.0.0 meanwhile
    _settle(engine, clock, 1)
    assert recorder.late == [], "a device ahead of the release is not sent a downgrade"
    r = engine.status(rid)
    targets = {t.device_id: t for t in r.targets}
    for device in ("cam8", "cam10"):
        assert targets[device].status == TargetStatus.AHEAD, targets[device]
        assert "runs digits 3.0.0, newer than 2.0.0" in targets[device].reason
    assert r.count(*(s for s in TargetStatus if s.failed)) == 0 and not r.flagged
    assert TargetStatus.AHEAD.settled and not TargetStatus.AHEAD.failed and not TargetStatus.AHEAD.in_flight
    _back(db, "cam8", version="1.0.0")  # it went back to an older version: now it needs the release
    _settle(engine, clock, 1)
    assert recorder.late == [("cam8", 1)]
    assert _targets(engine, rid)["cam8"].status == TargetStatus.SENT


def test_a_device_ahead_of_a_rollback_release_is_sent_it(ten_cams):
    """A rollback sends a group back on purpose: a device on the version it undid is sent the rollback too."""
    db, clock, recorder, engine = ten_cams
    first = _complete(db, clock, recorder, engine)
    for i in range(7):
        _back(db, f"cam{i}", version="2.0.0")
    back = engine.rollback(first, to_version="1.0.0", all_at_once=True)
    for _ in range(8):
        engine.tick()
        _commit(engine, back, [d for s, devices in recorder.stages for d in devices])
        clock.now += 1.5
    assert engine.status(back).state == RolloutState.COMPLETED
    db.upsert_device("cam10", "cams", "online", "digits", "2.0.0", ["digits-2.0.0"])
    _settle(engine, clock, 1)
    assert ("cam10", 0) in recorder.late and _targets(engine, back)["cam10"].status == TargetStatus.SENT


def test_a_completed_rollout_with_devices_ahead_is_a_success_for_the_cli():
    """``edgesdk push --wait`` exits 0 on a completed rollout whose only devices not updated are ahead of it."""
    from edgesdk.cli.fleet import _outcome

    counts = {TargetStatus.COMMITTED: 3, TargetStatus.AHEAD: 1}
    r = RolloutRecord("r1", "digits", "2.0.0", "cams", FAST, RolloutState.COMPLETED, 1, None, None, "3/3 updated",
                      0.0, 0.0, False, stage_sizes=(1, 3), counts=counts)
    _outcome(r)  # raises RolloutError when a device is unaccounted for


def _flagged(db, clock, recorder, engine):
    """Release 2.0.0 whose three late installs (cam7-cam9) failed: flagged."""
    rid = _complete(db, clock, recorder, engine)
    _back(db, "cam7", "cam8", "cam9")
    _settle(engine, clock, 1)
    _commit(engine, rid, ["cam7", "cam8", "cam9"], "rolled_back", "health check failed")
    _settle(engine, clock, 1)
    assert engine.status(rid).flagged
    return rid


def test_a_flagged_release_stops_catch_up_until_the_operator_resumes_it(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _flagged(db, clock, recorder, engine)
    sent = len(recorder.late)
    db.upsert_device("cam10", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # joins while flagged
    _settle(engine, clock, 3)
    assert len(recorder.late) == sent, "no late send while the release is flagged"
    assert _targets(engine, rid)["cam10"].status == TargetStatus.PENDING, "recorded, to be sent on resume"
    flag = engine.status(rid).flagged
    assert engine.reconciler.resume(rid) == flag
    resumed = [e.payload for e in db.events(rid) if e.type == "release_resumed"]
    assert resumed == [{"flag": flag, "failed": 3, "answered": 3}] and engine.status(rid).flagged is None
    _settle(engine, clock, 1)
    assert recorder.late[sent:] == [("cam10", 1)], "the device that waited is sent the release after the resume"
    _commit(engine, rid, ["cam10"], "rolled_back", "health check failed")  # one more failure after the resume
    _settle(engine, clock, 2)
    assert engine.status(rid).flagged is None, "the failures before the resume do not flag it again"
    with pytest.raises(ConflictError, match="is not flagged"):
        engine.reconciler.resume(rid)


def test_a_flag_after_a_resume_counts_only_the_new_failures(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _flagged(db, clock, recorder, engine)
    engine.reconciler.resume(rid)
    newcomers = [f"new{i}" for i in range(3)]
    for device in newcomers:
        db.upsert_device(device, "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    _commit(engine, rid, newcomers, "rolled_back", "health check failed")
    _settle(engine, clock, 1)
    flag = engine.status(rid).flagged
    assert flag and "3 of 3 late installs failed since it was resumed" in flag, flag


def test_only_a_flagged_rollout_that_is_running_or_its_groups_release_can_be_resumed(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _flagged(db, clock, recorder, engine)
    for i in range(7):
        _back(db, f"cam{i}", version="2.0.0")
    later = _complete(db, clock, recorder, engine, version="2.1.0")
    with pytest.raises(ConflictError, match="no longer group 'cams'.s release"):
        engine.reconciler.resume(rid)
    assert engine.status(rid).flagged and db.release("cams").rollout_id == later
