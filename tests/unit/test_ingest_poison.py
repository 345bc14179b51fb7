"""Ingest keeps flowing (issue 36): a report the store itself refuses is isolated and dropped, the rest written;
only a lost connection keeps a batch for another try. Refusals are counted by kind and reason and logged once per
device and period."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

import pytest

from edgesdk.errors import ReportError
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.devices.ingest import DeviceEvent, Ingest, connection_error, data_error, split_budget
from edgesdk.ota_server.devices.report_reader import ReportReader
from edgesdk.ota_server.store.fleet_db import DeviceState, EventRow, FleetDB
from tests.ota.conftest import wait_for
from tests.unit.test_server_metrics import samples, series


def _state(device: str, version: str = "1.0.0", **fields) -> DeviceState:
    return DeviceState(device, "lab", "online", fields.pop("model", "digits"), version, (), time.time(), **fields)


def test_rows_the_store_refuses_are_split_out_of_their_batch_and_the_rest_written(fleet_location):
    db = FleetDB(fleet_location)
    dropped: list[tuple[str, str, str]] = []
    # The writer lingers for more reports until a flush hurries it: each flush below writes what was queued as one
    # batch, however the threads are scheduled (holding the store instead let a loaded CI host's writer take cam0
    # alone before the rest were queued).
    ingest = Ingest(db, on_dropped=lambda device, kind, exc: dropped.append((device, kind, type(exc).__name__)),
                    linger_s=60.0)
    try:
        ingest.put(_state("warm"))
        assert ingest.flush(hurry=True)
        ingest.put(_state("cam0"))
        ingest.put(_state("evil1", model={"x": 1}))  # a value the store cannot bind
        for i in range(20):
            ingest.put(DeviceEvent(EventRow("progress", {"n": i}, "cam0", None, time.time()), None))
        ingest.put(_state("evil2", root_version=2**70))  # overflows the column
        ingest.put(_state("cam1", "2.0.0"))
        ingest.put(DeviceEvent(EventRow("bad", {"unjsonable": {1, 2}}, "evil3", None, time.time()), None))
        ingest.put(_state("cam0", "2.0.0"))
        assert ingest.flush(hurry=True), "the writer is stuck on a poisoned batch"
        assert ingest.batches == 2
        assert (db.device("cam0").version, db.device("cam1").version) == ("2.0.0", "2.0.0")
        assert db.device("evil1") is None and db.device("evil2") is None
        assert len([r for r in db.events(device_id="cam0") if r.type == "progress"]) == 20
    finally:
        ingest.stop()
        db.close()
    assert sorted(d[:2] for d in dropped) == [("evil1", "state"), ("evil2", "state"), ("evil3", "event")]
    assert ingest.dropped == 3 and ingest.written == 1 + 23 and ingest.retries == 0


def test_connection_errors_are_told_from_data_errors(tmp_path):
    closed = sqlite3.connect(str(tmp_path / "x.db"))
    closed.close()
    with pytest.raises(sqlite3.ProgrammingError) as on_closed:
        closed.execute("SELECT 1")
    assert connection_error(on_closed.value)
    live = sqlite3.connect(str(tmp_path / "y.db"))
    with pytest.raises((sqlite3.ProgrammingError, sqlite3.InterfaceError)) as binding:
        live.execute("SELECT ?", ({"x": 1},))
    assert not connection_error(binding.value)
    with pytest.raises(OverflowError) as overflow:
        live.execute("SELECT ?", (2**70,))
    assert not connection_error(overflow.value)
    live.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(str(tmp_path / "y.db"), timeout=0)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("BEGIN EXCLUSIVE")
    assert connection_error(locked.value)
    try:
        raise RuntimeError("wrapped") from locked.value
    except RuntimeError as wrapped:
        assert connection_error(wrapped)


def test_a_database_restart_keeps_the_batch_and_it_is_written_once_the_database_is_back(tmp_path):
    from edgesdk.ota_server.postgres import LocalPostgres, postgres_bindir

    if postgres_bindir() is None:
        pytest.skip("PostgreSQL is not installed")
    with LocalPostgres(tmp_path / "pg", durable=False) as server:
        db = FleetDB(server.url)
        dropped: list = []
        ingest = Ingest(db, retry_s=0.2, on_dropped=lambda *a: dropped.append(a))
        try:
            ingest.put(_state("cam0"))
            assert ingest.flush()
            old = server.process
            restart = threading.Thread(target=server.restart, kwargs={"down_s": 2.0})
            restart.start()
            wait_for(lambda: old.poll() is not None, what="PostgreSQL down")
            for i in range(50):  # written while the database is down: kept, tried again, written once it is back
                ingest.put(_state(f"cam{i}", "2.0.0"))
            restart.join()
            assert ingest.flush(timeout=60)
        finally:
            ingest.stop()
        assert dropped == [] and ingest.retries >= 1
        assert all(db.device(f"cam{i}").version == "2.0.0" for i in range(50))
        db.close()


def test_refusals_are_counted_by_kind_and_reason_and_logged_once_per_device_and_period(tmp_path, caplog):
    metrics = ServerMetrics(FleetDB(str(tmp_path / "fleet.db")))
    now = [1000.0]
    reader = ReportReader(metrics.report_refused, period_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="edgesdk.ota_server.server"):
        for _ in range(195):
            assert reader.state("edgesdk/devices/evil/state", b'{"status": "online", "model": {"x": 1}}') is None
            now[0] += 0.01
        assert reader.event("edgesdk/devices/evil/events", b"not json") is None
        assert reader.need("edgesdk/devices/cam9/need", b'{"transfer_id": "t", "chunks": [-1]}') is None
        assert reader.oversize("edgesdk/devices/evil/state", b"x" * (64 * 1024 + 1))
        reader.refuse("evil", "measurement", ReportError("bad figures", reason="range", field="figures.p"))
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2, lines  # one per device and period, however many it sends
        assert "malformed state from device evil" in lines[0] and "(reason type, field model)" in lines[0]
        assert "cam9" in lines[1] and "reason range, field chunks" in lines[1]
        now[0] += 60
        assert reader.state("edgesdk/devices/evil/state", b'{"status": 3}') is None
        assert len(caplog.records) == 3
        assert "197 more of its reports were refused in the last 60 s" in caplog.records[-1].getMessage()
    found = samples(metrics)
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="type") == 196
    assert series(found, "edgesdk_ota_reports_refused_total", kind="event", reason="json") == 1
    assert series(found, "edgesdk_ota_reports_refused_total", kind="need", reason="range") == 1
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="length") == 1
    assert series(found, "edgesdk_ota_reports_refused_total", kind="measurement", reason="range") == 1
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="flood") == 0
    good = reader.state("edgesdk/devices/cam1/state", b'{"status": "online", "group": "lab", "runtime": {"count": 1}}')
    assert good is not None and good.details == '{"runtime":{"count":1}}'


def _counting_writes(ingest: Ingest) -> list[int]:
    """Wrap the writer's one-transaction write: the sizes of the parts it tried, in order."""
    tried: list[int] = []
    write = ingest._write
    ingest._write = lambda batch: (tried.append(len(batch)), write(batch))[1]  # type: ignore[method-assign]
    return tried


def test_an_all_bad_batch_costs_a_bounded_number_of_transactions(tmp_path):
    """Issue 60: splitting had no cap, so an all-bad batch of n cost 2n - 1 transactions. Past the split budget the
    parts still failing are dropped whole; every report is still counted."""
    db = FleetDB(str(tmp_path / "fleet.db"))
    ingest = Ingest(db, linger_s=60.0)
    try:
        tried = _counting_writes(ingest)
        for i in range(512):
            ingest.put(_state(f"evil{i}", model={"x": i}))
        assert ingest.flush(hurry=True)
    finally:
        ingest.stop()
        db.close()
    assert ingest.dropped == 512 and ingest.written == 0 and ingest.errors == 0
    # Past the budget each pending right half is still tried once (it may be good): at most log2(n) more.
    assert len(tried) <= split_budget(512) + 9 < 2 * 512 - 1, len(tried)


def test_a_server_bug_while_writing_is_an_error_with_its_traceback_not_bad_data(tmp_path, caplog):
    """Issue 60: a bug in the writer was taken for bad data: the batch split to single rows and each dropped as
    refused by the store, silently. Now it is logged at ERROR with its traceback, counted, and not split."""
    db = FleetDB(str(tmp_path / "fleet.db"))
    dropped: list[str] = []
    ingest = Ingest(db, linger_s=60.0, on_dropped=lambda device, kind, exc: dropped.append(device))
    try:
        tried = _counting_writes(ingest)

        def broken(states):
            raise AttributeError("'NoneType' object has no attribute 'grp'")

        db.upsert_devices = broken  # type: ignore[method-assign]
        for i in range(8):
            ingest.put(_state(f"cam{i}"))
        with caplog.at_level(logging.ERROR):
            assert ingest.flush(hurry=True)
    finally:
        ingest.stop()
        db.close()
    assert ingest.errors == 1 and tried == [8] and ingest.dropped == 8 and sorted(dropped) == [f"cam{i}" for i in
                                                                                               range(8)]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "server error, not their data" in record.getMessage() and record.exc_info is not None


def test_data_errors_are_told_from_server_errors(tmp_path):
    live = sqlite3.connect(str(tmp_path / "y.db"))
    with pytest.raises(OverflowError) as overflow:
        live.execute("SELECT ?", (2**70,))
    assert data_error(overflow.value)
    with pytest.raises(TypeError) as unjsonable:
        json.dumps({"x": {1, 2}})
    assert data_error(unjsonable.value)
    with pytest.raises(TypeError) as bug:
        len(None)  # type: ignore[arg-type]
    assert not data_error(bug.value) and not data_error(AttributeError("x")) and not data_error(KeyError("k"))


def test_an_event_naming_a_rollout_its_device_is_no_target_of_is_written_without_it(tmp_path):
    """Issue 60 (found by the soak benchmark): a device that is no target wrote events into another group's
    rollout log by naming its deployment. The claim is kept in the payload, not as the rollout's event."""
    from edgesdk.fleet.records import RolloutPolicy

    db = FleetDB(str(tmp_path / "fleet.db"))
    db.add_rollout("r1", "digits", "2.0.0", "cams", RolloutPolicy(canary=1.0, waves=()), [[("cam0", "1.0.0")]])
    ingest = Ingest(db, linger_s=60.0)
    try:
        for device in ("cam0", "evil"):
            ingest.put(DeviceEvent(EventRow("committed", {"version": "2.0.0"}, device, "r1", time.time()), None))
        ingest.put(DeviceEvent(EventRow("failed", {}, "evil", "no-such-rollout", time.time()), None))
        assert ingest.flush(hurry=True)
    finally:
        ingest.stop()
    assert [(e.device_id, e.type) for e in db.events("r1")] == [("cam0", "committed")]
    evil = [(e.rollout_id, e.payload.get("claimed_rollout")) for e in db.events(device_id="evil")]
    assert evil == [(None, "r1"), (None, "no-such-rollout")] and ingest.unbound_events == 2
    db.close()
