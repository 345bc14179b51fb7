"""What a ManagedRuntime served, per model version and per minute: the traffic ledger.

Each :class:`~edgesdk.agent.managed.ManagedRuntime` keeps one :class:`TrafficLedger`. When a
runtime starts serving (after its health check) the ledger takes its counters' zero point
(:meth:`TrafficLedger.activate` returns a :class:`Meter`); each :meth:`TrafficLedger.fold` adds what
that runtime served since the previous fold (calls, errors, latency histogram) to its own bundle's
version, in the wall-clock slot of :data:`SLOT_S` seconds the fold happens in. So the health
check's calls are never counted, and an old version's calls never count for the new one: a runtime
a swap retires is folded one last time when it closes, into its own version.

The ledger keeps the last :data:`HORIZON_S` seconds of slots, for at most :data:`MAX_VERSIONS`
versions (those activated last). :meth:`TrafficLedger.document` is the app file's content
(:mod:`edgesdk.agent.app_file`); the agent merges it with the other apps'
(:mod:`edgesdk.agent.app_traffic`).
Nothing here starts a thread or touches a file: the exporter (:mod:`edgesdk.agent.app_stats`) or the
agent folds it, and tests drive it with a fake clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgesdk.runtime.latency_histogram import merge, subtract

__all__ = ["TrafficLedger", "Meter", "SLOT_S", "HORIZON_S", "MAX_VERSIONS", "slot_of", "in_horizon"]

#: Length of a slot (seconds of wall clock), named by its start: ``floor(t / SLOT_S) * SLOT_S``.
SLOT_S = 60
#: How far back the ledger (and the agent's report) keeps slots.
HORIZON_S = 900
#: Versions a ledger keeps at most: the ones activated last.
MAX_VERSIONS = 4

#: What a runtime's counters read: calls, failed calls, dense latency histogram.
Counters = tuple[int, int, list[int]]


def slot_of(t: float) -> int:
    """The start of the slot wall-clock time ``t`` falls in."""
    return int(math.floor(t / SLOT_S) * SLOT_S)


def in_horizon(slot_start: float, now: float, horizon_s: float = HORIZON_S) -> bool:
    """Whether a slot starting at ``slot_start`` overlaps the ``horizon_s`` s before ``now``."""
    return slot_start + SLOT_S > now - horizon_s


class Meter:
    """One runtime's counters as last folded, and the version its calls belong to."""

    def __init__(self, version: str, model: str, activated: float,
                 read: Callable[[], Counters]) -> None:
        self.version, self.model, self.activated = version, model, activated
        self._read = read
        #: The zero point: what the runtime did before serving (its health check) never counts.
        self.last: Counters = read()

    def take(self) -> tuple[int, int, list[list[int]]]:
        """Calls, errors and sparse histogram since the previous take (under the ledger's lock)."""
        now = self._read()
        calls, errors = now[0] - self.last[0], now[1] - self.last[1]
        histogram = subtract(now[2], self.last[2])
        self.last = now
        return calls, errors, histogram


@dataclass
class _Slot:
    calls: int = 0
    errors: int = 0
    local: int = 0
    cloud: int = 0
    histogram: list[list[int]] = field(default_factory=list)

    def row(self, start: int) -> list[Any]:
        return [start, self.calls, self.errors, self.local, self.cloud, self.histogram]


@dataclass
class _Version:
    model: str
    #: When this ledger's owner began serving the version (kept while the version is in the ledger).
    activated: float
    slots: dict[int, _Slot] = field(default_factory=dict)


class TrafficLedger:
    """Per version and slot: calls, errors, predict_async's local and cloud requests, latencies.

    Thread-safe. ``clock`` is wall-clock seconds (slots are named by it, and the agent compares them
    across processes); tests pass a fake one.
    """

    def __init__(self, clock: Callable[[], float] = time.time, horizon_s: float = HORIZON_S,
                 max_versions: int = MAX_VERSIONS) -> None:
        self._clock, self.horizon_s, self.max_versions = clock, horizon_s, max_versions
        self._lock = threading.Lock()
        #: version -> its log, in order of last activation (the newest last).
        self._versions: dict[str, _Version] = {}
        #: When the owner first served (its first activation); None before.
        self.session: float | None = None
        #: How many folds added something (an exporter writes only when it moved).
        self.changes = 0
        self._paths = (0, 0)

    def activate(self, version: str, model: str, read: Callable[[], Counters]) -> Meter:
        """A runtime of ``model`` ``version`` starts serving: its zero point is ``read()`` now."""
        with self._lock:
            now = self._clock()
            if self.session is None:
                self.session = now
            log = self._versions.pop(version, None) or _Version(model, now)
            self._versions[version] = log  # the newest activation last
            self._evict(keep=version)
            self.changes += 1
            return Meter(version, model, log.activated, read)

    def fold(self, meter: Meter, paths: Callable[[], tuple[int, int]] | None = None) -> bool:
        """Add what ``meter``'s runtime served since the last fold to its version's current slot.

        ``paths`` reads the owner's running totals of predict_async requests run locally and sent
        to the cloud; their increase since the last fold with paths counts for this version too.
        Returns whether anything was added.
        """
        with self._lock:
            calls, errors, histogram = meter.take()
            local = cloud = 0
            if paths is not None:
                totals = paths()
                local = max(0, totals[0] - self._paths[0])
                cloud = max(0, totals[1] - self._paths[1])
                self._paths = (max(totals[0], self._paths[0]), max(totals[1], self._paths[1]))
            if not (calls or errors or local or cloud):
                return False
            now = self._clock()
            log = self._versions.get(meter.version)
            if log is None:  # evicted while this runtime drained: it is back as the newest version
                log = self._versions[meter.version] = _Version(meter.model, meter.activated)
                self._evict(keep=meter.version)
            slot = log.slots.setdefault(slot_of(now), _Slot())
            slot.calls += calls
            slot.errors += errors
            slot.local += local
            slot.cloud += cloud
            if histogram:
                slot.histogram = merge([slot.histogram, histogram])
            self._prune(now)
            self.changes += 1
            return True

    def _evict(self, keep: str) -> None:
        """Drop the versions activated longest ago beyond ``max_versions`` (never ``keep``)."""
        for version in list(self._versions):
            if len(self._versions) <= self.max_versions:
                return
            if version != keep:
                del self._versions[version]

    def _prune(self, now: float) -> None:
        for log in self._versions.values():
            for start in [s for s in log.slots if not in_horizon(s, now, self.horizon_s)]:
                del log.slots[start]

    def document(self) -> dict[str, Any]:
        """The ledger now: ``{"session", "versions": {version: {"model", "activated", "slots"}}}``.

        A slot is ``[start, calls, errors, local, cloud, sparse_histogram]``; versions with no slot
        in the horizon and activated before it are left out.
        """
        with self._lock:
            now = self._clock()
            self._prune(now)
            versions = {
                version: {"model": log.model, "activated": log.activated,
                          "slots": [slot.row(start) for start, slot in sorted(log.slots.items())]}
                for version, log in self._versions.items()
                if log.slots or log.activated > now - self.horizon_s}
            return {"session": self.session, "versions": versions}
