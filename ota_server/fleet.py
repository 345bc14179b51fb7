"""Fleet state in SQLite: devices, rollouts, per-device deployment status, an event log.

One connection guarded by a lock (the server's MQTT thread, rollout thread and HTTP
handlers all write); WAL journal so a crash or restart keeps every committed write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["FleetDB", "TERMINAL"]

#: Per-device statuses after which a device is done with a deployment.
TERMINAL = ("committed", "failed", "rolled_back", "rejected", "timeout")

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


class FleetDB:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows as dicts; the SQL column ``grp`` (GROUP is an SQL keyword) is called ``group`` outside."""
        with self._lock:
            rows = [dict(r) for r in self._db.execute(sql, args).fetchall()]
        for r in rows:
            if "grp" in r:
                r["group"] = r.pop("grp")
        return rows

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self._lock:
            self._db.execute(sql, args)

    # devices -------------------------------------------------------------------------------
    def upsert_device(self, device_id: str, group: str, status: str, model: str | None, version: str | None,
                      slots: list[str]) -> None:
        self._exec("""INSERT INTO devices (id, grp, status, model, version, slots, last_seen) VALUES (?,?,?,?,?,?,?)
                      ON CONFLICT(id) DO UPDATE SET grp=excluded.grp, status=excluded.status,
                      model=COALESCE(excluded.model, devices.model), version=COALESCE(excluded.version, devices.version),
                      slots=CASE WHEN excluded.status='online' THEN excluded.slots ELSE devices.slots END,
                      last_seen=excluded.last_seen""",
                   (device_id, group, status, model, version, json.dumps(slots), time.time()))

    def devices(self, group: str | None = None) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM devices WHERE (? IS NULL OR grp = ?) ORDER BY id", (group, group))
        for r in rows:
            r["slots"] = json.loads(r["slots"])
        return rows

    def device(self, device_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM devices WHERE id = ?", (device_id,))
        if rows:
            rows[0]["slots"] = json.loads(rows[0]["slots"])
        return rows[0] if rows else None

    # rollouts ------------------------------------------------------------------------------
    def add_rollout(self, rollout_id: str, model: str, version: str, group: str, policy: dict[str, Any],
                    rollback: bool = False) -> None:
        now = time.time()
        self._exec("""INSERT INTO rollouts (id, model, version, grp, policy, state, wave, created, updated, rollback)
                      VALUES (?,?,?,?,?,'running',-1,?,?,?)""",
                   (rollout_id, model, version, group, json.dumps(policy), now, now, int(rollback)))

    def rollout(self, rollout_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM rollouts WHERE id = ?", (rollout_id,))
        if not rows:
            return None
        r = rows[0]
        r["policy"] = json.loads(r["policy"])
        r["targets"] = self._rows("SELECT * FROM targets WHERE rollout_id = ? ORDER BY wave, device_id", (rollout_id,))
        return r

    def rollouts(self, state: str | None = None) -> list[dict[str, Any]]:
        return self._rows("SELECT id, model, version, grp, state, wave, reason, created FROM rollouts "
                          "WHERE (? IS NULL OR state = ?) ORDER BY created", (state, state))

    def update_rollout(self, rollout_id: str, **fields: Any) -> None:
        fields["updated"] = time.time()
        assignments = ", ".join(f"{k} = ?" for k in fields)
        self._exec(f"UPDATE rollouts SET {assignments} WHERE id = ?", (*fields.values(), rollout_id))

    def add_target(self, rollout_id: str, device_id: str, wave: int, previous_version: str | None) -> None:
        self._exec("""INSERT OR IGNORE INTO targets (rollout_id, device_id, wave, status, previous_version, updated)
                      VALUES (?,?,?,'pending',?,?)""", (rollout_id, device_id, wave, previous_version, time.time()))

    def set_target(self, rollout_id: str, device_id: str, status: str, reason: str | None = None,
                   sent: bool = False) -> None:
        now = time.time()
        if sent:
            self._exec("UPDATE targets SET status=?, reason=?, sent=?, updated=? WHERE rollout_id=? AND device_id=?",
                       (status, reason, now, now, rollout_id, device_id))
        else:
            self._exec("UPDATE targets SET status=?, reason=?, updated=? WHERE rollout_id=? AND device_id=?",
                       (status, reason, now, rollout_id, device_id))

    # events --------------------------------------------------------------------------------
    def log(self, type: str, payload: dict[str, Any], device_id: str | None = None,
            rollout_id: str | None = None) -> None:
        self._exec("INSERT INTO events (ts, device_id, rollout_id, type, payload) VALUES (?,?,?,?,?)",
                   (time.time(), device_id, rollout_id, type, json.dumps(payload)))

    def events(self, rollout_id: str | None = None, device_id: str | None = None) -> list[dict[str, Any]]:
        rows = self._rows("""SELECT * FROM events WHERE (? IS NULL OR rollout_id = ?) AND (? IS NULL OR device_id = ?)
                             ORDER BY id""", (rollout_id, rollout_id, device_id, device_id))
        for r in rows:
            r["payload"] = json.loads(r["payload"])
        return rows

    def close(self) -> None:
        with self._lock:
            self._db.close()
