"""The reconciler: every device of a group converges to the group's release, whenever it is online.

A group's *desired state* is the release its last completed rollout set (``FleetDB.release``),
or, while a rollout runs, that rollout. Every online state report puts its device in a queue kept
in the store (``devices.reconcile``); each pass of :meth:`Reconciler.run` takes the group's
queued devices and compares each with the rollout:

- a device with no target in it (it joined the group after the rollout started) becomes a *late*
  target of the rollout's last stage: sent now if that stage is out (or the rollout completed),
  else with the stage;
- a *deferred* target (its device was offline when its stage went out, or went offline before
  answering) is sent again, late;
- while a running rollout's current stage has fewer devices sent than its planned (cumulative) size,
  because its devices were offline at the push, a device that comes back whose target waits in a
  *later* stage (or that joins now) is moved into the current stage and sent: the first devices to
  return are canaried, with the same stages and analysis (the engine's stage gate waits for them);
  a device of the current stage that comes back once it has all it planned, never sent yet, is
  moved to the next stage (the stages keep their sizes);
- a device that joins or returns running a *newer* version of the model than the rollout sends
  (not a rollback) is not sent a downgrade: its target reads ``ahead``, with both versions;
- a target planned before its device ever reported (a group only provisioned at the push) takes
  the device's board's artifact and version from its report (``no_artifact`` when there is none);
- a device that runs the release while its target is unfinished or timed out has committed, and
  its commit report was lost (queued in a replica that died, or sent while the broker restarted):
  the target is marked committed from the state, which the broker retains and every replica reads.
  So is its target of an earlier completed rollout whose version it runs, when that state reaches
  the server only after a later push;
- anything else (on the release already, or done with the rollout: committed, failed, refused)
  needs nothing.

A pass costs what there is to do: the engine reads that first, in one statement
(``FleetDB.work``); with nobody queued the group's queue is not read, and a release's in-flight
targets are chased every ``resend_s`` while catch-ups run, not every pass.

Sends are capped by ``max_catch_up`` late targets in flight across the whole fleet, so a
reconnect storm after a broker restart queues in the store instead of in the broker or the
outbox; devices over the cap stay queued for the next pass. Late targets that fail flag the
release past the policy's ``max_late_failure_rate``: each device has already rolled back on its
own, and the group is never reverted behind the operator's back. A flagged release sends nothing
more (no catch-up, no re-send) until the operator resumes it (:meth:`Reconciler.resume`, which
counts only the late failures after it) or rolls the group back (a new release).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError
from edgesdk.fleet.records import DeviceRecord, RolloutRecord, RolloutState, TargetRecord, TargetStatus
from edgesdk.ota_server.rollouts.late_plan import NOT_SENT, PassPlan, plan_pass
from edgesdk.ota_server.store.desired_state import FleetWork
from edgesdk.ota_server.store.fleet_db import FleetDB, TargetUpdate
from edgesdk.ota_server.store.rows import FAILED

__all__ = ["Reconciler", "LateSender", "MIN_LATE_FAILURES"]

log = logging.getLogger("edgesdk.ota_server.server")  # operators grep one logger for rollout transitions

#: The statuses of a late target that failed.
_FAILED = tuple(TargetStatus(s) for s in FAILED)

#: The reason a target is marked committed from its device's state rather than from its commit report.
_LOST_COMMIT = "committed by its state: the device reports it runs {} (no commit report had been received)"

#: With no catch-up in flight, a release's targets are still chased every this many ``resend_s``.
_IDLE_CHASE = 5

#: A release is flagged only once at least this many late targets failed (one of one says little).
MIN_LATE_FAILURES = 3


class LateSender(Protocol):
    """What the reconciler asks the dispatcher to do."""

    def send_late(self, rollout: RolloutRecord, targets: list[TargetRecord]) -> None:
        """Send the rollout's command to late targets, each with its stage's transfer (no broadcast)."""

    def busy(self) -> bool:
        """True while earlier sends, or the devices' answers, are still queued in this server."""

    def finish(self, rollout_id: str) -> None:
        """The rollout needs nothing sent any more: release what was kept for it (archives)."""


class Reconciler:
    """Brings the queued devices of a group to the group's release, at most ``max_catch_up`` at a time."""

    def __init__(self, db: FleetDB, sender: LateSender, clock: Callable[[], float], *,
                 max_catch_up: int = 500, resend_s: float = 3.0,
                 artifacts: Callable[[str, str], list[str]] | None = None) -> None:
        self.db, self.sender, self.clock = db, sender, clock
        #: A release's artifacts by board (see :class:`edgesdk.ota_server.rollouts.engine.RolloutEngine`).
        self.artifacts = artifacts
        self.max_catch_up, self.resend_s = max_catch_up, resend_s
        #: Late targets sent by this reconciler so far, and devices it found already on their release.
        self.sent = 0
        #: Rollout -> when its late targets were last chased, and the fleet's failed late targets when its flag was.
        self._chased: dict[str, float] = {}
        self._failed_seen: dict[str, int] = {}
        #: Releases (completed rollouts) this reconciler leased at its last pass over them, and those whose archive
        #: it opened for late targets (let go once none is in flight).
        self.releases: set[str] = set()
        self.serving: set[str] = set()
        #: The last pass over the releases left devices queued (for want of room under the cap, or beyond what it
        #: read): they are a crowd already, so the next pass need not wait for more to gather.
        self.backlog = False
        #: Which leased release goes first in the next pass's share of the room (round robin).
        self._turn = -1

    def run_releases(self, now: float, room: int, work: FleetWork, holder: str, lease_s: float) -> None:
        """One pass over the groups with no rollout running: bring their devices to their release (each release
        leased by ``holder`` for ``lease_s``, like a rollout); let go of the archives of releases with nothing in
        flight."""
        if work.queued:
            self.db.drop_unreleased_from_queue()
        self.backlog = False
        leased = self.db.lease_releases(holder, now, lease_s)
        releases = {r.id for r in leased}
        # The room is shared between the groups: each in turn (the first one rotates pass by pass) may use an equal
        # share of what is left, and what a group leaves unused goes to the groups after it; what is still left then
        # goes round again to the groups that used their whole share. Spent in group order, a backlog in one group
        # starved the groups after it; shared in one round only, a group catching up alone got 1/k of the cap.
        self._turn = (self._turn + 1) % max(len(leased), 1)
        order = leased[self._turn:] + leased[:self._turn]
        sent_by: dict[str, int] = {}
        first = True  # every release is passed over once, with no room too (its chase, flag and queue)
        while order and (first or room > 0):
            hungry = []
            for i, r in enumerate(order):
                share = -(-max(room, 0) // (len(order) - i))  # ceil: the room is never left unused for rounding
                try:
                    sent = self.run(r, share, work)
                except EdgeSDKError as exc:  # e.g. the release's bundle left the repository: say so, go on
                    log.error("group %s: cannot bring devices to release %s %s (%s): %s", r.group, r.model,
                              r.version, r.id, exc)
                    continue
                room -= sent
                sent_by[r.id] = sent_by.get(r.id, 0) + sent
                if sent and sent >= share:
                    hungry.append(r)
            order, first = hungry, False
        for r in leased:
            if sent_by.get(r.id):
                self.serving.add(r.id)
            elif r.id in self.serving and not self.db.late_in_flight(r.id):
                self.serving.discard(r.id)
                self.sender.finish(r.id)  # its archive is reopened by the next late send or chunk request
        if work.late_superseded:
            self._close_superseded(now)
        for gone in self.serving - releases:  # superseded, or reconciled by another replica now
            self.serving.discard(gone)
            self.sender.finish(gone)
        self.releases = releases

    def _close_superseded(self, now: float) -> None:
        """Close the late targets a superseded release still has in flight: deferred once offline, timed out once
        silent past the deploy timeout while online. Nothing is sent to them again (their group's new release reaches
        their devices); left open, they held catch-up room for good and kept the engine from going idle."""
        for r in self.db.superseded_in_flight():
            last = r.stage_count - 1
            self.db.defer_offline(r.id, last)
            self.db.time_out_targets(r.id, last, now - r.policy.deploy_timeout_s,
                                     f"no report in {r.policy.deploy_timeout_s:g} s (late; the release was superseded)")

    def keep_only(self, rollouts: set[str]) -> None:
        """Forget what was kept for rollouts not in ``rollouts`` (those driven here and the releases leased here):
        superseded, finished or driven elsewhere, they would otherwise stay in memory for the server's life."""
        for kept in (self._chased, self._failed_seen):
            for gone in set(kept) - rollouts:
                del kept[gone]

    def room(self, in_flight: int) -> int:
        """How many more catch-ups may start now, with ``in_flight`` running across the fleet (the cap less those)."""
        return max(0, self.max_catch_up - in_flight)

    def run(self, r: RolloutRecord, room: int, work: FleetWork) -> int:
        """One pass over ``r``'s group (``r`` runs, or is the group's release); how many late targets it sent
        (at most ``room``). ``work`` says what there is to do fleet-wide: with no catch-up in flight there is nothing
        to chase, with nobody queued nobody to compare."""
        now = self.clock()
        last = r.stage_count - 1
        # A running rollout's engine step defers and chases its own targets. A release's are chased every resend_s
        # while catch-ups run (a silent one is sent again after resend_s to 2 resend_s), else now and then: a target
        # that timed out and answered after all is in flight again, and not late.
        since = now - self._chased.get(r.id, float("-inf"))
        if r.state != RolloutState.RUNNING and since >= self.resend_s and (
                work.late_in_flight or since >= _IDLE_CHASE * self.resend_s):
            self._chased[r.id] = now
            self.db.defer_offline(r.id, last)
            self._chase(r, last, now)
        limit = max(room, 0) + 200
        queued = self.db.to_reconcile(r.group, limit) if work.queued else []
        if len(queued) >= limit:  # more may wait beyond what one pass reads
            self.backlog = True
        if not queued:
            self._flag(r, work)
            return 0
        targets = self.db.targets_of(r.id, [d.id for d in queued])
        stored: list[list[str] | None] = []  # the release's artifacts, read once if needed

        def artifacts() -> list[str] | None:
            if not stored:
                stored.append(None if self.artifacts is None
                              else self.artifacts(r.model, r.version))
            return stored[0]

        plan = plan_pass(r, queued, targets, room, lambda: self._stage_room(r), artifacts)
        self.backlog = self.backlog or plan.backlog
        self._commit_from_states(r, queued, targets)
        sent = self._apply(r, plan, now)
        self.db.reconciled(plan.done)
        self._flag(r, work)
        return sent

    def _stage_room(self, r: RolloutRecord) -> int:
        """How many devices the current stage of running ``r`` lacks of its planned cumulative
        size (devices sent to in it and the stages before, whatever they answered)."""
        if r.stage < 0 or r.stage >= len(r.stage_sizes):
            return 0
        sent = sum(n for (stage, status), n in self.db.target_counts(r.id).items()
                   if stage <= r.stage and status not in NOT_SENT)
        return r.stage_sizes[r.stage] - sent

    def _apply(self, r: RolloutRecord, plan: PassPlan, now: float) -> int:
        """Write what the pass decided and send the late commands; how many were sent."""
        last = r.stage_count - 1
        if plan.new or plan.unserved:
            self.db.add_late_targets(r.id, last, plan.new, plan.unserved)
        if plan.new_now:
            self.db.add_late_targets(r.id, r.stage, plan.new_now)
        if plan.ahead:
            self.db.mark_ahead(r.id, last, plan.ahead)
            log.info("rollout %s: %d devices of group %s run a newer version than %s: not sent a "
                     "downgrade (ahead)", r.id, len(plan.ahead), r.group, r.version)
        if plan.resolve or plan.unresolved:
            self.db.resolve_targets(r.id, plan.resolve, plan.unresolved)
        if plan.pull:
            moved = self.db.pull_forward(r.id, r.stage, plan.pull)
            self.db.log("pulled_forward", {"stage": r.stage, "devices": moved}, rollout_id=r.id)
            log.info("rollout %s: %d devices back online join stage %d, short of its planned size",
                     r.id, len(moved), r.stage + 1)
        if plan.push_back:
            moved = self.db.push_back(r.id, r.stage, plan.push_back)
            self.db.log("pushed_back", {"stage": r.stage + 1, "devices": moved}, rollout_id=r.id)
        if not plan.send:
            return 0
        plan.done += plan.send
        marked = self.db.send_late(r.id, plan.send, now)
        if not marked:
            return 0
        self.sender.send_late(r, marked)
        self.sent += len(marked)
        log.info("rollout %s: sent to %d devices of group %s that came back or joined late", r.id,
                 len(marked), r.group)
        return len(marked)

    def resume(self, rollout_id: str) -> str:
        """Clear the flag of ``rollout_id`` (a running rollout, or its group's release) so its
        catch-up goes on: the group's online devices behind it are queued again, and from now on
        only the late installs that fail after this count towards a new flag. Logs a
        ``release_resumed`` event; the flag's reason it cleared."""
        r = self.db.rollout(rollout_id, targets=False)
        if r is None:
            raise NotFoundError(f"no rollout {rollout_id!r}; `edgesdk rollout status` lists them")
        if not r.flagged:
            raise ConflictError(f"rollout {rollout_id} is not flagged: its catch-up is not "
                                "stopped, nothing to resume")
        release = self.db.release(r.group)
        if r.state != RolloutState.RUNNING and (release is None or release.rollout_id != r.id):
            now = "none" if release is None else f"{release.model} {release.version}"
            raise ConflictError(f"rollout {rollout_id} is flagged but is no longer group "
                                f"{r.group!r}'s release ({now}): nothing catches up to it any "
                                "more, so there is nothing to resume")
        late = self.db.late_counts(r.id)
        failed = sum(n for status, n in late.items() if status.failed)
        answered = sum(n for status, n in late.items() if status.terminal)
        if not self.db.unflag_release(r.id, r.flagged, failed, answered):
            raise ConflictError(f"rollout {rollout_id}'s flag changed while resuming it; see "
                                f"`edgesdk rollout status {rollout_id}`")
        self.db.log("release_resumed", {"flag": r.flagged, "failed": failed, "answered": answered},
                    rollout_id=r.id)
        queued = self.db.requeue_behind(r.group, r.model, r.version)
        self._failed_seen.pop(r.id, None)
        log.warning("rollout %s resumed by the operator (it was flagged: %s); %d devices of group "
                    "%s queued for it", r.id, r.flagged, queued, r.group)
        return r.flagged

    def _commit_from_states(self, r: RolloutRecord, queued: list[DeviceRecord], targets: dict[str, TargetRecord]) -> None:
        """Mark committed the unfinished or timed-out targets that ``queued`` devices' states show they reached: of
        ``r`` (``targets``, theirs) for a device on its version, else of the group's newest completed rollout of the
        version the device runs. Its commit report died with a replica or came after its timeout, and for an earlier
        rollout its state after the commit was lost too, until after ``r`` was pushed."""
        found = {r.version: (r.id, targets)}
        others = {str(d.version) for d in queued if d.model == r.model and d.version and d.version != r.version}
        if others:
            earlier = self.db.newest_completed(r.group, r.model, sorted(others), r.id)
            found.update({version: (rollout_id, self.db.targets_of(rollout_id, [
                d.id for d in queued if d.model == r.model and d.version == version]))
                for version, rollout_id in earlier.items()})
        arrived = []
        for d in queued:
            if d.model != r.model or d.version not in found:
                continue
            rollout_id, theirs = found[d.version]
            target = theirs.get(d.id)
            if target is not None and target.status in TargetStatus.COMMITTED.follows:
                arrived.append(TargetUpdate(rollout_id, d.id, TargetStatus.COMMITTED, _LOST_COMMIT.format(d.version)))
        if arrived:
            self.db.set_targets(arrived)
            for rollout_id in sorted({u.rollout_id for u in arrived}):
                log.info("rollout %s: %d devices run its version and no commit report of theirs was recorded: "
                         "committed from their states", rollout_id, sum(u.rollout_id == rollout_id for u in arrived))

    def _chase(self, r: RolloutRecord, last: int, now: float) -> None:
        """For a completed release: time out late targets silent while online, send again those not answering."""
        policy = r.policy
        if self.sender.busy():  # silence says nothing while answers queue here, or the broker link is new
            return
        last_try = [t for t in self.db.overdue_untried(r.id, last, now - policy.deploy_timeout_s) if t.late]
        if last_try and not r.flagged:  # one more try before silence is a failure (as the engine)
            self.sender.send_late(r, last_try)
            self.db.mark_resent(r.id, [t.device_id for t in last_try], now)
        self.db.time_out_targets(r.id, last, now - policy.deploy_timeout_s - 2 * self.resend_s,
                                 f"no report in {policy.deploy_timeout_s:g} s (late)")
        silent = [] if r.flagged else self.db.due_for_resend(
            r.id, last, now - self.resend_s, now - 4 * self.resend_s, late=True)
        if silent:
            found = self.db.targets_of(r.id, silent)
            self.sender.send_late(r, [found[d] for d in silent if d in found])
            self.db.mark_resent(r.id, silent, now)

    def _flag(self, r: RolloutRecord, work: FleetWork) -> None:
        """Flag the release when too many of its late targets failed (once; never a revert). Looked at again only
        when the fleet's count of failed late targets moved."""
        if r.flagged or work.late_failed < MIN_LATE_FAILURES or self._failed_seen.get(r.id) == work.late_failed:
            return
        self._failed_seen[r.id] = work.late_failed
        if sum(self.db.late_counts(r.id, _FAILED).values()) < MIN_LATE_FAILURES:
            return  # the common case, from the index entries of the failed late targets alone
        late = self.db.late_counts(r.id)
        failed_before, answered_before = self.db.flag_baseline(r.id)  # when it was last resumed
        failed = sum(n for status, n in late.items() if status.failed) - failed_before
        answered = sum(n for status, n in late.items() if status.terminal) - answered_before
        if failed < MIN_LATE_FAILURES or failed <= r.policy.max_late_failure_rate * answered:
            return
        since = " since it was resumed" if answered_before else ""
        reason = (f"{failed} of {answered} late installs failed{since} "
                  f"(> {r.policy.max_late_failure_rate:.0%}); each device rolled back on its own; "
                  "catch-up stopped: look at the failures, then `edgesdk rollout resume "
                  f"{r.id}` or roll the group back")
        if self.db.flag_release(r.id, reason):
            self.db.log("release_flagged", {"reason": reason, "failed": failed, "answered": answered}, rollout_id=r.id)
            log.warning("rollout %s flagged: %s", r.id, reason)
