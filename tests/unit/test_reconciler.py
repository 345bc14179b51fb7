"""Desired state and reconciliation on their own: a real fleet store (SQLite and PostgreSQL), a fake clock and a
dispatcher that records; no broker. The real-broker, real-agent versions are in tests/ota/test_convergence.py."""

from __future__ import annotations

import pytest

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.devices.provisioning import GroupGuard
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB
from tests.unit.test_rollout_engine import Clock, Recorder

#: All stages at once after a one-device canary, no health window, no canary analysis (these devices report no
#: traffic): each test steps it by hand.
FAST = RolloutPolicy(canary=0.1, waves=(1.0,), health_window_s=0, deploy_timeout_s=60, analysis=False)
#: One stage to the whole group, no health window, no analysis.
ONE_STAGE = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0, analysis=False)


def _ten_cams(db):
    """cam0-cam9 in group cams on digits 1.0.0, cam7-cam9 offline."""
    for i in range(10):
        db.upsert_device(f"cam{i}", "cams", "online" if i < 7 else "offline", "digits", "1.0.0", ["digits-1.0.0"])


def _commit(engine, rollout_id, devices, event="committed", reason=None):
    for device in devices:
        engine.on_event(device, event, rollout_id, reason)


def _settle(engine, clock, rounds=4):
    for _ in range(rounds):
        clock.now += 1.5
        engine.tick()


def _complete(db, clock, recorder, engine, version="2.0.0", policy=FAST, group="cams"):
    """Push ``version`` to ``group`` and commit every device it reaches until the rollout completes; its id."""
    rid = engine.start("digits", version, group, policy)
    for _ in range(10):
        engine.tick()
        _commit(engine, rid, [d for _, devices in recorder.stages for d in devices])
        clock.now += 1.5
        if engine.status(rid).state != RolloutState.RUNNING:
            break
    assert engine.status(rid).state == RolloutState.COMPLETED, engine.status(rid)
    return rid


def test_offline_devices_are_deferred_not_failed_and_the_canary_runs_online(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = engine.start("digits", "2.0.0", "cams", FAST)
    engine.tick()
    (stage, canary), = recorder.stages
    assert stage == 0 and canary[0] in {f"cam{i}" for i in range(7)}, "the canary is drawn from online devices"
    _commit(engine, rid, canary)
    _settle(engine, clock)
    _commit(engine, rid, recorder.stages[-1][1])
    _settle(engine, clock)
    r = engine.status(rid)
    assert r.state == RolloutState.COMPLETED, r
    assert {t.device_id for t in r.targets if t.status == TargetStatus.DEFERRED} == {"cam7", "cam8", "cam9"}
    assert r.deferred == 3 and "3 deferred" in r.reason
    assert sorted(d for _, devices in recorder.stages for d in devices) == [f"cam{i}" for i in range(7)], \
        "nothing is sent to an offline device"
    release = db.release("cams")
    assert (release.model, release.version, release.rollout_id) == ("digits", "2.0.0", rid)


def test_a_device_back_online_gets_the_release_as_a_late_target_of_the_rollout_that_set_it(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    assert recorder.late == []
    db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # it reports: it is back
    _settle(engine, clock, 1)
    assert recorder.late == [("cam8", 1)]
    (target,) = [t for t in engine.status(rid).targets if t.device_id == "cam8"]
    assert target.status == TargetStatus.SENT and target.late
    _commit(engine, rid, ["cam8"])
    r = engine.status(rid)
    assert r.late_counts == {TargetStatus.COMMITTED: 1} and r.state == RolloutState.COMPLETED
    _settle(engine, clock, 2)
    assert recorder.late == [("cam8", 1)], "a device that reported its commit is not sent the release again"


def test_a_device_provisioned_after_the_push_gets_the_release_on_first_report(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    db.upsert_device("cam10", "cams", "online", None, None, [])
    _settle(engine, clock, 1)
    assert recorder.late == [("cam10", 1)]
    (target,) = [t for t in engine.status(rid).targets if t.device_id == "cam10"]
    assert target.late and target.previous_version is None and target.stage == 1


def test_a_device_that_joins_during_a_rollout_goes_with_its_last_stage(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(canary=0.1, waves=(1.0,), health_window_s=0,
                                                                 auto_promote=False, analysis=False))
    engine.tick()
    db.upsert_device("cam10", "cams", "online", None, None, [])
    _settle(engine, clock, 2)
    assert recorder.late == [], "nothing is sent before the device's stage"
    engine.promote(rid)
    assert "cam10" in recorder.stages[-1][1], "the joined device is in the last stage's send"


def test_a_push_to_a_group_with_no_device_online_is_accepted_and_converges_as_devices_arrive(fleet_location):
    db = FleetDB(fleet_location)
    for i in range(3):
        db.upsert_device(f"cam{i}", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])
    clock, recorder = Clock(), Recorder()
    engine = RolloutEngine(db, recorder, clock)
    rid = engine.start("digits", "2.0.0", "cams", FAST)  # analysis off: the operator chose to judge nothing
    _settle(engine, clock, 12)
    r = engine.status(rid)
    assert r.state == RolloutState.COMPLETED and r.deferred == 3 and recorder.stages == [], "nothing sent to nobody"
    for i in range(3):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    assert sorted(d for d, _ in recorder.late) == ["cam0", "cam1", "cam2"]
    db.close()


def test_a_timeout_while_offline_defers_and_while_online_fails(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=0,
                                                                 deploy_timeout_s=60, max_failure_rate=0.5,
                                                                 analysis=False))
    engine.tick()
    (_, canary), = recorder.stages
    gone, silent, *answering = canary
    _commit(engine, rid, answering)
    db.upsert_device(gone, "cams", "offline", None, None, [])  # its last will: out of coverage mid-download
    clock.now += 61
    engine.tick()  # the silent one gets its last try
    clock.now += 2 * engine.resend_s + 0.5
    engine.tick()
    statuses = {t.device_id: t.status for t in engine.status(rid).targets}
    assert statuses[gone] == TargetStatus.DEFERRED, "losing the connection is not a failure"
    assert statuses[silent] == TargetStatus.TIMEOUT, "silent while reachable is"


def test_a_reconnect_storm_is_capped_at_max_catch_up_and_the_rest_stay_queued(fleet_location):
    db = FleetDB(fleet_location)
    db.upsert_device("cam0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    for i in range(1, 8):
        db.upsert_device(f"cam{i}", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])
    clock, recorder = Clock(), Recorder()
    engine = RolloutEngine(db, recorder, clock, max_catch_up=3)
    rid = _complete(db, clock, recorder, engine, policy=ONE_STAGE)
    for i in range(1, 8):  # the broker restarted: all seven report at once
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 2)
    assert len(recorder.late) == 3 and db.late_in_flight() == 3
    _commit(engine, rid, [d for d, _ in recorder.late])
    _settle(engine, clock, 1)
    assert len(recorder.late) == 6, "the next three start once the first three are done"
    _commit(engine, rid, [d for d, _ in recorder.late[3:]])
    _settle(engine, clock, 1)
    assert sorted(d for d, _ in recorder.late) == [f"cam{i}" for i in range(1, 8)]
    db.close()


def test_devices_held_back_by_the_cap_are_passed_over_every_second_not_every_reconcile_s(fleet_location):
    """Devices left queued under the catch-up cap are a crowd already: the next pass does not wait ``reconcile_s``
    for more to gather, so the cap, not the pass interval, paces a reconnect storm."""
    db = FleetDB(fleet_location)
    db.upsert_device("cam0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    for i in range(1, 8):
        db.upsert_device(f"cam{i}", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])
    clock, recorder = Clock(), Recorder()
    engine = RolloutEngine(db, recorder, clock, max_catch_up=3, reconcile_s=5.0)
    rid = _complete(db, clock, recorder, engine, policy=ONE_STAGE)
    for i in range(1, 8):  # the broker restarted: all seven report at once
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    clock.now += 5.0
    engine.tick()
    assert len(recorder.late) == 3 and engine.reconciler.backlog and not engine.idle
    _commit(engine, rid, [d for d, _ in recorder.late])
    clock.now += 1.0
    engine.tick()
    assert len(recorder.late) == 6, "the next three start a second later, not a reconcile interval later"
    _commit(engine, rid, [d for d, _ in recorder.late[3:]])
    clock.now += 1.0
    engine.tick()
    assert sorted(d for d, _ in recorder.late) == [f"cam{i}" for i in range(1, 8)]
    assert not engine.reconciler.backlog and engine.idle, "nobody held back: passes wait reconcile_s again"
    db.close()


def test_a_queue_longer_than_a_pass_reads_is_passed_over_again_a_second_later(fleet_location):
    """A pass reads at most the cap's room plus 200 queued devices. When it read that many (here all on the release
    already, queued again by their new states), more may wait behind them: the next pass comes a second later, not
    ``reconcile_s`` later, though no device was held back by the cap."""
    db = FleetDB(fleet_location)
    try:
        _ten_cams(db)
        clock, recorder = Clock(), Recorder()
        engine = RolloutEngine(db, recorder, clock, resend_s=3.0, max_catch_up=3, reconcile_s=5.0)
        _complete(db, clock, recorder, engine)
        _settle(engine, clock, 8)
        for i in range(203):  # the cap's room (3) plus 200: one pass's read, all on the release
            db.upsert_device(f"a{i:03d}", "cams", "online", "digits", "2.0.0", ["digits-2.0.0"])
        db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # behind them in the queue
        clock.now += 5.0
        engine.tick()
        assert recorder.late == [] and engine.reconciler.backlog, "the first pass read a full page of the queue"
        clock.now += 1.0
        engine.tick()
        assert recorder.late == [("cam8", 1)], "the device behind them is sent a second later"
    finally:
        db.close()


def test_late_failures_flag_the_release_and_never_revert_the_group(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    for i in (7, 8, 9):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    _commit(engine, rid, ["cam7", "cam8", "cam9"], "rolled_back", "health check failed")
    _settle(engine, clock, 1)
    r = engine.status(rid)
    assert r.flagged and "3 of 3 late installs failed" in r.flagged
    assert r.state == RolloutState.COMPLETED and recorder.reverts == [] and db.release("cams").rollout_id == rid
    assert [e.type for e in db.events(rid)].count("release_flagged") == 1
    for i in range(7):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "2.0.0", ["digits-1.0.0", "digits-2.0.0"])
    db.provision({"cam99": "cams", "gate0": "gates"}, "devices file")  # provisioned, never reported
    group, gates = db.group_releases()
    assert group.flagged == r.flagged and group.converged == 7 and group.behind_online == 3
    assert group.devices == 11 and group.behind_offline == 1, "the provisioned device that never reported is behind"
    assert (gates.group, gates.devices, gates.version, gates.behind_offline) == ("gates", 1, None, 0)


def test_an_abort_leaves_the_release_and_a_completed_rollback_sets_it_back(ten_cams):
    db, clock, recorder, engine = ten_cams
    first = _complete(db, clock, recorder, engine)
    for i in range(7):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "2.0.0", ["digits-1.0.0", "digits-2.0.0"])
    aborted = engine.start("digits", "3.0.0", "cams", FAST)
    engine.tick()
    engine.abort(aborted)
    assert db.release("cams").rollout_id == first, "an abort does not move the release"
    back = engine.rollback(first, to_version="1.0.0")
    for _ in range(12):
        engine.tick()
        _commit(engine, back, [d for _, devices in recorder.stages for d in devices])
        clock.now += 1.5
    assert engine.status(back).state == RolloutState.COMPLETED
    assert engine.status(back).stage_sizes == (1, 7), "staged with the rolled-back rollout's policy"
    assert (db.release("cams").version, db.release("cams").rollout_id) == ("1.0.0", back)


def test_a_driver_whose_lease_lapsed_cannot_move_a_stage_or_end_the_rollout(ten_cams):
    db, clock, recorder, engine = ten_cams
    other = RolloutEngine(db, Recorder(), clock, holder="replica-b", lease_s=10)
    rid = engine.start("digits", "2.0.0", "cams", FAST)
    engine.tick()  # engine holds the lease, sends the canary
    r = engine.status(rid, targets=False)
    clock.now += 11  # engine stalls past its lease; replica-b takes the rollout over
    assert db.hold_lease(rid, "replica-b", clock(), 10)
    assert not engine._send_stage(r, 1), "a stale driver's stage move is refused"
    assert not db.end_rollout(rid, RolloutState.COMPLETED, "stale", stage=r.stage, holder=engine.holder,
                              lease_now=clock())
    assert not engine._abort(r, "stale abort")
    assert not db.settle_stage(rid, clock(), stage=r.stage, holder=engine.holder, lease_now=clock()), \
        "a stale driver cannot start the stage's health window (and shorten the holder's)"
    assert engine.status(rid, targets=False).stage_settled is None
    after = engine.status(rid)
    assert after.state == RolloutState.RUNNING and after.stage == 0 and [s for s, _ in recorder.stages] == [0]
    assert other._send_stage(r, 1), "the holder moves it"
    sent = [e.payload for e in db.events(rid) if e.type == "stage_sent"]
    assert [(p["stage"], p["holder"]) for p in sent] == [(0, engine.holder), (1, "replica-b")]
    with pytest.raises(ConflictError, match="no stage 3"):
        engine.promote(rid)


def test_a_state_naming_another_group_is_refused_and_a_move_queues_the_device(fleet_location):
    db = FleetDB(fleet_location)
    refused = []
    guard = GroupGuard(db, on_refused=refused.append)
    state = DeviceState("cam1", "cams", "online", "digits", "1.0.0", (), 1.0)
    assert guard.admit([state]) == [state], "first report: provisioned in the group it names"
    assert db.provisioned_groups(["cam1"]) == {"cam1": "cams"}
    intruder = DeviceState("cam1", "canary", "online", "digits", "1.0.0", (), 2.0)
    assert guard.admit([intruder]) == [] and refused == ["wrong_group"]
    db.upsert_devices([state])
    db.reconciled(["cam1"])
    assert db.provision({"cam1": "lobby"}, "admin api") == ["cam1"]
    assert db.device("cam1").group == "lobby" and [d.id for d in db.to_reconcile("lobby", 10)] == ["cam1"]
    strict = GroupGuard(db, require_provisioning=True, on_refused=refused.append)
    assert strict.admit([DeviceState("cam2", "cams", "online", None, None, (), 1.0)]) == []
    assert refused[-1] == "unprovisioned" and db.provisioned_groups(["cam2"]) == {}
    db.close()


@pytest.mark.parametrize("lost_at", [TargetStatus.DOWNLOADING, TargetStatus.TIMEOUT, TargetStatus.FAILED])
def test_a_device_whose_state_shows_the_release_is_committed_though_its_commit_report_was_lost(ten_cams, lost_at):
    """A replica killed with reports in its queue loses them, and a resend may die with a broker restart: the
    device's next state (retained by the broker, read by every replica) names the release, and that closes an
    unfinished or timed-out target. A target the device itself failed stays failed."""
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # back: sent the release late
    _settle(engine, clock, 1)
    assert recorder.late == [("cam8", 1)]
    engine.on_event("cam8", "accepted", rid, None)
    if lost_at != TargetStatus.DOWNLOADING:
        db.set_target(rid, "cam8", lost_at, "no report in 60 s" if lost_at == TargetStatus.TIMEOUT else "health")
    db.upsert_device("cam8", "cams", "online", "digits", "2.0.0", ["digits-2.0.0"])  # its state after the commit
    _settle(engine, clock, 1)
    (target,) = [t for t in engine.status(rid).targets if t.device_id == "cam8"]
    if lost_at == TargetStatus.FAILED:
        assert target.status == TargetStatus.FAILED and target.reason == "health", target
    else:
        assert target.status == TargetStatus.COMMITTED, target
        assert "reports it runs 2.0.0" in target.reason, target
    assert recorder.late == [("cam8", 1)], "a device on the release is not sent it again"


def test_send_late_marks_only_pending_and_deferred_targets_in_one_statement_and_returns_them_in_order(ten_cams):
    db, clock, recorder, engine = ten_cams
    rid = engine.start("digits", "2.0.0", "cams", FAST)
    ids = ["cam3", "cam1", "cam2", "cam0"]
    db.set_target(rid, "cam3", TargetStatus.DEFERRED)
    db.set_target(rid, "cam2", TargetStatus.SENT)
    ran: list[str] = []
    execute = db.sql.rows
    db.sql.rows = lambda sql, args=(): ran.append(sql) or execute(sql, args)
    try:
        marked = db.send_late(rid, ids, clock.now)
    finally:
        db.sql.rows = execute
    assert [t.device_id for t in marked] == ["cam3", "cam1", "cam0"], "cam2's command is out already"
    assert len(ran) == 1, ran
    assert all(t.status == TargetStatus.SENT and t.late and t.sent == clock.now for t in marked), "returned as marked"
    targets = db.targets_of(rid, ids)
    assert all(targets[t.device_id].status == TargetStatus.SENT and targets[t.device_id].late for t in marked)
    assert not targets["cam2"].late


def test_a_pass_while_a_catch_up_runs_costs_three_statements_and_its_chase_runs_every_resend_s(ten_cams):
    """Nobody queued and one late target in flight: a tick reads what there is to do, leases the release and counts
    its catch-ups; the late targets are chased (deferred if offline, sent again if silent) every ``resend_s``, not
    every pass. An idle tick is one statement."""
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    _settle(engine, clock, 12)  # past the chase of a release with nothing in flight
    db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    clock.now += 1.0
    engine.tick()
    assert recorder.late == [("cam8", 1)]
    chased, ran = [], []
    defer, run = db.defer_offline, db.sql._run
    db.defer_offline = lambda *args: chased.append(clock.now) or defer(*args)
    db.sql._run = lambda sql, args: ran.append(sql) or run(sql, args)
    per_tick = []
    try:
        for _ in range(6):
            clock.now += 1.0
            ran.clear()
            engine.tick()
            per_tick.append(len(ran))
    finally:
        db.defer_offline, db.sql._run = defer, run
    assert len(chased) == 2, f"chased at {chased} in 6 s (resend_s 3)"
    assert sorted(per_tick)[:4] == [3, 3, 3, 3], f"statements per tick: {per_tick}"
    assert recorder.late == [("cam8", 1), ("cam8", 1)], "the silent late target was sent again by a chase"
    _commit(engine, rid, ["cam8"])
    _settle(engine, clock, 1)  # the pass that sees no catch-up left lets the archive go
    ran.clear()
    db.sql._run = lambda sql, args: ran.append(sql) or run(sql, args)
    try:
        clock.now += 1.0
        engine.tick()
    finally:
        db.sql._run = run
    assert len(ran) == 1, f"an idle tick ran {ran}"


def test_a_release_target_in_flight_again_but_not_late_is_still_timed_out_with_no_catch_up_running(ten_cams):
    """A target that timed out and whose device answered after all (``downloading`` again) is in flight but not late:
    with no catch-up running, the release's targets are still looked at every ``_IDLE_CHASE`` re-send intervals."""
    db, clock, recorder, engine = ten_cams
    rid = _complete(db, clock, recorder, engine)
    db.sql.execute("UPDATE targets SET status = ? WHERE device_id = 'cam0'", (TargetStatus.TIMEOUT.value,))
    db.set_target(rid, "cam0", TargetStatus.DOWNLOADING)  # its accepted came after all
    assert db.targets_of(rid, ["cam0"])["cam0"].status == TargetStatus.DOWNLOADING and db.work().late_in_flight == 0
    for _ in range(int(FAST.deploy_timeout_s / 1.5) + 20):  # past the deploy timeout, the last try and its wait
        clock.now += 1.5
        engine.tick()
        if engine.status(rid).count(TargetStatus.TIMEOUT):
            break
    (target,) = [t for t in engine.status(rid).targets if t.device_id == "cam0"]
    assert target.status == TargetStatus.TIMEOUT, target


def test_devices_coming_back_between_passes_get_their_commands_together_and_passes_keep_the_lease(fleet_location):
    """With passes every ``reconcile_s`` (5 s), devices that come back 2 s apart are sent their commands in one pass
    (one wave), not one each as they come; a pass interval longer than half the lease is cut to that, since the
    passes renew the release's lease."""
    db = FleetDB(fleet_location)
    try:
        _ten_cams(db)
        clock, recorder = Clock(), Recorder()
        engine = RolloutEngine(db, recorder, clock, resend_s=3.0, reconcile_s=5.0, lease_s=10.0)
        assert RolloutEngine(db, Recorder(), clock, reconcile_s=5.0, lease_s=4.0).reconcile_s == 2.0
        rid = _complete(db, clock, recorder, engine)
        _settle(engine, clock, 8)  # the pass that completed it is behind us
        waves: list[list[str]] = []
        send = recorder.send_late
        recorder.send_late = lambda rollout, targets: waves.append([t.device_id for t in targets]) or send(rollout,
                                                                                                              targets)
        back = {1: "cam7", 3: "cam8", 5: "cam9"}  # second -> the device reporting then
        for second in range(1, 13):
            clock.now += 1.0
            if second in back:
                db.upsert_device(back[second], "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
            sent = len(waves)
            engine.tick()
            for wave in waves[sent:]:
                _commit(engine, rid, wave)  # each answers at once: nothing is chased and sent again
        assert sorted(d for wave in waves for d in wave) == ["cam7", "cam8", "cam9"], waves
        assert len(waves) <= 2 and any(len(wave) >= 2 for wave in waves), f"one command a pass each: {waves}"
    finally:
        db.close()


def test_a_lost_commit_of_an_earlier_rollout_is_closed_by_a_state_that_arrives_after_the_next_push(ten_cams):
    """cam8 installed 2.0.0 as a late target, and both its commit report and its state after it were lost; it went
    offline, 2.0.1 was pushed without it, and its next state (still naming 2.0.0) reaches the server only now. That
    state closes its timed-out 2.0.0 target as committed, and cam8 is sent 2.0.1."""
    db, clock, recorder, engine = ten_cams
    first = _complete(db, clock, recorder, engine)
    db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # back: sent 2.0.0 late
    _settle(engine, clock, 1)
    engine.on_event("cam8", "accepted", first, None)
    db.set_target(first, "cam8", TargetStatus.TIMEOUT, "no report in 60 s")
    db.upsert_device("cam8", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])  # gone again
    _settle(engine, clock, 1)
    second = _complete(db, clock, recorder, engine, version="2.0.1")
    assert recorder.late == [("cam8", 1)]
    db.upsert_device("cam8", "cams", "online", "digits", "2.0.0", ["digits-2.0.0"])  # its state, late
    _settle(engine, clock, 1)
    (earlier,) = [t for t in engine.status(first).targets if t.device_id == "cam8"]
    assert earlier.status == TargetStatus.COMMITTED and "reports it runs 2.0.0" in earlier.reason, earlier
    (now,) = [t for t in engine.status(second).targets if t.device_id == "cam8"]
    assert now.status == TargetStatus.SENT and now.late, now
    assert recorder.late[-1] == ("cam8", 1)


def test_a_state_naming_an_aborted_rollouts_version_leaves_that_rollouts_target_to_its_reverts(ten_cams):
    """Only completed rollouts are closed from a device's state: an aborted one's targets are its reverts' business
    (a commit reported after the abort is reverted, not counted)."""
    db, clock, recorder, engine = ten_cams
    _complete(db, clock, recorder, engine)
    aborted = engine.start("digits", "3.0.0", "cams", FAST)
    engine.tick()
    ((_, (canary,)),) = recorder.stages[-1:]
    engine.abort(aborted)
    (before,) = [t for t in engine.status(aborted).targets if t.device_id == canary]
    later = _complete(db, clock, recorder, engine, version="2.0.1")
    db.upsert_device(canary, "cams", "online", "digits", "3.0.0", ["digits-3.0.0"])
    _settle(engine, clock, 1)
    (after,) = [t for t in engine.status(aborted).targets if t.device_id == canary]
    assert after.status == before.status != TargetStatus.COMMITTED, (before, after)
    assert engine.status(later).state == RolloutState.COMPLETED
