"""A rollout's canary verdicts in the fleet store: the devices' figures a stage is judged on, the verdict, and the
baseline snapshot kept for the next stage (migration 11; the analysis is :mod:`edgesdk.ota_server.rollouts.canary`).
"""

from __future__ import annotations

import json
from typing import Any

from edgesdk.fleet.records import RolloutState
from edgesdk.ota_server.store.sql import Database

__all__ = ["VerdictStore"]

#: (device id, version, details, board profile) of one device's last report.
StageReport = tuple[str, "str | None", dict[str, Any], "str | None"]


class VerdictStore:
    """The ``verdict`` and ``baseline`` columns of ``rollouts`` (mixed into :class:`FleetDB`)."""

    sql: Database

    def stage_reports(self, rollout_id: str, stage: int) -> tuple[list[StageReport], list[StageReport]]:
        """The last reports (with details) of the online devices of the rollout's group that run its model: those on
        its version, and those on another version that no stage up to ``stage`` (0-based) sent it to (the baseline)."""
        rows = self.sql.rows(
            """SELECT d.id, d.version, d.details, d.profile, r.version AS wanted FROM devices d
               JOIN rollouts r ON d.grp = r.grp
               WHERE r.id = ? AND d.model = r.model AND d.status = 'online' AND d.details IS NOT NULL
               AND (d.version = r.version OR NOT EXISTS (SELECT 1 FROM targets t WHERE t.rollout_id = r.id
                                                         AND t.device_id = d.id AND t.wave <= ?))
               ORDER BY d.id""", (rollout_id, stage))
        new: list[StageReport] = []
        old: list[StageReport] = []
        for row in rows:
            try:
                details = json.loads(row["details"])
            except ValueError:
                continue
            if isinstance(details, dict):
                (new if row["version"] == row["wanted"] else old).append((row["id"], row["version"], details,
                                                                          row["profile"]))
        return new, old

    def baseline(self, rollout_id: str) -> dict[str, Any] | None:
        """The baseline snapshot the last verdict stored (``figures`` and ``paths``), or None."""
        rows = self.sql.rows("SELECT baseline FROM rollouts WHERE id = ?", (rollout_id,))
        return json.loads(rows[0]["baseline"]) if rows and rows[0]["baseline"] else None

    def set_verdict(self, rollout_id: str, stage: int, verdict: dict[str, Any],
                    baseline: dict[str, Any] | None) -> bool:
        """Store stage ``stage``'s verdict (and, unless None, a new baseline snapshot) on a rollout still running at
        that stage; False when it moved on meanwhile."""
        return self.sql.execute(
            "UPDATE rollouts SET verdict = ?, baseline = COALESCE(?, baseline) WHERE id = ? AND state = ? AND wave = ?",
            (json.dumps(verdict), None if baseline is None else json.dumps(baseline), rollout_id,
             RolloutState.RUNNING.value, stage)) == 1
