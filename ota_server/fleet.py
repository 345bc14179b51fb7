"""Fleet state in SQLite: devices, rollouts, per-device deployment status, an event log.

One connection guarded by a lock (the server's MQTT thread, rollout thread and HTTP
handlers all write); WAL journal so a crash or restart keeps every committed write.
Rows leave this module only as the records of :mod:`edgesdk.fleet_protocol` (and
:class:`EventRecord`); the SQL names stay here: ``grp`` is a record's ``group`` (GROUP is
an SQL keyword) and the ``wave`` columns are a record's ``stage``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.fleet_protocol import (
    DeviceRecord,
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    RolloutSummary,
    TargetRecord,
    TargetStatus,
)

__all__ = ["FleetDB", "EventRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    id TEXT PRIMARY KEY, grp TEXT NOT NULL, status TEXT NOT NULL, model TEXT, version TEXT,
    slots TEXT NOT NULL DEFAULT '[]', last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, model TEXT NOT NULL, version TEXT NOT NULL, grp TEXT NOT NULL, policy TEXT NOT NULL,
    state TEXT NOT NULL, wave INTEGER NOT NULL, wave_started REAL, wave_settled REAL, reason TEXT,
    created REAL NOT NULL, updated REAL NOT NULL, rollback INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS targets (
    rollout_id TEXT NOT NULL, device_id TEXT NOT NULL, wave INTEGER NOT NULL, status TEXT NOT NULL,
    reason TEXT, previous_version TEXT, sent REAL, updated REAL NOT NULL, PRIMARY KEY (rollout_id, device_id));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, device_id TEXT, rollout_id TEXT, type TEXT NOT NULL,
    payload TEXT NOT NULL);
"""


@dataclass(frozen=True)
class EventRecord:
    """One entry of the event log: a device's event message or a rollout's or measurement's milestone."""

    id: int
    ts: float
    device_id: str | None
    rollout_id: str | None
    type: str
    payload: dict[str, Any]


def _device(row: sqlite3.Row) -> DeviceRecord:
    return DeviceRecord(row["id"], row["grp"], row["status"], row["model"], row["version"],
                        tuple(json.loads(row["slots"])), row["last_seen"])


def _target(row: sqlite3.Row) -> TargetRecord:
    return TargetRecord(row["rollout_id"], row["device_id"], row["wave"], TargetStatus(row["status"]), row["reason"],
                        row["previous_version"], row["sent"], row["updated"])


class FleetDB:
    """The fleet's devices, rollouts, targets and event log in one SQLite file (safe across threads)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self._lock:
            self._db.execute(sql, args)

    # devices -------------------------------------------------------------------------------
    def upsert_device(self, device_id: str, group: str, status: str, model: str | None, version: str | None,
                      slots: list[str]) -> None:
        """Record a device's reported state; model, version and slots keep their last known values when absent."""
        self._exec("""INSERT INTO devices (id, grp, status, model, version, slots, last_seen) VALUES (?,?,?,?,?,?,?)
                      ON CONFLICT(id) DO UPDATE SET grp=excluded.grp, status=excluded.status,
                      model=COALESCE(excluded.model, devices.model), version=COALESCE(excluded.version, devices.version),
                      slots=CASE WHEN excluded.status='online' THEN excluded.slots ELSE devices.slots END,
                      last_seen=excluded.last_seen""",
                   (device_id, group, status, model, version, json.dumps(slots), time.time()))

    def devices(self, group: str | None = None) -> list[DeviceRecord]:
        """Every device (of ``group``, if given), by id."""
        return [_device(r) for r in self._rows("SELECT * FROM devices WHERE (? IS NULL OR grp = ?) ORDER BY id",
                                               (group, group))]

    def device(self, device_id: str) -> DeviceRecord | None:
        """One device, or None if it never reported."""
        rows = self._rows("SELECT * FROM devices WHERE id = ?", (device_id,))
        return _device(rows[0]) if rows else None

    def device_counts(self) -> list[tuple[str, str | None, str | None, int]]:
        """How many devices are in each (status, model, version), for metrics."""
        rows = self._rows("SELECT status, model, version, COUNT(*) AS n FROM devices GROUP BY status, model, version")
        return [(r["status"], r["model"], r["version"], int(r["n"])) for r in rows]

    # rollouts ------------------------------------------------------------------------------
    def add_rollout(self, rollout_id: str, model: str, version: str, group: str, policy: RolloutPolicy,
                    rollback: bool = False) -> None:
        """A new ``running`` rollout before its first stage (stage -1); its targets follow with :meth:`add_target`."""
        now = time.time()
        self._exec("""INSERT INTO rollouts (id, model, version, grp, policy, state, wave, created, updated, rollback)
                      VALUES (?,?,?,?,?,?,-1,?,?,?)""",
                   (rollout_id, model, version, group, json.dumps(policy.to_dict()), RolloutState.RUNNING.value,
                    now, now, int(rollback)))

    def rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout with its policy and targets (by stage, then device), or None."""
        rows = self._rows("SELECT * FROM rollouts WHERE id = ?", (rollout_id,))
        if not rows:
            return None
        r = rows[0]
        targets = self._rows("SELECT * FROM targets WHERE rollout_id = ? ORDER BY wave, device_id", (rollout_id,))
        return RolloutRecord(r["id"], r["model"], r["version"], r["grp"], RolloutPolicy.from_dict(json.loads(r["policy"])),
                             RolloutState(r["state"]), r["wave"], r["wave_started"], r["wave_settled"], r["reason"],
                             r["created"], r["updated"], bool(r["rollback"]), tuple(_target(t) for t in targets))

    def rollouts(self, state: RolloutState | None = None) -> list[RolloutSummary]:
        """Every rollout (in ``state``, if given), oldest first."""
        value = None if state is None else state.value
        rows = self._rows("SELECT id, model, version, grp, state, wave, reason, created FROM rollouts "
                          "WHERE (? IS NULL OR state = ?) ORDER BY created", (value, value))
        return [RolloutSummary(r["id"], r["model"], r["version"], r["grp"], RolloutState(r["state"]), r["wave"],
                               r["reason"], r["created"]) for r in rows]

    def rollout_counts(self) -> dict[RolloutState, int]:
        """How many rollouts are in each state, for metrics."""
        rows = self._rows("SELECT state, COUNT(*) AS n FROM rollouts GROUP BY state")
        return {RolloutState(r["state"]): int(r["n"]) for r in rows}

    def start_stage(self, rollout_id: str, stage: int) -> None:
        """Mark ``stage`` (0-based) as sent now; it is not settled until all its devices report."""
        now = time.time()
        self._exec("UPDATE rollouts SET wave = ?, wave_started = ?, wave_settled = NULL, updated = ? WHERE id = ?",
                   (stage, now, now, rollout_id))

    def settle_stage(self, rollout_id: str, when: float) -> None:
        """Every device of the current stage reported at ``when``: the health window starts."""
        self._exec("UPDATE rollouts SET wave_settled = ?, updated = ? WHERE id = ?", (when, time.time(), rollout_id))

    def end_rollout(self, rollout_id: str, state: RolloutState, reason: str) -> None:
        """Leave ``running`` for ``completed`` or ``aborted``, saying why."""
        self._exec("UPDATE rollouts SET state = ?, reason = ?, updated = ? WHERE id = ?",
                   (state.value, reason, time.time(), rollout_id))

    def add_target(self, rollout_id: str, device_id: str, stage: int, previous_version: str | None) -> None:
        """A ``pending`` device of stage ``stage`` (0-based); a device already in the rollout is kept as it is."""
        self._exec("""INSERT OR IGNORE INTO targets (rollout_id, device_id, wave, status, previous_version, updated)
                      VALUES (?,?,?,?,?,?)""",
                   (rollout_id, device_id, stage, TargetStatus.PENDING.value, previous_version, time.time()))

    def set_target(self, rollout_id: str, device_id: str, status: TargetStatus, reason: str | None = None,
                   sent_at: float | None = None) -> None:
        """A target's new status; ``sent_at`` (the engine's clock) records when its command went out."""
        now = time.time()
        if sent_at is not None:
            self._exec("UPDATE targets SET status=?, reason=?, sent=?, updated=? WHERE rollout_id=? AND device_id=?",
                       (status.value, reason, sent_at, now, rollout_id, device_id))
        else:
            self._exec("UPDATE targets SET status=?, reason=?, updated=? WHERE rollout_id=? AND device_id=?",
                       (status.value, reason, now, rollout_id, device_id))

    # events --------------------------------------------------------------------------------
    def log(self, type: str, payload: dict[str, Any], device_id: str | None = None,
            rollout_id: str | None = None) -> None:
        """Append an event (``payload`` is stored as JSON)."""
        self._exec("INSERT INTO events (ts, device_id, rollout_id, type, payload) VALUES (?,?,?,?,?)",
                   (time.time(), device_id, rollout_id, type, json.dumps(payload)))

    def events(self, rollout_id: str | None = None, device_id: str | None = None) -> list[EventRecord]:
        """The event log (of one rollout and/or device, if given), oldest first."""
        rows = self._rows("""SELECT * FROM events WHERE (? IS NULL OR rollout_id = ?) AND (? IS NULL OR device_id = ?)
                             ORDER BY id""", (rollout_id, rollout_id, device_id, device_id))
        return [EventRecord(r["id"], r["ts"], r["device_id"], r["rollout_id"], r["type"], json.loads(r["payload"]))
                for r in rows]

    def close(self) -> None:
        """Close the database (committed writes are already on disk)."""
        with self._lock:
            self._db.close()
