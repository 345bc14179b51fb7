"""The rollout engine's dispatcher: it signs each stage's command, publishes it, re-sends it while unacknowledged,
sends a failed device back with a signed rollback, and broadcasts a stage's archive once to the group.

A stage's manifest is signed once (re-signed after a take-over, and at half its validity) and bound to each device
it goes to (:class:`~edgesdk.fleet.command_scope.Binder`: a small per-device signature), so no device can be sent
another's command. The broadcast plan is the chunks some target cannot copy from the slots it reports; the rest
each device copies from its own store. Only a transfer's targets are answered when they ask for chunks
(:meth:`StageSender.is_target` tells the chunk service about targets it did not see sent, from the store).
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from edgesdk.errors import NotFoundError
from edgesdk.fleet.command_scope import Binder
from edgesdk.fleet.protocol import COMMAND_TTL_S, ArchiveInfo, Topics, sign_command
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetRecord, TargetStatus
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.runtime.boards import artifact_for

__all__ = ["StageSender", "stage_transfer", "STAGE_TRANSFER"]


#: A rollout stage's transfer id: ``<rollout id>-w<stage>``, then ``.<artifact>`` when the release has artifacts per
#: board (each board's devices fetch their own archive); a revert's is ``<rollout id>-rb[.<artifact>]``.
STAGE_TRANSFER = re.compile(r"^(?P<rollout>.+?)-(?:w(?P<stage>\d+)|(?P<revert>rb))(?:\.(?P<artifact>[A-Za-z0-9_.-]+))?$")


def judged_for(policy: RolloutPolicy) -> float | None:
    """How long after committing a device of a judged rollout reports its traffic at its fast cadence: until the
    latest its stage can be judged (its stage may settle up to the deploy timeout after it was sent, then waits the
    health window and the evidence grace). None when the policy judges nothing."""
    if not policy.judged:
        return None
    return policy.deploy_timeout_s + policy.health_window_s + policy.evidence_grace_s


def stage_transfer(rollout_id: str, stage: int | str, artifact: str | None) -> str:
    """The transfer id of ``rollout_id``'s stage (an int) or revert (``"rb"``) for the devices of ``artifact``."""
    kind = f"w{stage}" if isinstance(stage, int) else stage
    return f"{rollout_id}-{kind}" + (f".{artifact}" if artifact else "")

#: How long a stage's archive is broadcast again while devices keep accepting.
_MAX_BROADCAST_WAIT_S = 120.0
#: How often a stage's broadcast looks at its targets' counts: each look is a count over the rollout's targets
#: (6 ms at 10,000 devices on PostgreSQL; at 20 looks a second it was the database's largest cost).
_BROADCAST_POLL_S = 0.25
#: Device reports queued for writing above which re-sends wait (the reports may be the answers).
_RESEND_BACKLOG = 100
#: How long the chunks of late commands wait for their devices to accept (and subscribe to the group's chunk topic)
#: before they go anyway: half the agent's default ``broadcast_wait_s``, after which a device asks for them itself.
_LATE_CHUNKS_WAIT_S = 1.0
#: Messages not yet acknowledged by the broker above which re-sends wait: a few times paho's in-flight window of 64,
#: so chunk traffic in flight does not count, a queue of commands does.
_RESEND_OUTBOX = 256


class StageSender:
    """Implements :class:`edgesdk.ota_server.rollouts.engine.Dispatcher` over the chunk service and ``publish``."""

    def __init__(self, db: FleetDB, repository: ModelRepository, chunks: ChunkDistributor, signing_key: Any,
                 publish: Callable[[str, bytes], None], metrics: ServerMetrics, backlog: Callable[[], int],
                 outbox: Callable[[], int], stopped: threading.Event, offload_url: str | None = None,
                 broadcast_wait_s: float = 2.0, command_ttl_s: float = COMMAND_TTL_S,
                 clock: Callable[[], float] = time.time, link_settled: Callable[[], bool] = lambda: True) -> None:
        self.db, self.repo, self.chunks, self.key = db, repository, chunks, signing_key
        self._publish = publish
        self.metrics = metrics
        self._backlog = backlog  # device reports waiting to be written
        self._outbox = outbox  # messages published and not yet acknowledged by the broker
        self._link_settled = link_settled  # this server's broker connection has been up a while
        self._stopped = stopped
        self.offload_url = offload_url
        self.broadcast_wait_s = broadcast_wait_s
        self.command_ttl_s, self._clock = command_ttl_s, clock
        #: Signed commands of the stages this server sent: (rollout, stage, with archive, artifact[, "late"]) -> (the envelope's
        #: binder, when signed, what it was signed from). One older than half its validity is signed again before it
        #: is sent. Bound envelopes are not kept: binding is deterministic and cheap, and 10,000 copies are not.
        self._signed: dict[tuple[Any, ...], tuple[Binder, float, tuple[Any, ...]]] = {}
        if chunks is not None:
            chunks.authorize = self.is_target

    def _command(self, r: RolloutRecord, rollback: bool, deployment_id: str, version: str, transfer_id: str,
                 archive: ArchiveInfo | None, broadcast: list[int] | None = None, reverts: str | None = None,
                 device: str | None = None) -> bytes:
        kind = "deploy" if archive is not None else "rollback"
        return sign_command(self.key, type=kind, deployment_id=deployment_id, transfer_id=transfer_id, name=r.model,
                            version=version, group=r.group, rollback=rollback, archive=archive,
                            offload_url=self.offload_url, broadcast=broadcast if archive is not None else None,
                            ttl_s=self.command_ttl_s, reverts=reverts, device=device,
                            judge_s=judged_for(r.policy) if reverts is None else None)

    def _stage_binder(self, r: RolloutRecord, stage: int, with_archive: bool, device_ids: list[str],
                      artifact: str | None) -> Binder:
        """The signed command of a stage for the devices of one artifact (board), to bind to each device: one
        manifest for all (re-signed after a take-over, and when half its validity has passed, so a re-send never
        carries an expired command).

        Its broadcast plan is the chunks some of ``device_ids`` lacks, judged by the versions they hold.
        """
        def first_signing() -> tuple[Any, ...]:
            transfer_id, info, plan = stage_transfer(r.id, stage, artifact), None, None
            if with_archive:
                info = self.chunks.open(transfer_id, r.model, r.version, artifact)
                plan = self._lacking(info, device_ids, artifact)
                self.chunks.plan(transfer_id, plan, r.group)
            return (r, r.rollback, r.id, r.version, transfer_id, info, plan)

        return self._binder((r.id, stage, with_archive, artifact), first_signing)

    def _binder(self, key: tuple[Any, ...], first_signing: Callable[[], tuple[Any, ...]]) -> Binder:
        """The binder kept under ``key``; signed from ``first_signing()``'s command arguments the first time, and
        again from the same arguments once half its validity has passed."""
        now, held = self._clock(), self._signed.get(key)
        if held is not None and now - held[1] <= self.command_ttl_s / 2:
            return held[0]
        args = held[2] if held is not None else first_signing()
        binder = Binder(self.key, self._command(*args))
        self._signed[key] = (binder, now, args)
        return binder

    def _lacking(self, info: ArchiveInfo, device_ids: list[str], artifact: str | None) -> list[int]:
        """Indexes of the chunks of ``info`` that some of ``device_ids`` cannot copy from its own slots (as it reports;
        a slot is taken to hold the same board's artifact of its version)."""
        held: set[str] | None = None
        sources = self.db.slots(device_ids, column="chunk_slots")
        for slots in set(sources.get(d, ()) for d in device_ids):  # few distinct slot sets
            have: set[str] = set()
            for slot in slots:
                name, _, version = slot.rpartition("-")
                table = self.repo.chunk_table(name, version, artifact) if name else None
                have.update(table.chunks if table else ())
            held = have if held is None else held & have
            if not held:
                break
        return [i for i, digest in enumerate(info.chunks) if digest not in (held or ())]

    def _needs_archive(self, r: RolloutRecord, device_ids: list[str]) -> dict[str, bool]:
        """Which devices get the archive: all but those a rollback sends back to a slot they hold."""
        if not r.rollback:
            return dict.fromkeys(device_ids, True)
        slot, slots = f"{r.model}-{r.version}", self.db.slots(device_ids)
        return {d: slot not in slots.get(d, ()) for d in device_ids}

    def _publish_stage(self, r: RolloutRecord, stage: int, targets: list[TargetRecord]) -> dict[str | None, list[str]]:
        """Publish the stage's command to each target, bound to it: each board's devices get their artifact's. By
        artifact, the devices that fetch its archive (they are the transfer's targets from now on: only they are
        answered when they ask for chunks)."""
        boards: dict[str | None, list[str]] = defaultdict(list)
        for t in targets:
            boards[t.artifact].append(t.device_id)
        fetching: dict[str | None, list[str]] = {}
        for artifact, device_ids in boards.items():
            needs = self._needs_archive(r, device_ids)
            fetching[artifact] = [device for device, with_archive in needs.items() if with_archive]
            binders = {with_archive: self._stage_binder(r, stage, with_archive, fetching[artifact], artifact)
                       for with_archive in set(needs.values())}
            if fetching[artifact]:
                self.chunks.allow(stage_transfer(r.id, stage, artifact), fetching[artifact])
            for device, with_archive in needs.items():
                self._publish(Topics.cmd(device), binders[with_archive].bind(device))
        return fetching

    def send_stage(self, rollout: RolloutRecord, stage: int, targets: list[TargetRecord]) -> None:
        """Sign and publish the stage's commands; broadcast each artifact's archive once the targets accepted (or
        soon)."""
        r = rollout
        fetching = self._publish_stage(r, stage, targets)
        self.metrics.command_sent(len({t.device_id for t in targets}))
        for artifact, devices in fetching.items():
            transfer_id = stage_transfer(r.id, stage, artifact)
            if devices and self.chunks.planned(transfer_id):
                threading.Thread(target=self._broadcast, args=(r.id, r.group, stage, transfer_id), daemon=True).start()

    def resend(self, rollout: RolloutRecord, stage: int, device_ids: list[str]) -> list[str]:
        """Publish the stage's command again to devices that have not acknowledged it (or whose report was lost);
        the devices sent to."""
        found = self.db.targets_of(rollout.id, device_ids)
        self._publish_stage(rollout, stage, [found[d] for d in device_ids if d in found])
        self.metrics.command_resent(len(device_ids))
        return device_ids

    def send_late(self, rollout: RolloutRecord, targets: list[TargetRecord]) -> None:
        """Send late targets their stage's command, with no broadcast of their own.

        For a completed release whose transfer's requests are gathered (a small archive), the command's plan names
        the chunks these devices lack, and the chunk service sends them once, on the group's topic, when all of them
        accepted (:meth:`ChunkDistributor.expect`): the devices need not ask. Otherwise the plan is empty and each
        device asks at once for the chunks it cannot copy from its slots; a transfer it had begun before going
        offline resumes under the same id, so the chunks it holds are kept.
        """
        r = rollout
        needs = self._needs_archive(r, [t.device_id for t in targets])
        sets: dict[tuple[int, bool, str | None], list[str]] = defaultdict(list)
        for t in targets:
            sets[t.stage, needs[t.device_id], t.artifact].append(t.device_id)
        for (stage, with_archive, artifact), device_ids in sets.items():
            transfer_id = stage_transfer(r.id, stage, artifact)
            info, plan = None, []
            if with_archive:
                info = self.chunks.open(transfer_id, r.model, r.version, artifact)  # a no-op when it is open
                self.chunks.allow(transfer_id, device_ids)
                if r.state == RolloutState.COMPLETED:  # a running stage's transfer may have thousands downloading
                    self.chunks.share(transfer_id, r.group)
                    if self.chunks.gathers(transfer_id):
                        plan = self._lacking(info, device_ids, artifact)
                        if plan:
                            self.chunks.expect(transfer_id, device_ids, plan, _LATE_CHUNKS_WAIT_S)
            args: tuple[Any, ...] = (r, r.rollback, r.id, r.version, transfer_id, info, plan)
            binder = self._binder((r.id, stage, with_archive, artifact, "late", tuple(plan)),
                                  lambda: args)  # noqa: B023 (called before the loop moves on)
            for device in device_ids:
                self._publish(Topics.cmd(device), binder.bind(device))
        self.metrics.command_sent(len(targets))

    def busy(self) -> bool:
        """Device reports wait to be written (the answers may be among them), commands wait to leave, or this
        server's broker connection is down or just back (the devices are reconnecting too)."""
        return (self._backlog() > _RESEND_BACKLOG or self._outbox() > _RESEND_OUTBOX
                or not self._link_settled())

    def send_revert(self, rollout: RolloutRecord, target: TargetRecord) -> None:
        """Send a signed rollback to the target's previous version (with its board's artifact of it when the device
        lacks it; an EdgeSDKError when that version has no artifact for its board)."""
        r, previous = rollout, target.previous_version
        assert previous is not None
        info, transfer_id = None, stage_transfer(r.id, "rb", None)
        if f"{r.model}-{previous}" not in self.db.slots([target.device_id]).get(target.device_id, ()):
            profile, arch = self.db.boards([target.device_id]).get(target.device_id, (None, None))
            stored = self.repo.artifacts(r.model, previous)
            artifact = artifact_for(stored, profile, arch)
            if artifact is None:
                raise NotFoundError(f"{r.model} {previous} has no artifact for {target.device_id}'s board "
                                    f"({profile or 'unknown'}); it has {', '.join(stored) or 'none'}")
            transfer_id = stage_transfer(r.id, "rb", artifact)
            info = self.chunks.open(transfer_id, r.model, previous, artifact)  # the device pulls the old chunks
            self.chunks.allow(transfer_id, [target.device_id])
        # Nothing is broadcast for a revert: the device asks at once for what it does not hold.
        envelope = self._command(r, True, f"{r.id}-rollback", previous, transfer_id, info, broadcast=[],
                                 reverts=r.version, device=target.device_id)
        self._publish(Topics.cmd(target.device_id), envelope)
        self.metrics.command_sent(1)

    def is_target(self, device: str, transfer_id: str) -> bool:
        """Whether the store lists ``device`` as a target of the stage (``R-wN[.artifact]``) or revert
        (``R-rb[.artifact]``) that ``transfer_id`` carries: how the chunk service learns the targets of a transfer
        this server did not send (it took the rollout over, or restarted), and of late devices another replica
        sent."""
        match = STAGE_TRANSFER.match(transfer_id)
        if match is None:
            return False
        target = self.db.targets_of(match["rollout"], [device]).get(device)
        if target is None or match["revert"]:
            return target is not None
        return target.stage == int(match["stage"]) and target.artifact == match["artifact"]

    def finish(self, rollout_id: str) -> None:
        """Release the rollout's archives and signed commands."""
        self.chunks.close_all(f"{rollout_id}-")
        for key in [k for k in self._signed if k[0] == rollout_id]:
            del self._signed[key]

    def _broadcast(self, rollout_id: str, group: str, stage: int, transfer_id: str) -> None:
        """Publish the stage's archive to the group once every target accepted, or after ``broadcast_wait_s``, and
        again every ``broadcast_wait_s`` while devices go on accepting (a big stage's devices accept over many
        seconds: each broadcast reaches the ones subscribed by then, the later ones wait for the next rather than
        ask one by one)."""
        started = time.monotonic()
        accepted_before, last = -1, started
        while not self._stopped.wait(_BROADCAST_POLL_S) and self.chunks.is_open(transfer_id):
            counts = self.db.target_counts(rollout_id)
            waiting = counts.get((stage, TargetStatus.SENT), 0) + counts.get((stage, TargetStatus.PENDING), 0)
            accepted = sum(n for (s, status), n in counts.items() if s == stage and status not in
                           (TargetStatus.SENT, TargetStatus.PENDING))
            now = time.monotonic()
            if accepted != accepted_before and (not waiting or now - last >= self.broadcast_wait_s):
                self.chunks.broadcast(group, transfer_id)
                accepted_before, last = accepted, now
            if (not waiting and accepted == accepted_before) or now - started >= _MAX_BROADCAST_WAIT_S:
                return
