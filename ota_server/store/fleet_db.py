"""Fleet state: devices, rollouts, per-device deployment status and an event log, in SQLite or PostgreSQL.

Rows leave this module only as the records of :mod:`edgesdk.fleet.records` (and
:class:`EventRecord`); the SQL names stay here: ``grp`` is a record's ``group`` (GROUP is an
SQL keyword) and the ``wave`` columns are a record's ``stage``. Every query the rollout engine
runs on each tick is answered from an index and returns only what needs action (counts per
status, the targets due for a re-send or a timeout), so a tick costs the same with 100 or
100,000 devices; device reports are written in batches (:meth:`FleetDB.transaction`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import (
    DeviceRecord,
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    RolloutSummary,
    TargetRecord,
    TargetStatus,
)
from edgesdk.ota_server.store.counters import CounterStore
from edgesdk.ota_server.store.desired_state import DesiredStateStore
from edgesdk.ota_server.store.event_log import EventLogStore
from edgesdk.ota_server.store.release_history import ReleaseHistoryStore
from edgesdk.ota_server.store.rows import (
    DETAIL_KEYS,
    IN_FLIGHT,
    ONLINE_DEVICE,
    TIMEABLE,
    UNSETTLED_ABORT,
    UNSETTLED_ABORT_ARGS,
    DeviceState,
    EventRecord,
    EventRow,
    Provisioning,
    Release,
    TargetUpdate,
    device_record,
    id_chunks,
    rollout_record,
    target_record,
    up_to,
    where_clause,
)
from edgesdk.ota_server.store.sql import Database, IntegrityError, open_database
from edgesdk.ota_server.store.verdicts import VerdictStore

__all__ = ["FleetDB", "EventRecord", "DeviceState", "TargetUpdate", "EventRow", "DETAIL_KEYS", "Release",
           "Provisioning"]


class FleetDB(DesiredStateStore, ReleaseHistoryStore, CounterStore, VerdictStore, EventLogStore):
    """The fleet's devices, rollouts, targets and event log (safe across threads).

    ``location`` is a SQLite file path (the embedded default), ``sqlite:///PATH`` or
    ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (several server replicas may share one).
    """

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.sql: Database = open_database(location)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.sql.dialect

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes so they commit together (and cost one commit)."""
        with self.sql.transaction():
            yield

    # devices -------------------------------------------------------------------------------
    def upsert_devices(self, states: Sequence[DeviceState]) -> None:
        """Record devices' reported states; model, version and slots keep their last known values when absent.

        Slots are taken only from ``online`` reports (a last will does not list them). An online report puts the
        device in the reconciler's queue (:meth:`to_reconcile`): it may have come back, or be new. A state the device sent
        before the one stored (by its own ``reported`` time) is ignored: with several replicas, each report reaches
        one of them, and one may write it after another wrote a newer one. A device whose clock went back is
        believed again once the server has heard nothing newer from it for 10 minutes.

        A last will has no time of its own, so states and wills are ordered by the connection they came on
        (:attr:`DeviceState.session` and :attr:`DeviceState.connection`, stored from the last state written):

        - a will of an earlier connection than the stored state's is ignored: written late by another replica, it
          would list a device that came back as gone;
        - an online state of the connection whose will is stored, or of an earlier connection of the same run, is
          ignored: the device sent it before that connection dropped, and written late it would list a device that
          is gone as online (the server would send it commands nobody receives, and time them out as failures). Only
          connection numbers of one run are compared here, never sessions: a board without a real-time clock may
          start its next run at an earlier time than the last, and that run's states must still count.

        A report that does not say its connection (an agent of an earlier release) is ordered by session alone.
        """
        self.sql.execute_many(
            """INSERT INTO devices (id, grp, status, model, version, slots, chunk_slots, last_seen, energy_mj, avg_watts,
                                    root_version, stale, reported, details, reconcile, session, profile, arch,
                                    connection)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
               ON CONFLICT(id) DO UPDATE SET grp=excluded.grp, status=excluded.status,
               model=COALESCE(excluded.model, devices.model), version=COALESCE(excluded.version, devices.version),
               slots=CASE WHEN excluded.status='online' THEN excluded.slots ELSE devices.slots END,
               chunk_slots=CASE WHEN excluded.status='online' THEN excluded.chunk_slots ELSE devices.chunk_slots END,
               last_seen=excluded.last_seen, energy_mj=COALESCE(excluded.energy_mj, devices.energy_mj),
               avg_watts=COALESCE(excluded.avg_watts, devices.avg_watts),
               root_version=CASE WHEN excluded.status='online' THEN excluded.root_version ELSE devices.root_version END,
               stale=CASE WHEN excluded.status='online' THEN excluded.stale ELSE devices.stale END,
               reported=COALESCE(excluded.reported, devices.reported),
               details=COALESCE(excluded.details, devices.details), reconcile=excluded.reconcile,
               profile=COALESCE(excluded.profile, devices.profile), arch=COALESCE(excluded.arch, devices.arch),
               session=COALESCE(excluded.session, devices.session),
               connection=CASE WHEN excluded.session IS NULL THEN devices.connection ELSE excluded.connection END
               WHERE (excluded.reported IS NULL OR devices.reported IS NULL OR excluded.reported >= devices.reported
                      OR excluded.last_seen - devices.last_seen > 600)
                 AND NOT (excluded.status != 'online' AND excluded.session IS NOT NULL AND devices.session IS NOT NULL
                          AND (excluded.session < devices.session
                               OR (excluded.session = devices.session AND excluded.connection IS NOT NULL
                                   AND devices.connection IS NOT NULL AND excluded.connection < devices.connection)))
                 AND NOT (excluded.status = 'online' AND devices.status != 'online' AND excluded.session IS NOT NULL
                          AND devices.session IS NOT NULL AND excluded.connection IS NOT NULL
                          AND devices.connection IS NOT NULL AND excluded.session = devices.session
                          AND excluded.connection <= devices.connection)""",
            [(s.device_id, s.group, s.status, s.model, s.version, json.dumps(list(s.slots)),
              json.dumps(list(s.chunk_slots)), s.seen, s.energy_mj, s.avg_watts, s.root_version,
              None if s.stale is None else int(s.stale), s.reported, s.details, int(s.status == "online"), s.session,
              s.profile, s.arch, s.connection)
             for s in sorted(states, key=lambda s: s.device_id)])  # one lock order across replicas (set_targets)

    def upsert_device(self, device_id: str, group: str, status: str, model: str | None, version: str | None,
                      slots: list[str]) -> None:
        """Record one device's reported state (see :meth:`upsert_devices`)."""
        self.upsert_devices([DeviceState(device_id, group, status, model, version, tuple(slots), time.time())])

    def devices(self, group: str | None = None, *, status: str | None = None, after: str | None = None,
                limit: int | None = None) -> list[DeviceRecord]:
        """Devices by id (of ``group``, in ``status``, if given); a page of ``limit`` starting after id ``after``."""
        where, args = where_clause({"grp": group, "status": status})
        if after is not None:
            where += (" AND" if where else " WHERE") + " id > ?"
            args += (after,)
        page = f" LIMIT {int(limit)}" if limit is not None else ""
        return [device_record(r) for r in self.sql.rows(f"SELECT * FROM devices{where} ORDER BY id{page}", args)]

    def device_total(self, group: str | None = None, status: str | None = None) -> int:
        """How many devices (of ``group``, in ``status``) have reported."""
        where, args = where_clause({"grp": group, "status": status})
        return int(self.sql.rows(f"SELECT COUNT(*) AS n FROM devices{where}", args)[0]["n"])

    def device(self, device_id: str) -> DeviceRecord | None:
        """One device, or None if it never reported."""
        rows = self.sql.rows("SELECT * FROM devices WHERE id = ?", (device_id,))
        return device_record(rows[0]) if rows else None

    def details(self, device_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The last reported details (:attr:`DeviceState.details`) of each of ``device_ids`` that sent some."""
        return {r["id"]: json.loads(r["details"]) for r in self._device_rows(device_ids, "details") if r["details"]}

    def running(self, device_ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """The (model, version) each of ``device_ids`` that has reported runs."""
        return {r["id"]: (r["model"], r["version"]) for r in self._device_rows(device_ids, "model, version")}

    def slots(self, device_ids: Iterable[str], column: str = "slots") -> dict[str, tuple[str, ...]]:
        """The installed slots of each of ``device_ids`` that has reported (one query per 500 ids).

        ``column="chunk_slots"``: the slots each can copy archive chunks from instead.
        """
        if column not in ("slots", "chunk_slots"):
            raise ValueError(f"no slot column {column!r}")
        return {r["id"]: tuple(json.loads(r["s"])) for r in self._device_rows(device_ids, f"{column} AS s")}

    def _device_rows(self, device_ids: Iterable[str], columns: str) -> Iterator[Mapping[str, Any]]:
        """``id`` and ``columns`` of each of ``device_ids`` that has reported, one query per 500 ids."""
        ids = list(device_ids)
        for chunk in id_chunks(ids):
            yield from self.sql.rows(f"SELECT id, {columns} FROM devices WHERE id IN ({','.join('?' * len(chunk))})",
                                     chunk)

    def versions_in_use(self) -> set[tuple[str, str]]:
        """Every (model, version) some device reports running."""
        rows = self.sql.rows("SELECT DISTINCT model, version FROM devices WHERE model IS NOT NULL AND version IS NOT NULL")
        return {(r["model"], r["version"]) for r in rows}

    def device_counts(self) -> list[tuple[str, str | None, str | None, int]]:
        """How many devices are in each (status, model, version), for metrics."""
        rows = self.sql.rows("SELECT status, model, version, COUNT(*) AS n FROM devices GROUP BY status, model, version")
        return [(r["status"], r["model"], r["version"], int(r["n"])) for r in rows]

    def energy_by_version(self) -> list[tuple[str, str, int, float | None, float | None]]:
        """(model, version, devices reporting energy, mean energy per inference mJ, mean average W) of online devices."""
        rows = self.sql.rows(
            """SELECT model, version, COUNT(energy_mj) AS n, AVG(energy_mj) AS energy, AVG(avg_watts) AS watts
               FROM devices WHERE status='online' AND model IS NOT NULL AND version IS NOT NULL
               AND (energy_mj IS NOT NULL OR avg_watts IS NOT NULL) GROUP BY model, version""")
        return [(r["model"], r["version"], int(r["n"]), None if r["energy"] is None else float(r["energy"]),
                 None if r["watts"] is None else float(r["watts"])) for r in rows]

    def trust_counts(self) -> list[tuple[int, bool, int]]:
        """(root version, stale, online devices) for the devices that report a root of trust, for metrics."""
        rows = self.sql.rows("SELECT root_version, stale, COUNT(*) AS n FROM devices WHERE status='online' "
                             "AND root_version IS NOT NULL GROUP BY root_version, stale")
        return [(int(r["root_version"]), bool(r["stale"]), int(r["n"])) for r in rows]

    # rollouts ------------------------------------------------------------------------------
    def add_rollout(self, rollout_id: str, model: str, version: str, group: str, policy: RolloutPolicy,
                    stages: Sequence[Sequence[tuple[str | None, ...]]], rollback: bool = False,
                    unserved: Sequence[tuple[str, str | None]] = ()) -> None:
        """A new ``running`` rollout before its first stage (stage -1), with its targets.

        ``stages`` lists each stage's new devices as (device id, its version now[, the artifact it gets]);
        ``unserved`` the devices whose board the release has no artifact for (``no_artifact`` targets of the
        last stage, never sent). A group that has a running rollout already raises ConflictError (the database
        enforces it, so two replicas cannot both start one).
        """
        now = time.time()
        sizes, total = [], 0
        for devices in stages:
            total += len(devices)
            sizes.append(total)
        try:
            with self.transaction():
                self.sql.execute(
                    """INSERT INTO rollouts (id, model, version, grp, policy, state, wave, created, updated, rollback,
                                             stages) VALUES (?,?,?,?,?,?,-1,?,?,?,?)""",
                    (rollout_id, model, version, group, json.dumps(policy.to_dict()), RolloutState.RUNNING.value,
                     now, now, int(rollback), json.dumps(sizes)))
                self.sql.execute_many(
                    """INSERT INTO targets (rollout_id, device_id, wave, status, previous_version, updated, artifact)
                       VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING""",
                    [(rollout_id, device, stage, TargetStatus.PENDING.value, previous, now, (*artifact, None)[0])
                     for stage, devices in enumerate(stages) for device, previous, *artifact in devices]
                    + [(rollout_id, device, len(stages) - 1, TargetStatus.NO_ARTIFACT.value, previous, now, None)
                       for device, previous in unserved])
        except IntegrityError as exc:
            raise ConflictError(f"group {group!r} already has a rollout running; abort or wait for it "
                                f"(`edgesdk rollout status`)") from exc

    def _summary_row(self, rollout_id: str) -> Mapping[str, Any] | None:
        rows = self.sql.rows("SELECT * FROM rollouts WHERE id = ?", (rollout_id,))
        return rows[0] if rows else None

    def rollout(self, rollout_id: str, *, targets: bool = True, stage: int | None = None,
                status: TargetStatus | None = None, after: str | None = None,
                limit: int | None = None, counts: bool = True) -> RolloutRecord | None:
        """A rollout with its policy, counts and targets (by stage, then device), or None.

        ``targets=False`` leaves the targets out; ``stage``, ``status``, ``after`` (a device id) and
        ``limit`` select a page of them. ``counts=False`` leaves the counts empty: counting reads every
        target's index entry, which a pass that needs only the rollout's state should not pay for.
        """
        r = self._summary_row(rollout_id)
        if r is None:
            return None
        by_stage = self.target_counts(rollout_id) if counts else {}
        overall: dict[TargetStatus, int] = {}
        for (_, s), n in by_stage.items():
            overall[s] = overall.get(s, 0) + n
        found: tuple[TargetRecord, ...] = ()
        if targets:
            found = tuple(self.targets(rollout_id, stage=stage, status=status, after=after, limit=limit))
        return rollout_record(r, found, overall, self.late_counts(rollout_id) if counts else {})

    def targets(self, rollout_id: str, *, stage: int | None = None, status: TargetStatus | None = None,
                after: str | None = None, limit: int | None = None) -> list[TargetRecord]:
        """A rollout's targets by stage then device (of ``stage``, in ``status``), paged like :meth:`devices`."""
        where, args = where_clause({"rollout_id": rollout_id, "wave": stage, "status": status and status.value})
        if after is not None:
            where += " AND device_id > ?"
            args += (after,)
        page = f" LIMIT {int(limit)}" if limit is not None else ""
        order = " ORDER BY device_id" if stage is not None else " ORDER BY wave, device_id"
        return [target_record(t) for t in self.sql.rows(f"SELECT * FROM targets{where}{order}{page}", args)]

    def target_counts(self, rollout_id: str) -> dict[tuple[int, TargetStatus], int]:
        """How many targets of each stage are in each status (from the index, without reading the targets)."""
        rows = self.sql.rows("SELECT wave, status, COUNT(*) AS n FROM targets WHERE rollout_id = ? GROUP BY wave, status",
                             (rollout_id,))
        return {(int(r["wave"]), TargetStatus(r["status"])): int(r["n"]) for r in rows}

    def failed_targets(self, rollout_id: str, limit: int) -> list[TargetRecord]:
        """Up to ``limit`` failed targets of sent stages, to name in an abort reason."""
        failed = tuple(s.value for s in TargetStatus if s.failed)
        marks = ",".join("?" * len(failed))
        return [target_record(t) for t in self.sql.rows(
            f"SELECT * FROM targets WHERE rollout_id = ? AND status IN ({marks}) ORDER BY updated LIMIT {int(limit)}",
            (rollout_id, *failed))]

    def rollouts(self, state: RolloutState | None = None) -> list[RolloutSummary]:
        """Every rollout (in ``state``, if given), oldest first."""
        where, args = where_clause({"state": state and state.value})
        rows = self.sql.rows(f"SELECT id, model, version, grp, state, wave, reason, created, rollback FROM rollouts"
                             f"{where} ORDER BY created", args)
        return [RolloutSummary(r["id"], r["model"], r["version"], r["grp"], RolloutState(r["state"]), r["wave"],
                               r["reason"], r["created"], bool(r["rollback"])) for r in rows]

    def rollout_counts(self) -> dict[RolloutState, int]:
        """How many rollouts are in each state, for metrics."""
        rows = self.sql.rows("SELECT state, COUNT(*) AS n FROM rollouts GROUP BY state")
        return {RolloutState(r["state"]): int(r["n"]) for r in rows}

    def start_stage(self, rollout_id: str, stage: int, sent_at: float, holder: str | None = None,
                    lease_now: float | None = None) -> bool:
        """Move a running rollout from stage ``stage - 1`` to ``stage`` (0-based), sent at ``sent_at``; False (and
        nothing changed) when the rollout is no longer running at ``stage - 1``, or, with ``holder``, when that
        holder's lease has lapsed at ``lease_now``: a compare-and-set, so a stale driver cannot move a stage.

        The stage's targets whose device is offline become ``deferred``; the others ``sent``.
        """
        now = time.time()
        fence, args = self._fence(stage - 1, holder, lease_now)
        with self.transaction():
            moved = self.sql.execute("UPDATE rollouts SET wave = ?, wave_started = ?, wave_settled = NULL, updated = ? "
                                     f"WHERE id = ?{fence}", (stage, now, now, rollout_id, *args))
            if moved != 1:
                return False
            self.sql.execute(f"UPDATE targets SET status = ?, reason = ?, updated = ? WHERE rollout_id = ? AND wave = ? "
                             f"AND status = ? AND NOT {ONLINE_DEVICE}",
                             (TargetStatus.DEFERRED.value, "offline when its stage was sent", now, rollout_id, stage,
                              TargetStatus.PENDING.value))
            self.sql.execute("UPDATE targets SET status = ?, sent = ?, last_sent = ?, updated = ? "
                             "WHERE rollout_id = ? AND wave = ? AND status = ?",
                             (TargetStatus.SENT.value, sent_at, sent_at, now, rollout_id, stage,
                              TargetStatus.PENDING.value))
        return True

    @staticmethod
    def _fence(stage: int | None, holder: str | None, lease_now: float | None) -> tuple[str, tuple[Any, ...]]:
        """The conditions of a rollout transition: still running (at ``stage``), and ``holder``'s lease valid."""
        sql = " AND state = ?"
        args: list[Any] = [RolloutState.RUNNING.value]
        if stage is not None:
            sql += " AND wave = ?"
            args.append(stage)
        if holder is not None:
            sql += " AND lease_holder = ? AND lease_expires >= ?"
            args += [holder, lease_now]
        return sql, tuple(args)

    def settle_stage(self, rollout_id: str, when: float, *, stage: int, holder: str | None = None,
                     lease_now: float | None = None) -> bool:
        """Every device of ``stage`` reported at ``when``: its health window starts. Compare-and-set: only while the
        rollout runs at ``stage``, not settled yet, and (with ``holder``) under that holder's valid lease; False
        otherwise. Unfenced, a driver whose lease lapsed could settle the next driver's stage and shorten its health
        window."""
        fence, args = self._fence(stage, holder, lease_now)
        return self.sql.execute(f"UPDATE rollouts SET wave_settled = ?, updated = ? WHERE id = ? AND wave_settled IS "
                                f"NULL{fence}", (when, time.time(), rollout_id, *args)) == 1

    def end_rollout(self, rollout_id: str, state: RolloutState, reason: str, *, stage: int | None = None,
                    holder: str | None = None, lease_now: float | None = None) -> bool:
        """Leave ``running`` for ``completed`` or ``aborted``, saying why (its last driver stays on record); False
        when it was not running (at ``stage``, by ``holder``'s valid lease: see :meth:`start_stage`).

        A completed rollout becomes its group's release (:meth:`release`) and enters its release
        history, in the same transaction.
        """
        now = time.time()
        fence, args = self._fence(stage, holder, lease_now)
        with self.transaction():
            if self.sql.execute(f"UPDATE rollouts SET state = ?, reason = ?, updated = ? WHERE id = ?{fence}",
                                (state.value, reason, now, rollout_id, *args)) != 1:
                return False
            if state == RolloutState.COMPLETED:
                row = self._summary_row(rollout_id)
                assert row is not None
                self.sql.execute(
                    """INSERT INTO group_releases (grp, model, version, rollout_id, updated) VALUES (?,?,?,?,?)
                       ON CONFLICT(grp) DO UPDATE SET model=excluded.model, version=excluded.version,
                       rollout_id=excluded.rollout_id, updated=excluded.updated""",
                    (row["grp"], row["model"], row["version"], rollout_id, now))
                self.record_release(row["grp"], row["model"], row["version"], rollout_id, now)
        return True

    def set_targets(self, updates: Sequence[TargetUpdate]) -> None:
        """Targets' new statuses from device events, in one transaction; a move backwards (a report that arrived
        after a later one) is ignored (:attr:`TargetStatus.follows`).

        Rows are updated in (rollout, device) order, a device's own reports in the order they came: replicas
        writing overlapping batches then take the rows' locks in one order and cannot deadlock each other.
        """
        now = time.time()
        width = len(TargetStatus)
        marks = ",".join("?" * width)

        def sources(status: TargetStatus) -> tuple[str, ...]:
            allowed = sorted(s.value for s in status.follows)
            return (*allowed, *allowed[-1:] * (width - len(allowed)))  # one statement: pad the list with a repeat

        self.sql.execute_many(
            f"UPDATE targets SET status=?, reason=?, updated=? WHERE rollout_id=? AND device_id=? AND status IN ({marks})",
            [(u.status.value, u.reason, now, u.rollout_id, u.device_id, *sources(u.status))
             for u in sorted(updates, key=lambda u: (u.rollout_id, u.device_id))])

    def set_target(self, rollout_id: str, device_id: str, status: TargetStatus, reason: str | None = None) -> None:
        """One target's new status."""
        self.set_targets([TargetUpdate(rollout_id, device_id, status, reason)])

    def time_out_targets(self, rollout_id: str, stage: int, sent_before: float, reason: str) -> int:
        """Fail the unfinished targets of stages up to ``stage`` whose command went out before ``sent_before`` and
        whose device is online (silent while reachable); how many. An offline device's target is deferred instead
        (:meth:`defer_offline`)."""
        return self.sql.execute(
            f"UPDATE targets SET status = ?, reason = ?, updated = ? WHERE rollout_id = ? AND {up_to(stage)} "
            f"AND status IN ({','.join('?' * len(TIMEABLE))}) AND sent IS NOT NULL AND sent < ? AND {ONLINE_DEVICE}",
            (TargetStatus.TIMEOUT.value, reason, time.time(), rollout_id, *TIMEABLE, sent_before))

    def defer_offline(self, rollout_id: str, stage: int) -> int:
        """Defer the in-flight targets (of stages up to ``stage``) whose device went offline; how many. Their device
        gets the release again when it reports (a duty-cycled device goes to sleep mid-download, a phone loses
        coverage): losing the connection is not a failure."""
        marks = ",".join("?" * len(IN_FLIGHT))
        return self.sql.execute(
            f"UPDATE targets SET status = ?, reason = ?, updated = ? WHERE rollout_id = ? AND {up_to(stage)} "
            f"AND status IN ({marks}) AND NOT {ONLINE_DEVICE}",
            (TargetStatus.DEFERRED.value, "went offline before it answered", time.time(), rollout_id, *IN_FLIGHT))

    def due_for_resend(self, rollout_id: str, stage: int, sent_before: float, stalled_before: float,
                       late: bool = False) -> list[str]:
        """Devices of stages up to ``stage`` to send the command again: not acknowledged since ``sent_before``, or
        stuck in a download or install (a lost report) since ``stalled_before`` (both on the engine's clock); of the
        late targets with ``late`` (each is sent its own stage's command), else of the others."""
        return [r["device_id"] for r in self.sql.rows(
            f"SELECT device_id FROM targets WHERE rollout_id = ? AND {up_to(stage)} AND late = ? AND "
            "((status = ? AND last_sent < ?) OR (status IN (?, ?) AND last_sent < ?)) ORDER BY device_id",
            (rollout_id, int(late), TargetStatus.SENT.value, sent_before, TargetStatus.DOWNLOADING.value,
             TargetStatus.INSTALLING.value, stalled_before))]

    def overdue_untried(self, rollout_id: str, stage: int, sent_before: float) -> list[TargetRecord]:
        """In-flight targets (of stages up to ``stage``, on online devices) sent before ``sent_before`` and never sent
        again since: before silence counts as a failure, each gets one more try (the first send, or the device's
        answer, may have died with a broker restart or a replica)."""
        marks = ",".join("?" * len(IN_FLIGHT))
        return [target_record(r) for r in self.sql.rows(
            f"SELECT * FROM targets WHERE rollout_id = ? AND {up_to(stage)} AND status IN ({marks}) AND sent < ? "
            f"AND last_sent <= sent AND {ONLINE_DEVICE} ORDER BY device_id",
            (rollout_id, *IN_FLIGHT, sent_before))]

    def unsettled_aborts(self) -> list[str]:
        """Aborted rollouts with devices still to send back: a revert unanswered, or a commit reported late."""
        return [r["id"] for r in self.sql.rows(f"SELECT id FROM rollouts WHERE {UNSETTLED_ABORT} ORDER BY created",
                                                UNSETTLED_ABORT_ARGS)]

    def due_for_revert(self, rollout_id: str, before: float) -> list[TargetRecord]:
        """Targets told to revert that have not answered since ``before`` (on the engine's clock)."""
        return [target_record(t) for t in self.sql.rows(
            "SELECT * FROM targets WHERE rollout_id = ? AND status = ? AND last_sent < ? ORDER BY device_id",
            (rollout_id, TargetStatus.REVERTING.value, before))]

    def mark_resent(self, rollout_id: str, device_ids: Sequence[str], when: float) -> None:
        """Record that the commands of ``device_ids`` went out again at ``when``."""
        self.sql.execute_many("UPDATE targets SET last_sent = ? WHERE rollout_id = ? AND device_id = ?",
                              [(when, rollout_id, d) for d in device_ids])

    # leases: which server replica drives a rollout ------------------------------------------------
    def now(self) -> float:
        """The database's clock (epoch seconds): what replicas compare leases and deadlines by, so a replica
        whose own clock is wrong neither steals a live lease nor keeps a dead one."""
        return self.sql.now()

    def hold_lease(self, rollout_id: str, holder: str, now: float, lease_s: float) -> bool:
        """Take or renew the right to drive a running rollout (or to finish an aborted one's reverts) for ``lease_s``;
        False while another holder's is valid. Releases are leased together (:meth:`lease_releases`)."""
        return self.sql.execute(
            "UPDATE rollouts SET lease_holder = ?, lease_expires = ? WHERE id = ? AND state IN (?, ?) "
            "AND (lease_holder IS NULL OR lease_holder = ? OR lease_expires < ?)",
            (holder, now + lease_s, rollout_id, RolloutState.RUNNING.value, RolloutState.ABORTED.value, holder,
             now)) == 1

    # events --------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        """The database's size on disk (the SQLite file with its WAL, or PostgreSQL's database size)."""
        return self.sql.size_bytes()

    def close(self) -> None:
        """Close the database (committed writes are already stored)."""
        self.sql.close()
