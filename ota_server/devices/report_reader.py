"""The server's reading of device messages: typed records or a counted, quietly logged refusal.

Each message a device sends passes a parser of :mod:`edgesdk.fleet.reports` (states, events,
chunk requests; measurement results through :func:`edgesdk.fleet.measurement.parse_result`). A
message that fails is dropped whole and

- counted in ``edgesdk_ota_reports_refused_total{kind,reason}``: ``kind`` is the topic (state,
  event, need, measurement), ``reason`` the parser's (``length``, ``json``, ``type``, ``range``,
  ``id``, ``missing``), ``store`` for a report the fleet store itself refused
  (:mod:`edgesdk.ota_server.devices.ingest`), and ``flood`` for the report limit's drops
  (:mod:`edgesdk.ota_server.devices.report_guard`);
- logged at most once per device and :attr:`ReportReader.period_s` (60 s), the next line saying how
  many were refused in between: a device sending a malformed report every 10 ms costs one log line
  a minute, not a hundred a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from edgesdk.errors import ReportError
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.reports import (
    MAX_REPORT_BYTES,
    ChunkRequest,
    EventReport,
    parse_chunk_request,
    parse_event,
    parse_state,
)
from edgesdk.ota_server.admin.metrics import REFUSAL_REASONS, REFUSED_KINDS
from edgesdk.ota_server.store.fleet_db import DETAIL_KEYS as _STORED_KEYS
from edgesdk.ota_server.store.fleet_db import DeviceState

__all__ = ["ReportReader", "DETAIL_KEYS"]

#: The keys of a state report the server keeps as the device's details: the console's, and
#: ``traffic`` (the apps' figures per version, :mod:`edgesdk.fleet.traffic`) the canary judge reads.
DETAIL_KEYS = tuple(dict.fromkeys((*_STORED_KEYS, "traffic")))

_Report = TypeVar("_Report")

log = logging.getLogger("edgesdk.ota_server.server")  # the server's log, as operators filter it

_TOPIC_KINDS = {"state": "state", "events": "event", "need": "need", "measurements": "measurement"}


class ReportReader:
    """Parses device messages for the server; refusals are counted with ``on_refused(kind, reason)`` and logged
    once per device and ``period_s`` (thread-safe)."""

    def __init__(self, on_refused: Callable[[str, str], None] | None = None, period_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, max_devices: int = 100_000,
                 max_bytes: int = MAX_REPORT_BYTES) -> None:
        self._on_refused, self.period_s, self._clock = on_refused, period_s, clock
        self.max_devices, self.max_bytes = max_devices, max_bytes
        self._lock = threading.Lock()
        #: device -> [when its last refusal was logged, refusals since then not logged]
        self._logged: dict[str, list[float]] = {}
        #: Refusals so far by (kind, reason), for tests and benchmarks.
        self.refused: dict[tuple[str, str], int] = {}

    # parsing ---------------------------------------------------------------------------------
    def oversize(self, topic: str, payload: bytes) -> bool:
        """True (the message is refused, counted and maybe logged) when it is too large to be read at all."""
        if len(payload) <= self.max_bytes:
            return False
        kind = _kind(topic)
        device = _device_label(topic)
        self.refuse(device, kind, ReportError(
            f"ignoring a {len(payload)}-byte {kind} from device {device} (topic {topic[:200]}): device reports are at "
            f"most {self.max_bytes} bytes", reason="length"))
        return True

    def state(self, topic: str, payload: bytes) -> DeviceState | None:
        """The state on ``topic`` as the store writes it (received now), or None when it was refused."""
        report = self._parse(parse_state, "state", topic, payload)
        if report is None:
            return None
        details = {k: v for k, v in report.details.items() if k in DETAIL_KEYS}
        return DeviceState(report.device, report.group, report.status, report.model, report.version, report.slots,
                           time.time(), report.chunk_slots, report.energy_mj, report.avg_watts, report.root_version,
                           report.stale, report.updated, report.session,
                           _compact(details) if details and report.status == "online" else None, report.profile,
                           report.arch, report.connection)

    def event(self, topic: str, payload: bytes) -> EventReport | None:
        """The event on ``topic``, or None when it was refused."""
        return self._parse(parse_event, "event", topic, payload)

    def need(self, topic: str, payload: bytes) -> ChunkRequest | None:
        """The chunk request on ``topic``, or None when it was refused."""
        return self._parse(parse_chunk_request, "need", topic, payload)

    def _parse(self, parse: Callable[[str, bytes], _Report], kind: str, topic: str, payload: bytes) -> _Report | None:
        """``parse(device, payload)``, or None with the refusal counted and maybe logged."""
        try:
            return parse(Topics.device_of(topic), payload)
        except ReportError as exc:
            self.refuse(_device_label(topic), kind, exc)
            return None

    # refusals --------------------------------------------------------------------------------
    def dropped(self, device: str, kind: str, exc: BaseException) -> None:
        """A report the fleet store refused to write (it was isolated from its batch and dropped)."""
        self.refuse(device, kind, ReportError(f"the fleet store refused a {kind} of device {device} "
                                              f"({type(exc).__name__}: {str(exc)[:300]}); it was dropped",
                                              reason="store"))

    def refuse(self, device: str, kind: str, exc: ReportError) -> None:
        """Count one refused message of ``device`` and log it, unless this device was logged within ``period_s``."""
        reason = exc.reason if exc.reason in REFUSAL_REASONS else "type"
        kind = kind if kind in REFUSED_KINDS else "state"
        if self._on_refused is not None:
            self._on_refused(kind, reason)
        now = self._clock()
        with self._lock:
            self.refused[kind, reason] = self.refused.get((kind, reason), 0) + 1
            mark = self._logged.get(device)
            if mark is not None and now - mark[0] < self.period_s:
                mark[1] += 1
                return
            if mark is None and len(self._logged) >= self.max_devices:
                self._forget(now)
            suppressed = int(mark[1]) if mark is not None else 0
            self._logged[device] = [now, 0]
        field = f", field {exc.field}" if exc.field else ""
        more = (f"; {suppressed} more of its reports were refused in the last {self.period_s:g} s"
                if suppressed else "")
        message = str(exc) if exc.reason in ("length", "store") else f"ignoring a malformed {kind} from device " \
                                                                     f"{device}: {exc}"
        log.warning("%s (reason %s%s)%s", message, reason, field, more)

    def _forget(self, now: float) -> None:
        for device in [d for d, (at, _) in self._logged.items() if now - at >= self.period_s]:
            del self._logged[device]
        if len(self._logged) >= self.max_devices:  # all recent: forget them rather than grow
            self._logged.clear()


def _kind(topic: str) -> str:
    parts = topic.split("/")
    return _TOPIC_KINDS.get(parts[3] if len(parts) > 3 else "", "state")


def _device_label(topic: str) -> str:
    """The device level of a topic, cut short (for logs and the rate limit; it may not be a valid id)."""
    parts = topic.split("/")
    return (parts[2] if len(parts) > 2 else topic)[:64]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
