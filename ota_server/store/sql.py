"""The SQL databases a fleet store runs on: SQLite (embedded, the default) and PostgreSQL (shared by replicas).

One small interface, :class:`Database`, hides the two drivers: queries are written once with
``?`` placeholders, rows come back as mappings by column name, :meth:`Database.transaction`
groups writes (nested calls join the outer one) and the schema is versioned
(:data:`MIGRATIONS`, applied in order by :func:`open_database`, recorded in
``schema_version``). PostgreSQL takes an advisory lock while it migrates, so replicas starting
together do not migrate twice. A lost PostgreSQL connection (a restarted database) is opened
again, and a statement outside a transaction is retried once.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["Database", "SQLiteDatabase", "PostgresDatabase", "open_database", "MIGRATIONS", "IntegrityError",
           "redact_url"]

#: (version, what it does, statements). ``{real}`` is a float column type, ``{serial}`` an auto-numbered key.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "devices, rollouts, targets, events", (
        """CREATE TABLE IF NOT EXISTS devices (
            id TEXT PRIMARY KEY, grp TEXT NOT NULL, status TEXT NOT NULL, model TEXT, version TEXT,
            slots TEXT NOT NULL DEFAULT '[]', last_seen {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS rollouts (
            id TEXT PRIMARY KEY, model TEXT NOT NULL, version TEXT NOT NULL, grp TEXT NOT NULL, policy TEXT NOT NULL,
            state TEXT NOT NULL, wave INTEGER NOT NULL, wave_started {real}, wave_settled {real}, reason TEXT,
            created {real} NOT NULL, updated {real} NOT NULL, rollback INTEGER NOT NULL DEFAULT 0)""",
        """CREATE TABLE IF NOT EXISTS targets (
            rollout_id TEXT NOT NULL, device_id TEXT NOT NULL, wave INTEGER NOT NULL, status TEXT NOT NULL,
            reason TEXT, previous_version TEXT, sent {real}, updated {real} NOT NULL,
            PRIMARY KEY (rollout_id, device_id))""",
        """CREATE TABLE IF NOT EXISTS events (
            id {serial}, ts {real} NOT NULL, device_id TEXT, rollout_id TEXT, type TEXT NOT NULL,
            payload TEXT NOT NULL)""",
    )),
    (2, "scale: indexes for the engine's queries, stage sizes, re-send times, rollout leases for replicas", (
        "ALTER TABLE targets ADD COLUMN last_sent {real}",
        "ALTER TABLE rollouts ADD COLUMN stages TEXT",
        "ALTER TABLE rollouts ADD COLUMN lease_holder TEXT",
        "ALTER TABLE rollouts ADD COLUMN lease_expires {real}",
        "CREATE INDEX IF NOT EXISTS targets_by_stage ON targets (rollout_id, wave, status)",
        "CREATE INDEX IF NOT EXISTS devices_by_group ON devices (grp, id)",
        "CREATE INDEX IF NOT EXISTS rollouts_by_state ON rollouts (state, created)",
        "CREATE INDEX IF NOT EXISTS events_by_rollout ON events (rollout_id, id)",
        "CREATE INDEX IF NOT EXISTS events_by_device ON events (device_id, id)",
        # Two replicas (or two operators) starting a rollout to one group at once: the database refuses the second.
        "CREATE UNIQUE INDEX IF NOT EXISTS one_running_rollout_per_group ON rollouts (grp) WHERE state = 'running'",
    )),
    (3, "chunk reuse: the slots each device can take chunks from", (
        "ALTER TABLE devices ADD COLUMN chunk_slots TEXT NOT NULL DEFAULT '[]'",
    )),
    (4, "energy: each device's last reported energy per inference (mJ) and average power (W)", (
        "ALTER TABLE devices ADD COLUMN energy_mj {real}",
        "ALTER TABLE devices ADD COLUMN avg_watts {real}",
    )),
    (5, "trust: the root version each device holds and whether its freshness metadata expired (stale)", (
        "ALTER TABLE devices ADD COLUMN root_version INTEGER",
        "ALTER TABLE devices ADD COLUMN stale INTEGER",
    )),
    (6, "order: the device's own time of its last state, so a report written late by another replica is ignored", (
        "ALTER TABLE devices ADD COLUMN reported {real}",
    )),
    (7, "console: each device's last reported details (runtime statistics, offload paths, disk, previous version)", (
        "ALTER TABLE devices ADD COLUMN details TEXT",
    )),
    (8, "desired state: each group's release, the group each device is provisioned in, late targets, flagged "
        "releases, and the devices to reconcile", (
        """CREATE TABLE IF NOT EXISTS group_releases (
            grp TEXT PRIMARY KEY, model TEXT NOT NULL, version TEXT NOT NULL, rollout_id TEXT NOT NULL,
            updated {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS provisioned (
            device_id TEXT PRIMARY KEY, grp TEXT NOT NULL, source TEXT NOT NULL, updated {real} NOT NULL)""",
        "ALTER TABLE targets ADD COLUMN late INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN flagged TEXT",
        # Set by every online state report, cleared once the reconciler has compared the device with its release:
        # the queue of devices to look at lives in the store, so any replica can work it.
        "ALTER TABLE devices ADD COLUMN reconcile INTEGER NOT NULL DEFAULT 0",
        # When the run of the agent that sent the stored state began: an earlier run's last will never overwrites it.
        "ALTER TABLE devices ADD COLUMN session {real}",
        "CREATE INDEX IF NOT EXISTS devices_to_reconcile ON devices (grp, id) WHERE reconcile = 1",
        "CREATE INDEX IF NOT EXISTS late_targets ON targets (rollout_id, status) WHERE late = 1",
    )),
    (9, "counters shared by replicas: the timestamp metadata version, one more per publication", (
        "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        # Earlier servers used their clock's milliseconds as the version: start above what a right clock sent.
        "INSERT INTO counters (name, value) VALUES ('timestamp_version', {now_ms})",
    )),
    (10, "boards: the profile and CPU architecture each device runs as, and the release artifact each target gets", (
        "ALTER TABLE devices ADD COLUMN profile TEXT",
        "ALTER TABLE devices ADD COLUMN arch TEXT",
        "ALTER TABLE targets ADD COLUMN artifact TEXT",
    )),
    (11, "canary analysis: each rollout's last stage verdict and the baseline figures kept for its next stage", (
        "ALTER TABLE rollouts ADD COLUMN verdict TEXT",
        "ALTER TABLE rollouts ADD COLUMN baseline TEXT",
    )),
    (12, "the connection of the agent's run a stored state came on: a report sent before that connection's will", (
        # was written never lists the device online again (see FleetDB.upsert_devices).
        "ALTER TABLE devices ADD COLUMN connection INTEGER",
    )),
    (13, "the catch-ups in flight across the fleet, counted from their own index entries (every engine tick asks)", (
        "CREATE INDEX IF NOT EXISTS late_by_status ON targets (status) WHERE late = 1",
    )),
    (14, "release history: the releases each group's completed rollouts set and the version it "
         "ran before its first (where a rollback may go); a flagged release's late installs counted "
         "when the operator resumed it", (
        """CREATE TABLE IF NOT EXISTS release_history (
            id {serial}, grp TEXT NOT NULL, model TEXT NOT NULL, version TEXT NOT NULL,
            rollout_id TEXT, kind TEXT NOT NULL, at {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS release_history_by_group ON release_history (grp, model, at)",
        "ALTER TABLE rollouts ADD COLUMN late_failed_resumed INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN late_answered_resumed INTEGER NOT NULL DEFAULT 0",
        # What a store written before this migration ran: its completed rollouts' releases, and for
        # each group's first rollout of a model, the version most of its targets had before it.
        "INSERT INTO release_history (grp, model, version, rollout_id, kind, at) SELECT grp, "
        "model, version, id, 'release', updated FROM rollouts WHERE state = 'completed'",
        "INSERT INTO release_history (grp, model, version, rollout_id, kind, at) "
        "SELECT r.grp, r.model, (SELECT t.previous_version FROM targets t "
        "WHERE t.rollout_id = r.id AND t.previous_version IS NOT NULL GROUP BY t.previous_version "
        "ORDER BY COUNT(*) DESC, t.previous_version LIMIT 1), r.id, 'before', r.created "
        "FROM rollouts r WHERE NOT EXISTS (SELECT 1 FROM rollouts o WHERE o.grp = r.grp "
        "AND o.model = r.model AND o.created < r.created) AND EXISTS (SELECT 1 FROM targets t "
        "WHERE t.rollout_id = r.id AND t.previous_version IS NOT NULL)",
    )),
    (15, "moves: the group a moved device was in, whose name its agent reports until it is told of the move", (
        "ALTER TABLE provisioned ADD COLUMN moved_from TEXT",
    )),
)

_TYPES = {"sqlite": {"real": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
                     "now_ms": "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"},
          "postgresql": {"real": "DOUBLE PRECISION", "serial": "BIGSERIAL PRIMARY KEY",
                         "now_ms": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"}}


class IntegrityError(EdgeSDKError):
    """A write broke a constraint of the schema (a duplicate key, a second running rollout of a group)."""


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)


class Database(abc.ABC):
    """A connection to the fleet store's database, safe to share between threads (one statement at a time)."""

    #: "sqlite" or "postgresql".
    dialect: str
    #: An SQL expression for the database server's clock in epoch seconds (see :meth:`now`).
    clock_sql: str

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # nesting of transaction()

    @abc.abstractmethod
    def _run(self, sql: str, args: Sequence[Any]) -> Any:
        """Execute one statement on the driver; the cursor."""

    @abc.abstractmethod
    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Execute one statement for each row of arguments."""

    @abc.abstractmethod
    def _begin(self) -> None: ...

    @abc.abstractmethod
    def _end(self, commit: bool) -> None: ...

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[Mapping[str, Any]]:
        """The rows of a query, each a mapping of column name to value."""
        with self._lock:
            return list(self._run(sql, args).fetchall())

    def now(self) -> float:
        """The database's clock, in epoch seconds: one clock for every replica sharing the database, whatever
        each host's own clock says."""
        return float(self.rows(f"SELECT {self.clock_sql} AS now")[0]["now"])

    def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        with self._lock:
            return int(self._run(sql, args).rowcount)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments, in one transaction."""
        if not rows:
            return
        with self.transaction():
            self._run_many(sql, rows)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside commits together or not at all; nested calls join the outermost transaction."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._begin()
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._end(commit=False)
                raise
            self._depth = 0
            self._end(commit=True)

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection (committed writes are kept)."""

    def migrate(self) -> int:
        """Apply the migrations this database lacks, in order; the schema version it is at afterwards."""
        with self.transaction():
            self._lock_schema()
            self._run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                      f"applied {_TYPES[self.dialect]['real']} NOT NULL)", ())
            rows = self._run("SELECT MAX(version) AS v FROM schema_version", ()).fetchall()
            current = rows[0]["v"] or 0
            newest = MIGRATIONS[-1][0]
            if current > newest:
                raise EdgeSDKError(f"the fleet database is at schema version {current}, newer than this edgesdk "
                                   f"({newest}); upgrade edgesdk on this server to the version the other replicas run")
            for version, description, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    self._run(statement.format(**_TYPES[self.dialect]), ())
                self._run("INSERT INTO schema_version (version, description, applied) VALUES (?, ?, ?)",
                          (version, description, time.time()))
                current = version
        return int(current)

    @abc.abstractmethod
    def size_bytes(self) -> int:
        """The database's size on disk."""

    def _lock_schema(self) -> None:  # noqa: B027 (SQLite's BEGIN IMMEDIATE already locks)
        """Keep other processes from migrating at the same time (inside the migration's transaction)."""


class SQLiteDatabase(Database):
    """One SQLite file in WAL mode: a crash keeps every committed write, readers do not block the writer."""

    dialect = "sqlite"
    clock_sql = "(julianday('now') - 2440587.5) * 86400.0"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:
            raise EdgeSDKError(f"{path} is not a usable SQLite fleet database ({exc}); restore it from a backup or "
                               "point --db at a new file") from exc
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=10000")

    def _run(self, sql: str, args: Sequence[Any]) -> Any:
        try:
            return self._db.execute(sql, tuple(args))
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(str(exc)) from exc

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(str(exc)) from exc

    def _begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _end(self, commit: bool) -> None:
        self._db.execute("COMMIT" if commit else "ROLLBACK")

    def size_bytes(self) -> int:
        """The file with its write-ahead log."""
        return sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()


_PLACEHOLDER = re.compile(r"\?")


class PostgresDatabase(Database):
    """A PostgreSQL database through psycopg 3 (the ``server`` extra); several servers may share it."""

    dialect = "postgresql"
    clock_sql = "EXTRACT(EPOCH FROM clock_timestamp())::float8"

    def __init__(self, url: str, connect_timeout_s: float = 10.0) -> None:
        super().__init__()
        try:
            import psycopg
        except ImportError as exc:
            raise EdgeSDKError("PostgreSQL needs psycopg: pip install 'edgesdk[server]'") from exc
        self._psycopg = psycopg
        self.url, self._timeout = url, connect_timeout_s
        self._sql: dict[str, str] = {}
        self._transaction: Any = None
        self._conn = self._connect()

    def _connect(self) -> Any:
        from psycopg.rows import dict_row

        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return self._psycopg.connect(self.url, autocommit=True, row_factory=dict_row,
                                             connect_timeout=max(1, int(self._timeout)))
            except self._psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise EdgeSDKError(f"cannot reach PostgreSQL at {redact_url(self.url)}: {str(exc).strip()}; check "
                                       "--db (postgresql://USER:PASSWORD@HOST:PORT/DATABASE) and that the server "
                                       "runs") from exc
                time.sleep(0.2)

    def _native(self, sql: str) -> str:
        native = self._sql.get(sql)
        if native is None:
            native = self._sql[sql] = _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))
        return native

    def _retrying(self, call: Any) -> Any:
        try:
            return call()
        except self._psycopg.errors.IntegrityError as exc:
            raise IntegrityError(str(exc).strip()) from exc
        except self._psycopg.OperationalError:
            if self._depth or not self._conn.closed:
                raise
            self._conn = self._connect()  # the database restarted: open again, run the statement once more
            return call()

    def _run(self, sql: str, args: Sequence[Any]) -> Any:
        native = self._native(sql)
        return self._retrying(lambda: self._conn.execute(native, tuple(args)))

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        native = self._native(sql)

        def run() -> None:
            with self._conn.cursor() as cursor:
                cursor.executemany(native, [tuple(r) for r in rows])

        self._retrying(run)

    def _begin(self) -> None:
        if self._conn.closed:
            self._conn = self._connect()
        self._transaction = self._conn.transaction()
        self._transaction.__enter__()

    def _end(self, commit: bool) -> None:
        transaction, self._transaction = self._transaction, None
        if commit:
            transaction.__exit__(None, None, None)
        else:
            transaction.__exit__(RuntimeError, RuntimeError("rolled back"), None)

    def size_bytes(self) -> int:
        """``pg_database_size`` of the database."""
        return int(self.rows("SELECT pg_database_size(current_database()) AS n")[0]["n"])

    def _lock_schema(self) -> None:
        self._run("SELECT pg_advisory_xact_lock(?)", (0x6564676573646B,))  # "edgesdk"

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


def open_database(location: str | os.PathLike[str]) -> Database:
    """The fleet database at ``location`` (``postgresql://...``, ``sqlite:///path`` or a file path), migrated."""
    text = str(location)
    database: Database
    if text.startswith(("postgresql://", "postgres://")):
        database = PostgresDatabase(text)
    elif "://" in text and not text.startswith("sqlite:///"):
        raise EdgeSDKError(f"--db {redact_url(text)!r} is neither a file path, sqlite:///PATH nor "
                           "postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    else:
        database = SQLiteDatabase(text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else text)
    try:
        database.migrate()
    except BaseException:
        database.close()
        raise
    return database
