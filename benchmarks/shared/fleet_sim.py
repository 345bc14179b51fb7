"""A simulated fleet: thousands of devices speaking the real OTA protocol, a few processes, one event loop each.

Each simulated device does what a real :class:`edgesdk.agent.agent.DeviceAgent` shows the
server, message for message: it connects as ``edgesdk-agent-<id>`` with a retained last will
``{"status": "offline", "group"}`` on its state topic, subscribes its command topic and its own
chunk topic, and publishes its retained state. A command is verified with
:func:`edgesdk.fleet.protocol.parse_command` against the server's public key (real Ed25519) and answered
with the agent's events and fields: ``rejected`` (bad signature, replay, downgrade),
``accepted``, ``downloaded``, ``committed`` (or ``rolled_back`` for a device in ``fail_share``),
then the retained state with the new version and slots. Archives are fetched like the agent
fetches them (group broadcast, then requests for missing chunks on the ``need`` topic after
``broadcast_wait_s`` and every ``retry_interval_s`` without progress), each chunk and the whole
archive checked against the signed hashes and held in memory only; ``fetch=False`` skips the
bytes. Devices in ``silent_share`` stay connected and answer nothing. There is no runtime: the
"install" is instant and only a ``fail_share`` device fails its health check (never a rollback).

Use it from a benchmark or a test::

    with SimulatedFleet(broker.url, "keys/server.pub", 1000, version="1.0.0").start() as fleet:
        server.start_rollout("digits", "2.0.0", "sim", policy)
        fleet.wait_versions("2.0.0", 1000, timeout=120)
    report = fleet.report          # FleetReport: counts, bytes, messages, per-process CPU and peak RSS

Each device keeps its own install log (time, deployment, version, outcome) and the times its
connections were accepted, which the report carries with each device's final version and chunk
bytes received; ``fleet.fault(...)`` puts devices under the chaos run's faults
(benchmarks/shared/fleet_sim_faults.py).

Workers are ``python -m benchmarks.shared.fleet_sim worker CONFIG`` processes fed JSON lines on stdin;
a worker ends by itself when its stdin closes (the parent died) or after ``max_runtime_s``.
The manual checks (connect time of 10,000 devices, this client's CPU per message against paho's)
are in :mod:`benchmarks.fleet.fleet_sim_checks`.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.errors import RolloutTimeoutError
from edgesdk.fleet.protocol import check_id
from edgesdk.runtime.bundle import parse_version

if __package__ in (None, ""):  # run as python benchmarks/shared/fleet_sim.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.shared.fleet_sim_basics import COUNTERS, SimulationError, device_role  # noqa: E402
from benchmarks.shared.fleet_sim_worker import worker_main  # noqa: E402

__all__ = ["SimulatedFleet", "FleetReport", "ProcessReport", "SimulationError", "device_role"]

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ProcessReport:
    """One worker process: its devices, how long they took to connect, its CPU seconds and peak RSS."""

    pid: int
    devices: int
    connect_s: float
    cpu_s: float
    rss_mb: float


@dataclass(frozen=True)
class FleetReport:
    """What the simulated devices saw and did, summed over the fleet, and what each worker process cost."""

    devices: int
    #: Counters of :data:`COUNTERS`: commands received, duplicates (a deployment id seen before), events sent...
    counts: dict[str, int]
    #: Deployment id -> installs (committed or rolled back) over the fleet.
    installs: dict[str, int]
    #: Devices whose own install log shows one version committed twice by updates (whatever the deployment ids).
    updated_twice: int
    messages_in: int
    messages_out: int
    #: Payload bytes the devices received (chunks and commands) and sent.
    bytes_in: int
    bytes_out: int
    #: Version -> devices on it when the fleet stopped.
    versions: dict[str, int]
    #: Device -> its installs in order, ``[time, deployment id, version, outcome, rollback]`` (devices that
    #: installed something).
    install_log: dict[str, list[list[Any]]] = field(default_factory=dict)
    #: Device -> the version it ran when the fleet stopped.
    final: dict[str, str | None] = field(default_factory=dict)
    #: Device -> when (time.time()) the broker accepted each of its connections: its first connect, and each return
    #: from a partition, a crash or a sleep.
    connect_log: dict[str, list[float]] = field(default_factory=dict)
    #: Device -> the chunk payload bytes it received (broadcasts and its own requests; devices that received any).
    device_chunk_bytes: dict[str, int] = field(default_factory=dict)
    processes: tuple[ProcessReport, ...] = field(default=())

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every worker process together."""
        return sum(p.cpu_s for p in self.processes)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what benchmarks print)."""
        data = asdict(self)
        data["cpu_s"] = self.cpu_s
        return data


# ------------------------------------------------------------------------------------------------
# parent side (the devices run in worker processes: benchmarks/shared/fleet_sim_worker.py)
# ------------------------------------------------------------------------------------------------

class _WorkerHandle:
    """A worker process and the thread that reads its JSON lines."""

    def __init__(self, config: dict[str, Any], log_path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.log_path = log_path
        #: The devices this worker runs.
        self.ids = frozenset(config["ids"])
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.shared.fleet_sim", "worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=REPO,
                                        env=env)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"fleet-sim-{self.process.pid}", daemon=True)
        self._reader.start()
        self.send(config)  # the first line is the worker's config (device ids included: too long for argv)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SimulationError(f"fleet worker {self.process.pid} is gone ({exc}): {self.stderr_tail()}") from exc

    def receive(self, kind: str, timeout: float) -> dict[str, Any]:
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise SimulationError(f"fleet worker {self.process.pid} sent no {kind!r} within {timeout:g} s; "
                                  f"its log: {self.stderr_tail()}") from None
        if message is None or message.get("type") != kind:
            detail = message.get("error") if message else "it exited"
            raise SimulationError(f"fleet worker {self.process.pid} failed instead of sending {kind!r} ({detail}); "
                                  f"its log: {self.stderr_tail()}")
        return message

    def stderr_tail(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-1500:] or "(empty)"
        except OSError:
            return "(no log)"

    def close(self, timeout: float = 10.0) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._reader.join(timeout=5)
        self._log.close()


class SimulatedFleet:
    """N simulated devices in ``processes`` worker processes (see the module docstring); a context manager.

    Device ids are ``<id_prefix><index>`` (``sim00000``, ...), device ``i`` runs in worker
    ``i % processes``. ``fail_share`` and ``silent_share`` pick devices by a hash of their id
    (:func:`device_role`; :attr:`failing` and :attr:`silent` list them). ``connect_rate`` paces
    connects (devices per second over the fleet; None: as fast as ``connect_concurrency`` in-flight
    connects per worker allow, retrying refused ones with backoff). Every device fails the health
    check of the versions in ``bad_versions`` (a release that fails its canary).
    """

    def __init__(self, broker_url: str, server_public_key_path: str | os.PathLike[str], devices: int, *,
                 group: str = "sim", id_prefix: str = "sim", processes: int = 2, model: str = "digits",
                 version: str = "1.0.0", fetch: bool = True, fail_share: float = 0.0, silent_share: float = 0.0,
                 connect_rate: float | None = None, connect_concurrency: int = 128, keepalive: int = 60,
                 broadcast_wait_s: float = 2.0, retry_interval_s: float = 1.0, request_window: int = 32,
                 max_runtime_s: float = 3600.0, root: str | os.PathLike[str] | None = None,
                 bad_versions: tuple[str, ...] = ()) -> None:
        from edgesdk.fleet.transport import parse_broker_url

        address = parse_broker_url(broker_url)
        if address.tls:
            raise SimulationError(f"broker {broker_url!r}: simulated devices speak plain MQTT on loopback; give "
                                  "mqtt://127.0.0.1:PORT")
        if not Path(server_public_key_path).is_file():
            raise SimulationError(f"server public key {server_public_key_path} does not exist; pass the .pub file "
                                  "the server's signing key pairs with (edgesdk keygen)")
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise SimulationError(f"devices={devices!r} must be a positive integer")
        if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= 64:
            raise SimulationError(f"processes={processes!r} must be an integer in 1..64 (one per core is plenty)")
        if not (0 <= fail_share <= 1 and 0 <= silent_share <= 1 and fail_share + silent_share <= 1):
            raise SimulationError(f"fail_share={fail_share!r} and silent_share={silent_share!r} must be in [0, 1] "
                                  "and add up to at most 1")
        if connect_rate is not None and connect_rate <= 0:
            raise SimulationError(f"connect_rate={connect_rate!r} must be a positive number of connects per second, "
                                  "or None")
        check_id(group, "group")
        check_id(f"{id_prefix}{devices - 1}", "device id")
        parse_version(version)
        width = max(5, len(str(devices - 1)))
        #: Every device id, in index order.
        self.device_ids = [f"{id_prefix}{i:0{width}d}" for i in range(devices)]
        roles = {d: device_role(d, fail_share, silent_share) for d in self.device_ids}
        #: Devices that fail every health check, and devices that never answer.
        self.failing = sorted(d for d, role in roles.items() if role == "fail")
        self.silent = sorted(d for d, role in roles.items() if role == "silent")
        self.processes = processes
        self._base = {"host": address.host, "port": address.port, "group": group, "model": model, "version": version,
                      "fetch": fetch, "fail_share": fail_share, "silent_share": silent_share,
                      "server_key": str(Path(server_public_key_path).resolve()), "keepalive": keepalive,
                      "connect_timeout": 10.0, "connect_concurrency": connect_concurrency,
                      "connect_rate": connect_rate / processes if connect_rate else None,
                      "broadcast_wait_s": broadcast_wait_s, "retry_interval_s": retry_interval_s,
                      "request_window": request_window, "max_runtime_s": max_runtime_s,
                      "root": str(Path(root).resolve()) if root is not None else None,
                      "bad_versions": list(bad_versions)}
        self._workers: list[_WorkerHandle] = []
        self._lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        #: Wall seconds start() took (every device connected, subscribed and its state acknowledged).
        self.start_s: float | None = None
        #: The final report, once stop() ran.
        self.report: FleetReport | None = None

    def start(self, timeout: float = 120.0) -> SimulatedFleet:
        """Start the workers; return once every device is connected and the broker acknowledged its state.

        Raises SimulationError (with the failing worker's log) when a worker cannot connect its devices
        within ``timeout``.
        """
        if self._workers:
            raise SimulationError("this SimulatedFleet was started already; make a new one")
        self._tmp = tempfile.TemporaryDirectory(prefix="fleet-sim-")
        started = time.monotonic()
        try:
            for p in range(self.processes):
                ids = self.device_ids[p::self.processes]
                if ids:
                    config = {**self._base, "ids": ids, "start_timeout": timeout}
                    self._workers.append(_WorkerHandle(config, Path(self._tmp.name) / f"worker{p}.log"))
            deadline = time.monotonic() + timeout + 5
            for worker in self._workers:
                worker.receive("started", max(0.1, deadline - time.monotonic()))
        except BaseException:
            self._close_workers()
            raise
        self.start_s = time.monotonic() - started
        return self

    def snapshot(self, by_device: bool = False) -> dict[str, Any]:
        """Live figures from every worker: ``versions`` (version -> devices) and ``counts`` (COUNTERS, and
        ``messages_in``/``messages_out``, as of the moment each worker answered); with ``by_device``, also
        ``by_device`` (device id -> the version it runs, None before its first install)."""
        with self._lock:
            if not self._workers:
                raise SimulationError("the simulated fleet is not running; call start() first")
            for worker in self._workers:
                worker.send({"cmd": "snapshot", "by_device": by_device})
            replies = [worker.receive("snapshot", 30) for worker in self._workers]
        versions: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        devices: dict[str, str | None] = {}
        for reply in replies:
            versions.update(reply["versions"])
            counts.update(reply["counts"])
            devices.update(reply.get("by_device", {}))
        return {"versions": dict(versions), "counts": dict(counts), **({"by_device": devices} if by_device else {})}

    def fault(self, kind: str, ids: list[str], **params: Any) -> int:
        """Put the devices ``ids`` under a fault (see benchmarks/shared/fleet_sim_faults.py: ``partition`` and ``crash`` take
        ``seconds``, ``corrupt`` takes ``chunks``, ``slow`` takes ``seconds`` and ``delay_s``, ``duty`` takes
        ``awake_s``, ``sleep_s``, ``cycles`` and optionally ``offset_s``, ``claim_group`` takes ``group``, ``heal``
        takes ``seconds``); how many it reached. A numeric parameter may be a dict ``{device id: value}``."""
        from benchmarks.shared.fleet_sim_faults import FAULT_COMMANDS

        if kind not in FAULT_COMMANDS:
            raise SimulationError(f"fault {kind!r} is not one of {', '.join(FAULT_COMMANDS)}")
        with self._lock:
            if not self._workers:
                raise SimulationError("the simulated fleet is not running; call start() first")
            for worker in self._workers:  # each its own devices only: a request is one line on its stdin
                mine = [d for d in ids if d in worker.ids]
                worker.send({"cmd": kind, "ids": mine, **{name: {d: value[d] for d in mine if d in value}
                                                          if isinstance(value, dict) else value
                                                          for name, value in params.items()}})
            return sum(worker.receive("fault", 30)["touched"] for worker in self._workers)

    def versions(self) -> dict[str, int]:
        """Version -> number of devices running it now."""
        return dict(self.snapshot()["versions"])

    def device_versions(self) -> dict[str, str | None]:
        """Device id -> the version it runs now (None before its first install)."""
        return dict(self.snapshot(by_device=True)["by_device"])

    def wait_versions(self, version: str, count: int, timeout: float, interval: float = 0.2) -> None:
        """Wait until at least ``count`` devices run ``version``; RolloutTimeoutError (with the counts) if they do not."""
        deadline = time.monotonic() + timeout
        while True:
            versions = self.versions()
            if versions.get(version, 0) >= count:
                return
            if time.monotonic() >= deadline:
                raise RolloutTimeoutError(f"{versions.get(version, 0)} of the {count} devices expected run {version} "
                                          f"after {timeout:g} s (versions now: {versions}); wait longer or look at "
                                          "the rollout's status")
            time.sleep(interval)

    def stop(self, timeout: float = 60.0) -> FleetReport:
        """Publish every device offline, disconnect, end the workers and return the fleet's report."""
        if self.report is not None:
            return self.report
        replies = []
        try:
            with self._lock:
                for worker in self._workers:
                    worker.send({"cmd": "stop"})
                deadline = time.monotonic() + timeout
                replies = [worker.receive("report", max(0.1, deadline - time.monotonic())) for worker in self._workers]
        finally:
            self._close_workers()
        self.report = _combine(len(self.device_ids), replies)
        return self.report

    def _close_workers(self) -> None:
        for worker in self._workers:
            worker.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SimulatedFleet:
        return self if self._workers else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.report is None and self._workers:
            self.stop()


def _combine(devices: int, replies: list[dict[str, Any]]) -> FleetReport:
    counts: Counter[str] = Counter({name: 0 for name in COUNTERS})
    versions: Counter[str] = Counter()
    installs: Counter[str] = Counter()
    for reply in replies:
        counts.update(reply["counts"])
        versions.update(reply["versions"])
        installs.update(reply["installs"])
    return FleetReport(
        devices=devices, counts=dict(counts), installs=dict(installs),
        updated_twice=sum(r["updated_twice"] for r in replies),
        messages_in=sum(r["messages_in"] for r in replies), messages_out=sum(r["messages_out"] for r in replies),
        bytes_in=sum(r["bytes_in"] for r in replies), bytes_out=sum(r["bytes_out"] for r in replies),
        versions=dict(versions),
        install_log={device: log for r in replies for device, log in r["install_log"].items()},
        final={device: version for r in replies for device, version in r["final"].items()},
        connect_log={device: times for r in replies for device, times in r["connect_log"].items()},
        device_chunk_bytes={device: n for r in replies for device, n in r["device_chunk_bytes"].items()},
        processes=tuple(ProcessReport(r["pid"], r["devices"], r["connect_s"], r["cpu_s"], r["rss_mb"]) for r in replies))


def main(argv: list[str] | None = None) -> None:
    """``worker`` (internal): run one worker process's devices; the manual checks are in fleet_sim_checks."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared.fleet_sim", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="internal: run one worker process's devices (config: first line on stdin)")
    parser.parse_args(argv)
    worker_main()


if __name__ == "__main__":
    main()
