"""The rollout engine: a state machine over the fleet store, driven by device events and a clock.

It decides; a :class:`Dispatcher` acts. Starting a rollout orders the group's devices into
stages (canary, then the later stages); each :meth:`RolloutEngine.tick` sends the first
stage, times out silent targets, aborts above the failure rate, waits for the health
window once a stage has settled, then promotes or completes. Device events move targets
through :class:`TargetStatus`. Nothing here touches MQTT or the repository, so the whole
machine runs in a test with a fake clock and a recording dispatcher.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from edgesdk.bundle import parse_version
from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError
from edgesdk.fleet_protocol import (
    AgentEvent,
    DeviceRecord,
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    TargetRecord,
    TargetStatus,
)
from edgesdk.ota import check_id
from edgesdk.ota_server.fleet import FleetDB
from edgesdk.ota_server.rollout import canary_order, stage_sizes

__all__ = ["RolloutEngine", "Dispatcher"]

log = logging.getLogger("edgesdk.ota_server.server")  # operators grep one logger for rollout transitions

#: A device event's effect on its target: (status while rolling out, status while reverting after an abort).
_EVENT_STATUS: dict[AgentEvent, tuple[TargetStatus, TargetStatus]] = {
    AgentEvent.ACCEPTED: (TargetStatus.DOWNLOADING, TargetStatus.REVERTING),
    AgentEvent.DOWNLOADED: (TargetStatus.INSTALLING, TargetStatus.REVERTING),
    AgentEvent.COMMITTED: (TargetStatus.COMMITTED, TargetStatus.REVERTED),
    AgentEvent.FAILED: (TargetStatus.FAILED, TargetStatus.REVERT_FAILED),
    AgentEvent.ROLLED_BACK: (TargetStatus.ROLLED_BACK, TargetStatus.REVERT_FAILED),
    AgentEvent.REJECTED: (TargetStatus.REJECTED, TargetStatus.REVERT_FAILED),
}


class Dispatcher(Protocol):
    """What the engine asks the outside world to do (the OTA server implements it over MQTT)."""

    def send_stage(self, rollout: RolloutRecord, stage: int, targets: list[TargetRecord]) -> None:
        """Send the signed commands of one stage to its targets (and make the archive available)."""

    def resend(self, rollout_id: str, device_id: str, now: float) -> None:
        """Send a target's command again if it has not acknowledged it for a while."""

    def send_revert(self, rollout: RolloutRecord, target: TargetRecord) -> None:
        """Send a signed rollback to the target's previous version; an EdgeSDKError when it cannot be sent."""

    def finish(self, rollout_id: str) -> None:
        """The rollout needs nothing sent any more: release what was kept for it (archives)."""


class RolloutEngine:
    """Starts, steps, promotes, aborts and rolls back rollouts; state lives in the fleet store, time in ``clock``."""

    def __init__(self, db: FleetDB, dispatcher: Dispatcher, clock: Callable[[], float] = time.time) -> None:
        self.db, self.dispatcher, self.clock = db, dispatcher, clock
        #: Aborted rollouts whose devices are still reverting (their archives stay available until they are done).
        self._reverting: set[str] = set()

    # operator actions ------------------------------------------------------------------------
    def start(self, name: str, version: str, group: str, policy: RolloutPolicy | None = None,
              rollback: bool = False) -> str:
        """Plan a rollout of ``name`` ``version`` to the online devices of ``group`` that need it; its id.

        Raises ConflictError when the group has no online device, a rollout running,
        every device at that version already, or (unless ``rollback``) a newer version.
        The first stage is sent by the next :meth:`tick`.
        """
        check_id(group, "group")
        online = [d for d in self.db.devices(group) if d.status == "online"]
        if not online:
            raise ConflictError(f"group {group!r} has no online device; start the agents first (see `edgesdk devices`)")
        running = [r for r in self.db.rollouts(RolloutState.RUNNING) if r.group == group]
        if running:
            raise ConflictError(f"group {group!r} already has rollout {running[0].id} running; abort or wait for it")
        devices = _targets(name, version, group, online, rollback)
        policy = policy or RolloutPolicy()
        rollout_id = f"r{time.strftime('%Y%m%d%H%M%S', time.gmtime(self.clock()))}-{uuid.uuid4().hex[:6]}"
        self.db.add_rollout(rollout_id, name, version, group, policy, rollback)
        order = canary_order(group, [d.id for d in devices])
        sizes = stage_sizes(len(order), policy)
        by_id = {d.id: d for d in devices}
        start = 0
        for stage, end in enumerate(sizes):
            for device in order[start:end]:
                self.db.add_target(rollout_id, device, stage, by_id[device].version)
            start = end
        self.db.log("rollout_started", {"name": name, "version": version, "stages": sizes, "rollback": rollback},
                    rollout_id=rollout_id)
        log.info("rollout %s started: %s %s to %d devices of group %s in stages %s%s", rollout_id, name, version,
                 len(order), group, sizes, " (rollback)" if rollback else "")
        return rollout_id

    def promote(self, rollout_id: str) -> None:
        """Send the next stage now, without waiting for the health window."""
        r = self._running(rollout_id)
        log.info("rollout %s promoted by operator to stage %d", rollout_id, r.stage + 2)
        self._send_stage(r, r.stage + 1)

    def abort(self, rollout_id: str, reason: str = "aborted by operator") -> None:
        """Stop a running rollout and send its updated devices back to their previous version."""
        self._abort(self._running(rollout_id), reason)

    def rollback(self, rollout_id: str, to_version: str | None = None) -> str:
        """Roll a rollout's group back with a signed rollback, as a new rollout (aborting it first if running)."""
        r = self.status(rollout_id)
        if r.state == RolloutState.RUNNING:
            self._abort(r, "rolled back by operator")
        if to_version is None:
            previous = [t.previous_version for t in r.targets if t.previous_version]
            if not previous:
                raise ConflictError(f"rollout {rollout_id} has no previous version to go back to; pass --to VERSION")
            to_version = max(set(previous), key=previous.count)
        policy = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0, max_failure_rate=0.99)
        return self.start(r.model, to_version, r.group, policy, rollback=True)

    def status(self, rollout_id: str) -> RolloutRecord:
        """A rollout with its targets; NotFoundError for an unknown id."""
        r = self.db.rollout(rollout_id)
        if r is None:
            raise NotFoundError(f"no rollout {rollout_id!r}; `edgesdk rollout status` lists them")
        return r

    def _running(self, rollout_id: str) -> RolloutRecord:
        r = self.status(rollout_id)
        if r.state != RolloutState.RUNNING:
            raise ConflictError(f"rollout {rollout_id} is {r.state}, not running")
        return r

    # device events ---------------------------------------------------------------------------
    def on_event(self, device_id: str, kind: str, deployment_id: str, reason: str | None) -> None:
        """Move the device's target by its event (``deployment_id`` ends in ``-rollback`` for a revert)."""
        rollout_id = deployment_id.removesuffix("-rollback")
        try:
            statuses = _EVENT_STATUS.get(AgentEvent(kind))
        except ValueError:  # an event this server does not know (a newer agent's): nothing to track
            return
        if not rollout_id or statuses is None:
            return
        rolling_out, after_abort = statuses
        self.db.set_target(rollout_id, device_id, after_abort if deployment_id.endswith("-rollback") else rolling_out,
                           reason)

    # the clock -------------------------------------------------------------------------------
    def tick(self) -> None:
        """One step of every running rollout (and release of finished reverts); call it periodically."""
        for summary in self.db.rollouts(RolloutState.RUNNING):
            try:
                self._step(self.status(summary.id))
            except EdgeSDKError as exc:  # e.g. a bundle changed on disk after upload
                self._abort(self.status(summary.id), f"server error: {exc}")
            except Exception:
                log.exception("rollout %s: engine step failed", summary.id)
        for rollout_id in list(self._reverting):
            r = self.db.rollout(rollout_id)
            if r is None or not any(t.status == TargetStatus.REVERTING for t in r.targets):
                self._reverting.discard(rollout_id)
                self.dispatcher.finish(rollout_id)

    def _step(self, r: RolloutRecord) -> None:
        policy = r.policy
        if r.stage < 0:
            self._send_stage(r, 0)
            return
        now = self.clock()
        timed_out = False
        for t in r.in_stage(r.stage):
            if not t.status.terminal and t.sent and now - t.sent > policy.deploy_timeout_s:
                self.db.set_target(r.id, t.device_id, TargetStatus.TIMEOUT,
                                   f"no report in {policy.deploy_timeout_s:g} s")
                timed_out = True
            elif t.status == TargetStatus.SENT:
                self.dispatcher.resend(r.id, t.device_id, now)
        if timed_out:
            r = self.status(r.id)
        sent = [t for t in r.targets if t.stage <= r.stage]
        failed = [t for t in sent if t.status.failed]
        if sent and len(failed) / len(sent) > policy.max_failure_rate:
            reasons = "; ".join(f"{t.device_id}: {t.reason}" for t in failed[:3])
            self._abort(r, f"{len(failed)}/{len(sent)} devices failed (> {policy.max_failure_rate:.0%}): {reasons}")
            return
        if not all(t.status.terminal for t in r.in_stage(r.stage)):
            return
        if r.stage_settled is None:
            self.db.settle_stage(r.id, now)
            return
        if now - r.stage_settled < policy.health_window_s:
            return
        if r.stage >= r.stage_count - 1:
            self.db.end_rollout(r.id, RolloutState.COMPLETED, f"{len(sent) - len(failed)}/{len(sent)} updated")
            self.db.log("rollout_completed", {"failed": len(failed)}, rollout_id=r.id)
            log.info("rollout %s completed: %d/%d devices updated", r.id, len(sent) - len(failed), len(sent))
            self.dispatcher.finish(r.id)
        elif policy.auto_promote:
            self._send_stage(r, r.stage + 1)

    def _send_stage(self, r: RolloutRecord, stage: int) -> None:
        targets = r.in_stage(stage)
        if not targets:
            raise ConflictError(f"rollout {r.id} has no stage {stage + 1}: its last stage was sent already")
        self.db.start_stage(r.id, stage)
        self.dispatcher.send_stage(r, stage, targets)
        sent_at = self.clock()
        for t in targets:
            self.db.set_target(r.id, t.device_id, TargetStatus.SENT, sent_at=sent_at)
        self.db.log("stage_sent", {"stage": stage, "devices": [t.device_id for t in targets]}, rollout_id=r.id)
        log.info("rollout %s: stage %d sent to %d devices", r.id, stage + 1, len(targets))

    def _abort(self, r: RolloutRecord, reason: str) -> None:
        self.db.end_rollout(r.id, RolloutState.ABORTED, reason)
        self.db.log("rollout_aborted", {"reason": reason}, rollout_id=r.id)
        log.warning("rollout %s aborted: %s", r.id, reason)
        reverting = False
        for t in r.targets:
            if t.status != TargetStatus.COMMITTED or not t.previous_version:
                continue
            try:
                self.dispatcher.send_revert(r, t)
            except EdgeSDKError as exc:  # e.g. the previous version is no longer in the repository
                self.db.set_target(r.id, t.device_id, TargetStatus.REVERT_FAILED, str(exc))
                continue
            self.db.set_target(r.id, t.device_id, TargetStatus.REVERTING, reason)
            reverting = True
        if reverting:
            self._reverting.add(r.id)
        else:
            self.dispatcher.finish(r.id)


def _targets(name: str, version: str, group: str, online: list[DeviceRecord], rollback: bool) -> list[DeviceRecord]:
    """The online devices that need ``version``; refuses a version the group runs already, or a downgrade."""
    wanted = parse_version(version)
    targets = [d for d in online if not (d.model == name and d.version == version)]
    if not targets:
        raise ConflictError(f"{name} {version} is already installed on all {len(online)} online devices of group "
                            f"{group!r}; nothing to send")
    newer = sorted({d.version for d in targets if d.model == name and d.version
                    and parse_version(d.version) > wanted}, key=parse_version)
    if newer and not rollback:
        raise ConflictError(f"group {group!r} runs {name} {newer[-1]}, newer than {version}: devices refuse a "
                            f"downgrade; use `edgesdk rollout rollback ID --to {version}`")
    return targets
