"""Fixtures of the unit tests: the fleet store on both databases it runs on, and ten cameras in it."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_location(request, tmp_path) -> str:
    """Where a FleetDB lives: a SQLite file, then a fresh PostgreSQL database (the same tests run on both)."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def ten_cams(fleet_location):
    """cam0-cam9 of group cams on digits 1.0.0 (cam7-cam9 offline) in a fleet store, a fake clock, a recording
    dispatcher and a rollout engine over them: ``(db, clock, recorder, engine)``."""
    from edgesdk.ota_server.rollouts.engine import RolloutEngine
    from edgesdk.ota_server.store.fleet_db import FleetDB
    from tests.unit.test_reconciler import _ten_cams
    from tests.unit.test_rollout_engine import Clock, Recorder

    db = FleetDB(fleet_location)
    _ten_cams(db)
    clock, recorder = Clock(), Recorder()
    yield db, clock, recorder, RolloutEngine(db, recorder, clock, resend_s=3.0)
    db.close()
