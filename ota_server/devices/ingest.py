"""Device reports into the fleet store in batches: one writer thread, one transaction per batch.

The MQTT thread only parses and queues; the writer takes whatever has queued up (at most
``max_batch``) and writes it in one transaction: the devices' states, the event log and the
targets the events move. Under load, batches grow by themselves, so the cost per report
falls as the fleet grows instead of every report paying its own commit. When reports trickle
in (devices coming back one by one: few wait behind the one it takes), the writer waits for others to
share the transaction (group commit) as long as they keep coming: until ``quiet_s`` passes with
none, or ``linger_s`` from the oldest report's arrival. One report per transaction cost a late
device about six transactions, each with its own round trips and commit; a lone report waits only
``quiet_s``. Under load the writer does not linger.

A batch that fails to write is handled by why it failed:

- **the connection** (the database restarting, locked, closed: :func:`connection_error`): the batch
  is kept and tried again every ``retry_s``; nothing is dropped;
- **its data** (a report the store refuses: a value it cannot bind, encode or that overflows a
  column: :func:`data_error`): the batch is split in halves, each written on its own, until the
  refused reports stand alone; those are dropped and passed to ``on_dropped`` (the server counts
  them as refused with reason ``store`` and logs them), and every other report is written. One
  poisoned report costs about ``2 log2(batch)`` extra transactions, never the fleet's ingest. The
  splitting is bounded (:func:`split_budget` transactions a batch, plus one try of each half
  still pending, at most log2 n): past it, the parts still failing are dropped whole, so an all-bad
  batch of n costs O(log n) transactions, not 2n - 1.
- **anything else** is a bug in this server, not bad data: it is logged with its traceback at
  ERROR and counted in :attr:`Ingest.errors`, and the batch (every report in it counted as
  dropped) is not split, since every part would fail the same way.
"""

from __future__ import annotations

import logging
import math
import queue
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from edgesdk.ota_server.devices.provisioning import GroupGuard
from edgesdk.ota_server.store.fleet_db import DeviceState, EventRow, FleetDB, TargetUpdate

__all__ = ["Ingest", "DeviceEvent", "connection_error", "data_error", "split_budget"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceEvent:
    """A device's event message: the log entry and, if it moves a rollout target, the move."""

    row: EventRow
    update: TargetUpdate | None


#: Called after each written batch with (kind, seconds from receipt to commit) for every report in it.
Observer = Callable[[str, float], None]
#: Called with (device, kind, the store's error) for each report the store refused and ingest dropped.
Dropped = Callable[[str, str, BaseException], None]
_Item = tuple[float, DeviceState | DeviceEvent]


def connection_error(exc: BaseException) -> bool:
    """True when ``exc`` (or an error it was raised from) says the database connection failed, not the data:
    SQLite's OperationalError (locked, I/O, full) or use of a closed connection; psycopg's OperationalError or
    InterfaceError; an EdgeSDKError raised from one (PostgreSQL not reachable again yet)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, sqlite3.OperationalError) or (
                isinstance(error, sqlite3.ProgrammingError) and "closed" in str(error)):
            return True
        if type(error).__module__.startswith("psycopg") and any(
                cls.__name__ in ("OperationalError", "InterfaceError") for cls in type(error).__mro__):
            return True
        error = error.__cause__ or error.__context__
    return False


def data_error(exc: BaseException) -> bool:
    """True when ``exc`` says the store refused a report's data (not the connection: :func:`connection_error`):
    a SQLite or psycopg error, a number that overflows a column, text that does not encode, or a payload the JSON
    encoder refuses."""
    if isinstance(exc, (sqlite3.Error, OverflowError, UnicodeError)):
        return True
    if any(cls.__module__.startswith("psycopg") for cls in type(exc).__mro__):
        return True
    if isinstance(exc, (TypeError, ValueError)):  # from json.dumps of an event's payload
        return any(frame.f_code.co_filename.endswith(("json/encoder.py", "json/__init__.py"))
                   for frame, _ in traceback.walk_tb(exc.__traceback__))
    return False


def split_budget(size: int) -> int:
    """Transactions one batch of ``size`` reports may take to isolate the ones the store refuses: room for about
    four poisoned reports (each costs about ``2 log2(size)``), and a floor for small batches."""
    return 8 * max(1, math.ceil(math.log2(max(size, 2)))) + 16


#: The writer lingers only when fewer reports than this wait behind the one it takes: reports trickling in. Under
#: load they queue up while it writes, batches fill by themselves, and a linger would only delay the answers a rollout
#: waits for.
LINGER_BELOW = 32


class Ingest:
    """Queues device states and events and writes them in batches (thread-safe)."""

    def __init__(self, db: FleetDB, observe: Observer | None = None, max_batch: int = 2000,
                 retry_s: float = 1.0, groups: GroupGuard | None = None, on_dropped: Dropped | None = None,
                 linger_s: float = 0.0, quiet_s: float | None = None) -> None:
        self.db, self._observe, self.max_batch, self.retry_s = db, observe, max_batch, retry_s
        #: How long after the oldest report of a batch the writer may wait for more before writing, when the last
        #: batch was small (0: it writes what has queued at once). A report that already waited that long is written
        #: at once.
        self.linger_s = linger_s
        #: The writer stops waiting once this long passes with no new report (None: it waits the whole ``linger_s``).
        self.quiet_s = quiet_s
        self._on_dropped = on_dropped
        #: Refuses states naming a group other than the device's provisioned one (None: every state is written).
        self.groups = groups
        self._queue: queue.Queue[tuple[float, DeviceState | DeviceEvent] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0  # queued or being written
        self._hurry = threading.Event()  # set while flush() waits: no lingering then
        self._thread = threading.Thread(target=self._run, name="fleet-ingest", daemon=True)
        self._thread.start()
        #: Batches written so far, and the reports in them (for tests and benchmarks).
        self.batches = 0
        self.written = 0
        #: Reports the store refused (dropped), and batch writes retried after a connection error.
        self.dropped = 0
        self.retries = 0
        #: Batches dropped on a server error that was not their data (each logged with its traceback).
        self.errors = 0
        #: Events naming a rollout their device is no target of, written without it (:meth:`_bound_to_targets`).
        self.unbound_events = 0

    def put(self, report: DeviceState | DeviceEvent) -> None:
        """Queue one report, stamped with the time it arrived."""
        with self._idle:
            self._pending += 1
        self._queue.put((time.monotonic(), report))

    @property
    def pending(self) -> int:
        """Reports queued or being written."""
        return self._pending

    def flush(self, timeout: float = 10.0, hurry: bool = False) -> bool:
        """Wait until everything queued so far is written (with ``hurry``, the writer stops lingering for more); False
        if that took longer than ``timeout``."""
        if hurry:
            self._hurry.set()
        try:
            with self._idle:
                return self._idle.wait_for(lambda: self._pending == 0, timeout)
        finally:
            if hurry:  # a plain flush (stop(), a test) must not end another caller's hurry
                self._hurry.clear()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            # Judged by the queue, not by the last batch: a trickle of LINGER_BELOW reports a linger would alternate
            # with a batch of one written at once (the last batch was full), a transaction that shares nothing.
            batch = self._gather(first, linger=self._queue.qsize() < LINGER_BELOW)
            self._write_until_done(batch)

    def _gather(self, first: _Item, linger: bool) -> list[_Item]:
        """``first`` and what queues after it: until ``max_batch``, the queue is empty (after :meth:`_linger` when
        ``linger``), or the writer is told to stop."""
        if linger:
            self._linger(first[0] + self.linger_s)
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(item)
        return batch

    def _linger(self, until: float) -> None:
        """Wait for more reports while they keep coming: until ``until``, a ``quiet_s`` with none new, a full batch,
        or a :meth:`flush`. Not a wait on the queue: each report put meanwhile would wake the writer."""
        queued = self._queue.qsize()
        while (left := until - time.monotonic()) > 0:
            if self._hurry.wait(left if self.quiet_s is None else min(left, self.quiet_s)):
                return  # someone waits for what is queued (a push deciding on the devices' states)
            now_queued = self._queue.qsize()
            if now_queued == queued or now_queued + 1 >= self.max_batch:
                return
            queued = now_queued

    def _write_until_done(self, batch: list[_Item]) -> None:
        written = self._write_isolating(batch)
        done = time.monotonic()
        if self._observe is not None:
            for received, report in written:
                self._observe("state" if isinstance(report, DeviceState) else "event", done - received)
        self.batches += 1
        self.written += len(written)
        with self._idle:
            self._pending -= len(batch)
            self._idle.notify_all()

    def _write_isolating(self, batch: list[_Item], budget: list[int] | None = None) -> list[_Item]:
        """Write ``batch``; on a data error, its halves in order, down to the single reports the store refuses
        (dropped), within ``budget`` transactions (then a failing part is dropped whole). A connection error waits
        and tries the same part again; any other error drops the batch, loudly (module doc). The reports written."""
        budget = budget if budget is not None else [split_budget(len(batch))]
        while True:
            try:
                self._write(batch)
            except Exception as exc:
                if connection_error(exc):  # the database went away: keep the batch, try again (costs no budget)
                    self.retries += 1
                    log.warning("writing %d device reports failed (%s: %s); retrying in %g s", len(batch),
                                type(exc).__name__, str(exc).strip()[:300], self.retry_s)
                    time.sleep(self.retry_s)
                    continue
                budget[0] -= 1
                if not data_error(exc):
                    self.errors += 1
                    log.error("writing %d device reports failed on a server error, not their data; they are dropped",
                              len(batch), exc_info=exc)
                    for _, report in batch:
                        self._drop(report, exc)
                    return []
                if len(batch) > 1 and budget[0] >= 2:
                    half = len(batch) // 2
                    return self._write_isolating(batch[:half], budget) + self._write_isolating(batch[half:], budget)
                if len(batch) > 1:
                    log.warning("the fleet store refused %d device reports of one batch past its split budget; they "
                                "are dropped whole", len(batch))
                for _, report in batch:
                    self._drop(report, exc)
                return []
            budget[0] -= 1
            return batch

    def _drop(self, report: DeviceState | DeviceEvent, exc: BaseException) -> None:
        self.dropped += 1
        device = report.device_id if isinstance(report, DeviceState) else str(report.row.device_id)
        kind = "state" if isinstance(report, DeviceState) else "event"
        if self._on_dropped is not None:
            self._on_dropped(device, kind, exc)
        else:
            log.warning("the fleet store refused a %s of device %s (%s: %s); it was dropped", kind, device,
                        type(exc).__name__, str(exc)[:300])

    def _write(self, batch: list[_Item]) -> None:
        states, rows, updates = [], [], []
        for _, report in batch:
            if isinstance(report, DeviceState):
                states.append(report)
            else:
                rows.append(report.row)
                if report.update is not None:
                    updates.append(report.update)
        with self.db.transaction():
            self.db.upsert_devices(self.groups.admit(states) if self.groups is not None else states)
            self.db.log_many(self._bound_to_targets(rows))
            self.db.set_targets(updates)

    def _bound_to_targets(self, rows: list[EventRow]) -> list[EventRow]:
        """``rows`` with each event's rollout kept only when its device is a target of it: a device names the
        deployment in its own event, and one that is no target must not write into another rollout's log (the
        claim is kept in the payload as ``claimed_rollout``, and counted in :attr:`unbound_events`)."""
        claims: dict[str, set[str]] = {}
        for row in rows:
            if row.rollout_id is not None and row.device_id is not None:
                claims.setdefault(row.rollout_id, set()).add(row.device_id)
        targets = {(rollout, device) for rollout, devices in claims.items()
                   for device in self.db.targets_of(rollout, sorted(devices))}
        kept = []
        for row in rows:
            if row.rollout_id is not None and row.device_id is not None and (row.rollout_id, row.device_id) \
                    not in targets:
                self.unbound_events += 1
                row = replace(row, rollout_id=None, payload={**row.payload, "claimed_rollout": row.rollout_id})
            kept.append(row)
        return kept
