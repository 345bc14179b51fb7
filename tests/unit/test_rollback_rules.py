"""Issue 58, a rollback you can trust: the rules on plain data (no store), then through the engine on a real fleet
store (SQLite and PostgreSQL) with a fake clock and a recording dispatcher: what is refused changes nothing, what is
allowed is staged with the rolled-back rollout's policy, or sent all at once without analysis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.analysis.rollback_rules import (
    GroupHistory,
    all_at_once_policy,
    may_go_to,
    plan_rollback,
    rollback_refusal,
)
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.ota_server.store.sql import MIGRATIONS, PostgresDatabase, SQLiteDatabase
from tests.unit.test_reconciler import _commit

POLICY = RolloutPolicy(canary=0.2, waves=(0.5, 1.0), health_window_s=30, deploy_timeout_s=120)
#: The group ran 1.0.0, then 2.0.0, was rolled back to 1.0.0, then took 3.0.0 (its release, rollout r4).
HISTORY = GroupHistory("cams", "digits", ("1.0.0", "2.0.0", "1.0.0", "3.0.0"), "r4", "3.0.0")


def _rollout(rollout_id="r4", version="3.0.0", state=RolloutState.COMPLETED, **counts: int) -> RolloutRecord:
    return RolloutRecord(rollout_id, "digits", version, "cams", POLICY, state, 2, None, None, None, 0.0, 0.0, False,
                         counts={TargetStatus(k): v for k, v in (counts or {"committed": 10}).items()})


def test_without_a_version_it_goes_to_the_one_the_group_ran_just_before_staged_with_the_same_policy():
    plan = plan_rollback(_rollout(), HISTORY)
    assert (plan.version, plan.undoes, plan.policy, plan.all_at_once) == ("1.0.0", "3.0.0", POLICY, False)
    assert may_go_to(HISTORY, "3.0.0") == ["1.0.0", "2.0.0"], "the most recent first, not the highest"
    assert plan_rollback(_rollout(), HISTORY, "2.0.0").version == "2.0.0"


@pytest.mark.parametrize("to, says", [
    ("9.9.9", "group 'cams' never ran digits 9.9.9: a rollback goes only to a version the group ran; it may go to "
              "digits 1.0.0, 2.0.0"),
    ("3.0.0", "digits 3.0.0 is the version group 'cams' runs now (rollout r4): a rollback goes to an older one; it "
              "may go to digits 1.0.0, 2.0.0"),
])
def test_a_version_never_run_or_the_one_running_is_refused_naming_the_versions_it_may_go_to(to, says):
    with pytest.raises(ConflictError) as refused:
        plan_rollback(_rollout(), HISTORY, to)
    assert str(refused.value) == says
    assert rollback_refusal(_rollout(), HISTORY, to) == says, "the console's words are the API's"


def test_a_newer_version_is_refused_even_one_the_group_ran():
    rolled_back = GroupHistory("cams", "digits", ("1.0.0", "3.0.0", "2.0.0"), "r5", "2.0.0")
    with pytest.raises(ConflictError, match=r"digits 3.0.0 is newer than 2.0.0, the version group 'cams' runs now: "
                                            r"a rollback never goes forward .* it may go to digits 1.0.0$"):
        plan_rollback(_rollout("r5", "2.0.0"), rolled_back, "3.0.0")


def test_a_version_the_repository_no_longer_holds_is_refused_and_never_offered():
    stored = {"2.0.0", "3.0.0"}.__contains__
    with pytest.raises(ConflictError, match="digits 1.0.0 is no longer in the repository .* it may go to digits "
                                            "2.0.0$"):
        plan_rollback(_rollout(), HISTORY, "1.0.0", stored=stored)
    assert plan_rollback(_rollout(), HISTORY, stored=stored).version == "2.0.0"


def test_nothing_older_to_go_to_is_refused():
    first = GroupHistory("cams", "digits", ("1.0.0",), "r1", "1.0.0")
    with pytest.raises(ConflictError, match="it ran no version of digits older than 1.0.0"):
        plan_rollback(_rollout("r1", "1.0.0"), first)


def test_what_it_undoes_a_running_rollout_the_release_or_an_aborted_one_with_devices_left_on_it():
    running = _rollout("r6", "4.0.0", RolloutState.RUNNING)
    assert plan_rollback(running, HISTORY).version == "3.0.0", "back to the release"
    superseded = _rollout("r2", "2.0.0")
    with pytest.raises(ConflictError, match=r"rollout r2 \(digits 2.0.0\) is no longer group 'cams'.s release: the "
                                            r"group moved on to digits 3.0.0 \(rollout r4\).*it may go to digits "
                                            r"1.0.0, 2.0.0\)$"):
        plan_rollback(superseded, HISTORY, "1.0.0")
    reverted = _rollout("r7", "4.0.0", RolloutState.ABORTED, reverted=2, skipped=8)
    with pytest.raises(ConflictError, match="was aborted and its updated devices were sent back .* nothing to undo"):
        plan_rollback(reverted, HISTORY)
    stuck = _rollout("r7", "4.0.0", RolloutState.ABORTED, reverted=1, revert_failed=1, skipped=8)
    assert plan_rollback(stuck, HISTORY).version == "3.0.0"


def test_all_at_once_sends_to_every_device_in_one_stage_without_analysis_keeping_the_timeouts():
    plan = plan_rollback(_rollout(), HISTORY, "2.0.0", all_at_once=True)
    assert plan.all_at_once and plan.policy == all_at_once_policy(POLICY)
    assert (plan.policy.stages, plan.policy.health_window_s, plan.policy.analysis) == ((1.0,), 0.0, False)
    assert plan.policy.deploy_timeout_s == 120 and plan.policy.max_failure_rate == POLICY.max_failure_rate
    with pytest.raises(ConflictError, match="never ran digits 9.9.9"):
        plan_rollback(_rollout(), HISTORY, "9.9.9", all_at_once=True)


# --- through the engine, on a real store ------------------------------------------------------------------------

#: Two stages, analysis off (these devices report no traffic).
STAGED = RolloutPolicy(canary=0.2, waves=(1.0,), health_window_s=0, analysis=False)


def _run(engine, clock, recorder, rollout_id):
    """Tick, committing every device sent anything, until the rollout is over; the rollout."""
    for _ in range(40):
        engine.tick()
        _commit(engine, rollout_id, [d for _, devices in recorder.stages for d in devices])
        clock.now += 1.5
        if engine.status(rollout_id, targets=False).state != RolloutState.RUNNING:
            break
    return engine.status(rollout_id)


def _all_on(db, version):
    for i in range(7):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", version, [f"digits-{version}"])


def test_the_release_history_records_what_the_group_ran_before_and_every_release(ten_cams):
    db, clock, recorder, engine = ten_cams
    first = _run(engine, clock, recorder, engine.start("digits", "2.0.0", "cams", STAGED))
    _all_on(db, "2.0.0")
    aborted = engine.start("digits", "3.0.0", "cams", STAGED)
    engine.abort(aborted)
    second = _run(engine, clock, recorder, engine.start("digits", "2.1.0", "cams", STAGED))
    history = db.group_history("cams", "digits")
    assert history.ran == ("1.0.0", "2.0.0", "2.1.0"), "before the first, then each completed release (not 3.0.0)"
    assert (history.release_rollout, history.release_version) == (second.id, "2.1.0")
    assert first.state == RolloutState.COMPLETED and db.group_history("lobby", "digits").ran == ()


def test_a_refused_rollback_changes_nothing_and_names_the_versions_it_may_go_to(ten_cams):
    db, clock, recorder, engine = ten_cams
    _run(engine, clock, recorder, engine.start("digits", "2.0.0", "cams", STAGED))
    _all_on(db, "2.0.0")
    running = engine.start("digits", "3.0.0", "cams", STAGED)
    engine.tick()
    for to, says in (("9.9.9", "group 'cams' never ran digits 9.9.9"),
                     ("3.0.0", "digits 3.0.0 is the version group 'cams' runs now"),
                     ("4.0.0", "group 'cams' never ran digits 4.0.0")):
        with pytest.raises(ConflictError, match=says) as refused:
            engine.rollback(running, to)
        assert str(refused.value).endswith("it may go to digits 2.0.0, 1.0.0"), refused.value
    assert engine.status(running).state == RolloutState.RUNNING, "a refused rollback aborts nothing"
    assert len(db.rollouts()) == 2, "and starts nothing"


def test_a_newer_version_the_group_ran_is_refused_through_the_engine(ten_cams):
    db, clock, recorder, engine = ten_cams
    first = _run(engine, clock, recorder, engine.start("digits", "2.0.0", "cams", STAGED))
    _all_on(db, "2.0.0")
    back = _run(engine, clock, recorder, engine.rollback(first.id, "1.0.0"))
    assert back.state == RolloutState.COMPLETED and db.release("cams").version == "1.0.0"
    _all_on(db, "1.0.0")
    with pytest.raises(ConflictError, match="digits 2.0.0 is newer than 1.0.0, the version group 'cams' runs now"):
        engine.rollback(back.id, "2.0.0")


def test_an_allowed_rollback_is_staged_with_the_rollouts_policy_and_all_at_once_is_one_stage_without_analysis(ten_cams):
    db, clock, recorder, engine = ten_cams
    pushed = replace(STAGED, max_p99_ratio=2.0, deploy_timeout_s=77)  # analysis off: these devices report no traffic
    release = _run(engine, clock, recorder, engine.start("digits", "2.0.0", "cams", pushed))
    assert release.state == RolloutState.COMPLETED, release
    _all_on(db, "2.0.0")
    staged = engine.rollback(release.id)  # to 1.0.0, what the group ran before
    r = engine.status(staged, targets=False)
    assert (r.version, r.rollback, r.stage_sizes, r.policy) == ("1.0.0", True, (2, 7), pushed)
    engine.abort(staged)
    emergency = engine.rollback(release.id, "1.0.0", all_at_once=True)
    r = engine.status(emergency, targets=False)
    assert (r.stage_sizes, r.policy.analysis, r.policy.health_window_s) == ((7,), False, 0.0)
    assert [e.payload for e in db.events(release.id) if e.type == "rollback_planned"][-1] == {
        "to": "1.0.0", "undoes": "2.0.0", "all_at_once": True}


def test_the_migration_fills_the_history_of_a_store_written_before_it(fleet_location):
    """A store at schema 13 with completed rollouts gets their releases, and each group's version before its first
    rollout (most of its targets' previous version), when it is opened by this server."""
    if fleet_location.startswith("postgres"):
        database = PostgresDatabase(fleet_location)
    else:
        database = SQLiteDatabase(fleet_location)
    try:
        database._run("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                      f"applied {'DOUBLE PRECISION' if database.dialect == 'postgresql' else 'REAL'} NOT NULL)", ())
        types = {"sqlite": {"real": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "now_ms": "0"},
                 "postgresql": {"real": "DOUBLE PRECISION", "serial": "BIGSERIAL PRIMARY KEY", "now_ms": "0"}}
        for version, description, statements in MIGRATIONS[:13]:
            for statement in statements:
                database._run(statement.format(**types[database.dialect]), ())
            database._run("INSERT INTO schema_version VALUES (?, ?, 0)", (version, description))
        rollout = ("INSERT INTO rollouts (id, model, version, grp, policy, state, wave, created, updated) "
                   "VALUES (?, 'digits', ?, 'cams', '{}', ?, 1, ?, ?)")
        database._run(rollout, ("r1", "2.0.0", "completed", 10.0, 20.0))
        database._run(rollout, ("r2", "3.0.0", "aborted", 30.0, 40.0))
        database._run(rollout, ("r3", "2.5.0", "completed", 50.0, 60.0))
        for device, previous in (("cam0", "1.0.0"), ("cam1", "1.0.0"), ("cam2", "0.9.0")):
            database._run("INSERT INTO targets (rollout_id, device_id, wave, status, previous_version, updated) "
                          "VALUES ('r1', ?, 0, 'committed', ?, 20.0)", (device, previous))
    finally:
        database.close()
    db = FleetDB(fleet_location)
    try:
        assert db.group_history("cams", "digits").ran == ("1.0.0", "2.0.0", "2.5.0")
    finally:
        db.close()
