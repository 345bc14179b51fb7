"""Sending the devices of an aborted rollout back to the version they ran before.

When a rollout aborts, every target that committed the new version is sent a signed revert to its
previous version (:meth:`Reverts.revert_committed`). Reverts are settled like stages: a device that
does not answer within ``resend_s`` (a revert lost with a broker restart, a partition, or a dead
replica) is sent it again, and a commit reported after the abort is reverted too
(:meth:`Reverts.finish`, every engine tick while any is unsettled). The work is read from the store
and shared by lease, so whichever replica is alive finishes it. A device that a later rollout moved
on to a third version is not taken back past that rollout: its target ends ``revert_failed``, saying
so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutRecord, TargetRecord, TargetStatus
from edgesdk.ota_server.store.fleet_db import FleetDB

__all__ = ["Reverts", "RevertSender"]

#: Operators grep one logger for rollout transitions.
log = logging.getLogger("edgesdk.ota_server.server")


class RevertSender(Protocol):
    """What reverts ask the dispatcher (:class:`edgesdk.ota_server.rollouts.engine.Dispatcher`) to
    do."""

    def send_revert(self, rollout: RolloutRecord, target: TargetRecord) -> None:
        """Send a signed rollback to the target's previous version; an EdgeSDKError when it cannot
        be sent."""

    def busy(self) -> bool:
        """True while what was sent earlier, or the answers to it, are queued in this server."""

    def finish(self, rollout_id: str) -> None:
        """The rollout needs nothing sent any more: release what was kept for it (archives)."""


class Reverts:
    """The reverts of aborted rollouts, driven by one engine (``holder``) under the rollouts'
    leases."""

    def __init__(self, db: FleetDB, sender: RevertSender, clock: Callable[[], float], holder: str,
                 lease_s: float, resend_s: float) -> None:
        self.db, self.sender, self.clock = db, sender, clock
        self.holder, self.lease_s, self.resend_s = holder, lease_s, resend_s
        #: Aborted rollouts whose reverts this engine sent and whose archives it keeps open until
        #: they settle.
        self.reverting: set[str] = set()

    def finish(self, now: float) -> None:
        """Send the devices of aborted rollouts back: commits reported after the abort, and reverts
        a device has not answered for ``resend_s``; let go of the archives of rollouts whose reverts
        all settled."""
        unsettled = self.db.unsettled_aborts()
        busy = self.sender.busy()
        for rollout_id in unsettled:
            if not self.db.hold_lease(rollout_id, self.holder, now, self.lease_s):
                continue
            r = self.db.rollout(rollout_id, targets=False)
            if r is None:
                continue
            self.revert_committed(r, r.reason or "rollout aborted")
            resent = []
            unanswered = [] if busy else self.db.due_for_revert(rollout_id, now - self.resend_s)
            for t in self._still_to_revert(r, unanswered):
                try:
                    self.sender.send_revert(r, t)
                    resent.append(t.device_id)
                except EdgeSDKError as exc:  # e.g. its previous version left the repository
                    self.db.set_target(r.id, t.device_id, TargetStatus.REVERT_FAILED, str(exc))
            if resent:
                self.db.mark_resent(rollout_id, resent, now)
                log.info("rollout %s: revert sent again to %d devices", rollout_id, len(resent))
        for rollout_id in self.reverting - set(unsettled):
            self.reverting.discard(rollout_id)
            self.sender.finish(rollout_id)

    def revert_committed(self, r: RolloutRecord, reason: str) -> None:
        """Send every committed target of an aborted rollout back to its previous version."""
        self.reverting.add(r.id)
        sent = []
        targets = self.db.targets(r.id, status=TargetStatus.COMMITTED)
        committed = [t for t in targets if t.previous_version]
        for t in self._still_to_revert(r, committed):
            try:
                self.sender.send_revert(r, t)
            except EdgeSDKError as exc:  # e.g. the previous version is no longer in the repository
                self.db.set_target(r.id, t.device_id, TargetStatus.REVERT_FAILED, str(exc))
                continue
            self.db.set_target(r.id, t.device_id, TargetStatus.REVERTING, reason)
            sent.append(t.device_id)
        if sent:
            self.db.mark_resent(r.id, sent, self.clock())  # when a revert is due again (see finish)

    def _still_to_revert(self, r: RolloutRecord, targets: list[TargetRecord]) -> list[TargetRecord]:
        """``targets`` less those whose device a later rollout moved on to a third version: a revert
        now would take it back past that rollout (they end ``revert_failed``, saying so)."""
        running = self.db.running(t.device_id for t in targets)
        keep = []
        for t in targets:
            model, version = running.get(t.device_id, (None, None))
            if model == r.model and version not in (None, r.version, t.previous_version):
                self.db.set_target(r.id, t.device_id, TargetStatus.REVERT_FAILED,
                                   f"not reverted: the device runs {version} now (a later "
                                   "rollout moved it on)")
            else:
                keep.append(t)
        return keep
