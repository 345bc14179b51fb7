"""An app's exporter (no thread: its tick driven on a fake clock): a write at each activation, then
only on changes and at most every ``every_s`` (slow, or the agent's cadence while judged), bounded
size, one warning when the directory cannot be written."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from edgesdk.agent.app_file import (
    APPS_DIR,
    CADENCE_FILE,
    MAX_APP_FILE_BYTES,
    encode_app_file,
    parse_app_file,
)
from edgesdk.agent.app_stats import SLOW_EVERY_S, AppExporter, default_app_name
from edgesdk.agent.traffic_ledger import TrafficLedger
from edgesdk.errors import TransferError
from edgesdk.runtime.latency_histogram import N_BUCKETS
from edgesdk.runtime.stats import LatencyStats
from tests.unit.test_app_traffic import T0, Clock


class Managed:
    """What the exporter uses of a ManagedRuntime: its ledger and fold_traffic (one model)."""

    def __init__(self, clock: Clock) -> None:
        self.traffic = TrafficLedger(clock)
        self.stats = LatencyStats()
        self.meter = self.traffic.activate("1.0.0", "digits", self.stats.counters)

    def serve(self, calls: int) -> None:
        for _ in range(calls):
            self.stats.record(250_000)

    def fold_traffic(self) -> bool:
        return self.traffic.fold(self.meter)


@pytest.fixture
def app(tmp_path):
    clock = Clock()
    (tmp_path / APPS_DIR).mkdir(mode=0o777)
    managed = Managed(clock)
    exporter = AppExporter(managed, tmp_path, app="camera", clock=clock)  # type: ignore[arg-type]
    return exporter, managed, clock


def _calls(exporter: AppExporter) -> int:
    session = parse_app_file(exporter.path.read_bytes())
    return sum(slot.calls for version in session.versions.values() for slot in version.slots)


def test_the_file_is_written_at_start_then_only_on_changes_at_the_slow_cadence(app):
    exporter, managed, clock = app
    assert exporter.write() and exporter.writes == 1  # start() does it first: the activation shows
    assert exporter.path.name == f"camera-{os.getpid()}.json"
    assert stat.S_IMODE(exporter.path.stat().st_mode) == 0o644
    session = parse_app_file(exporter.path.read_bytes())
    assert (session.app, session.pid) == ("camera", os.getpid())
    assert (session.session, session.written) == (T0, T0)
    assert session.versions["1.0.0"].slots == () and _calls(exporter) == 0
    clock.now += SLOW_EVERY_S + 1
    assert exporter.tick() is False  # nothing changed: no write, however long it has been
    managed.serve(40)
    clock.now += 1
    assert exporter.tick() is True and _calls(exporter) == 40
    managed.serve(5)
    clock.now += SLOW_EVERY_S - 2
    assert exporter.tick() is False and _calls(exporter) == 40  # changed, but not a minute yet
    clock.now += 2
    assert exporter.tick() is True and _calls(exporter) == 45 and exporter.writes == 3


def test_the_agents_cadence_is_followed_until_it_ends_and_read_when_it_changes(app, tmp_path):
    exporter, managed, clock = app
    exporter.write()
    cadence = tmp_path / APPS_DIR / CADENCE_FILE
    cadence.write_text(json.dumps({"every_s": 10, "until": T0 + 100}))
    assert exporter.every_s() == 10
    managed.serve(3)
    clock.now += 10
    assert exporter.tick() is True
    managed.serve(3)
    clock.now += 5
    assert exporter.tick() is False
    clock.now += 5
    assert exporter.tick() is True and _calls(exporter) == 6
    clock.now = T0 + 101  # the judged window ended
    assert exporter.every_s() == SLOW_EVERY_S
    cadence.write_text(json.dumps({"every_s": 0.001, "until": T0 + 1000}))
    os.utime(cadence, ns=(1, 1))  # a new modification time: read again
    assert exporter.every_s() == exporter.tick_s  # never faster than a write per tick
    cadence.write_text("{garbage")
    os.utime(cadence, ns=(2, 2))
    assert exporter.every_s() == SLOW_EVERY_S


def test_an_activation_is_written_at_once_whatever_the_cadence(app):
    exporter, managed, clock = app
    exporter.write()
    stats = LatencyStats()
    managed.meter = managed.traffic.activate("2.0.0", "digits", stats.counters)
    clock.now += 1
    exporter.activated()
    assert set(parse_app_file(exporter.path.read_bytes()).versions) == {"1.0.0", "2.0.0"}


def test_a_directory_that_cannot_be_written_warns_once_and_the_app_goes_on(tmp_path, caplog):
    clock = Clock()
    managed = Managed(clock)
    exporter = AppExporter(managed, tmp_path / "store", app="camera",  # type: ignore[arg-type]
                           clock=clock)
    with caplog.at_level(logging.INFO, logger="edgesdk.agent.app_stats"):
        assert exporter.write() is False
        managed.serve(1)
        clock.now += SLOW_EVERY_S
        assert exporter.tick() is False
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "store/apps" in warnings[0] and "chmod 1777" in warnings[0]
        (tmp_path / "store" / APPS_DIR).mkdir(parents=True)  # the agent started
        assert exporter.tick() is True
    assert any("again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_the_file_stays_within_its_cap_leaving_out_the_oldest_slots(tmp_path):
    wide = [[i, 1] for i in range(N_BUCKETS)]
    slots = [[int(T0 // 60 * 60) + 60 * s, N_BUCKETS, 0, 0, 0, wide] for s in range(16)]
    document = {"session": T0, "versions": {
        f"{v}.0.0": {"model": "digits", "activated": T0, "slots": slots} for v in range(1, 5)}}
    data = encode_app_file("camera", 7, document, T0 + 16 * 60)
    assert len(data) <= MAX_APP_FILE_BYTES
    session = parse_app_file(data)
    kept = sorted(slot.start for version in session.versions.values() for slot in version.slots)
    assert 0 < len(kept) < 64 and kept[-1] == int(T0 // 60 * 60) + 60 * 15  # the newest slots stay


def test_app_names():
    assert default_app_name() and default_app_name() == default_app_name()
    with pytest.raises(TransferError, match="app name '../x'"):
        AppExporter(Managed(Clock()), "/tmp", app="../x")  # type: ignore[arg-type]
