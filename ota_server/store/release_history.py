"""The desired state's memory: the releases each group ran (migration 14), and the versions
retention must keep.

Every release a completed rollout sets is recorded (in the transaction that sets it), and so is
the version most of a group ran before its first rollout of a model (when that rollout starts):
the versions a rollback may go to (:mod:`edgesdk.ota_server.rollouts.analysis.rollback_rules`).
Retention (:meth:`ReleaseHistoryStore.versions_kept`) never deletes what the fleet may still be
sent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from edgesdk.fleet.records import RolloutState
from edgesdk.ota_server.rollouts.analysis.rollback_rules import GroupHistory
from edgesdk.ota_server.store.rows import IN_FLIGHT, UNSETTLED_ABORT, UNSETTLED_ABORT_ARGS
from edgesdk.ota_server.store.sql import Database

__all__ = ["ReleaseHistoryStore", "majority_version"]

_INSERT = ("INSERT INTO release_history (grp, model, version, rollout_id, kind, at) "
           "VALUES (?,?,?,?,?,?)")


def majority_version(versions: Sequence[str | None]) -> str | None:
    """The version most of ``versions`` are (ties: the highest in text order, so the choice is
    stable); None when none is known."""
    known = [v for v in versions if v]
    if not known:
        return None
    return max(sorted(set(known)), key=known.count)


class ReleaseHistoryStore:
    """The ``release_history`` table of :class:`edgesdk.ota_server.store.fleet_db.FleetDB`
    (mixed into it)."""

    sql: Database

    def record_release(self, group: str, model: str, version: str, rollout_id: str,
                       at: float) -> None:
        """Record that ``rollout_id`` set ``group``'s release to ``model`` ``version`` (call it in
        the transaction that sets the release)."""
        self.sql.execute(_INSERT, (group, model, version, rollout_id, "release", at))

    def record_before(self, group: str, model: str, version: str | None, rollout_id: str) -> bool:
        """Record ``version`` as what ``group`` ran of ``model`` before its first rollout of it
        (``rollout_id``), unless the group's history of ``model`` has an entry already; whether it
        was recorded."""
        if version is None:
            return False
        with self.sql.transaction():
            if self.sql.rows("SELECT 1 FROM release_history WHERE grp = ? AND model = ? LIMIT 1",
                             (group, model)):
                return False
            self.sql.execute(_INSERT, (group, model, version, rollout_id, "before", time.time()))
        return True

    def group_history(self, group: str, model: str) -> GroupHistory:
        """The versions of ``model`` ``group`` ran, oldest first, and its release now (what the
        rollback rules read)."""
        ran = tuple(r["version"] for r in self.sql.rows(
            "SELECT version FROM release_history WHERE grp = ? AND model = ? ORDER BY at, id",
            (group, model)))
        rows = self.sql.rows("SELECT version, rollout_id FROM group_releases WHERE grp = ?",
                             (group,))
        release = rows[0] if rows else None
        return GroupHistory(group, model, ran, release["rollout_id"] if release else None,
                            release["version"] if release else None)

    def versions_kept(self) -> set[tuple[str, str]]:
        """The (model, version) pairs retention must keep besides what devices report running:
        each group's release and the one before it; each running rollout's version and its
        targets' previous versions (an abort reverts to them), and those of aborted rollouts with
        reverts still to send; every release with late targets in flight."""
        current = {r["grp"]: (r["model"], r["version"]) for r in self.sql.rows(
            "SELECT grp, model, version FROM group_releases")}
        kept = set(current.values())
        before: dict[str, str] = {}
        for r in self.sql.rows("SELECT grp, model, version FROM release_history ORDER BY at, id"):
            model, version = current.get(r["grp"], (None, None))
            if r["model"] == model and r["version"] != version:
                before[r["grp"]] = r["version"]  # the newest entry other than the release wins
        kept |= {(current[group][0], version) for group, version in before.items()}
        kept |= {(r["model"], r["version"]) for r in self.sql.rows(
            "SELECT model, version FROM rollouts WHERE state = ?", (RolloutState.RUNNING.value,))}
        kept |= {(r["model"], r["previous_version"]) for r in self.sql.rows(
            "SELECT DISTINCT r.model, t.previous_version FROM rollouts r JOIN targets t ON "
            "t.rollout_id = r.id WHERE t.previous_version IS NOT NULL AND (r.state = ? OR r.id IN "
            f"(SELECT id FROM rollouts WHERE {UNSETTLED_ABORT}))",
            (RolloutState.RUNNING.value, *UNSETTLED_ABORT_ARGS))}
        marks = ",".join("?" * len(IN_FLIGHT))
        kept |= {(r["model"], r["version"]) for r in self.sql.rows(
            "SELECT model, version FROM rollouts r WHERE EXISTS (SELECT 1 FROM targets t WHERE "
            f"t.rollout_id = r.id AND t.late = 1 AND t.status IN ({marks}))", IN_FLIGHT)}
        return kept
