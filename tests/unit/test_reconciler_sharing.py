"""Issue 60: what the reconciler shares and what it lets go of. The catch-up room between groups (in turn, equal
shares, what is left going round again), a superseded release's late targets closed, and the state kept for
rollouts no longer driven or leased here forgotten. A real fleet store (SQLite and PostgreSQL), a fake clock and
a dispatcher that records; tests/unit/test_reconciler.py has the reconciler's other rules."""

from __future__ import annotations

from edgesdk.fleet.records import TargetStatus
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import FleetDB
from tests.unit.test_reconciler import FAST, ONE_STAGE, _commit, _complete, _settle
from tests.unit.test_rollout_engine import Clock, Recorder


def test_what_the_reconciler_keeps_for_a_release_goes_when_the_release_is_superseded(ten_cams):
    """Issue 60: its chase times and failure counts were kept by rollout id for the server's life."""
    db, clock, recorder, engine = ten_cams
    first = _complete(db, clock, recorder, engine)
    for i in (7, 8, 9):
        db.upsert_device(f"cam{i}", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    _commit(engine, first, ["cam7", "cam8", "cam9"], "rolled_back", "health check failed")
    _settle(engine, clock, 4)
    assert first in engine.reconciler._chased and first in engine.reconciler._failed_seen
    second = _complete(db, clock, recorder, engine, version="3.0.0")
    _settle(engine, clock, 4)
    assert set(engine.reconciler._chased) | set(engine.reconciler._failed_seen) <= {second}
    assert first not in engine.reconciler.releases


def test_the_catch_up_room_is_shared_between_groups_not_spent_in_group_order(fleet_location):
    """Issue 60: a backlog in group "a" (alphabetically first) took the whole cap, starving group "b" behind it.
    With a cap of 4, twelve of a's devices and two of b's returning at once: b's two go in the first pass."""
    db = _two_groups(fleet_location, {"a": 12, "b": 2})
    clock, recorder, engine = _two_groups_released(db)
    for group, count in (("a", 12), ("b", 2)):
        for i in range(1, count + 1):
            db.upsert_device(f"{group}{i}", group, "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 2)
    sent = [d for d, _ in recorder.late]
    assert len(sent) == 4 and sorted(d for d in sent if d.startswith("b")) == ["b1", "b2"], sent
    db.close()


def test_late_targets_of_a_superseded_release_are_closed_once_the_deploy_timeout_passes(ten_cams):
    """Issue 60: a late target of release R1 still in flight when R2 was pushed was never timed out or deferred: it
    held catch-up room for good and kept the engine from going idle."""
    db, clock, recorder, engine = ten_cams
    first = _complete(db, clock, recorder, engine)
    db.upsert_device("cam8", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])  # back: a late target of R1
    db.upsert_device("cam9", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    _settle(engine, clock, 1)
    assert db.late_in_flight(first) == 2
    second = _complete(db, clock, recorder, engine, version="3.0.0")
    db.upsert_device("cam9", "cams", "offline", "digits", "1.0.0", ["digits-1.0.0"])  # gone again
    _settle(engine, clock, 2)
    statuses = {t.device_id: t for t in engine.status(first).targets if t.late}
    assert statuses["cam9"].status == TargetStatus.DEFERRED and statuses["cam8"].status == TargetStatus.SENT
    clock.now += FAST.deploy_timeout_s
    _settle(engine, clock, 2)
    cam8 = next(t for t in engine.status(first).targets if t.device_id == "cam8")
    assert cam8.status == TargetStatus.TIMEOUT and "superseded" in cam8.reason
    assert db.late_in_flight(first) == 0 and db.release("cams").rollout_id == second
    assert db.work().late_in_flight == 0, "nothing of R1 holds catch-up room or keeps the engine busy"


def test_a_group_catching_up_alone_gets_the_whole_room_whatever_its_turn(fleet_location):
    """Issue 60 (found by the fairness benchmark): shared in one round, the room went in equal shares to every
    group with a release, busy or not, so a group catching up alone got half the cap beside one idle group."""
    db = _two_groups(fleet_location, {"a": 0, "b": 12})
    clock, recorder, engine = _two_groups_released(db)
    for i in range(1, 13):  # b's twelve come back together
        db.upsert_device(f"b{i}", "b", "online", "digits", "1.0.0", ["digits-1.0.0"])
    for turn in range(3):  # one pass each, the first group of the pass alternating between a and b
        before = len(recorder.late)
        _settle(engine, clock, 1)
        assert len(recorder.late) - before == 4 and db.late_in_flight() == 4, (turn, recorder.late)
        _commit(engine, db.release("b").rollout_id, [d for d, _ in recorder.late[before:]])
    assert sorted(d for d, _ in recorder.late) == sorted(f"b{i}" for i in range(1, 13))
    db.close()


def _two_groups(fleet_location, away: dict[str, int]) -> FleetDB:
    """Groups with one online device each (``a0``, ``b0``...) and ``away[group]`` offline ones, on digits 1.0.0."""
    db = FleetDB(fleet_location)
    for group, count in away.items():
        for i in range(count + 1):
            db.upsert_device(f"{group}{i}", group, "offline" if i else "online", "digits", "1.0.0", ["digits-1.0.0"])
    return db


def _two_groups_released(db: FleetDB) -> tuple[Clock, Recorder, RolloutEngine]:
    """An engine with a catch-up cap of 4 that pushed 2.0.0 to groups a and b (each completed: its release)."""
    clock, recorder = Clock(), Recorder()
    engine = RolloutEngine(db, recorder, clock, max_catch_up=4)
    for group in ("a", "b"):
        _complete(db, clock, recorder, engine, policy=ONE_STAGE, group=group)
    return clock, recorder, engine
