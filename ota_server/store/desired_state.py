"""Desired state in the fleet store: each group's release, the devices still to reconcile with it, late targets,
and the group each device is provisioned in (:mod:`edgesdk.ota_server.rollouts.reconciler` works these)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.records import DeviceRecord, GroupRelease, RolloutRecord, RolloutState, TargetRecord, TargetStatus
from edgesdk.ota_server.store.rows import (
    FAILED,
    IN_FLIGHT,
    UNSETTLED_ABORT,
    UNSETTLED_ABORT_ARGS,
    Provisioning,
    Release,
    device_record,
    id_chunks,
    release_record,
    rollout_record,
    target_record,
    where_clause,
)
from edgesdk.ota_server.store.sql import Database

__all__ = ["DesiredStateStore", "FleetWork"]


@dataclass(frozen=True)
class FleetWork:
    """What there is for the rollout engine to do, fleet-wide (:meth:`DesiredStateStore.work`)."""

    #: Rollouts running (whoever drives them).
    running: int
    #: Devices that reported online and wait for the reconciler to compare them with their group's release.
    queued: bool
    #: Late targets whose command is out and unanswered: the catch-ups running.
    late_in_flight: int
    #: Aborted rollouts with devices still to send back.
    reverting: bool
    #: Late targets that failed (a change tells the reconciler to look at its releases' flags again).
    late_failed: int
    #: Late targets in flight of completed rollouts that are no longer their group's release (superseded).
    late_superseded: int = 0

    @property
    def releases_idle(self) -> bool:
        """True when no release has anything for a reconciliation pass: nothing queued, no catch-up running."""
        return not self.queued and not self.late_in_flight


#: The ids of completed rollouts a later completed rollout of their group superseded: no longer the group's
#: release (rollouts of a group run one at a time, so the release is its newest completed one). Written without
#: ``group_releases``, so the one work statement an idle server runs each tick reads the late targets' index only.
_SUPERSEDED = ("SELECT r.id FROM rollouts r WHERE r.state = 'completed' AND EXISTS (SELECT 1 FROM rollouts n "
               "WHERE n.grp = r.grp AND n.state = 'completed' AND n.created > r.created)")


class DesiredStateStore:
    """The desired-state tables of :class:`edgesdk.ota_server.store.fleet_db.FleetDB` (mixed into it)."""

    sql: Database

    # desired state: each group's release, and the devices still to compare with it -----------------------
    def release(self, group: str) -> Release | None:
        """The release ``group``'s devices should run (set by its last completed rollout), or None."""
        rows = self.sql.rows("SELECT * FROM group_releases WHERE grp = ?", (group,))
        return release_record(rows[0]) if rows else None

    def releases(self) -> list[Release]:
        """Every group's release, by group."""
        return [release_record(r) for r in self.sql.rows("SELECT * FROM group_releases ORDER BY grp")]

    def lease_releases(self, holder: str, now: float, lease_s: float) -> list[RolloutRecord]:
        """Take or renew for ``lease_s`` the lease of every group's release (the completed rollout that set it) whose
        group has no rollout running and whose lease is free or ``holder``'s: those releases, by group, without
        their targets or counts. One statement: a pass over the releases reads and leases them together."""
        rows = self.sql.rows(
            "UPDATE rollouts SET lease_holder = ?, lease_expires = ? WHERE state = ? "
            "AND id IN (SELECT rollout_id FROM group_releases) AND grp NOT IN (SELECT grp FROM rollouts WHERE state = ?) "
            "AND (lease_holder IS NULL OR lease_holder = ? OR lease_expires < ?) RETURNING *",
            (holder, now + lease_s, RolloutState.COMPLETED.value, RolloutState.RUNNING.value, holder, now))
        return sorted((rollout_record(r) for r in rows), key=lambda r: r.group)

    def group_releases(self) -> list[GroupRelease]:
        """Every group that has devices (reported or only provisioned), a release or a running rollout: its release
        and how far its devices are from it; a provisioned device that never reported counts as offline."""
        rows = self.sql.rows(
            """SELECT d.grp AS grp, COUNT(*) AS n,
                      SUM(CASE WHEN d.model = g.model AND d.version = g.version THEN 1 ELSE 0 END) AS converged,
                      SUM(CASE WHEN (d.model = g.model AND d.version = g.version) OR g.grp IS NULL THEN 0
                               WHEN d.status = 'online' THEN 1 ELSE 0 END) AS behind_online
               FROM devices d LEFT JOIN group_releases g ON g.grp = d.grp GROUP BY d.grp""")
        counts = {r["grp"]: (int(r["n"]), int(r["converged"] or 0), int(r["behind_online"] or 0)) for r in rows}
        # Provisioned devices that never reported: in their group, offline, and (with a release) behind it.
        for r in self.sql.rows("SELECT p.grp AS grp, COUNT(*) AS n FROM provisioned p WHERE NOT EXISTS "
                               "(SELECT 1 FROM devices d WHERE d.id = p.device_id) GROUP BY p.grp"):
            n, converged, behind_online = counts.get(r["grp"], (0, 0, 0))
            counts[r["grp"]] = (n + int(r["n"]), converged, behind_online)
        releases = {r.group: r for r in self.releases()}
        running = {r["grp"]: r["id"] for r in self.sql.rows("SELECT id, grp FROM rollouts WHERE state = ?",
                                                            (RolloutState.RUNNING.value,))}
        flagged = {r["id"]: r["flagged"] for r in self.sql.rows(
            "SELECT r.id, r.flagged FROM rollouts r JOIN group_releases g ON g.rollout_id = r.id")}
        out = []
        for group in sorted(set(counts) | set(releases) | set(running)):
            n, converged, behind_online = counts.get(group, (0, 0, 0))
            release = releases.get(group)
            if release is None:
                out.append(GroupRelease(group, None, None, None, None, n, converged, behind_online, 0,
                                        running.get(group)))
            else:
                out.append(GroupRelease(group, release.model, release.version, release.rollout_id, release.since, n,
                                        converged, behind_online, n - converged - behind_online, running.get(group),
                                        flagged.get(release.rollout_id)))
        return out

    def board_counts(self) -> dict[str, list[dict[str, Any]]]:
        """For each group, its devices per board (profile, arch): how many, and how many run the group's release."""
        rows = self.sql.rows(
            """SELECT d.grp AS grp, d.profile AS profile, d.arch AS arch, COUNT(*) AS n,
                      SUM(CASE WHEN d.model = g.model AND d.version = g.version THEN 1 ELSE 0 END) AS converged
               FROM devices d LEFT JOIN group_releases g ON g.grp = d.grp GROUP BY d.grp, d.profile, d.arch
               ORDER BY d.grp, d.profile, d.arch""")
        found: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            found.setdefault(r["grp"], []).append({"profile": r["profile"], "arch": r["arch"], "devices": int(r["n"]),
                                                   "converged": int(r["converged"] or 0)})
        return found

    def to_reconcile(self, group: str, limit: int) -> list[DeviceRecord]:
        """Up to ``limit`` devices of ``group`` that reported online since the reconciler last compared them with
        the group's release (by id; from a partial index, so the cost follows the queue, not the fleet)."""
        return [device_record(r) for r in self.sql.rows(
            f"SELECT * FROM devices WHERE grp = ? AND reconcile = 1 ORDER BY id LIMIT {int(limit)}", (group,))]

    def reconciled(self, device_ids: Sequence[str]) -> None:
        """Take ``device_ids`` out of the reconciler's queue."""
        ids = list(device_ids)
        for chunk in id_chunks(ids):
            self.sql.execute(f"UPDATE devices SET reconcile = 0 WHERE id IN ({','.join('?' * len(chunk))})", chunk)

    def drop_unreleased_from_queue(self) -> int:
        """Empty the reconciler's queue of groups that have neither a release nor a running rollout; how many."""
        return self.sql.execute(
            "UPDATE devices SET reconcile = 0 WHERE reconcile = 1 AND grp NOT IN (SELECT grp FROM group_releases) "
            "AND grp NOT IN (SELECT grp FROM rollouts WHERE state = ?)", (RolloutState.RUNNING.value,))

    def boards(self, device_ids: Sequence[str]) -> dict[str, tuple[str | None, str | None]]:
        """The (profile, arch) each of ``device_ids`` last reported, for those the store knows."""
        found: dict[str, tuple[str | None, str | None]] = {}
        ids = list(device_ids)
        for chunk in id_chunks(ids):
            for row in self.sql.rows(f"SELECT id, profile, arch FROM devices WHERE id IN "
                                     f"({','.join('?' * len(chunk))})", chunk):
                found[row["id"]] = (row["profile"], row["arch"])
        return found

    def targets_of(self, rollout_id: str, device_ids: Sequence[str]) -> dict[str, TargetRecord]:
        """The targets of ``rollout_id`` that ``device_ids`` have, by device."""
        found: dict[str, TargetRecord] = {}
        ids = list(device_ids)
        for chunk in id_chunks(ids):
            for row in self.sql.rows(f"SELECT * FROM targets WHERE rollout_id = ? AND device_id IN "
                                     f"({','.join('?' * len(chunk))})", (rollout_id, *chunk)):
                found[row["device_id"]] = target_record(row)
        return found

    def newest_completed(self, group: str, model: str, versions: Sequence[str], other_than: str) -> dict[str, str]:
        """Version -> the id of ``group``'s newest completed rollout of ``model`` at that version, for ``versions``
        (rollouts other than ``other_than``)."""
        found: dict[str, str] = {}
        for chunk in id_chunks(list(versions)):
            for row in self.sql.rows(
                    f"SELECT id, version FROM rollouts WHERE grp = ? AND model = ? AND state = ? AND id <> ? AND version "
                    f"IN ({','.join('?' * len(chunk))}) ORDER BY created",
                    (group, model, RolloutState.COMPLETED.value, other_than, *chunk)):
                found[row["version"]] = row["id"]  # ordered by creation: the newest stays
        return found

    def add_late_targets(self, rollout_id: str, stage: int, devices: Sequence[tuple[str | None, ...]],
                         unserved: Sequence[tuple[str, str | None]] = ()) -> None:
        """Add devices that joined ``rollout_id``'s group after it started, as late ``pending`` targets of ``stage``
        (each with the version it runs now[, and the artifact it gets]); ``unserved``: devices whose board the
        release has no artifact for (``no_artifact``, never sent)."""
        now = time.time()
        self.sql.execute_many(
            """INSERT INTO targets (rollout_id, device_id, wave, status, previous_version, updated, late, artifact)
               VALUES (?,?,?,?,?,?,1,?) ON CONFLICT DO NOTHING""",
            [(rollout_id, device, stage, TargetStatus.PENDING.value, previous, now, (*artifact, None)[0])
             for device, previous, *artifact in devices]
            + [(rollout_id, device, stage, TargetStatus.NO_ARTIFACT.value, previous, now, None)
               for device, previous in unserved])

    def skip_unsent(self, rollout_id: str) -> int:
        """Mark the targets of an aborted rollout that were never sent a command (pending, or deferred before their
        first send) ``skipped``; how many. A target sent once stays as it is: its device may still answer."""
        return self.sql.execute(
            "UPDATE targets SET status = ?, reason = ?, updated = ? WHERE rollout_id = ? AND sent IS NULL "
            "AND status IN (?, ?)", (TargetStatus.SKIPPED.value, "never sent: the rollout was aborted first",
                                     time.time(), rollout_id, TargetStatus.PENDING.value, TargetStatus.DEFERRED.value))

    def send_late(self, rollout_id: str, device_ids: Sequence[str], sent_at: float) -> list[TargetRecord]:
        """Mark pending or deferred targets (or ``ahead`` ones whose device went back to an older
        version) as sent late at ``sent_at`` (the engine's clock); the targets marked, as they are
        now, in the order given. One statement for the pass's devices (per 500), not a round trip
        each."""
        now = time.time()
        marked: dict[str, TargetRecord] = {}
        waiting = (TargetStatus.PENDING.value, TargetStatus.DEFERRED.value,
                   TargetStatus.AHEAD.value)
        for chunk in id_chunks(list(device_ids)):
            marks = ",".join("?" * len(chunk))
            for row in self.sql.rows(
                    "UPDATE targets SET status = ?, late = 1, reason = NULL, sent = ?, "
                    f"last_sent = ?, updated = ? WHERE rollout_id = ? AND device_id IN ({marks}) "
                    "AND status IN (?, ?, ?) RETURNING *",
                    (TargetStatus.SENT.value, sent_at, sent_at, now, rollout_id, *chunk, *waiting)):
                marked[row["device_id"]] = target_record(row)
        return [marked[d] for d in device_ids if d in marked]

    def pull_forward(self, rollout_id: str, stage: int, device_ids: Sequence[str]) -> list[str]:
        """Move the pending or deferred targets of ``device_ids`` in stages after ``stage`` into
        ``stage`` (devices back online while their rollout's current stage is short of its planned
        size: first come, first canaried); the devices moved."""
        moved: list[str] = []
        for chunk in id_chunks(list(device_ids)):
            moved += [r["device_id"] for r in self.sql.rows(
                f"UPDATE targets SET wave = ?, updated = ? WHERE rollout_id = ? AND device_id IN "
                f"({','.join('?' * len(chunk))}) AND wave > ? AND status IN (?, ?) "
                "RETURNING device_id", (stage, time.time(), rollout_id, *chunk, stage,
                                        TargetStatus.PENDING.value, TargetStatus.DEFERRED.value))]
        return moved

    def push_back(self, rollout_id: str, stage: int, device_ids: Sequence[str]) -> list[str]:
        """Move the never-sent pending or deferred targets of ``device_ids`` in ``stage`` to the
        next stage, pending (their stage has all the devices it planned, from devices back first);
        the devices moved."""
        moved: list[str] = []
        for chunk in id_chunks(list(device_ids)):
            moved += [r["device_id"] for r in self.sql.rows(
                "UPDATE targets SET wave = ?, status = ?, reason = NULL, updated = ? "
                f"WHERE rollout_id = ? AND device_id IN ({','.join('?' * len(chunk))}) "
                "AND wave = ? AND sent IS NULL AND status IN (?, ?) RETURNING device_id",
                (stage + 1, TargetStatus.PENDING.value, time.time(), rollout_id, *chunk, stage,
                 TargetStatus.PENDING.value, TargetStatus.DEFERRED.value))]
        return moved

    def mark_ahead(self, rollout_id: str, stage: int,
                   devices: Sequence[tuple[str, str, str]]) -> None:
        """Record devices running a newer version than ``rollout_id`` sends as ``ahead`` targets
        (each (device id, the version it runs, why)): a new one joins ``stage`` as a late target;
        a pending or deferred one keeps its stage. Nothing is sent to them."""
        now = time.time()
        self.sql.execute_many(
            """INSERT INTO targets (rollout_id, device_id, wave, status, reason, previous_version,
                                    updated, late)
               VALUES (?,?,?,?,?,?,?,1) ON CONFLICT (rollout_id, device_id) DO UPDATE SET
               status = excluded.status, reason = excluded.reason, updated = excluded.updated
               WHERE targets.status IN (?, ?)""",
            [(rollout_id, device, stage, TargetStatus.AHEAD.value, reason, version, now,
              TargetStatus.PENDING.value, TargetStatus.DEFERRED.value)
             for device, version, reason in devices])

    def resolve_targets(self, rollout_id: str,
                        devices: Sequence[tuple[str, str | None, str | None]],
                        unserved: Sequence[tuple[str, str | None]] = ()) -> None:
        """Complete targets planned before their device reported (a group only provisioned at the
        push) from its report: ``devices``, each (device id, the version it runs, its board's
        artifact or None for the release's one bundle), get their previous version where it is
        unknown and their artifact; ``unserved`` (device id, version), whose board the release has
        no artifact for, become ``no_artifact`` and are never sent."""
        now = time.time()
        waiting = (TargetStatus.PENDING.value, TargetStatus.DEFERRED.value)
        self.sql.execute_many(
            "UPDATE targets SET previous_version = COALESCE(previous_version, ?), artifact = ?, "
            "updated = ? WHERE rollout_id = ? AND device_id = ? AND status IN (?, ?)",
            [(previous, artifact, now, rollout_id, device, *waiting)
             for device, previous, artifact in devices])
        self.sql.execute_many(
            "UPDATE targets SET previous_version = COALESCE(previous_version, ?), status = ?, "
            "reason = ?, updated = ? WHERE rollout_id = ? AND device_id = ? AND status IN (?, ?)",
            [(previous, TargetStatus.NO_ARTIFACT.value, "the release has no artifact for the board "
              "it reported", now, rollout_id, device, *waiting) for device, previous in unserved])

    def requeue_no_artifact(self, model: str, version: str) -> list[str]:
        """A board's bundle of ``model`` ``version`` arrived: the ``no_artifact`` targets of its running or completed
        rollouts wait again (``pending``) and their devices go into the reconciler's queue, which gives each its
        board's artifact if there is one now (else ``no_artifact`` again). The devices requeued."""
        rows = self.sql.rows(
            "SELECT t.rollout_id AS rollout_id, t.device_id AS device_id FROM targets t JOIN rollouts r ON "
            "r.id = t.rollout_id WHERE t.status = ? AND r.model = ? AND r.version = ? AND r.state IN (?, ?)",
            (TargetStatus.NO_ARTIFACT.value, model, version, RolloutState.RUNNING.value,
             RolloutState.COMPLETED.value))
        if not rows:
            return []
        now = time.time()
        with self.sql.transaction():
            self.sql.execute_many(
                "UPDATE targets SET status = ?, reason = NULL, updated = ? WHERE rollout_id = ? AND device_id = ? "
                "AND status = ?", [(TargetStatus.PENDING.value, now, r["rollout_id"], r["device_id"],
                                    TargetStatus.NO_ARTIFACT.value) for r in rows])
            self.sql.execute_many("UPDATE devices SET reconcile = 1 WHERE id = ?", [(r["device_id"],) for r in rows])
        return sorted({str(r["device_id"]) for r in rows})

    def work(self) -> FleetWork:
        """What there is to do, in one statement from the partial indexes (an idle server runs this and little else
        each tick: its cost follows the work, not the fleet)."""
        marks = ",".join("?" * len(IN_FLIGHT))
        row = self.sql.rows(
            "SELECT (SELECT COUNT(*) FROM rollouts WHERE state = ?) AS running, "
            "EXISTS (SELECT 1 FROM devices WHERE reconcile = 1) AS queued, "
            f"(SELECT COUNT(*) FROM targets WHERE late = 1 AND status IN ({marks})) AS late_in_flight, "
            f"EXISTS (SELECT 1 FROM rollouts WHERE {UNSETTLED_ABORT}) AS reverting, "
            f"(SELECT COUNT(*) FROM targets WHERE late = 1 AND status IN ({','.join('?' * len(FAILED))})) AS failed, "
            f"(SELECT COUNT(*) FROM targets WHERE late = 1 AND status IN ({marks}) AND rollout_id IN "
            f"({_SUPERSEDED})) AS superseded",
            (RolloutState.RUNNING.value, *IN_FLIGHT, *UNSETTLED_ABORT_ARGS, *FAILED, *IN_FLIGHT))[0]
        return FleetWork(int(row["running"]), bool(row["queued"]), int(row["late_in_flight"]), bool(row["reverting"]),
                         int(row["failed"]), int(row["superseded"]))

    def late_in_flight(self, rollout_id: str | None = None) -> int:
        """Late targets (of one rollout, or all) whose command is out and unanswered: the catch-ups running."""
        marks = ",".join("?" * len(IN_FLIGHT))
        where, args = ("rollout_id = ? AND ", (rollout_id,)) if rollout_id else ("", ())
        return int(self.sql.rows(f"SELECT COUNT(*) AS n FROM targets WHERE {where}late = 1 AND status IN ({marks})",
                                 (*args, *IN_FLIGHT))[0]["n"])

    def superseded_in_flight(self) -> list[RolloutRecord]:
        """Completed rollouts that are no longer their group's release (a newer push superseded them) and still have
        late targets in flight, without their targets or counts: nothing chases those any more."""
        marks = ",".join("?" * len(IN_FLIGHT))
        rows = self.sql.rows(
            f"SELECT * FROM rollouts WHERE id IN ({_SUPERSEDED}) AND id IN "
            f"(SELECT rollout_id FROM targets WHERE late = 1 AND status IN ({marks})) ORDER BY id", IN_FLIGHT)
        return [rollout_record(r) for r in rows]

    def late_counts(self, rollout_id: str, only: Sequence[TargetStatus] = ()) -> dict[TargetStatus, int]:
        """How many late targets of ``rollout_id`` are in each status (of those in ``only``, if given)."""
        among = f" AND status IN ({','.join('?' * len(only))})" if only else ""
        rows = self.sql.rows(f"SELECT status, COUNT(*) AS n FROM targets WHERE rollout_id = ? AND late = 1{among} "
                             "GROUP BY status", (rollout_id, *(s.value for s in only)))
        return {TargetStatus(r["status"]): int(r["n"]) for r in rows}

    def flag_release(self, rollout_id: str, reason: str) -> bool:
        """Flag a rollout's release (once); False when it was flagged already."""
        return self.sql.execute("UPDATE rollouts SET flagged = ? WHERE id = ? AND flagged IS NULL",
                                (reason, rollout_id)) == 1

    def unflag_release(self, rollout_id: str, reason: str, failed: int, answered: int) -> bool:
        """Clear a flag that still reads ``reason``, noting the late installs failed and answered
        so far (the flag counts only those after: :meth:`flag_baseline`); False when the flag
        changed meanwhile."""
        return self.sql.execute(
            "UPDATE rollouts SET flagged = NULL, late_failed_resumed = ?, "
            "late_answered_resumed = ? WHERE id = ? AND flagged = ?",
            (failed, answered, rollout_id, reason)) == 1

    def flag_baseline(self, rollout_id: str) -> tuple[int, int]:
        """The late installs (failed, answered) of ``rollout_id`` when the operator last resumed it
        ((0, 0) if never)."""
        rows = self.sql.rows("SELECT late_failed_resumed AS f, late_answered_resumed AS a "
                             "FROM rollouts WHERE id = ?", (rollout_id,))
        return (int(rows[0]["f"]), int(rows[0]["a"])) if rows else (0, 0)

    def requeue_behind(self, group: str, model: str, version: str) -> int:
        """Queue ``group``'s online devices that do not run ``model`` ``version`` for the
        reconciler again; how many."""
        return self.sql.execute(
            "UPDATE devices SET reconcile = 1 WHERE grp = ? AND status = 'online' AND "
            "(model IS NULL OR version IS NULL OR model <> ? OR version <> ?)",
            (group, model, version))

    # provisioning: the group an operator put each device in ----------------------------------------------
    def provision(self, devices: Mapping[str, str], source: str) -> list[str]:
        """Put devices in groups (device id -> group); the devices whose group changed. A moved device's reported
        state moves with it, it goes into the reconciler's queue, its unfinished targets of other groups' rollouts
        are skipped (it is no longer theirs), and its old group is kept as ``moved_from`` (its agent reports that
        name until a command of the new group tells it, and its will keeps it until it reconnects:
        :class:`~edgesdk.ota_server.devices.provisioning.GroupGuard` records those under the new group)."""
        now = time.time()
        have = self.provisioned_groups(list(devices))
        moved = [d for d, group in devices.items() if d in have and have[d] != group]
        unfinished = [s.value for s in (TargetStatus.PENDING, TargetStatus.SENT, TargetStatus.DOWNLOADING,
                                        TargetStatus.INSTALLING, TargetStatus.DEFERRED, TargetStatus.NO_ARTIFACT,
                                        TargetStatus.AHEAD)]
        with self.sql.transaction():
            self.sql.execute_many(
                """INSERT INTO provisioned (device_id, grp, source, updated) VALUES (?,?,?,?)
                   ON CONFLICT(device_id) DO UPDATE SET grp=excluded.grp, source=excluded.source,
                   updated=excluded.updated""",
                [(d, group, source, now) for d, group in sorted(devices.items()) if have.get(d) != group])
            self.sql.execute_many("UPDATE provisioned SET moved_from = ? WHERE device_id = ?",
                                  [(have[d], d) for d in moved])
            self.sql.execute_many("UPDATE devices SET grp = ?, reconcile = 1 WHERE id = ?",
                                  [(devices[d], d) for d in moved])
            self.sql.execute_many(
                f"UPDATE targets SET status = ?, reason = ?, updated = ? WHERE device_id = ? AND status IN "
                f"({','.join('?' * len(unfinished))}) AND rollout_id IN (SELECT id FROM rollouts WHERE grp <> ?)",
                [(TargetStatus.SKIPPED.value, f"the device moved to group {devices[d]}", now, d, *unfinished,
                  devices[d]) for d in moved])
        return moved

    def moves(self, device_ids: Iterable[str]) -> dict[str, tuple[str, str | None]]:
        """The provisioned group of each of ``device_ids`` that has one, and the group it was last moved from (None:
        never moved)."""
        found: dict[str, tuple[str, str | None]] = {}
        for chunk in id_chunks(list(dict.fromkeys(device_ids))):
            for row in self.sql.rows(f"SELECT device_id, grp, moved_from FROM provisioned WHERE device_id IN "
                                     f"({','.join('?' * len(chunk))})", chunk):
                found[row["device_id"]] = (row["grp"], row["moved_from"])
        return found


    def provisioned_groups(self, device_ids: Iterable[str]) -> dict[str, str]:
        """The provisioned group of each of ``device_ids`` that has one."""
        found: dict[str, str] = {}
        ids = list(dict.fromkeys(device_ids))
        for chunk in id_chunks(ids):
            for row in self.sql.rows(f"SELECT device_id, grp FROM provisioned WHERE device_id IN "
                                     f"({','.join('?' * len(chunk))})", chunk):
                found[row["device_id"]] = row["grp"]
        return found

    def provisioning(self, group: str | None = None) -> list[Provisioning]:
        """Every provisioned device (of ``group``), by id."""
        where, args = where_clause({"grp": group})
        return [Provisioning(r["device_id"], r["grp"], r["source"], r["updated"])
                for r in self.sql.rows(f"SELECT * FROM provisioned{where} ORDER BY device_id", args)]

    # what the console shows -----------------------------------------------------------------------------------
    def group_counts(self) -> list[tuple[str, str, str | None, str | None, int]]:
        """How many devices of each group are in each (status, model, version)."""
        rows = self.sql.rows("SELECT grp, status, model, version, COUNT(*) AS n FROM devices "
                             "GROUP BY grp, status, model, version ORDER BY grp, status, model, version")
        return [(r["grp"], r["status"], r["model"], r["version"], int(r["n"])) for r in rows]

    def target_devices(self, rollout_id: str) -> list[tuple[str | None, dict[str, Any]]]:
        """For each target of ``rollout_id``: the version its device runs now and its last reported details."""
        rows = self.sql.rows("SELECT d.version AS version, d.details AS details FROM targets t JOIN devices d "
                             "ON d.id = t.device_id WHERE t.rollout_id = ?", (rollout_id,))
        return [(r["version"], json.loads(r["details"]) if r["details"] else {}) for r in rows]
