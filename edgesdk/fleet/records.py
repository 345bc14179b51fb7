"""The fleet vocabulary shared by the OTA server, its admin API, the admin client and the CLI.

A rollout spreads one model version over a device group in **stages**: the canary first,
then the later stages (``--canary 10% --waves 50,100`` gives three stages: 10%, 50%,
100% of the group). Each device of a rollout is a *target* that belongs to one stage and
moves through :class:`TargetStatus`; the rollout itself is in one :class:`RolloutState`.
Devices report :class:`AgentEvent` names on their event topic.

The enums are ``str`` enums: their values are what the database, the MQTT messages and
the JSON API carry, unchanged. The records are frozen dataclasses; ``to_json`` gives the
admin API's JSON (times as ISO 8601 UTC strings, a stage numbered from 1, the canary, as
the CLI and the console number it: ``0`` before the first stage is sent) and ``from_json``
reads it back (the records themselves hold 0-based stage indexes)::

    >>> RolloutPolicy(canary=parse_percent("10%"), waves=(0.5, 1.0)).stages
    (0.1, 0.5, 1.0)

This module is device-side (stdlib only): the operator CLI and the admin client depend on
it, not on :mod:`edgesdk.ota_server`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.policy import RolloutPolicy

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    class StrEnum(str, Enum):
        """``str`` enum whose ``str()`` and format are the value (as :class:`enum.StrEnum` on 3.11+)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

__all__ = [
    "TargetStatus",
    "RolloutState",
    "AgentEvent",
    "RolloutPolicy",
    "DeviceRecord",
    "TargetRecord",
    "RolloutSummary",
    "RolloutRecord",
    "GroupRelease",
    "parse_percent",
    "parse_duration",
    "iso_time",
    "parse_time",
]


class TargetStatus(StrEnum):
    """Where one device of a rollout is; members are in the order a device passes through them."""

    PENDING = "pending"
    SENT = "sent"
    DOWNLOADING = "downloading"
    INSTALLING = "installing"
    COMMITTED = "committed"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    #: The device was offline when its stage was sent (or went offline before it answered): not a failure, and it
    #: holds no stage back; it gets the release when it reports again (a *late* target then).
    DEFERRED = "deferred"
    #: After an abort: the device was told to go back to its previous version ...
    REVERTING = "reverting"
    #: ... and did, or could not.
    REVERTED = "reverted"
    REVERT_FAILED = "revert_failed"
    #: The release has no artifact for the device's board (nor a ``generic-<arch>`` one): it is never sent another
    #: board's bundle and stays on its version. Not a failure; it holds no stage back.
    NO_ARTIFACT = "no_artifact"
    #: The rollout ended (aborted) before the target's stage was sent: the device was never sent the update.
    SKIPPED = "skipped"
    #: The device joined or came back running a newer version of the model than the release (not
    #: a rollback): it is not sent a downgrade (the reason names both versions). Not a failure,
    #: not in flight; it holds no stage back.
    AHEAD = "ahead"

    @property
    def terminal(self) -> bool:
        """True once the device is done with the deployment (updated, failed, refused or silent too long)."""
        return self in _TERMINAL

    @property
    def settled(self) -> bool:
        """True when the target no longer holds its stage back: done with the deployment, or deferred (offline)."""
        return self in _TERMINAL or self in (TargetStatus.DEFERRED, TargetStatus.NO_ARTIFACT,
                                             TargetStatus.SKIPPED, TargetStatus.AHEAD)

    @property
    def in_flight(self) -> bool:
        """True while a command is out and the device has not finished with it (sent, downloading, installing)."""
        return self in (TargetStatus.SENT, TargetStatus.DOWNLOADING, TargetStatus.INSTALLING)

    @property
    def failed(self) -> bool:
        """True for the terminal statuses that count against the rollout's failure rate."""
        return self in _FAILED

    @property
    def follows(self) -> frozenset[TargetStatus]:
        """The statuses a target may move from into this one. Statuses only move forward, so a report that
        arrives late (written by another server replica, or re-sent) cannot undo a later one; a device that
        answers after its timeout still counts."""
        return _FOLLOWS.get(self, frozenset(TargetStatus))


_FAILED = frozenset({TargetStatus.FAILED, TargetStatus.ROLLED_BACK, TargetStatus.REJECTED, TargetStatus.TIMEOUT})
_TERMINAL = _FAILED | {TargetStatus.COMMITTED}
_WAITING = frozenset({TargetStatus.PENDING, TargetStatus.SENT, TargetStatus.TIMEOUT, TargetStatus.DEFERRED})
_IN_FLIGHT = _WAITING | {TargetStatus.DOWNLOADING, TargetStatus.INSTALLING}
_FOLLOWS: dict[TargetStatus, frozenset[TargetStatus]] = {
    # Sent again to a device that returned; deferred when it went offline before answering.
    # ... and sent to a device that was ahead of the release and went back to an older version.
    TargetStatus.SENT: frozenset({TargetStatus.PENDING, TargetStatus.DEFERRED, TargetStatus.AHEAD}),
    TargetStatus.DEFERRED: frozenset({TargetStatus.PENDING, TargetStatus.SENT, TargetStatus.DOWNLOADING,
                                      TargetStatus.INSTALLING}),
    TargetStatus.DOWNLOADING: _WAITING,
    TargetStatus.INSTALLING: _WAITING | {TargetStatus.DOWNLOADING},
    **dict.fromkeys((TargetStatus.COMMITTED, TargetStatus.FAILED, TargetStatus.ROLLED_BACK, TargetStatus.REJECTED),
                    _IN_FLIGHT),
    TargetStatus.REVERTING: frozenset({TargetStatus.COMMITTED}),
    TargetStatus.REVERTED: frozenset({TargetStatus.REVERTING}),
    TargetStatus.REVERT_FAILED: frozenset({TargetStatus.REVERTING, TargetStatus.COMMITTED}),
    TargetStatus.NO_ARTIFACT: frozenset({TargetStatus.PENDING, TargetStatus.DEFERRED}),
    TargetStatus.SKIPPED: frozenset({TargetStatus.PENDING, TargetStatus.DEFERRED}),
    TargetStatus.AHEAD: frozenset({TargetStatus.PENDING, TargetStatus.DEFERRED}),
}


class RolloutState(StrEnum):
    """A rollout is ``running`` until it ``completed`` its last stage or was ``aborted``."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"


class AgentEvent(StrEnum):
    """The ``event`` field of a device's event messages (the agent sends these values)."""

    ACCEPTED = "accepted"
    PROGRESS = "progress"
    DOWNLOADED = "downloaded"
    COMMITTED = "committed"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    REJECTED = "rejected"


def iso_time(seconds: float) -> str:
    """Epoch seconds as the API shows them: ISO 8601 UTC to the second, e.g. ``2024-05-01T12:00:00Z``."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_time(text: str) -> float:
    """An API time (:func:`iso_time`) back to epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _iso_or_none(seconds: float | None) -> str | None:
    return None if seconds is None else iso_time(seconds)


def _time_or_none(text: str | None) -> float | None:
    return None if text is None else parse_time(text)


def parse_percent(text: str | float) -> float:
    """``"10%"``, ``"10"`` or ``0.1`` -> 0.1 (a number above 1 is read as percent)."""
    if isinstance(text, (int, float)):
        value = float(text)
        return value if value <= 1 else value / 100
    raw = text.strip().rstrip("%")
    try:
        value = float(raw)
    except ValueError:
        raise EdgeSDKError(f"{text!r} is not a percentage; write e.g. 10%") from None
    return value / 100


def parse_duration(text: str | float) -> float:
    """``"60s"``, ``"2m"``, ``"250ms"``, ``"1h"``, ``"365d"`` or ``"1.5"`` -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    raw = text.strip().lower()
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    for suffix in ("ms", "s", "m", "h", "d"):
        if raw.endswith(suffix):
            raw, factor = raw[: -len(suffix)], scale[suffix]
            break
    else:
        factor = 1.0
    try:
        return float(raw) * factor
    except ValueError:
        raise EdgeSDKError(f"{text!r} is not a duration; write e.g. 60s, 2m or 365d") from None


@dataclass(frozen=True)
class DeviceRecord:
    """A device as it last reported its state (retained on its state topic)."""

    id: str
    group: str
    #: ``online`` or ``offline`` (the agent's last will), as the device reported it.
    status: str
    model: str | None
    version: str | None
    #: Installed ``model-version`` slots on the device (kept from its last ``online`` report).
    slots: tuple[str, ...]
    last_seen: float
    #: The device profile its agent runs as (``--profile``, else detected, e.g. ``raspberry-pi-5``) and its CPU
    #: architecture; None from an agent too old to say. A release sends each device its board's artifact.
    profile: str | None = None
    arch: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The API's JSON for a device."""
        return {"id": self.id, "group": self.group, "status": self.status, "model": self.model,
                "version": self.version, "slots": list(self.slots), "last_seen": iso_time(self.last_seen),
                "profile": self.profile, "arch": self.arch}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceRecord:
        """A device from :meth:`to_json`'s JSON."""
        return cls(str(data["id"]), str(data["group"]), str(data["status"]), data.get("model"), data.get("version"),
                   tuple(data.get("slots", ())), parse_time(data["last_seen"]), data.get("profile"), data.get("arch"))


@dataclass(frozen=True)
class TargetRecord:
    """One device of a rollout: its stage, where it is, and the version it had before."""

    rollout_id: str
    device_id: str
    #: 0-based index of the stage that sends to this device (0 is the canary).
    stage: int
    status: TargetStatus
    reason: str | None
    previous_version: str | None
    #: When the command was sent, ``None`` before.
    sent: float | None
    updated: float
    #: Sent after its stage: the device was offline then (deferred), or joined the group later.
    late: bool = False
    #: The release artifact (its target profile) this device gets; None when the release has none for its board.
    artifact: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The API's JSON for a target (inside a rollout's ``targets``)."""
        return {"rollout_id": self.rollout_id, "device_id": self.device_id, "stage": self.stage + 1,
                "status": self.status.value, "reason": self.reason, "previous_version": self.previous_version,
                "sent": _iso_or_none(self.sent), "updated": iso_time(self.updated), "late": self.late,
                "artifact": self.artifact}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetRecord:
        """A target from :meth:`to_json`'s JSON."""
        return cls(str(data["rollout_id"]), str(data["device_id"]), int(data["stage"]) - 1, TargetStatus(data["status"]),
                   data.get("reason"), data.get("previous_version"), _time_or_none(data.get("sent")),
                   parse_time(data["updated"]), bool(data.get("late", False)), data.get("artifact"))


@dataclass(frozen=True)
class RolloutSummary:
    """A rollout as the list of rollouts shows it (no policy, no targets)."""

    id: str
    model: str
    version: str
    group: str
    state: RolloutState
    #: 0-based index of the stage sent last; -1 before the first.
    stage: int
    reason: str | None
    created: float
    #: True for a rollout that sends a signed rollback (see :attr:`RolloutRecord.rollback`).
    rollback: bool = False

    def to_json(self) -> dict[str, Any]:
        """The API's JSON for one entry of ``GET /api/rollouts``."""
        return {"id": self.id, "model": self.model, "version": self.version, "group": self.group,
                "state": self.state.value, "stage": self.stage + 1, "reason": self.reason,
                "created": iso_time(self.created), "rollback": self.rollback}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutSummary:
        """A summary from :meth:`to_json`'s JSON."""
        return cls(str(data["id"]), str(data["model"]), str(data["version"]), str(data["group"]),
                   RolloutState(data["state"]), int(data["stage"]) - 1, data.get("reason"), parse_time(data["created"]),
                   bool(data.get("rollback", False)))


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout with its policy, how many targets are in each status, and its targets (all, or one page)."""

    id: str
    model: str
    version: str
    group: str
    policy: RolloutPolicy
    state: RolloutState
    #: 0-based index of the stage sent last; -1 before the first.
    stage: int
    #: When the current stage was sent, and when all its devices had reported (its health window starts).
    stage_started: float | None
    stage_settled: float | None
    reason: str | None
    created: float
    updated: float
    #: True for a rollout that sends a signed rollback (``rollout rollback``), which devices accept as a downgrade.
    rollback: bool
    #: The targets asked for: all of them, one page (``targets_total`` tells how many there are), or none.
    targets: tuple[TargetRecord, ...] = field(default=())
    #: Cumulative device counts per stage (the canary first); empty for a record built from targets alone.
    stage_sizes: tuple[int, ...] = ()
    #: How many targets are in each status, over every stage (computed from ``targets`` when not given).
    counts: dict[TargetStatus, int] = field(default_factory=dict)
    #: How many targets the rollout has, whether or not ``targets`` holds them all.
    targets_total: int | None = None
    #: The server (replica) that drives the rollout now, or drove it last; None before the first.
    driver: str | None = None
    #: How many late targets (see :attr:`TargetRecord.late`) are in each status.
    late_counts: dict[TargetStatus, int] = field(default_factory=dict)
    #: Why the release is flagged (too many late targets failed), or None.
    flagged: str | None = None
    #: The canary analysis of the last stage judged (:mod:`edgesdk.ota_server.rollouts.analysis`): ``stage``
    #: (1-based), ``outcome`` (passed, failed, inconclusive, or waiting for evidence), ``passed``, ``reason`` with the
    #: devices and figures, ``canary`` and ``baseline`` summaries, ``boards``, ``devices``, ``checks``, ``limits``.
    verdict: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.counts and self.targets:
            counts: dict[TargetStatus, int] = {}
            for t in self.targets:
                counts[t.status] = counts.get(t.status, 0) + 1
            object.__setattr__(self, "counts", counts)
        if self.targets_total is None:
            object.__setattr__(self, "targets_total", sum(self.counts.values()))

    @property
    def stage_count(self) -> int:
        """How many stages the rollout has (at least 1)."""
        if self.stage_sizes:
            return len(self.stage_sizes)
        return max((t.stage for t in self.targets), default=0) + 1

    def count(self, *statuses: TargetStatus) -> int:
        """How many targets are in any of ``statuses``."""
        return sum(self.counts.get(s, 0) for s in statuses)

    @property
    def deferred(self) -> int:
        """Targets waiting for their device to come back online."""
        return self.counts.get(TargetStatus.DEFERRED, 0)

    @property
    def reachable_done(self) -> bool:
        """True once every target is settled (done, or deferred while its device is offline)."""
        return all(status.settled for status, n in self.counts.items() if n)

    @property
    def phase(self) -> str:
        """What the rollout is doing: ``completed`` or ``aborted`` once over; while running ``starting`` (no stage
        sent), ``deploying`` (a stage's devices are installing), ``health_window`` (they all reported; the window and
        the canary verdict are pending), ``waiting_for_evidence`` (the window passed, and too few devices have
        reported enough figures yet, or the canary's devices are offline) or ``waiting_for_promote`` (a manual
        rollout whose stage passed, or a stage whose verdict was inconclusive: the verdict's ``reason`` says why)."""
        if self.state != RolloutState.RUNNING:
            return self.state.value
        if self.stage < 0:
            return "starting"
        current = self.verdict if self.verdict and self.verdict.get("stage") == self.stage + 1 else None
        if current is not None and current.get("outcome") == "inconclusive":
            return "waiting_for_promote"
        if current is not None and current.get("outcome") == "waiting":
            return "waiting_for_evidence"
        if self.verdict and self.verdict.get("stage") == self.stage + 1 and self.verdict.get("passed"):
            # An automatic rollout is between its verdict and its next stage's send (two writes): not waiting.
            manual = not self.policy.auto_promote and self.stage + 1 < self.stage_count
            return "waiting_for_promote" if manual else "health_window"
        return "deploying" if self.stage_settled is None else "health_window"

    def in_stage(self, stage: int) -> list[TargetRecord]:
        """The targets (of those held in ``targets``) that stage ``stage`` (0-based) sends to."""
        return [t for t in self.targets if t.stage == stage]

    def to_json(self) -> dict[str, Any]:
        """The API's JSON for a rollout, with the targets it holds."""
        return {"id": self.id, "model": self.model, "version": self.version, "group": self.group,
                "policy": self.policy.to_dict(), "state": self.state.value, "stage": self.stage + 1,
                "stage_started": _iso_or_none(self.stage_started), "stage_settled": _iso_or_none(self.stage_settled),
                "reason": self.reason, "created": iso_time(self.created), "updated": iso_time(self.updated),
                "rollback": self.rollback, "stages": list(self.stage_sizes),
                "counts": {status.value: n for status, n in self.counts.items()},
                "targets_total": self.targets_total, "driver": self.driver, "deferred": self.deferred,
                "late": {status.value: n for status, n in self.late_counts.items()}, "flagged": self.flagged,
                "phase": self.phase, "verdict": self.verdict, "targets": [t.to_json() for t in self.targets]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutRecord:
        """A rollout from :meth:`to_json`'s JSON."""
        return cls(str(data["id"]), str(data["model"]), str(data["version"]), str(data["group"]),
                   RolloutPolicy.from_dict(data["policy"]), RolloutState(data["state"]), int(data["stage"]) - 1,
                   _time_or_none(data.get("stage_started")), _time_or_none(data.get("stage_settled")),
                   data.get("reason"), parse_time(data["created"]), parse_time(data["updated"]),
                   bool(data["rollback"]), tuple(TargetRecord.from_json(t) for t in data.get("targets", ())),
                   tuple(int(n) for n in data.get("stages", ())),
                   {TargetStatus(k): int(v) for k, v in (data.get("counts") or {}).items()},
                   data.get("targets_total"), data.get("driver"),
                   {TargetStatus(k): int(v) for k, v in (data.get("late") or {}).items()}, data.get("flagged"),
                   verdict=data.get("verdict"))


@dataclass(frozen=True)
class GroupRelease:
    """A group's desired state: the release every device of the group should run, the rollout that set it, and
    how far the group is from it. A completed rollout sets it; an aborted one leaves it where it was."""

    group: str
    #: The release (None: nothing was ever completed for the group).
    model: str | None
    version: str | None
    rollout_id: str | None
    since: float | None
    #: Devices of the group; how many run the release; how many do not, online and offline.
    devices: int = 0
    converged: int = 0
    behind_online: int = 0
    behind_offline: int = 0
    #: A rollout of the group that is running now (it sets the next release when it completes).
    running: str | None = None
    #: Why the release is flagged (too many late installs failed), or None.
    flagged: str | None = None
    #: The release per board: ``{"profile", "arch", "devices", "converged", "artifact"}`` for each board of the
    #: group's devices (``artifact``: the release's bundle that board gets, None when it has none).
    boards: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The API's JSON for one entry of ``GET /api/groups``."""
        return {"group": self.group, "model": self.model, "version": self.version, "rollout_id": self.rollout_id,
                "since": _iso_or_none(self.since), "devices": self.devices, "converged": self.converged,
                "behind_online": self.behind_online, "behind_offline": self.behind_offline, "running": self.running,
                "flagged": self.flagged, "boards": [dict(b) for b in self.boards]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupRelease:
        """A group's release from :meth:`to_json`'s JSON."""
        return cls(str(data["group"]), data.get("model"), data.get("version"), data.get("rollout_id"),
                   _time_or_none(data.get("since")), int(data.get("devices", 0)), int(data.get("converged", 0)),
                   int(data.get("behind_online", 0)), int(data.get("behind_offline", 0)), data.get("running"),
                   data.get("flagged"), tuple(dict(b) for b in data.get("boards") or ()))
