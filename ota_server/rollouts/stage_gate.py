"""When a stage may move on: the gate between a settled stage and the next one, failing closed.

The engine (:mod:`edgesdk.ota_server.rollouts.engine`) asks the gate two things:

- :meth:`StageGate.waits_for_devices`: a stage none (or too few) of whose devices could be sent to,
  because they were offline when it went out, is not settled yet: the first devices that come back
  take their place (the reconciler moves them into the stage) and the stage settles once
  ``min_evidence`` of its planned devices were sent. A stage is never passed on devices that were
  not there;
- :meth:`StageGate.judge`: once a stage settled and its health window passed, its verdict
  (:mod:`edgesdk.ota_server.rollouts.analysis.stage`), judged again every few seconds while it is
  *waiting* for evidence, until it passes, fails, or its deadline (settled + health window +
  ``evidence_grace_s``) makes it inconclusive. Each verdict is stored on the rollout (the API, the
  CLI and the console show it); the final one is logged as a ``stage_verdict`` event.

The engine acts on the outcome: aborts on a failure (and on an inconclusive verdict with
``on_inconclusive="abort"``), waits for the operator on an inconclusive one (``phase``
``waiting_for_promote``), moves on when it passed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from edgesdk.fleet.records import RolloutRecord, TargetStatus, iso_time
from edgesdk.ota_server.rollouts.analysis.stage import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    WAITING,
    judge_stage,
    needed,
)
from edgesdk.ota_server.store.fleet_db import FleetDB

__all__ = ["StageGate", "REJUDGE_EVERY_S", "NOT_SENT"]

#: Operators grep one logger for rollout transitions.
log = logging.getLogger("edgesdk.ota_server.server")

#: How a final outcome is logged.
_SAID = {PASSED: "passed", FAILED: "failed", INCONCLUSIVE: "is inconclusive in"}

#: How often a stage waiting for evidence is judged again (each judgment reads the stage's devices'
#: last states).
REJUDGE_EVERY_S = 5.0

#: Statuses of targets whose command is not out: offline at their stage, late and waiting for the
#: catch-up cap, never to be sent (no artifact for the board, or the device runs a newer version),
#: or skipped by an abort.
NOT_SENT = frozenset({TargetStatus.DEFERRED, TargetStatus.PENDING, TargetStatus.NO_ARTIFACT,
                      TargetStatus.SKIPPED, TargetStatus.AHEAD})


class StageGate:
    """Judges stages on evidence for one engine (see the module doc); state lives in the store, time
    in ``clock``."""

    def __init__(self, db: FleetDB, clock: Callable[[], float]) -> None:
        self.db, self.clock = db, clock
        #: Rollout -> when this engine last judged (or looked at) its current stage.
        self._looked: dict[str, float] = {}

    def keep_only(self, driving: set[str]) -> None:
        """Drop what is kept for rollouts this engine no longer drives (finished, or driven
        elsewhere now)."""
        for gone in set(self._looked) - driving:
            self._looked.pop(gone, None)

    def _due(self, rollout_id: str, now: float) -> bool:
        """True when the rollout's stage was not looked at within :data:`REJUDGE_EVERY_S` (and marks
        it looked at)."""
        if now - self._looked.get(rollout_id, float("-inf")) < REJUDGE_EVERY_S:
            return False
        self._looked[rollout_id] = now
        return True

    def waits_for_devices(self, r: RolloutRecord,
                          counts: Mapping[tuple[int, TargetStatus], int]) -> bool:
        """True while ``r``'s current stage has too few devices sent to settle (see the module doc):
        fewer than ``min_evidence`` of the devices planned for it, some still offline. Rollouts
        whose policy judges nothing settle on whatever was sent."""
        if not r.policy.judged or len(r.stage_sizes) <= r.stage:
            return False
        stage = r.stage
        waiting = sum(n for (s, status), n in counts.items()
                      if s == stage and status in (TargetStatus.DEFERRED, TargetStatus.PENDING))
        sent = sum(n for (s, status), n in counts.items() if s == stage and status not in NOT_SENT)
        planned = r.stage_sizes[stage] - (r.stage_sizes[stage - 1] if stage else 0)
        need = needed(r.policy, planned)
        if not waiting or sent >= need:
            return False
        which = "the canary's devices" if stage == 0 else f"stage {stage + 1}'s devices"
        reason = (f"waiting for {which}: {sent} of the {need} needed were sent, {waiting} are "
                  "offline (the first devices of the group to come back online take their place)")
        stored = r.verdict if r.verdict and r.verdict.get("stage") == stage + 1 else None
        if stored is None or stored.get("reason") != reason:  # written when the counts move
            waiting_verdict = {"stage": stage + 1, "version": r.version, "outcome": WAITING,
                               "passed": False, "final": False, "reason": reason,
                               "judged_at": iso_time(self.clock())}
            self.db.set_verdict(r.id, r.stage, waiting_verdict, None)
        return True

    def judge(self, r: RolloutRecord) -> str:
        """The outcome of ``r``'s settled stage (its health window passed): PASSED, FAILED,
        INCONCLUSIVE (final) or WAITING; judged and stored as the module doc says."""
        stored = r.verdict if r.verdict and r.verdict.get("stage") == r.stage + 1 else None
        if stored is not None and stored.get("final", True):
            return str(stored.get("outcome") or (PASSED if stored.get("passed") else FAILED))
        now = self.clock()
        if not self._due(r.id, now):
            return WAITING
        assert r.stage_settled is not None
        deadline = r.stage_settled + r.policy.health_window_s + r.policy.evidence_grace_s
        devices, baseline = self.db.stage_evidence(r.id, r.stage)
        verdict, keep = judge_stage(r.policy, r.stage, r.version, devices, baseline,
                                    self.db.baseline(r.id), now, final=now >= deadline)
        if not self.db.set_verdict(r.id, r.stage, verdict, keep):
            return WAITING  # the rollout moved on meanwhile (another replica, or the operator)
        outcome = str(verdict["outcome"])
        if outcome == WAITING:
            if stored is None or stored.get("reason") != verdict["reason"]:
                log.info("rollout %s: stage %d waits for evidence: %s", r.id, r.stage + 1,
                         verdict["reason"])
            return WAITING
        self.db.log("stage_verdict", verdict, rollout_id=r.id)
        log.log(logging.INFO if outcome == PASSED else logging.WARNING,
                "rollout %s: stage %d %s its canary analysis: %s", r.id, r.stage + 1,
                _SAID[outcome], verdict["reason"])
        return outcome


def action(outcome: str, policy_on_inconclusive: str) -> str:
    """What the engine does on an outcome: ``advance``, ``abort`` or ``wait``."""
    if outcome == PASSED:
        return "advance"
    if outcome == FAILED or (outcome == INCONCLUSIVE and policy_on_inconclusive == "abort"):
        return "abort"
    return "wait"
