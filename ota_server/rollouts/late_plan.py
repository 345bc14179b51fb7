"""What one reconciliation pass does with each queued device of a group: the decisions, apart
from the store.

For a rollout ``r`` (running, or the group's release) and the devices that reported since the
last pass, with their targets in ``r``, :func:`plan_pass` says which to send now, which to add as
late targets, which to move into the current stage or out of it, which to record as ``ahead``
and which need nothing (:mod:`.reconciler` states the rules).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from edgesdk.errors import BundleError
from edgesdk.fleet.records import DeviceRecord, RolloutRecord, RolloutState, TargetRecord, TargetStatus
from edgesdk.runtime.boards import artifact_for
from edgesdk.runtime.bundle import parse_version

__all__ = ["PassPlan", "plan_pass", "ahead_reason", "NOT_SENT"]

#: Targets whose command is not out: not counted as sent when a stage is compared with its plan.
NOT_SENT = frozenset({TargetStatus.DEFERRED, TargetStatus.PENDING, TargetStatus.NO_ARTIFACT,
                      TargetStatus.SKIPPED, TargetStatus.AHEAD})

#: Targets sent to once their stage is out: deferred ones, late ones added while the cap was full,
#: and ``ahead`` ones whose device went back to an older version.
_SENDABLE = (TargetStatus.DEFERRED, TargetStatus.PENDING, TargetStatus.AHEAD)

#: A new late target: (device id, the version it runs, the artifact it gets).
Row = tuple[str, str | None, str | None]


@dataclass
class PassPlan:
    """What a pass does (device ids, or rows as the store's methods take them)."""

    #: New late targets: of the last stage (sent now if it is out), and of the current stage.
    new: list[Row] = field(default_factory=list)
    new_now: list[Row] = field(default_factory=list)
    #: New devices whose board the release has no artifact for: (device id, its version).
    unserved: list[tuple[str, str | None]] = field(default_factory=list)
    #: Devices running a newer version than ``r`` sends: (device id, its version, why).
    ahead: list[tuple[str, str, str]] = field(default_factory=list)
    #: Targets planned before their device reported, completed from its report: served (id,
    #: version, artifact) and unserved (id, version).
    resolve: list[Row] = field(default_factory=list)
    unresolved: list[tuple[str, str | None]] = field(default_factory=list)
    #: Targets of later stages moved into the current one; never-sent targets of the current one
    #: moved to the next (it has the devices it planned, from those back first).
    pull: list[str] = field(default_factory=list)
    push_back: list[str] = field(default_factory=list)
    #: Every target sent now, and the devices the pass is done with (out of the queue).
    send: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    #: Devices left queued for want of room under the catch-up cap.
    backlog: bool = False


def ahead_reason(r: RolloutRecord, device: DeviceRecord) -> str | None:
    """Why ``device`` is not sent ``r``'s version: it runs a newer version of the model (and ``r``
    is no rollback, which sends a group back on purpose); None when it is not ahead."""
    if r.rollback or device.model != r.model or not device.version:
        return None
    try:
        newer = parse_version(device.version) > parse_version(r.version)
    except BundleError:
        return None
    if not newer:
        return None
    what = "the group's release" if r.state == RolloutState.COMPLETED else f"rollout {r.id}'s"
    return (f"runs {r.model} {device.version}, newer than {r.version} ({what}): not sent a "
            "downgrade (`edgesdk rollout rollback` sends a group back)")


class _Room:
    """How many more devices the pass may send (the catch-up cap) and pull into the current stage
    (its plan)."""

    def __init__(self, cap: int, stage_room: Callable[[], int]) -> None:
        self.cap, self._stage_room = cap, stage_room
        self._short: int | None = None
        self.sent_in_stage = 0  # targets of stages up to the current one sent by this pass

    def stage(self) -> int:
        """How many more devices the current stage may take (read from the store once, when
        first asked)."""
        if self._short is None:
            self._short = self._stage_room()
        return self._short - self.sent_in_stage


def plan_pass(r: RolloutRecord, queued: Sequence[DeviceRecord], targets: Mapping[str, TargetRecord],
              cap: int, stage_room: Callable[[], int],
              stored: Callable[[], Sequence[str] | None]) -> PassPlan:
    """The pass over ``queued`` for ``r`` (see the module doc). ``cap``: how many may be sent now;
    ``stage_room()``: how many devices the current stage of a running ``r`` lacks of its planned
    size (asked only when it matters); ``stored()``: the release's artifacts (None: one bundle for
    every device)."""
    p, room = PassPlan(), _Room(cap, stage_room)
    running = r.state == RolloutState.RUNNING
    for device in queued:
        target = targets.get(device.id)
        on_release = device.model == r.model and device.version == r.version
        if device.status != "online" or on_release:
            p.done.append(device.id)
        elif (why := ahead_reason(r, device)) is not None:
            if target is None or target.status in (TargetStatus.PENDING, TargetStatus.DEFERRED):
                p.ahead.append((device.id, str(device.version), why))
            p.done.append(device.id)
        elif target is None:
            _new(p, r, device, room, stored, running and r.stage < r.stage_count - 1)
        elif target.status in _SENDABLE and not r.flagged:
            _existing(p, r, device, target, room, stored)
        else:  # done with it, or the release is flagged: nothing is sent until it is resumed
            p.done.append(device.id)
    return p


def _new(p: PassPlan, r: RolloutRecord, device: DeviceRecord, room: _Room,
         stored: Callable[[], Sequence[str] | None], before_last: bool) -> None:
    """A device with no target in ``r``: it joined the group after ``r`` started."""
    previous = device.version if device.model == r.model else None
    artifacts = stored()
    artifact = None if artifacts is None else artifact_for(artifacts, device.profile, device.arch)
    if artifacts is not None and artifact is None:  # never sent another board's bundle
        p.unserved.append((device.id, previous))
        p.done.append(device.id)
    elif r.flagged:  # recorded; sent once the operator resumes the release
        p.new.append((device.id, previous, artifact))
        p.done.append(device.id)
    elif before_last and (len(p.send) >= room.cap or room.stage() <= 0):
        p.new.append((device.id, previous, artifact))  # it goes with the last stage
        p.done.append(device.id)
    elif len(p.send) >= room.cap:
        p.new.append((device.id, previous, artifact))
        p.backlog = True
    else:
        (p.new_now if before_last else p.new).append((device.id, previous, artifact))
        p.send.append(device.id)
        room.sent_in_stage += int(before_last)


def _existing(p: PassPlan, r: RolloutRecord, device: DeviceRecord, target: TargetRecord,
              room: _Room, stored: Callable[[], Sequence[str] | None]) -> None:
    """A device whose target in ``r`` waits for it (deferred, pending, or ahead and now behind)."""
    running = r.state == RolloutState.RUNNING
    later = running and target.stage > r.stage  # its stage is not out yet
    if later and room.stage() <= 0:
        p.done.append(device.id)  # the current stage has all it planned: it waits for its own
        return
    if (running and target.stage == r.stage < r.stage_count - 1 and target.sent is None
            and room.stage() <= 0):  # devices back before it took its place: it goes with the next
        p.push_back.append(device.id)
        p.done.append(device.id)
        return
    if len(p.send) >= room.cap:  # it stays queued for the next pass
        p.backlog = True
        return
    previous = device.version if device.model == r.model else None
    artifacts = stored() if target.artifact is None else None
    if artifacts is not None:  # planned before its device reported: its board's artifact now
        artifact = artifact_for(artifacts, device.profile, device.arch)
        if artifact is None:
            p.unresolved.append((device.id, previous))
            p.done.append(device.id)
            return
        p.resolve.append((device.id, previous, artifact))
    elif target.previous_version is None and previous is not None:
        p.resolve.append((device.id, previous, None))
    if later:
        p.pull.append(device.id)
    p.send.append(device.id)
    room.sent_in_stage += int(running)
