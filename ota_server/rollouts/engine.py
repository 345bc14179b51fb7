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
from typing import Any, Protocol

from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError
from edgesdk.fleet.protocol import check_id
from edgesdk.fleet.records import AgentEvent, RolloutPolicy, RolloutRecord, RolloutState, TargetRecord, TargetStatus
from edgesdk.ota_server.rollouts.analysis.rollback_rules import plan_rollback
from edgesdk.ota_server.rollouts.reconciler import Reconciler
from edgesdk.ota_server.rollouts.reverts import Reverts
from edgesdk.ota_server.rollouts.stage_gate import NOT_SENT, StageGate, action
from edgesdk.ota_server.rollouts.targets import plan_rollout
from edgesdk.ota_server.store.fleet_db import FleetDB, TargetUpdate

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


#: How often a running rollout's in-flight targets whose device went offline are deferred, and how often the releases
#: are passed over while the catch-up cap holds devices back (a reconnect storm: no need to wait for a crowd).
_DEFER_EVERY_S = _BACKLOG_EVERY_S = 1.0

#: While reports keep coming, a re-send round still runs every this many ``resend_s``, and sends again only the
#: commands unanswered for ``_ROUND_QUIET`` of them (those of a stage just sent are mostly answers on their way).
_ROUND_EVERY, _ROUND_QUIET = 10, 5


class Dispatcher(Protocol):
    """What the engine asks the outside world to do (the OTA server implements it over MQTT)."""

    def send_stage(self, rollout: RolloutRecord, stage: int, targets: list[TargetRecord]) -> None:
        """Send the signed commands of one stage to its targets (and make the archive available)."""

    def resend(self, rollout: RolloutRecord, stage: int, device_ids: list[str]) -> list[str]:
        """Send the stage's command again to devices that have not acknowledged it; the devices it was sent to."""

    def busy(self) -> bool:
        """True while what was sent earlier, or the answers to it, are queued in this server (silence says nothing)."""

    def send_revert(self, rollout: RolloutRecord, target: TargetRecord) -> None:
        """Send a signed rollback to the target's previous version; an EdgeSDKError when it cannot be sent."""

    def finish(self, rollout_id: str) -> None:
        """The rollout needs nothing sent any more: release what was kept for it (archives)."""

    def send_late(self, rollout: RolloutRecord, targets: list[TargetRecord]) -> None:
        """Send the rollout's command to late targets (devices back from offline, or new to the group)."""


class RolloutEngine:
    """Starts, steps, promotes, aborts and rolls back rollouts; state lives in the fleet store, time in ``clock``.

    Several engines (one per server replica) may share a store: each running rollout is driven
    by the one engine that holds its lease (``holder``, renewed every tick for ``lease_s``); when
    that engine stops ticking, another takes the rollout over once the lease expires and re-sends
    what was not acknowledged. Every stage move and rollout end is a compare-and-set on the
    rollout's state and stage and on the lease, so a driver whose lease lapsed moves nothing.
    A group's release (its last completed rollout) is leased the same way by whichever engine
    reconciles the group to it (:class:`Reconciler`): every ``reconcile_s`` while devices wait or
    catch-ups run, every ``lease_s / 2`` otherwise (``reconcile_s`` is at most that: the passes keep the lease)."""

    def __init__(self, db: FleetDB, dispatcher: Dispatcher, clock: Callable[[], float] = time.time, *,
                 resend_s: float = 3.0, holder: str | None = None, lease_s: float = 10.0,
                 max_catch_up: int = 500, reconcile_s: float = 1.0,
                 artifacts: Callable[[str, str], list[str]] | None = None) -> None:
        self.db, self.dispatcher, self.clock = db, dispatcher, clock
        self.resend_s, self.lease_s = resend_s, lease_s
        #: How often the groups' releases are passed over: the devices that came back or joined since the last pass
        #: are sent their commands together. At most half the lease, which these passes renew.
        self.reconcile_s = min(reconcile_s, lease_s / 2)
        #: A release's artifacts (the target profiles it has a bundle for; the repository's): each device gets its
        #: board's (:func:`edgesdk.runtime.boards.artifact_for`). None: every device gets the release's one bundle.
        self.artifacts = artifacts
        self.reconciler = Reconciler(db, dispatcher, clock, max_catch_up=max_catch_up, resend_s=resend_s,
                                     artifacts=artifacts)
        #: When this engine last passed over the groups' releases.
        self._last_reconcile = float("-inf")
        #: Rollout -> when this engine last deferred its targets whose device went offline.
        self._deferred_at: dict[str, float] = {}
        #: This engine's name in the rollouts' leases.
        self.holder = holder or f"engine-{uuid.uuid4().hex[:8]}"
        #: Running rollouts this engine drove at its last tick (to log take-overs once).
        self._driving: set[str] = set()
        #: Rollout -> (its stage's unfinished targets, since when that count has not changed).
        self._progress: dict[str, tuple[int, float]] = {}
        #: Rollout -> when this engine last looked for devices to send its command again.
        self._last_round: dict[str, float] = {}
        #: When a settled stage may move on: its canary verdict, on evidence (:mod:`.stage_gate`).
        self.gate = StageGate(db, clock)
        #: Sends the devices of aborted rollouts back (:mod:`.reverts`).
        self.reverts = Reverts(db, dispatcher, clock, self.holder, lease_s, resend_s)

    @property
    def driving(self) -> frozenset[str]:
        """The running rollouts this engine held the lease of at its last tick, and the releases it reconciles."""
        return frozenset(self._driving | self.reconciler.releases)

    @property
    def idle(self) -> bool:
        """True when this engine drove no rollout, sent back no revert and left no device waiting under the catch-up
        cap at its last tick: its next tick may wait ``reconcile_s`` (an operator's push, promote or abort through this
        server wakes it at once)."""
        return not self._driving and not self.reverts.reverting and not self.reconciler.backlog

    def serving(self, rollout_id: str) -> None:
        """Note that this engine opened ``rollout_id``'s archive for a release's late targets (a chunk request of a
        transfer resumed after sleep); it is released once no late target of it is in flight."""
        if rollout_id in self.reconciler.releases:
            self.reconciler.serving.add(rollout_id)

    # operator actions ------------------------------------------------------------------------
    def start(self, name: str, version: str, group: str, policy: RolloutPolicy | None = None,
              rollback: bool = False) -> str:
        """Plan a rollout of ``name`` ``version`` to every device of ``group`` that needs it; its id.

        Online devices come first in the stage order, so the canary runs on devices that can answer
        now; offline ones are deferred when their stage is sent and get the release when they
        report again (:mod:`edgesdk.ota_server.rollouts.reconciler`), the first back filling a
        stage short of its size. A group whose devices are only provisioned is planned over them,
        each device's board and version taken from its first report. Raises ConflictError when the
        group has no device (reported or provisioned), a rollout running, every device at that
        version already, or (unless ``rollback``) a newer version. The first stage is sent by the
        next :meth:`tick`.
        """
        check_id(group, "group")
        devices = self.db.devices(group)
        provisioned = [] if devices else [p.device_id for p in self.db.provisioning(group)]
        if not devices and not provisioned:
            raise ConflictError(f"group {group!r} has no device; provision its devices (`edgesdk devices provision "
                                "ID GROUP`) or start their agents (see `edgesdk devices`)")
        running = [r for r in self.db.rollouts(RolloutState.RUNNING) if r.group == group]
        if running:
            raise ConflictError(f"group {group!r} already has rollout {running[0].id} running; abort or wait for it")
        policy = policy or RolloutPolicy()
        plan = plan_rollout(name, version, group, devices, provisioned, policy,
                            self.artifacts and self.artifacts(name, version), rollback)
        rollout_id = f"r{time.strftime('%Y%m%d%H%M%S', time.gmtime(self.clock()))}-{uuid.uuid4().hex[:6]}"
        self.db.add_rollout(rollout_id, name, version, group, policy, plan.stages, rollback,
                            unserved=plan.unserved)
        self.db.record_before(group, name, plan.before, rollout_id)  # its release history's start
        self.db.log("rollout_started", {"name": name, "version": version, "stages": plan.sizes,
                                        "rollback": rollback, "offline": plan.offline,
                                        "no_artifact": len(plan.unserved),
                                        "provisioned": plan.provisioned}, rollout_id=rollout_id)
        if plan.unserved:
            log.warning("rollout %s: %d devices of group %s have a board %s %s has no artifact "
                        "for (%s): left on their version", rollout_id, len(plan.unserved), group,
                        name, version, plan.unserved_boards)
        log.info("rollout %s started: %s %s to %d devices of group %s in stages %s (%d offline: "
                 "deferred until they report)%s", rollout_id, name, version,
                 plan.sizes[-1] if plan.sizes else 0, group, plan.sizes, plan.offline,
                 " (rollback)" if rollback else "")
        return rollout_id

    def promote(self, rollout_id: str) -> None:
        """Send the next stage now, without waiting for the health window or the canary verdict; on a last stage
        paused by an inconclusive verdict, or waiting for evidence or devices, complete the rollout (the operator
        accepts the release as it is)."""
        r = self._running(rollout_id)
        verdict = r.verdict if r.verdict and r.verdict.get("stage") == r.stage + 1 else {}
        self.db.log("stage_promoted", {"stage": r.stage + 1, "verdict": verdict.get("outcome")}, rollout_id=r.id)
        if r.stage + 1 >= r.stage_count:
            if verdict.get("outcome") in ("inconclusive", "waiting"):
                log.warning("rollout %s: completed by the operator past a verdict %s", r.id, verdict["outcome"])
                if self._complete(r, self.db.target_counts(r.id), by="completed by the operator past a verdict "
                                  f"{verdict['outcome']}: {verdict.get('reason')}"):
                    return
                raise ConflictError(f"rollout {r.id} moved on while completing it; see `edgesdk rollout status`")
            raise ConflictError(f"rollout {r.id} has no stage {r.stage + 2}: its last stage was sent already")
        log.info("rollout %s promoted by operator to stage %d", rollout_id, r.stage + 2)
        if not self._send_stage(r, r.stage + 1, fenced=False):
            raise ConflictError(f"rollout {r.id} moved on while promoting (its stage or state changed); see "
                                "`edgesdk rollout status`")

    def abort(self, rollout_id: str, reason: str = "aborted by operator") -> None:
        """Stop a running rollout and send its updated devices back to their previous version."""
        if not self._abort(self._running(rollout_id), reason, fenced=False):
            raise ConflictError(f"rollout {rollout_id} ended while aborting it; see `edgesdk rollout status`")

    def rollback(self, rollout_id: str, to_version: str | None = None,
                 all_at_once: bool = False) -> str:
        """Roll a rollout's group back with a signed rollback, as a new rollout (aborting it first if
        running): to ``to_version``, else the most recent version the group ran before; staged with
        the rollout's policy, or with ``all_at_once`` to every device at once without analysis.
        Refused (ConflictError, nothing changed) by
        :mod:`edgesdk.ota_server.rollouts.analysis.rollback_rules`."""
        r = self.status(rollout_id, targets=False)
        artifacts = self.artifacts
        stored = None if artifacts is None else (lambda v: bool(artifacts(r.model, v)))
        history = self.db.group_history(r.group, r.model)
        plan = plan_rollback(r, history, to_version, all_at_once, stored)
        if r.state == RolloutState.RUNNING:
            self._abort(r, "rolled back by operator", fenced=False)
        self.db.log("rollback_planned", {"to": plan.version, "undoes": plan.undoes,
                                         "all_at_once": all_at_once}, rollout_id=r.id)
        return self.start(r.model, plan.version, r.group, plan.policy, rollback=True)

    def status(self, rollout_id: str, **page: Any) -> RolloutRecord:
        """A rollout with its counts and targets (``page``: see :meth:`FleetDB.rollout`); NotFoundError if unknown."""
        r = self.db.rollout(rollout_id, **page)
        if r is None:
            raise NotFoundError(f"no rollout {rollout_id!r}; `edgesdk rollout status` lists them")
        return r

    def _running(self, rollout_id: str) -> RolloutRecord:
        r = self.status(rollout_id, targets=False)
        if r.state != RolloutState.RUNNING:
            raise ConflictError(f"rollout {rollout_id} is {r.state}, not running")
        return r

    # device events ---------------------------------------------------------------------------
    @staticmethod
    def target_update(device_id: str, kind: str, deployment_id: str, reason: str | None) -> TargetUpdate | None:
        """How a device's event moves its target (``deployment_id`` ends in ``-rollback`` for a revert), or None."""
        rollout_id = deployment_id.removesuffix("-rollback")
        try:
            statuses = _EVENT_STATUS.get(AgentEvent(kind))
        except ValueError:  # an event this server does not know (a newer agent's): nothing to track
            return None
        if not rollout_id or statuses is None:
            return None
        rolling_out, after_abort = statuses
        return TargetUpdate(rollout_id, device_id, after_abort if deployment_id.endswith("-rollback") else rolling_out,
                            reason)

    def on_event(self, device_id: str, kind: str, deployment_id: str, reason: str | None) -> None:
        """Move the device's target by its event (the server batches many with :meth:`target_update`)."""
        update = self.target_update(device_id, kind, deployment_id, reason)
        if update is not None:
            self.db.set_targets([update])

    # the clock -------------------------------------------------------------------------------
    def tick(self) -> None:
        """One step of every running rollout this engine holds the lease of, a reconciliation pass over their groups
        (and, every ``reconcile_s`` while a release has work, over the groups whose release it leases), and the
        release of finished reverts. What there is to do is read first, in one statement: with nothing queued and
        no catch-up in flight, a release pass runs only every ``lease_s / 2`` (to keep the releases' leases)."""
        now = self.clock()
        work = self.db.work()
        driving = set()
        running = self.db.rollouts(RolloutState.RUNNING) if work.running else []
        room = self.reconciler.room(work.late_in_flight)  # the cap's fleet-wide count
        for summary in running:
            if not self.db.hold_lease(summary.id, self.holder, now, self.lease_s):
                continue
            driving.add(summary.id)
            if summary.id not in self._driving and summary.stage >= 0:
                log.info("rollout %s: driven by %s from stage %d", summary.id, self.holder, summary.stage + 1)
            try:
                self._step(self.status(summary.id, targets=False))
                r = self.status(summary.id, targets=False, counts=False)
                if r.state == RolloutState.RUNNING and r.stage >= 0:
                    room -= self.reconciler.run(r, room, work)
            except EdgeSDKError as exc:  # e.g. a bundle changed on disk after upload
                self._abort(self.status(summary.id, targets=False), f"server error: {exc}")
            except Exception:
                log.exception("rollout %s: engine step failed", summary.id)
        self._driving = driving
        for gone in (set(self._progress) | set(self._last_round) | set(self._deferred_at)) - driving:
            self._progress.pop(gone, None)  # finished, or driven elsewhere now
            self._last_round.pop(gone, None)
            self._deferred_at.pop(gone, None)
        self.gate.keep_only(driving)
        since = now - self._last_reconcile
        every = _BACKLOG_EVERY_S if self.reconciler.backlog else self.reconcile_s
        if since >= every and (not work.releases_idle or self.reconciler.serving or since >= self.lease_s / 2):
            self._last_reconcile = now
            self.reconciler.run_releases(now, room, work, self.holder, self.lease_s)
        self.reconciler.keep_only(driving | self.reconciler.releases)
        if work.reverting or self.reverts.reverting:
            self.reverts.finish(now)

    def _step(self, r: RolloutRecord) -> None:
        policy = r.policy
        if r.stage < 0:
            self._send_stage(r, 0)
            return
        now = self.clock()
        if now - self._deferred_at.get(r.id, float("-inf")) >= _DEFER_EVERY_S:
            self._deferred_at[r.id] = now  # a look per in-flight target: once a second, not every tick
            self.db.defer_offline(r.id, r.stage)
        timed_out = 0
        if not self.dispatcher.busy():  # silence says nothing while answers queue here, or the broker link is new
            # At the deadline a target never sent again gets a last try, answered in two re-send intervals or failed.
            self._send_again(r, self.db.overdue_untried(r.id, r.stage, now - policy.deploy_timeout_s), now)
            timed_out = self.db.time_out_targets(r.id, r.stage, now - policy.deploy_timeout_s - 2 * self.resend_s,
                                                 f"no report in {policy.deploy_timeout_s:g} s")
        counts = self.db.target_counts(r.id)
        if (quiet := self._round_due(r.id, counts, r.stage, now)) is not None:
            self._last_round[r.id] = now
            # A device that is downloading ignores a repeated command and one that committed reports it again, so a
            # report lost with a dead replica's queue costs a re-send, not a timeout.
            stuck = now - max(quiet, 4 * self.resend_s)
            if silent := self.db.due_for_resend(r.id, r.stage, now - quiet, stuck):
                self.db.mark_resent(r.id, self.dispatcher.resend(r, r.stage, silent), now)
            late = self.db.due_for_resend(r.id, r.stage, now - quiet, stuck, late=True)
            self._send_again(r, list(self.db.targets_of(r.id, late).values()), now)
        if timed_out:
            log.warning("rollout %s: %d devices of stage %d timed out", r.id, timed_out, r.stage + 1)
        # Deferred targets (offline) and late ones not sent yet neither count nor hold a stage back.
        sent = sum(n for (stage, status), n in counts.items() if stage <= r.stage and status not in NOT_SENT)
        failed = sum(n for (stage, status), n in counts.items() if stage <= r.stage and status.failed)
        if sent and failed / sent > policy.max_failure_rate:
            reasons = "; ".join(f"{t.device_id}: {t.reason}" for t in self.db.failed_targets(r.id, 3))
            self._abort(r, f"{failed}/{sent} devices failed (> {policy.max_failure_rate:.0%}): {reasons}")
            return
        if any(not status.settled and status not in NOT_SENT for (stage, status), n in counts.items()
               if stage == r.stage and n):
            return
        if r.stage_settled is None:
            # A canary whose devices were offline waits for them.
            if not self.gate.waits_for_devices(r, counts) and not self.db.settle_stage(
                    r.id, now, stage=r.stage, holder=self.holder, lease_now=now):
                log.warning("rollout %s: stage %d not settled by %s: its lease lapsed or the rollout moved on", r.id,
                            r.stage + 1, self.holder)
            return
        if now - r.stage_settled < policy.health_window_s or not self._verdict(r):
            return  # in its health window, failed its canary verdict (aborted), or waiting (evidence, or promote)
        if r.stage >= r.stage_count - 1:
            self._complete(r, counts)
        elif policy.auto_promote:
            self._send_stage(r, r.stage + 1)

    def _complete(self, r: RolloutRecord, counts: dict[tuple[int, TargetStatus], int], by: str | None = None) -> bool:
        """End ``r`` as completed, the group's release (``by``: the operator who accepted its last stage; else fenced
        on this engine's lease); False when it moved on meanwhile."""
        sent = sum(n for (_, status), n in counts.items() if status not in NOT_SENT)
        failed = sum(n for (_, status), n in counts.items() if status.failed)
        deferred = sum(n for (_, status), n in counts.items() if status == TargetStatus.DEFERRED)
        summary = (f"{sent - failed}/{sent} updated" + (f", {deferred} deferred (offline)" if deferred else "")
                   if sent or deferred else "no device has reported yet: each gets it on its first report (late)")
        if by is not None:
            summary += f"; {by}"
        holder, now = (None, None) if by is not None else (self.holder, self.clock())
        if not self.db.end_rollout(r.id, RolloutState.COMPLETED, summary, stage=r.stage, holder=holder,
                                   lease_now=now):
            log.warning("rollout %s: not completed by %s: its lease lapsed or another server moved it on", r.id,
                        self.holder)
            return False
        self.db.log("rollout_completed", {"failed": failed, "deferred": deferred, "holder": holder or "operator"},
                    rollout_id=r.id)
        log.info("rollout %s completed: %s; it is group %s's release now", r.id, summary, r.group)
        self.dispatcher.finish(r.id)
        return True

    def _send_again(self, r: RolloutRecord, targets: list[TargetRecord], now: float) -> None:
        """Send targets their command again: a late one its own stage's (no broadcast), the others the stage's."""
        if not targets:
            return
        late = [t for t in targets if t.late]
        self.dispatcher.send_late(r, late)
        sent = [t.device_id for t in late]
        if len(late) < len(targets):
            sent += self.dispatcher.resend(r, r.stage, [t.device_id for t in targets if not t.late])
        self.db.mark_resent(r.id, sent, now)

    def _round_due(self, rollout_id: str, counts: dict[tuple[int, TargetStatus], int], stage: int,
                   now: float) -> float | None:
        """How long a command must have gone unanswered to be sent again, when a re-send round is due; else None.
        Due once the stage's reports stopped for ``resend_s``, or ``_ROUND_EVERY`` times that after the last round
        (reports can trickle for minutes under faults, and a command lost in a broker restart must not wait for the
        deploy timeout); that round skips commands younger than ``_ROUND_QUIET`` of them, as a stage sent a
        moment ago is still being answered (half the 10,000-device runs re-sent ~6,000 commands, likely so)."""
        unfinished = sum(n for (s, status), n in counts.items() if s == stage and not status.terminal)
        seen = self._progress.get(rollout_id)
        last_round = self._last_round.setdefault(rollout_id, now)
        if self.dispatcher.busy():  # the devices have not had the commands yet: silence starts once they are out
            self._progress[rollout_id] = (unfinished, now)
            return None
        if seen is None or seen[0] != unfinished:
            self._progress[rollout_id] = (unfinished, now)
            return _ROUND_QUIET * self.resend_s if now - last_round >= _ROUND_EVERY * self.resend_s else None
        return self.resend_s if now - seen[1] >= self.resend_s else None

    def _send_stage(self, r: RolloutRecord, stage: int, fenced: bool = True) -> bool:
        """Move ``r`` to ``stage`` and send it; False when the move was refused (compare-and-set on the rollout's
        state and stage, and with ``fenced`` on this engine's lease: a driver whose lease lapsed moves nothing)."""
        now = self.clock()
        # Marked sent before the commands go out: a device's answer may arrive before the publish loop ends.
        if not self.db.start_stage(r.id, stage, now, *((self.holder, now) if fenced else (None, None))):
            log.warning("rollout %s: stage %d not sent by %s: its lease lapsed or the rollout moved on", r.id,
                        stage + 1, self.holder)
            return False
        targets = self.db.targets(r.id, stage=stage, status=TargetStatus.SENT)
        if targets:
            self.dispatcher.send_stage(r, stage, targets)
        deferred = len(self.db.targets(r.id, stage=stage, status=TargetStatus.DEFERRED))
        self.db.log("stage_sent", {"stage": stage, "devices": len(targets), "deferred": deferred,
                                   "holder": self.holder if fenced else "operator"}, rollout_id=r.id)
        log.info("rollout %s: stage %d sent to %d devices (%d offline, deferred)", r.id, stage + 1, len(targets),
                 deferred)
        return True

    def _abort(self, r: RolloutRecord, reason: str, fenced: bool = True) -> bool:
        """End ``r`` as aborted and revert its committed devices; False when it was no longer running (or, with
        ``fenced``, this engine's lease lapsed)."""
        holder, now = (self.holder, self.clock()) if fenced else (None, None)
        if not self.db.end_rollout(r.id, RolloutState.ABORTED, reason, holder=holder, lease_now=now):
            return False
        skipped = self.db.skip_unsent(r.id)
        self.db.log("rollout_aborted", {"reason": reason, "holder": holder or "operator", "skipped": skipped},
                    rollout_id=r.id)
        log.warning("rollout %s aborted: %s", r.id, reason)
        self.reverts.revert_committed(r, reason)
        return True

    def _verdict(self, r: RolloutRecord) -> bool:
        """Whether ``r``'s settled stage may move on, by its canary verdict (:class:`StageGate`): aborts with the
        figures when it failed (or was inconclusive and the policy says abort); False while it waits for evidence or,
        inconclusive or manual, for the operator (``RolloutRecord.phase`` reads ``waiting_for_promote``)."""
        outcome = self.gate.judge(r)
        todo = action(outcome, r.policy.on_inconclusive)
        if todo == "abort":
            verdict = self.status(r.id, targets=False, counts=False).verdict or {}
            self._abort(r, f"stage {r.stage + 1} {'failed' if outcome == 'failed' else 'was inconclusive in'} its "
                           f"canary analysis: {verdict.get('reason', outcome)}")
        return todo == "advance"
