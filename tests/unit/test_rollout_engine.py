"""The rollout state machine on its own: a real fleet store, a fake clock, a dispatcher that records; no broker.

The devices here run no app, so their rollouts turn the canary analysis off (``analysis=False``, as ``push
--no-analysis`` does); the engine acting on verdicts is tested in ``test_canary_engine.py``."""

from __future__ import annotations

import pytest

from edgesdk.errors import ConflictError, EdgeSDKError
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import FleetDB


class Recorder:
    """The engine's dispatcher: remembers what it was asked to send."""

    def __init__(self, unrevertable: set[str] = frozenset()) -> None:
        self.stages: list[tuple[int, list[str]]] = []
        self.resent: list[str] = []
        self.reverts: list[str] = []
        self.finished: list[str] = []
        self.late: list[tuple[str, int]] = []  # (device, stage) of each late send
        self.unrevertable = unrevertable
        self.queued = False  # the server's outbox still holds earlier sends

    def send_stage(self, rollout, stage, targets):
        self.stages.append((stage, [t.device_id for t in targets]))

    def resend(self, rollout, stage, device_ids):
        self.resent.extend(device_ids)
        return device_ids

    def busy(self):
        return self.queued

    def send_revert(self, rollout, target):
        if target.device_id in self.unrevertable:
            raise EdgeSDKError(f"digits {target.previous_version} is not in the repository")
        self.reverts.append(target.device_id)

    def finish(self, rollout_id):
        self.finished.append(rollout_id)

    def send_late(self, rollout, targets):
        self.late.extend((t.device_id, t.stage) for t in targets)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fleet(fleet_location):
    db = FleetDB(fleet_location)
    for i in range(10):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    clock, recorder = Clock(), Recorder()
    yield db, clock, recorder, RolloutEngine(db, recorder, clock, resend_s=3.0)
    db.close()


def _report(engine, rollout_id, devices, event="committed", reason=None):
    for device in devices:
        engine.on_event(device, event, rollout_id, reason)


def test_stages_wait_for_every_report_and_the_health_window_then_complete(fleet):
    db, clock, recorder, engine = fleet
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.1, waves=(0.5, 1.0), health_window_s=60))
    engine.tick()
    (stage, canary), = recorder.stages
    assert stage == 0 and len(canary) == 1
    engine.tick()
    assert recorder.resent == [], "re-sent before resend_s passed"
    clock.now += 3.5
    engine.tick()
    assert recorder.resent == canary, "an unacknowledged command is sent again"
    _report(engine, rid, canary)
    engine.tick()  # the stage settles now; the window starts
    clock.now += 59
    engine.tick()
    assert len(recorder.stages) == 1, "promoted before the health window passed"
    clock.now += 2
    engine.tick()
    assert [s for s, _ in recorder.stages] == [0, 1] and len(recorder.stages[1][1]) == 4
    _report(engine, rid, recorder.stages[1][1])
    engine.tick()
    clock.now += 61
    engine.tick()
    _report(engine, rid, recorder.stages[2][1])
    engine.tick()
    clock.now += 61
    engine.tick()
    r = engine.status(rid)
    assert r.state == RolloutState.COMPLETED and r.reason == "10/10 updated"
    assert recorder.finished == [rid] and recorder.reverts == []
    assert sorted(d for _, ds in recorder.stages for d in ds) == sorted(f"cam{i}" for i in range(10))


def test_nothing_is_sent_again_while_the_first_send_is_still_queued(fleet):
    """At 10,000 devices the first send of a stage took seconds to leave the server; re-sends queued behind it,
    delayed it more and fed on themselves. Silence counts only from when the queue is empty."""
    db, clock, recorder, engine = fleet
    engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.1, waves=(1.0,)))
    engine.tick()
    recorder.queued = True
    for _ in range(4):
        clock.now += 3.5
        engine.tick()
    assert recorder.resent == [], "re-sent while the outbox still held the first command"
    recorder.queued = False
    clock.now += 1
    engine.tick()
    assert recorder.resent == [], "silence is counted from when the outbox emptied, not from the send"
    clock.now += 3
    engine.tick()
    assert recorder.resent == recorder.stages[0][1]


def test_a_device_whose_command_was_lost_gets_it_again_while_others_keep_reporting(fleet):
    """At 10,000 devices under faults, reports trickled in for minutes: a command lost in a broker restart waited
    for the deploy timeout, because re-sends waited for the reports to stop."""
    db, clock, recorder, engine = fleet
    for i in range(10, 30):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), deploy_timeout_s=600))
    engine.tick()
    (_, devices), = recorder.stages
    lost, reporting = devices[0], devices[1:]
    resent_at, answered_before = None, []
    for device in reporting:  # a commit every 2 s: the stage never goes a full resend_s without progress
        clock.now += 2
        _report(engine, rid, [device])
        engine.tick()
        if resent_at is None and recorder.resent:
            resent_at = clock.now - 1_000_000.0
        if resent_at is None:
            answered_before.append(device)
    assert resent_at is not None and resent_at <= 10 * engine.resend_s + 2, \
        f"the silent device waited {resent_at} s while the others trickled in"
    assert lost in recorder.resent and not set(answered_before) & set(recorder.resent), \
        "the round re-sends to the devices that have not answered, and only to them"


def test_a_round_while_reports_still_come_skips_the_commands_of_a_stage_just_sent(fleet):
    """Half the 10,000-device benchmark runs re-sent ~6,000 commands of the last stage, most likely because the round
    every ``_ROUND_EVERY`` re-send intervals fell just after that stage went out, while its answers were on their way.
    While reports come, a round sends again only commands unanswered for ``_ROUND_QUIET`` intervals; a command lost
    for good still goes again."""
    db, clock, recorder, engine = fleet
    for i in range(10, 20):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.5, waves=(1.0,), deploy_timeout_s=600,
                                                                 health_window_s=0.0))
    engine.tick()
    (_, canary), = recorder.stages
    for device in canary:  # a commit every 2.5 s: the canary settles at +25 s, and the wave goes out
        clock.now += 2.5
        _report(engine, rid, [device])
        engine.tick()
    while len(recorder.stages) < 2:
        clock.now += 0.5
        engine.tick()
    wave_sent = clock.now
    (_, wave) = recorder.stages[1]
    lost, reporting = wave[0], wave[1:]
    for device in reporting:  # a commit every 2 s, across the round due at +30 s
        clock.now += 2
        _report(engine, rid, [device])
        engine.tick()
    assert clock.now - 1_000_000.0 >= 10 * engine.resend_s, "the test spans a round"
    assert recorder.resent == [], "a round re-sent a stage whose answers were still coming"
    while not recorder.resent and clock.now - wave_sent < 60:
        clock.now += 1
        engine.tick()
    assert recorder.resent == [lost], "the command lost for good goes again (once the reports stop)"


def _aborted_with_one_commit(engine, recorder):
    """A canary of two: the first commits, the second fails its health check, and the rollout aborts (40% allowed)."""
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.2, waves=(1.0,), max_failure_rate=0.4))
    engine.tick()
    first, second = recorder.stages[0][1]
    _report(engine, rid, [first])
    _report(engine, rid, [second], "rolled_back", "health check failed")
    engine.tick()
    return rid, first, second


def test_failures_above_the_rate_abort_and_revert_what_was_updated(fleet):
    db, clock, recorder, engine = fleet
    rid, first, second = _aborted_with_one_commit(engine, recorder)
    r = engine.status(rid)
    assert r.state == RolloutState.ABORTED and "1/2 devices failed" in r.reason and "health check failed" in r.reason
    assert recorder.reverts == [first] and recorder.finished == []
    assert {t.device_id: t.status for t in r.targets if t.stage == 0} == {first: TargetStatus.REVERTING,
                                                                         second: TargetStatus.ROLLED_BACK}
    _report(engine, f"{rid}-rollback", [first])
    engine.tick()
    assert {t.device_id: t.status for t in engine.status(rid).targets}[first] == TargetStatus.REVERTED
    assert recorder.finished == [rid], "the archives are released once the reverts are done"


def test_targets_never_sent_before_an_abort_are_skipped_not_pending(fleet):
    """Issue 37: after an abort at the canary, the 8 devices of the next stage were never sent anything; they read
    ``skipped``, and a deferred target that was once sent keeps its status (its device may still answer)."""
    db, clock, recorder, engine = fleet
    rid, first, second = _aborted_with_one_commit(engine, recorder)
    r = engine.status(rid)
    later = {t.device_id: t for t in r.targets if t.stage == 1}
    assert len(later) == 8 and {t.status for t in later.values()} == {TargetStatus.SKIPPED}
    assert {t.reason for t in later.values()} == {"never sent: the rollout was aborted first"}
    assert r.count(TargetStatus.PENDING) == 0 and r.count(TargetStatus.SKIPPED) == 8
    assert db.skip_unsent(rid) == 0  # the canary's two were sent: neither is touched


def test_an_unanswered_revert_is_sent_again_by_whichever_replica_holds_the_lease(fleet):
    """A revert lost with a broker restart or a partition would leave the device on the aborted version for good."""
    db, clock, recorder, engine = fleet
    rid, first, _ = _aborted_with_one_commit(engine, recorder)
    assert recorder.reverts == [first]
    clock.now += engine.resend_s / 2
    engine.tick()
    assert recorder.reverts == [first], "not due yet"
    # The engine that aborted dies; another replica's engine takes the lease over and sends the revert again.
    other = RolloutEngine(db, recorder, clock, resend_s=engine.resend_s, holder="replica-b", lease_s=engine.lease_s)
    clock.now += engine.lease_s + 1
    other.tick()
    assert recorder.reverts == [first, first]
    _report(other, f"{rid}-rollback", [first])
    other.tick()
    assert {t.device_id: t.status for t in other.status(rid).targets}[first] == TargetStatus.REVERTED
    clock.now += engine.resend_s * 3
    other.tick()
    assert recorder.reverts == [first, first], "a reverted device is not sent anything more"


def test_an_unanswered_revert_waits_while_the_outbox_is_full(fleet):
    db, clock, recorder, engine = fleet
    rid, first, _ = _aborted_with_one_commit(engine, recorder)
    recorder.queued = True
    clock.now += engine.resend_s * 2
    engine.tick()
    assert recorder.reverts == [first], "a revert was sent again behind the queued first one"
    recorder.queued = False
    engine.tick()
    assert recorder.reverts == [first, first]


def test_a_revert_is_not_sent_again_to_a_device_a_later_rollout_moved_on(fleet):
    """Sent late, the revert would take the device back past the newer version."""
    db, clock, recorder, engine = fleet
    rid, first, _ = _aborted_with_one_commit(engine, recorder)
    assert recorder.reverts == [first]
    db.upsert_device(first, "cams", "online", "digits", "3.0.0", ["digits-1.0.0", "digits-3.0.0"])
    clock.now += engine.resend_s + 1
    engine.tick()
    assert recorder.reverts == [first], "nothing sent again"
    target = {t.device_id: t for t in engine.status(rid).targets}[first]
    assert target.status == TargetStatus.REVERT_FAILED and "runs 3.0.0 now" in target.reason


def test_a_commit_reported_after_the_abort_is_reverted_too(fleet):
    """Reports are written in batches: a device's commit can land just after the abort that missed it."""
    db, clock, recorder, engine = fleet
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.2, waves=(1.0,), max_failure_rate=0.4))
    engine.tick()
    first, second = recorder.stages[0][1]
    _report(engine, rid, [second], "rolled_back", "health check failed")
    engine.tick()
    assert engine.status(rid).state == RolloutState.ABORTED and recorder.reverts == []
    _report(engine, rid, [first])  # its commit, written after the abort
    engine.tick()
    assert recorder.reverts == [first]
    assert {t.device_id: t.status for t in engine.status(rid).targets}[first] == TargetStatus.REVERTING


def test_a_target_never_sent_again_gets_one_more_try_before_it_times_out(fleet):
    """A command lost with a broker restart, or a commit lost with a dead replica's queue, costs a re-send, not a
    failure: while reports keep coming no re-send round runs, so the timeout itself tries once more first."""
    db, clock, recorder, engine = fleet
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.2, waves=(1.0,), deploy_timeout_s=30,
                                                                 max_failure_rate=0.9))
    engine.tick()
    first, second = recorder.stages[0][1]
    clock.now += 31
    engine._progress[rid] = (2, clock.now)  # reports keep coming: no re-send round
    engine._last_round[rid] = clock.now
    engine.tick()
    assert sorted(recorder.resent) == sorted([first, second]), "each gets a last try before it would time out"
    assert engine.status(rid).count(TargetStatus.TIMEOUT) == 0
    _report(engine, rid, [first])  # the last try reached it
    clock.now += 2 * engine.resend_s + 0.5
    engine.tick()
    statuses = {t.device_id: t.status for t in engine.status(rid).targets}
    assert statuses[first] == TargetStatus.COMMITTED and statuses[second] == TargetStatus.TIMEOUT


def test_a_silent_device_times_out_and_an_unrevertable_one_is_marked(fleet):
    db, clock, _, _ = fleet
    recorder = Recorder(unrevertable={f"cam{i}" for i in range(10)})
    engine = RolloutEngine(db, recorder, clock, resend_s=3.0)
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.2, waves=(1.0,),
                                                                 max_failure_rate=0.0, deploy_timeout_s=300))
    engine.tick()
    committed, silent = recorder.stages[0][1]
    _report(engine, rid, [committed])
    clock.now += 299
    engine.tick()
    assert engine.status(rid).state == RolloutState.RUNNING
    clock.now += 2
    engine.tick()
    assert engine.status(rid).state == RolloutState.RUNNING, "timed out without a try since its last send"
    clock.now += 2 * engine.resend_s  # the last try (a re-send) goes unanswered too
    engine.tick()
    r = engine.status(rid)
    statuses = {t.device_id: (t.status, t.reason) for t in r.targets}
    assert r.state == RolloutState.ABORTED
    assert statuses[silent] == (TargetStatus.TIMEOUT, "no report in 300 s")
    assert statuses[committed][0] == TargetStatus.REVERT_FAILED and "not in the repository" in statuses[committed][1]
    clock.now += engine.resend_s
    engine.tick()
    assert recorder.finished == [rid]


def test_the_engine_is_idle_only_with_no_rollout_to_drive_and_no_revert_to_finish(fleet):
    """The server ticks once a release pass while the engine is idle, five times as often otherwise."""
    db, clock, recorder, engine = fleet
    engine.tick()
    assert engine.idle, "nothing runs"
    rid, first, _ = _aborted_with_one_commit(engine, recorder)
    engine.tick()  # the rollout is over; its revert is not
    assert recorder.reverts == [first] and not engine.idle, "a revert is unanswered: the engine chases it"
    engine.on_event(first, "committed", f"{rid}-rollback", None)  # the device went back: the revert is answered
    engine.tick()
    assert engine.idle, "every revert answered"
    engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.2, waves=(1.0,)))
    engine.tick()
    assert not engine.idle, "it drives a rollout"


def test_refusals_up_front(fleet):
    db, _, _, engine = fleet
    with pytest.raises(ConflictError, match="already installed on all 10"):
        engine.start("digits", "1.0.0", "cams")
    engine.start("digits", "2.0.0", "cams")
    with pytest.raises(ConflictError, match="already has rollout"):
        engine.start("digits", "3.0.0", "cams")
    with pytest.raises(ConflictError, match="group 'nowhere' has no device; provision its devices"):
        engine.start("digits", "2.0.0", "nowhere")


def test_a_push_to_devices_only_provisioned_is_planned_over_them_and_canaries_the_first_to_report(fleet):
    """Issue 58: a push to a group none of whose devices reported yet no longer completes empty as the release (each
    device then got it with no stage): it is planned over the provisioned devices, all deferred, and the first device
    to report is the canary, whichever stage it was planned in; the next ones wait for their stage."""
    db, clock, recorder, engine = fleet
    db.provision({f"door{i}": "doors" for i in range(4)}, "devices file")
    # Judged (the default): a canary none of whose devices could be sent waits for them instead of settling empty.
    rollout_id = engine.start("digits", "2.0.0", "doors", RolloutPolicy(canary=0.25, waves=(1.0,), health_window_s=0.0))
    for _ in range(3):
        engine.tick()
        clock.now += 1.0
    r = engine.status(rollout_id)
    assert r.state == RolloutState.RUNNING and r.stage_sizes == (1, 4) and r.targets_total == 4, r
    assert (r.stage, r.count(TargetStatus.DEFERRED), r.count(TargetStatus.PENDING)) == (0, 1, 3)
    assert recorder.stages == [] and db.release("doors") is None, "nothing sent, and no release set on nothing"
    first, second = [t.device_id for t in r.targets if t.stage == 1][:2]
    db.upsert_device(first, "doors", "online", "digits", "1.0.0", ["digits-1.0.0"])  # its first report
    clock.now += engine.reconcile_s
    engine.tick()
    assert recorder.late == [(first, 0)], "the first device back is the canary"
    (target,) = [t for t in engine.status(rollout_id).targets if t.device_id == first]
    assert (target.stage, target.status, target.previous_version) == (0, TargetStatus.SENT, "1.0.0"), target
    db.upsert_device(second, "doors", "online", "digits", "1.0.0", ["digits-1.0.0"])
    clock.now += engine.reconcile_s
    engine.tick()
    assert recorder.late == [(first, 0)], "the canary has the one device it planned: the next waits for stage 2"
    assert engine.status(rollout_id).state == RolloutState.RUNNING


def test_a_manual_rollout_waits_for_promote(fleet):
    db, clock, recorder, engine = fleet
    rid = engine.start("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.1, waves=(1.0,), health_window_s=0,
                                                                 auto_promote=False))
    engine.tick()
    _report(engine, rid, recorder.stages[0][1])
    for _ in range(5):
        clock.now += 3600
        engine.tick()
    assert [s for s, _ in recorder.stages] == [0] and engine.status(rid).state == RolloutState.RUNNING
    engine.promote(rid)
    assert [s for s, _ in recorder.stages] == [0, 1]
