"""`edgesdk server` processes for the fleet benchmark and the replica tests: started as an operator would,
measured from /proc (CPU seconds, peak RSS), stopped or killed; and a :class:`FleetStack` (a broker, one server,
simulated fleets) for the late-device scenarios."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.shared.common import log
from benchmarks.shared.fleet_sim import FleetReport, SimulatedFleet
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutRecord, RolloutState, TargetStatus
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from edgesdk.ota_server.postgres import LocalPostgres
from edgesdk.ota_server.store.fleet_db import FleetDB

TOKEN = "fleet-bench-token"
#: A FleetStack's waits stop once nothing moved for this long (the result says so; the goals are missed).
STALL_S = 180.0


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident set size (VmHWM) of process ``pid`` in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and its children, the exited ones included (their time is added to the
    parent's when it reaps them): for PostgreSQL's postmaster, every backend that served a connection."""
    return sum(tree_cpu_parts(pid).values())


def tree_cpu_parts(pid: int) -> dict[str, float]:
    """:func:`tree_cpu_seconds` by part, for PostgreSQL: ``connections`` (live backends serving a client),
    ``background`` (the other live children: checkpointer, WAL writer, autovacuum), ``exited`` (children reaped so
    far, e.g. autovacuum workers) and ``main`` (the postmaster itself)."""
    tick = os.sysconf("SC_CLK_TCK")
    parts = dict.fromkeys(("connections", "background", "exited", "main"), 0.0)
    own = _stat_fields(pid)
    if own is None:
        return parts
    parts["main"] = (int(own[11]) + int(own[12])) / tick
    parts["exited"] = (int(own[13]) + int(own[14])) / tick
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(pid):
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[1] == str(pid):  # a live child
                try:
                    title = (entry / "cmdline").read_bytes()
                except OSError:
                    title = b""
                part = "connections" if b"(" in title or b"[local]" in title else "background"
                parts[part] += sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick
    return parts


class ServerProcess:
    """One ``edgesdk server`` (a replica with ``replica=True``) on a free loopback port, its log in ``workdir``."""

    def __init__(self, workdir: Path, broker_url: str, db: str, keys: Path, name: str, *, replica: bool = False,
                 lease: str = "10s", extra: tuple[str, ...] = (), timeout: float = 60.0,
                 program: tuple[str, ...] | None = None) -> None:
        """``program`` replaces the ``edgesdk`` executable (the chaos run's skewed clocks and planted bugs)."""
        self.name = name
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        for attempt in range(3):  # a free port can be taken by another process before the server binds it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            command = [*(program or (str(Path(sys.executable).parent / "edgesdk"),)), "server", "--broker", broker_url,
                       "--repo", str(workdir / "repo"), "--db", db, "--key", str(keys / "server.key"),
                       "--bundle-key", str(keys / "converter.pub"), "--http", f"127.0.0.1:{self.port}",
                       "--token", TOKEN, "--name", name, "--lease", lease, *(["--replica"] if replica else []), *extra]
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(command, stdout=log, stderr=log)
            self.client = AdminClient(self.url, TOKEN)
            try:
                self._wait_up(timeout)
                return
            except RuntimeError:
                if attempt == 2 or self.process.poll() is None or "address already in use" not in self.log_tail():
                    raise

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.process.returncode}: {self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/api/devices", timeout=1)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # answering, and refusing a request without the token
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server {self.name} did not answer within {timeout:g} s: {self.log_tail()}")

    def counters(self) -> dict[str, float]:
        """The server's own Prometheus counters (commands sent and re-sent, chunk bytes by kind)."""
        return {name: value for name, value in self.scrape().items() if name.split("{")[0].endswith("_total")}

    def scrape(self) -> dict[str, float]:
        """Every ``edgesdk_ota_`` sample of the server's /metrics, named without the prefix, labels in braces
        (``outbox_messages``, ``chunk_bytes_total{kind=resend}``, ...)."""
        from prometheus_client.parser import text_string_to_metric_families

        request = urllib.request.Request(f"{self.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        text = urllib.request.urlopen(request, timeout=10).read().decode()
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("edgesdk_ota_"):
                    label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    found[sample.name.removeprefix("edgesdk_ota_") + (f"{{{label}}}" if label else "")] = sample.value
        return found

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        """The process's peak resident set size (VmHWM) in MiB."""
        return peak_rss_mb(self.process.pid) or 0.0

    def kill(self) -> None:
        """SIGKILL: the process dies without stopping anything (a machine failure)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM and wait (the server writes what it queued and disconnects)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class FleetStack:
    """A broker, one ``edgesdk server`` on ``db`` (its CPU and, with ``pg``, PostgreSQL's), and simulated fleets."""

    def __init__(self, work: Path, name: str, devices: int, db: str, keys: Path, pg: LocalPostgres | None,
                 server_args: tuple[str, ...] = ()) -> None:
        """``server_args`` go to ``edgesdk server`` after the stack's own options."""
        self.keys, self.db, self.pg = keys, db, pg
        self.broker = LocalMosquitto(work / name / "broker", max_open_files=devices + 4096)
        try:
            self.server = ServerProcess(work / name, self.broker.url, db, keys, name, extra=server_args)
        except BaseException:
            self.broker.stop()
            raise
        self.client = self.server.client
        self.fleets: list[SimulatedFleet] = []

    def fleet(self, devices: int, group: str, id_prefix: str, model: str, **options: Any) -> SimulatedFleet:
        fleet = SimulatedFleet(self.broker.url, self.keys / "server.pub", devices, group=group, id_prefix=id_prefix,
                               model=model, version="1.0.0", fetch=True, **options)
        self.fleets.append(fleet)
        return fleet

    def db_cpu_parts(self) -> dict[str, float]:
        """PostgreSQL's CPU seconds so far by part (:func:`tree_cpu_parts`; empty for SQLite)."""
        return tree_cpu_parts(self.pg.process.pid) if self.pg is not None and self.pg.process is not None else {}

    def clean_up(self) -> None:
        """``VACUUM (ANALYZE)`` the fleet store, then ``CHECKPOINT`` (PostgreSQL only): a phase's dead rows and dirty
        pages are dealt with by that phase, inside its CPU, instead of by autovacuum and the checkpointer during the
        next one."""
        if self.pg is None:
            return
        store = FleetDB(self.db)
        try:
            store.sql.execute("VACUUM (ANALYZE)")
            store.sql.execute("CHECKPOINT")
        finally:
            store.close()
        time.sleep(0.5)  # the backend has exited: its CPU is in the postmaster's reaped children once it is reaped

    def wait_devices(self, group: str, status: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (n := self.client.device_page(group, status=status, limit=1).total) != count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server lists {n} devices {status} in {group}, not {count}, after "
                                   f"{timeout:g} s: {self.server.log_tail(5)}")
            time.sleep(0.2)

    def upload(self, bundle: Path) -> str:
        return str(self.client.upload(pack_bundle(bundle))["version"])

    def wait_rollout(self, rollout_id: str, timeout: float, interval: float = 0.5,
                     stall_s: float = STALL_S) -> RolloutRecord:
        """The rollout once it ended, ``timeout`` passed, or its target counts stood still for ``stall_s``."""
        deadline = time.monotonic() + timeout
        counts, since = None, time.monotonic()
        while True:
            r = self.client.rollout(rollout_id, limit=0)
            if r.counts != counts:
                counts, since = r.counts, time.monotonic()
            if r.state != RolloutState.RUNNING or time.monotonic() > deadline:
                return r
            if time.monotonic() - since > stall_s:
                log(f"  rollout {rollout_id}: no target moved in {stall_s:g} s ({r.counts}); giving up on it: "
                    f"{self.gauges()}")
                return r
            time.sleep(interval)

    def wait_quiet(self, timeout: float = 60.0) -> float:
        """Wait until the server's outbox and its queue of reports to write are empty, and no device waits for the
        reconciler, at two reads 0.5 s apart: what it sent has left, what came back is written, and each device that
        reported has been compared with its group's release (a rollout's devices report their new version, and the
        reconciler takes them off its queue in passes of a few hundred after the rollout completed). The seconds
        that took."""
        started = time.monotonic()
        quiet = 0
        store = FleetDB(self.db)
        try:
            while quiet < 2 and time.monotonic() - started < timeout:
                gauges = self.gauges()
                done = gauges.get("outbox_messages") == 0 and gauges.get("ingest_pending") == 0
                quiet = quiet + 1 if done and not store.work().queued else 0
                time.sleep(0.5)
        finally:
            store.close()
        return time.monotonic() - started

    def gauges(self) -> dict[str, float]:
        """The server's queues and catch-ups now (what a stall is diagnosed from)."""
        try:
            found = self.server.scrape()
        except OSError as exc:
            return {"error": str(exc)[:100]}  # type: ignore[dict-item]
        return {k: v for k, v in found.items() if k.split("{")[0] in (
            "outbox_messages", "ingest_pending", "catch_up_in_flight", "commands_sent_total",
            "commands_resent_total", "chunk_bytes_total")}

    def wait_late_committed(self, rollout_id: str, count: int, timeout: float) -> RolloutRecord:
        """The rollout once ``count`` of its late targets committed (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.client.rollout(rollout_id, limit=0)
            if r.late_counts.get(TargetStatus.COMMITTED, 0) >= count or time.monotonic() > deadline:
                return r
            time.sleep(1.0)

    def warnings(self) -> list[str]:
        """The server log's WARNING and ERROR lines (the last 10)."""
        try:
            lines = self.server.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line[:300] for line in lines if " WARNING " in line or " ERROR " in line][-10:]

    def close(self) -> list[FleetReport]:
        reports = []
        try:
            for fleet in self.fleets:
                reports.append(fleet.stop())
        finally:
            self.server.stop()
            self.broker.stop()
        return reports
