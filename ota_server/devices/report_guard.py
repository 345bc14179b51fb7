"""Per-device limits on the reports the server reads, so that one device's flood cannot crowd out the fleet.

A device holding broker credentials can publish on its own state, events and need topics as fast
as its link allows (the broker's ACL keeps it to its own topics, and its packet cap keeps each
message small). Without a limit every message is parsed and queued for the fleet store, and a
single device can grow the queue, the event log and the server's CPU without bound. A real
agent sends a handful of events per deployment and a state when something changes, so the
limits below sit far above it.

- **Events** (and chunk requests and measurement results) pass one token bucket per device: ``burst`` at once, then
  ``rate`` per second. What is over it is dropped unparsed and counted.
- **States** are the device's latest word, so none is simply dropped: over its bucket, a state
  waits in :attr:`ReportGuard.deferred` (one per device, a newer replacing an older) until the
  bucket refills, and :meth:`ReportGuard.due` hands it back. The server's view of a flooding
  device still ends on the device's last state.
- Each flooding device is reported: :meth:`ReportGuard.flood_reports` yields one line per device
  and ``report_every_s`` with what was dropped or replaced, which the server writes to its event
  log as a ``flood`` event and counts in ``edgesdk_ota_reports_refused_total``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError

__all__ = ["ReportGuard", "ReportLimits"]


@dataclass(frozen=True)
class ReportLimits:
    """Token buckets per device: ``*_burst`` messages at once, then ``*_per_s`` each second."""

    state_burst: int = 50
    state_per_s: float = 5.0
    event_burst: int = 200
    event_per_s: float = 10.0
    #: At most one ``flood`` event per device this often (the drops in between are summed into it).
    report_every_s: float = 60.0
    #: Buckets kept at most; beyond this, full buckets (devices that are quiet) are forgotten.
    max_devices: int = 200_000

    def __post_init__(self) -> None:
        for name in ("state_burst", "event_burst", "max_devices"):
            if not getattr(self, name) >= 1:
                raise EdgeSDKError(f"ReportLimits.{name}={getattr(self, name)!r} must be a whole number >= 1")
        for name in ("state_per_s", "event_per_s", "report_every_s"):
            if not getattr(self, name) > 0:
                raise EdgeSDKError(f"ReportLimits.{name}={getattr(self, name)!r} must be > 0")


class _Bucket:
    __slots__ = ("tokens", "stamp")

    def __init__(self, burst: int, now: float) -> None:
        self.tokens, self.stamp = float(burst), now

    def take(self, burst: int, per_s: float, now: float) -> bool:
        self.tokens = min(float(burst), self.tokens + (now - self.stamp) * per_s)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def full(self, burst: int, per_s: float, now: float) -> bool:
        return self.tokens + (now - self.stamp) * per_s >= burst


@dataclass
class _Flood:
    first: float
    refused: dict[str, int]


class ReportGuard:
    """Decides, per device, which of its reports the server reads now (thread-safe)."""

    def __init__(self, limits: ReportLimits | None = None, on_refused: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or ReportLimits()
        #: Called with the kind of each report refused (dropped, or a waiting state replaced), as it happens.
        self._on_refused = on_refused
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _Bucket] = {}
        self._events: dict[str, _Bucket] = {}
        #: device -> (topic, payload) of its newest state that is waiting for its bucket.
        self.deferred: dict[str, tuple[str, bytes]] = {}
        self._floods: dict[str, _Flood] = {}
        self._reported: dict[str, float] = {}

    def admit_state(self, device: str, topic: str, payload: bytes) -> bool:
        """True: read this state now. False: it waits as the device's newest (see :meth:`due`)."""
        lim = self.limits
        with self._lock:
            if device not in self.deferred and self._take(self._states, device, lim.state_burst, lim.state_per_s):
                return True
            if device in self.deferred:
                self._refused(device, "state")  # the waiting one is replaced, never read
            self.deferred[device] = (topic, payload)
            return False

    def admit(self, device: str, kind: str) -> bool:
        """True: read this event or chunk request; False: drop it (it is counted)."""
        if kind not in ("event", "need", "measurement"):
            raise EdgeSDKError(f"ReportGuard.admit kind={kind!r} must be 'event', 'need' or 'measurement'; states use "
                               "admit_state")
        lim = self.limits
        with self._lock:
            if self._take(self._events, device, lim.event_burst, lim.event_per_s):
                return True
            self._refused(device, kind)
            return False

    def due(self) -> list[tuple[str, bytes]]:
        """The waiting states whose device's bucket has refilled, taken out of :attr:`deferred`."""
        lim = self.limits
        with self._lock:
            ready = [d for d in self.deferred if self._take(self._states, d, lim.state_burst, lim.state_per_s)]
            return [self.deferred.pop(d) for d in ready]

    def flood_reports(self) -> Iterator[tuple[str, dict[str, int], float]]:
        """(device, refused per kind, seconds the count spans) for each device due a report, at most one per
        device and ``report_every_s``; the counts start again after each."""
        now = self._clock()
        with self._lock:
            due = [d for d, f in self._floods.items()
                   if now - self._reported.get(d, -self.limits.report_every_s) >= self.limits.report_every_s]
            taken = [(d, self._floods.pop(d)) for d in due]
            for d in due:
                self._reported[d] = now
            for d in [d for d, t in self._reported.items() if now - t >= self.limits.report_every_s
                      and d not in self._floods]:
                del self._reported[d]  # quiet for a whole period: its next flood is reported at once
        for device, flood in taken:
            yield device, flood.refused, now - flood.first

    def _take(self, buckets: dict[str, _Bucket], device: str, burst: int, per_s: float) -> bool:
        now = self._clock()
        bucket = buckets.get(device)
        if bucket is None:
            if len(buckets) >= self.limits.max_devices:
                self._forget_quiet(buckets, burst, per_s, now)
            bucket = buckets[device] = _Bucket(burst, now)
        return bucket.take(burst, per_s, now)

    def _forget_quiet(self, buckets: dict[str, _Bucket], burst: int, per_s: float, now: float) -> None:
        for device in [d for d, b in buckets.items() if b.full(burst, per_s, now) and d not in self.deferred]:
            del buckets[device]

    def _refused(self, device: str, kind: str) -> None:
        flood = self._floods.get(device)
        if flood is None:
            flood = self._floods[device] = _Flood(self._clock(), dict.fromkeys(("state", "event", "need", "measurement"), 0))
        flood.refused[kind] += 1
        if self._on_refused is not None:
            self._on_refused(kind)
