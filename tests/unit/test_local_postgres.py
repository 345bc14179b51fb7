"""LocalPostgres: a real PostgreSQL on loopback for the fleet-store tests and the benchmarks."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server import postgres
from edgesdk.ota_server.postgres import LocalPostgres


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def test_starts_serves_two_separate_databases_and_stops(tmp_path):
    if postgres.postgres_bindir() is None:
        pytest.skip(f"PostgreSQL is not installed: `{postgres.INSTALL_HINT}`")
    with LocalPostgres(tmp_path / "pg", durable=False) as pg:
        assert pg.url == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
        first, second = pg.create_database("first_db"), pg.create_database("second_db")
        assert first.endswith("/first_db") and second.endswith("/second_db")
        with psycopg.connect(first, autocommit=True) as connection:
            connection.execute("CREATE TABLE devices (id text PRIMARY KEY)")
            connection.execute("INSERT INTO devices VALUES ('d1')")
            assert connection.execute("SELECT current_database(), current_user").fetchone() == ("first_db", "postgres")
            assert connection.execute("SHOW fsync").fetchone() == ("off",)
            assert connection.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        with psycopg.connect(second) as connection:
            found = connection.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'devices'").fetchone()
            assert found == (0,)
        process = pg.process
        assert process is not None and process.poll() is None
        if os.geteuid() == 0:
            assert _uid_of(process.pid) == postgres._system_user()[0]  # PostgreSQL refuses root
    assert process.returncode is not None, "leaving the context stops the server"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(first, connect_timeout=2)


def test_the_session_fixture_gives_each_test_its_own_empty_database(postgres_url, postgres_server):
    assert postgres_url.startswith(f"postgresql://postgres@127.0.0.1:{postgres_server.port}/t")
    with psycopg.connect(postgres_url) as connection:
        name = connection.execute("SELECT current_database()").fetchone()[0]
        assert "the_session_fixture" in name
        assert connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_a_database_name_that_is_not_an_identifier_is_refused(postgres_server):
    with pytest.raises(EdgeSDKError, match=r"'fleet; DROP' is not a plain identifier; use up to 63 lower-case"):
        postgres_server.create_database("fleet; DROP")


def test_missing_binaries_name_the_apt_command(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "postgres_bindir", lambda: None)  # this machine has them; pretend it does not
    with pytest.raises(EdgeSDKError, match=r"PostgreSQL is not installed .*`apt-get install -y postgresql`"):
        LocalPostgres(tmp_path / "pg")
    assert not (tmp_path / "pg").exists(), "nothing is created before the binaries are found"
