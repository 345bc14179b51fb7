"""The fleet store's event log: what devices reported and what the server did, appended, never changed."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from edgesdk.ota_server.store.rows import EventRecord, EventRow, where_clause
from edgesdk.ota_server.store.sql import Database

__all__ = ["EventLogStore"]


class EventLogStore:
    """The ``events`` table of :class:`edgesdk.ota_server.store.fleet_db.FleetDB` (mixed into it)."""

    sql: Database

    def log_many(self, events: Sequence[EventRow]) -> None:
        """Append events (payloads stored as JSON) in one transaction."""
        now = time.time()
        self.sql.execute_many("INSERT INTO events (ts, device_id, rollout_id, type, payload) VALUES (?,?,?,?,?)",
                              [(e.ts or now, e.device_id, e.rollout_id, e.type, json.dumps(e.payload)) for e in events])

    def log(self, type: str, payload: dict[str, Any], device_id: str | None = None,
            rollout_id: str | None = None) -> None:
        """Append one event (``payload`` is stored as JSON)."""
        self.log_many([EventRow(type, payload, device_id, rollout_id)])

    def events(self, rollout_id: str | None = None, device_id: str | None = None) -> list[EventRecord]:
        """The event log (of one rollout and/or device, if given), oldest first."""
        where, args = where_clause({"rollout_id": rollout_id, "device_id": device_id})
        rows = self.sql.rows(f"SELECT * FROM events{where} ORDER BY id", args)
        return [EventRecord(r["id"], r["ts"], r["device_id"], r["rollout_id"], r["type"], json.loads(r["payload"]))
                for r in rows]
