"""Counters in the fleet store that every replica shares: each value is handed out once, and never goes back.

The timestamp metadata's version (:mod:`edgesdk.ota_server.devices.freshness`) comes from here and not from
a clock: a replica whose clock runs a day ahead would otherwise publish versions that make devices ignore
every honest timestamp for a day. Migration 9 starts it at the database clock's milliseconds, above the
versions earlier servers derived from their own clocks; from then on each publication adds one, inside a
transaction (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's row lock), so two replicas never get the same value.
"""

from __future__ import annotations

from edgesdk.ota_server.store.sql import Database

__all__ = ["CounterStore", "TIMESTAMP_VERSION"]

#: The counter timestamp metadata versions come from.
TIMESTAMP_VERSION = "timestamp_version"


class CounterStore:
    """The ``counters`` table of :class:`edgesdk.ota_server.store.fleet_db.FleetDB` (mixed into it)."""

    sql: Database

    def next_value(self, name: str) -> int:
        """Add one to the counter ``name`` (created at 1 when new) and return it: every caller, on any replica sharing
        the database, gets a value above every value handed out before."""
        with self.sql.transaction():
            if not self.sql.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (name,)):
                self.sql.execute("INSERT INTO counters (name, value) VALUES (?, 1)", (name,))
            return int(self.sql.rows("SELECT value FROM counters WHERE name = ?", (name,))[0]["value"])

    def next_timestamp_version(self) -> int:
        """The version of the next timestamp metadata to publish (see the module doc)."""
        return self.next_value(TIMESTAMP_VERSION)

    def counter(self, name: str) -> int | None:
        """The last value of counter ``name`` handed out (or its start), or None when it does not exist."""
        rows = self.sql.rows("SELECT value FROM counters WHERE name = ?", (name,))
        return int(rows[0]["value"]) if rows else None
