"""`edgesdk server` processes for the fleet benchmark and the replica tests: started as an operator would,
measured from /proc (CPU seconds, peak RSS), stopped or killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from edgesdk.fleet.admin_client import AdminClient
from edgesdk.ota_server.broker import free_port

TOKEN = "fleet-bench-token"


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
    ticks = 0
    own = _stat_fields(pid)
    if own is None:
        return 0.0
    ticks += sum(int(own[i]) for i in (11, 12, 13, 14))  # utime, stime, and the reaped children's
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(pid):
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[1] == str(pid):  # a live child
                ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """One ``edgesdk server`` (a replica with ``replica=True``) on a free loopback port, its log in ``workdir``."""

    def __init__(self, workdir: Path, broker_url: str, db: str, keys: Path, name: str, *, replica: bool = False,
                 lease: str = "10s", extra: tuple[str, ...] = (), timeout: float = 60.0,
                 program: tuple[str, ...] | None = None) -> None:
        """``program`` replaces the ``edgesdk`` executable (the chaos run's skewed clocks and planted bugs)."""
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        command = [*(program or (str(Path(sys.executable).parent / "edgesdk"),)), "server", "--broker", broker_url,
                   "--repo", str(workdir / "repo"), "--db", db, "--key", str(keys / "server.key"),
                   "--bundle-key", str(keys / "converter.pub"), "--http", f"127.0.0.1:{self.port}",
                   "--token", TOKEN, "--name", name, "--lease", lease, *(["--replica"] if replica else []), *extra]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        self.client = AdminClient(self.url, TOKEN)
        self._wait_up(timeout)

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
        from prometheus_client.parser import text_string_to_metric_families

        request = urllib.request.Request(f"{self.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        text = urllib.request.urlopen(request, timeout=10).read().decode()
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.name.startswith("edgesdk_ota_"):
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
