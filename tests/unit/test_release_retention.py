"""Issue 58: the server's repository retention (``apply_policy(in_use=OTAServer._in_use())``) never deletes a group's
current or previous release, a running rollout's version or its targets' previous versions (an abort reverts to
them), nor a release whose late targets are in flight. A real fleet store (SQLite and PostgreSQL), a repository of
bundle directories on disk, a fake clock and a recording dispatcher."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.server import OTAServer
from edgesdk.ota_server.store.fleet_db import FleetDB
from tests.unit.test_reconciler import _commit, _settle
from tests.unit.test_rollout_engine import Clock, Recorder

#: One stage to the whole group, analysis off; a device that fails does not abort it (one of two).
ONE_STAGE = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0, analysis=False, max_failure_rate=0.5)


def _repository(root, versions) -> ModelRepository:
    """digits at ``versions``, each an artifact directory with a manifest (all retention looks at), keeping the
    newest one alone by age."""
    for version in versions:
        artifact = root / "digits" / version / "generic-x86_64"
        artifact.mkdir(parents=True)
        (artifact / "manifest.json").write_text(json.dumps({"name": "digits", "version": version}))
    return ModelRepository(root, keep_latest=1)


def _in_use(db) -> set[tuple[str, str]]:
    return OTAServer._in_use(SimpleNamespace(db=db))  # what upload() hands to apply_policy


@pytest.fixture
def fleet(fleet_location):
    db = FleetDB(fleet_location)
    clock, recorder = Clock(), Recorder()
    yield db, clock, recorder, RolloutEngine(db, recorder, clock, resend_s=3.0)
    db.close()


def _run(engine, clock, recorder, group, version, commit, fail=(), policy=ONE_STAGE):
    """Push ``version`` to ``group``; ``commit`` commit it, ``fail`` fail it, until the rollout ends; its id."""
    rid = engine.start("digits", version, group, policy)
    for _ in range(12):
        engine.tick()
        _commit(engine, rid, commit)
        _commit(engine, rid, fail, "failed", "busy")
        clock.now += 1.5
        if engine.status(rid, targets=False).state != RolloutState.RUNNING:
            break
    assert engine.status(rid, targets=False).state == RolloutState.COMPLETED
    return rid


def test_a_groups_release_and_the_one_before_are_kept_though_no_device_runs_them(fleet, tmp_path):
    db, clock, recorder, engine = fleet
    db.upsert_device("cam0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    for version in ("2.0.0", "3.0.0"):
        _run(engine, clock, recorder, "cams", version, ["cam0"])
        db.upsert_device("cam0", "cams", "online", "digits", version, [f"digits-{version}"])
    db.upsert_device("cam0", "cams", "online", "digits", "4.0.0", ["digits-4.0.0"])  # hand-installed, say
    repo = _repository(tmp_path / "repo", ["1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0"])
    assert {("digits", "3.0.0"), ("digits", "2.0.0")} <= _in_use(db)
    assert sorted(repo.apply_policy(in_use=_in_use(db))) == [("digits", "1.0.0")]
    assert repo.versions("digits") == ["2.0.0", "3.0.0", "4.0.0", "5.0.0"]


def test_a_running_rollouts_version_and_its_targets_previous_versions_are_kept_until_the_reverts_end(fleet):
    db, clock, recorder, engine = fleet
    db.upsert_device("gate0", "gates", "online", "digits", "1.0.0", ["digits-1.0.0"])
    db.upsert_device("gate1", "gates", "online", "digits", "2.0.0", ["digits-2.0.0"])
    canary = RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=3600, analysis=False)
    rid = engine.start("digits", "3.0.0", "gates", canary)
    assert ("digits", "3.0.0") in _in_use(db), "the version being sent, though no device runs it yet"
    engine.tick()
    ((_, (first,)),) = recorder.stages
    before = "1.0.0" if first == "gate0" else "2.0.0"
    _commit(engine, rid, [first])
    db.upsert_device(first, "gates", "online", "digits", "3.0.0", ["digits-3.0.0"])  # nobody runs `before` now
    assert {("digits", "3.0.0"), ("digits", before)} <= _in_use(db), "the running version and the canary's revert"
    engine.abort(rid)
    assert engine.status(rid).count(TargetStatus.REVERTING) == 1 and ("digits", before) in _in_use(db)
    db.upsert_device(first, "gates", "online", "digits", before, [f"digits-{before}"])
    engine.on_event(first, "committed", f"{rid}-rollback", None)  # the revert answered
    db.upsert_device(first, "gates", "online", "digits", "9.0.0", ["digits-9.0.0"])
    assert ("digits", before) not in _in_use(db) and ("digits", "3.0.0") not in _in_use(db), "nothing needs them"


def test_a_superseded_release_with_a_late_target_in_flight_is_kept(fleet, tmp_path):
    db, clock, recorder, engine = fleet
    db.upsert_device("door0", "lobby", "online", "digits", "1.0.0", ["digits-1.0.0"])
    db.upsert_device("door1", "lobby", "offline", "digits", "1.0.0", ["digits-1.0.0"])
    two = _run(engine, clock, recorder, "lobby", "2.0.0", ["door0"])
    db.upsert_device("door0", "lobby", "online", "digits", "2.0.0", ["digits-2.0.0"])
    db.upsert_device("door1", "lobby", "online", "digits", "1.0.0", ["digits-1.0.0"])  # back: sent 2.0.0 late
    _settle(engine, clock, 1)
    engine.on_event("door1", "accepted", two, None)  # downloading 2.0.0 when the next releases come
    for version in ("3.0.0", "4.0.0"):
        _run(engine, clock, recorder, "lobby", version, ["door0"], fail=["door1"])
        db.upsert_device("door0", "lobby", "online", "digits", version, [f"digits-{version}"])
    assert db.late_in_flight(two) == 1 and db.release("lobby").version == "4.0.0"
    repo = _repository(tmp_path / "repo", ["1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0"])
    assert repo.apply_policy(in_use=_in_use(db)) == [], "2.0.0 is on its way to door1"
    engine.on_event("door1", "committed", two, None)
    db.upsert_device("door1", "lobby", "online", "digits", "4.0.0", ["digits-4.0.0"])
    assert repo.apply_policy(in_use=_in_use(db)) == [("digits", "1.0.0"), ("digits", "2.0.0")]
