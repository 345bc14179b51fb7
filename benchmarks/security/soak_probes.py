"""What the security soak (``security_soak.py``) reads from the OTA server it runs in its process.

- :class:`SoakServer`: the server with its device handlers wrapped to say whose MQTT message the
  handler thread is handling (a thread-local), and its repository's ``archive`` (load, verify,
  pack, hash; the chunk service's loader) recorded in :data:`WORK` by that device; with
  :func:`hashes_counted`, ``ArchiveInfo.of`` (chunk hashing) too. What the server does is
  unchanged.
- :class:`RssSampler`: this process's VmRSS every second.
- :func:`structures`: the sizes of the server's structures keyed by device, transfer or rollout
  (private fields, read as they are); :func:`refusals`: the refused reports by kind and reason.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgesdk.fleet.protocol import ArchiveInfo, Topics
from edgesdk.ota_server.server import OTAServer

__all__ = ["WORK", "WorkLog", "SoakServer", "RssSampler", "hashes_counted", "open_transfers",
           "structures", "refusals"]

_ACTING = threading.local()


class WorkLog:
    """Archive loads and chunk hashings by the device whose message was being handled (None:
    none's, e.g. the engine's thread opening a stage)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loads: dict[str | None, int] = {}
        self.hashes: dict[str | None, int] = {}

    def note(self, table: dict[str | None, int]) -> None:
        device = getattr(_ACTING, "device", None)
        with self.lock:
            table[device] = table.get(device, 0) + 1

    def of(self, device: str) -> int:
        """Loads and hashings done while handling ``device``'s messages."""
        with self.lock:
            return self.loads.get(device, 0) + self.hashes.get(device, 0)


WORK = WorkLog()


def _acting(handler: Any) -> Any:
    """``handler`` (an MQTT handler of device topics) run with the topic's device as the actor."""
    def handle(topic: str, payload: bytes) -> None:
        try:
            _ACTING.device = Topics.device_of(topic)
        except Exception:  # noqa: BLE001 - a topic the server refuses anyway
            _ACTING.device = "?"
        try:
            handler(topic, payload)
        finally:
            _ACTING.device = None

    return handle


class SoakServer(OTAServer):
    """The OTA server with its device handlers wrapped to say whose message they handle, and its
    repository's archive loads recorded (what it does is unchanged)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        load = self.repo.archive

        def archive(*a: Any, **kw: Any) -> Any:
            WORK.note(WORK.loads)
            return load(*a, **kw)

        self.repo.archive = archive  # type: ignore[method-assign]  # chunk_table calls self.archive
        self.chunks._load = archive
        self.measurements.on_result = _acting(self.measurements.on_result)  # type: ignore
        self._on_state = _acting(super()._on_state)  # type: ignore[method-assign]
        self._on_event = _acting(super()._on_event)  # type: ignore[method-assign]
        self._on_need = _acting(super()._on_need)  # type: ignore[method-assign]


@contextlib.contextmanager
def hashes_counted() -> Iterator[None]:
    """``ArchiveInfo.of`` (chunk hashing) counted in this process meanwhile."""
    original = ArchiveInfo.__dict__["of"]

    def of(cls: Any, *a: Any, **kw: Any) -> Any:
        WORK.note(WORK.hashes)
        return original.__func__(cls, *a, **kw)

    ArchiveInfo.of = classmethod(of)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ArchiveInfo.of = original  # type: ignore[method-assign]


class RssSampler:
    """This process's resident set (MiB) every ``every_s``."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), name="rss", daemon=True)
        self._thread.start()

    @staticmethod
    def rss_mib() -> float:
        """VmRSS now."""
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    @staticmethod
    def parts() -> dict[str, float]:
        """The resident set by kind (MiB): ``anon`` (heaps: Python's, SQLite's page cache, paho's
        buffers), ``file`` (mapped files: libraries, SQLite's WAL index), ``shmem``."""
        lines = Path("/proc/self/status").read_text().splitlines()
        return {line.split(":")[0][3:].lower(): round(int(line.split()[1]) / 1024, 2)
                for line in lines if line.startswith(("RssAnon:", "RssFile:", "RssShmem:"))}

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(self.rss_mib())

    def median_last(self, n: int = 5) -> float:
        """The median of the newest ``n`` samples."""
        return statistics.median(self.samples[-n:]) if self.samples else self.rss_mib()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def open_transfers(server: OTAServer) -> list[str]:
    """The server's open stage transfers."""
    with server.chunks._lock:  # stage transfers only (a measurement's id starts with m)
        return sorted(t for t in server.chunks._transfers if not t.startswith("m"))


def structures(server: OTAServer) -> dict[str, int]:
    """Sizes of the server's structures keyed by device, transfer or rollout (private fields)."""
    c, g, e = server.chunks, server.guard, server.engine
    return {"chunks.transfers": len(c._transfers), "chunks.archives": len(c._archives),
            "chunks.asked": len(c._asked), "chunks.targets": sum(map(len, c._targets.values())),
            "chunks.resent_keys": len(c.resent), "chunks.refusals_logged": len(c._refusals_logged),
            "chunks.awaited": len(c._awaited), "guard.state_buckets": len(g._states),
            "guard.event_buckets": len(g._events), "guard.deferred": len(g.deferred),
            "guard.floods": len(g._floods), "guard.reported": len(g._reported),
            "reports.logged": len(server.reports._logged),
            "measurements.items": len(server.measurements._items),
            "reconciler.chased": len(e.reconciler._chased),
            "reconciler.failed_seen": len(e.reconciler._failed_seen),
            "repo.tables": len(server.repo._tables), "ingest.pending": server.ingest.pending,
            "db.bytes": server.db.size_bytes()}


def refusals(server: OTAServer) -> dict[str, float]:
    """``edgesdk_ota_reports_refused_total`` by ``kind/reason``."""
    counts: dict[str, float] = {}
    for line in server.metrics.render()[0].decode().splitlines():
        if line.startswith("edgesdk_ota_reports_refused_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counts[f"{kind}/{reason}"] = float(line.split()[-1])
    return counts
