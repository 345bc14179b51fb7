"""The agent's reading of its apps' files (real files, a fake clock): several apps merged per
version, a restart counted, bad and oversized files skipped with one log line, files of processes
gone removed once out of the horizon, the agent's own ManagedRuntime counted only for what it
served."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from edgesdk.agent.app_file import APPS_DIR, MAX_APP_FILE_BYTES, app_file_name, encode_app_file
from edgesdk.agent.app_traffic import TrafficReporter, merge_traffic, read_app_files
from edgesdk.agent.traffic_ledger import HORIZON_S, TrafficLedger
from edgesdk.fleet.traffic import parse_traffic
from edgesdk.runtime.latency_histogram import merge, percentile, to_sparse
from edgesdk.runtime.stats import LatencyStats

T0 = 1_700_000_000.0
#: A process id no process has (above any kernel's pid_max), for apps that are gone.
GONE = 2**31 - 2


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class App:
    """An app's ledger on the test's clock, written as the app's exporter writes its file."""

    def __init__(self, directory: Path, clock: Clock, name: str, pid: int) -> None:
        self.directory, self.clock, self.name, self.pid = directory, clock, name, pid
        self.ledger = TrafficLedger(clock)
        self.meters: dict = {}
        self.stats: dict[str, LatencyStats] = {}

    def serve(self, version: str, calls: int, ns: int = 300_000, errors: int = 0) -> App:
        if version not in self.meters:
            self.stats[version] = LatencyStats()
            counters = self.stats[version].counters
            self.meters[version] = self.ledger.activate(version, "digits", counters)
        for _ in range(calls):
            self.stats[version].record(ns)
        for _ in range(errors):
            self.stats[version].record_error()
        self.ledger.fold(self.meters[version])
        return self

    def write(self) -> Path:
        path = self.directory / app_file_name(self.name, self.pid)
        document = self.ledger.document()
        path.write_bytes(encode_app_file(self.name, self.pid, document, self.clock.now))
        return path


@pytest.fixture
def device(tmp_path):
    clock = Clock()
    reporter = TrafficReporter(tmp_path / "store", clock=clock, label="cam0")
    return reporter, clock, tmp_path / "store" / APPS_DIR


def test_the_apps_directory_is_sticky_and_writable_by_all(device):
    reporter, _, apps = device
    assert apps.is_dir() and (apps.stat().st_mode & 0o7777) == 0o1777
    assert reporter.report()["versions"] == {}


def test_two_apps_on_one_device_are_merged_per_version(device):
    reporter, clock, apps = device
    camera = App(apps, clock, "camera", os.getpid()).serve("1.0.0", 200, ns=200_000, errors=2)
    door = App(apps, clock, "door", os.getppid()).serve("1.0.0", 100, ns=2_000_000)
    clock.now += 30
    camera.serve("1.0.0", 50, ns=200_000).write()
    door.write()
    traffic = reporter.report()
    entry = traffic["versions"]["1.0.0"]
    assert (entry["calls"], entry["errors"]) == (352, 2)
    assert (entry["apps"], entry["starts"], entry["restarts"]) == (2, 2, 0)
    assert (entry["from"], entry["to"], traffic["at"]) == (T0, T0 + 30, T0 + 30)
    both = merge([to_sparse(app.stats["1.0.0"].counters()[2]) for app in (camera, door)])
    assert entry["p99_ms"] == pytest.approx(percentile(both, 99), abs=1e-6)
    assert entry["p99_ms"] > 1.5
    assert entry["p50_ms"] == pytest.approx(0.2, rel=0.0625)
    assert parse_traffic(json.loads(json.dumps(traffic))) == traffic


def test_an_app_restarting_counts_in_restarts_and_each_session_as_a_start(device):
    reporter, clock, apps = device
    App(apps, clock, "camera", GONE).serve("2.0.0", 40).write()  # crashed: its file stays
    clock.now += 20
    App(apps, clock, "camera", os.getpid()).serve("2.0.0", 10).write()
    App(apps, clock, "door", os.getppid()).serve("2.0.0", 5).write()  # another app: no restart
    entry = reporter.report()["versions"]["2.0.0"]
    assert (entry["calls"], entry["apps"], entry["starts"], entry["restarts"]) == (55, 3, 3, 1)


def test_a_crash_right_after_loading_shows_as_a_start_with_no_calls(device):
    reporter, clock, apps = device
    app = App(apps, clock, "camera", GONE)
    app.ledger.activate("2.0.0", "digits", LatencyStats().counters)
    app.write()
    entry = reporter.report()["versions"]["2.0.0"]
    assert (entry["calls"], entry["starts"], entry["p99_ms"]) == (0, 1, None)
    assert (entry["from"], entry["to"]) == (T0, T0)


def test_versions_are_kept_apart_and_the_old_one_keeps_its_window(device):
    reporter, clock, apps = device
    app = App(apps, clock, "camera", os.getpid()).serve("1.0.0", 80, ns=100_000)
    clock.now += 100
    app.serve("2.0.0", 30, ns=5_000_000).write()
    versions = reporter.report()["versions"]
    assert (versions["1.0.0"]["calls"], versions["2.0.0"]["calls"]) == (80, 30)
    assert versions["1.0.0"]["p99_ms"] < 0.2 < 4 < versions["2.0.0"]["p50_ms"]
    assert versions["2.0.0"]["from"] == T0 + 100 and versions["1.0.0"]["from"] == T0


def test_bad_and_oversized_files_are_skipped_with_one_log_line_each(device, caplog):
    reporter, clock, apps = device
    App(apps, clock, "camera", os.getpid()).serve("1.0.0", 10).write()
    (apps / "broken-1.json").write_text("{not json")
    (apps / "liar-2.json").write_text(json.dumps({
        "format": 1, "app": "liar", "pid": 2, "session": T0, "written": T0, "versions": {"1.0.0": {
            "model": "digits", "activated": T0, "slots": [[int(T0 // 60 * 60), 5, 9, 0, 0, []]]}}}))
    (apps / "fast-6.json").write_text(json.dumps({  # a million calls in the second since it loaded
        "format": 1, "app": "fast", "pid": 6, "session": T0, "written": T0, "versions": {"1.0.0": {
            "model": "digits", "activated": T0,
            "slots": [[int(T0 // 60 * 60), 10**6, 10**6, 0, 0, []]]}}}))
    (apps / "huge-3.json").write_bytes(b" " * (MAX_APP_FILE_BYTES + 1))
    os.mkfifo(apps / "fifo-4.json")  # never blocks the agent
    os.symlink("/etc/passwd", apps / "link-5.json")
    with caplog.at_level(logging.WARNING, logger="edgesdk.agent.app_traffic"):
        first = reporter.report()
        second = reporter.report()
    assert first["versions"]["1.0.0"]["calls"] == second["versions"]["1.0.0"]["calls"] == 10
    skipped = [r.getMessage() for r in caplog.records if "skipping app file" in r.getMessage()]
    assert len(skipped) == 6, skipped  # one line per file, not one per report
    assert any("liar-2.json" in line and "errors" in line for line in skipped)
    assert any("huge-3.json" in line and "cap" in line for line in skipped)
    assert any("fast-6.json" in line and "calls/s" in line for line in skipped)


def test_files_of_processes_gone_are_removed_once_out_of_the_horizon(device):
    reporter, clock, apps = device
    gone = App(apps, clock, "camera", GONE).serve("1.0.0", 10).write()
    alive_silent = App(apps, clock, "door", os.getpid()).serve("1.0.0", 5).write()
    clock.now += HORIZON_S - 10
    assert reporter.report()["versions"]["1.0.0"]["calls"] == 15 and gone.exists()  # still counted
    clock.now += 30
    reporter.report()
    assert not gone.exists() and alive_silent.exists()  # gone, and nothing of it in the horizon
    clock.now += 60
    assert reporter.report()["versions"] == {}
    assert not alive_silent.exists()  # silent for the horizon and a minute
    leftover, bad = apps / ".camera-9.json.tmp1234", apps / "bad-9.json"
    leftover.write_text("half")
    bad.write_text("[]")
    reporter.report()
    assert leftover.exists() and bad.exists()  # recent: they may still be written
    old = clock.now - HORIZON_S - 61
    for path in (leftover, bad):
        os.utime(path, (old, old))
    reporter.report()
    assert not leftover.exists() and not bad.exists()


def test_only_the_newest_32_files_are_read(device):
    _, clock, apps = device
    for i in range(40):
        App(apps, clock, f"app{i}", os.getpid()).serve("1.0.0", 1).write()
        os.utime(apps / app_file_name(f"app{i}", os.getpid()), (T0 + i, T0 + i))
    sessions = read_app_files(apps, clock.now)
    assert len(sessions) == 32 and {s.app for s in sessions} == {f"app{i}" for i in range(8, 40)}
    assert merge_traffic(sessions, clock.now)["versions"]["1.0.0"]["apps"] == 32


class _AgentRuntime:
    """The agent's own ManagedRuntime, as the reporter sees it: a ledger it folds before reading."""

    def __init__(self, clock: Clock) -> None:
        self.traffic, self.folds = TrafficLedger(clock), 0

    def fold_traffic(self) -> bool:
        self.folds += 1
        return False


def test_the_agents_own_runtime_counts_only_the_versions_it_served(tmp_path):
    clock = Clock()
    runtime = _AgentRuntime(clock)
    reporter = TrafficReporter(tmp_path / "store", runtime, clock=clock)  # type: ignore[arg-type]
    runtime.traffic.activate("1.0.0", "digits", LatencyStats().counters)  # health checks only
    assert reporter.report()["versions"] == {} and runtime.folds == 1
    stats = LatencyStats()
    meter = runtime.traffic.activate("2.0.0", "digits", stats.counters)
    for _ in range(25):
        stats.record(400_000)
    runtime.traffic.fold(meter)
    App(tmp_path / "store" / APPS_DIR, clock, "camera", os.getpid()).serve("2.0.0", 5).write()
    entry = reporter.report()["versions"]["2.0.0"]
    assert (entry["calls"], entry["apps"]) == (30, 2)
    assert "1.0.0" not in reporter.report()["versions"]
