"""A rollout's canary verdicts in the fleet store: what a stage is judged on (its devices, the baseline devices), the
verdict, and the boards' baselines kept for the next stages (migration 11; the judge is
:mod:`edgesdk.ota_server.rollouts.analysis`).
"""

from __future__ import annotations

import json
from typing import Any

from edgesdk.fleet.records import RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.analysis.evidence import UNKNOWN_BOARD, BaselineDevice, StageDevice
from edgesdk.ota_server.store.sql import Database

__all__ = ["VerdictStore"]

#: The target statuses a stage's verdict reads: done with the deployment (committed or failed).
_JUDGED = tuple(s.value for s in TargetStatus if s.terminal)


def _details(raw: str | None) -> dict[str, Any]:
    """A device's stored details, or an empty dict when there are none or they do not parse."""
    try:
        details = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


class VerdictStore:
    """The ``verdict`` and ``baseline`` columns of ``rollouts`` (mixed into :class:`FleetDB`)."""

    sql: Database

    def stage_evidence(self, rollout_id: str, stage: int) -> tuple[list[StageDevice], list[BaselineDevice]]:
        """What stage ``stage`` (0-based) of the rollout is judged on: the devices it sent the release to that are done
        with it (committed or failed), with their last state; and the group's devices on another version of the model
        that no stage up to ``stage`` was sent to, online, with their last state (the baseline)."""
        marks = ",".join("?" * len(_JUDGED))
        rows = self.sql.rows(
            f"""SELECT t.device_id, t.status, t.reason, t.previous_version, t.updated, d.status AS online, d.last_seen,
                      d.details, d.profile FROM targets t LEFT JOIN devices d ON d.id = t.device_id
               WHERE t.rollout_id = ? AND t.wave = ? AND t.status IN ({marks}) ORDER BY t.device_id""",
            (rollout_id, stage, *_JUDGED))
        devices = [StageDevice(row["device_id"], row["profile"] or UNKNOWN_BOARD, TargetStatus(row["status"]),
                               row["reason"], row["previous_version"], row["online"] == "online", row["last_seen"],
                               float(row["updated"]), _details(row["details"])) for row in rows]
        rows = self.sql.rows(
            """SELECT d.id, d.version, d.last_seen, d.details, d.profile FROM devices d JOIN rollouts r ON d.grp = r.grp
               WHERE r.id = ? AND d.model = r.model AND d.status = 'online' AND d.details IS NOT NULL
               AND d.version != r.version AND NOT EXISTS (SELECT 1 FROM targets t WHERE t.rollout_id = r.id
                                                          AND t.device_id = d.id AND t.wave <= ?)
               ORDER BY d.id""", (rollout_id, stage))
        baseline = [BaselineDevice(row["id"], row["profile"] or UNKNOWN_BOARD, row["version"], row["last_seen"],
                                   _details(row["details"])) for row in rows]
        return devices, baseline

    def baseline(self, rollout_id: str) -> dict[str, Any] | None:
        """The boards' baselines the last passed stage kept (``{"boards": {...}}``), or None."""
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
