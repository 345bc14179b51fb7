"""Device reports into the fleet store in batches: one writer thread, one transaction per batch.

The MQTT thread only parses and queues; the writer takes whatever has queued up (at most
``max_batch``) and writes it in one transaction: the devices' states, the event log and the
targets the events move. Under load, batches grow by themselves, so the cost per report
falls as the fleet grows instead of every report paying its own commit. A batch that fails
to write (the database restarting) is kept and tried again; nothing is dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgesdk.ota_server.devices.provisioning import GroupGuard
from edgesdk.ota_server.store.fleet_db import DeviceState, EventRow, FleetDB, TargetUpdate

__all__ = ["Ingest", "DeviceEvent"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceEvent:
    """A device's event message: the log entry and, if it moves a rollout target, the move."""

    row: EventRow
    update: TargetUpdate | None


#: Called after each written batch with (kind, seconds from receipt to commit) for every report in it.
Observer = Callable[[str, float], None]


class Ingest:
    """Queues device states and events and writes them in batches (thread-safe)."""

    def __init__(self, db: FleetDB, observe: Observer | None = None, max_batch: int = 2000,
                 retry_s: float = 1.0, groups: GroupGuard | None = None) -> None:
        self.db, self._observe, self.max_batch, self.retry_s = db, observe, max_batch, retry_s
        #: Refuses states naming a group other than the device's provisioned one (None: every state is written).
        self.groups = groups
        self._queue: queue.Queue[tuple[float, DeviceState | DeviceEvent] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0  # queued or being written
        self._thread = threading.Thread(target=self._run, name="fleet-ingest", daemon=True)
        self._thread.start()
        #: Batches written so far, and the reports in them (for tests and benchmarks).
        self.batches = 0
        self.written = 0

    def put(self, report: DeviceState | DeviceEvent) -> None:
        """Queue one report, stamped with the time it arrived."""
        with self._idle:
            self._pending += 1
        self._queue.put((time.monotonic(), report))

    @property
    def pending(self) -> int:
        """Reports queued or being written."""
        return self._pending

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written; False if that took longer than ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

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
            self._write_until_done(batch)

    def _write_until_done(self, batch: list[tuple[float, DeviceState | DeviceEvent]]) -> None:
        while True:
            try:
                self._write(batch)
                break
            except Exception:  # the database went away: keep the batch, try again
                log.exception("writing %d device reports failed; retrying in %g s", len(batch), self.retry_s)
                time.sleep(self.retry_s)
        done = time.monotonic()
        if self._observe is not None:
            for received, report in batch:
                self._observe("state" if isinstance(report, DeviceState) else "event", done - received)
        self.batches += 1
        self.written += len(batch)
        with self._idle:
            self._pending -= len(batch)
            self._idle.notify_all()

    def _write(self, batch: list[tuple[float, DeviceState | DeviceEvent]]) -> None:
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
            self.db.log_many(rows)
            self.db.set_targets(updates)
