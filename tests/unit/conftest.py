"""Fixtures of the unit tests: the fleet store on both databases it runs on."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_location(request, tmp_path) -> str:
    """Where a FleetDB lives: a SQLite file, then a fresh PostgreSQL database (the same tests run on both)."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    return str(request.getfixturevalue("postgres_url"))
