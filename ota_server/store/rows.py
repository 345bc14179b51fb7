"""The fleet store's rows: what is written (device states, events, target moves) and how rows become records.

SQL names stay in :mod:`edgesdk.ota_server.store`: ``grp`` is a record's ``group`` (GROUP is an
SQL keyword) and the ``wave`` columns are a record's ``stage``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.records import DeviceRecord, RolloutPolicy, RolloutRecord, RolloutState, TargetRecord, TargetStatus

__all__ = ["EventRecord", "DeviceState", "TargetUpdate", "EventRow", "Release", "Provisioning", "DETAIL_KEYS",
           "device_record", "target_record", "rollout_record", "release_record", "where_clause", "NOT_TERMINAL",
           "IN_FLIGHT", "FAILED", "TIMEABLE", "ONLINE_DEVICE", "UNSETTLED_ABORT", "UNSETTLED_ABORT_ARGS", "id_chunks",
           "up_to"]

NOT_TERMINAL = tuple(s.value for s in TargetStatus if not s.terminal)
#: A command is out and the device has not finished with it.
IN_FLIGHT = tuple(s.value for s in TargetStatus if s.in_flight)
#: The device is done with the deployment and it failed (the failure rate counts these).
FAILED = tuple(s.value for s in TargetStatus if s.failed)
#: What a silent target times out from: unfinished, less deferred. The list itself leaves deferred targets out, not a
#: filter after it, so a fleet with thousands of devices away does not have their index entries read on every pass.
#: A device ahead of the release (``ahead``) is not waited for either, though it may have been
#: sent a command before.
TIMEABLE = tuple(s for s in NOT_TERMINAL
                 if s not in (TargetStatus.DEFERRED.value, TargetStatus.AHEAD.value))
#: The target's device is online: an unfinished target of one times out, an offline one's is deferred. A primary-key
#: lookup per candidate row, so the cost follows the targets in question, not the fleet.
ONLINE_DEVICE = "EXISTS (SELECT 1 FROM devices d WHERE d.id = targets.device_id AND d.status = 'online')"
#: An aborted rollout (row of ``rollouts``) with devices still to send back: a revert unanswered, or a commit reported
#: after the abort; its arguments follow.
UNSETTLED_ABORT = ("state = ? AND EXISTS (SELECT 1 FROM targets WHERE rollout_id = rollouts.id AND (status = ? OR "
                   "(status = ? AND previous_version IS NOT NULL)))")
UNSETTLED_ABORT_ARGS = (RolloutState.ABORTED.value, TargetStatus.REVERTING.value, TargetStatus.COMMITTED.value)


def up_to(stage: int) -> str:
    """A target's stage is ``stage`` or an earlier one: ``wave <= stage`` as a list of stages, so that with a list of
    statuses the index on (rollout, stage, status) finds just the rows in question. As a range it would read the
    index entry of every target of the rollout, each second, for a release of thousands of devices."""
    return f"wave IN ({','.join(str(w) for w in range(int(stage) + 1))})" if stage >= 0 else "wave < 0"


@dataclass(frozen=True)
class EventRecord:
    """One entry of the event log: a device's event message or a rollout's or measurement's milestone."""

    id: int
    ts: float
    device_id: str | None
    rollout_id: str | None
    type: str
    payload: dict[str, Any]


#: The keys of a device's state report kept as its details: runtime statistics (latency, offload paths), disk,
#: the previous version, energy, the pins and slot retention it runs with, and whether the board is in the serving
#: bundle's power mode (an agent run with --apply-power-mode).
DETAIL_KEYS = ("runtime", "disk", "previous", "energy", "keep_slots", "pinned", "power_mode_applied", "power_mode")


@dataclass(frozen=True)
class DeviceState:
    """A device's reported state, as the server writes it (model, version and slots may be unknown)."""

    device_id: str
    group: str
    status: str
    model: str | None
    version: str | None
    slots: tuple[str, ...]
    #: When the server received the report.
    seen: float
    #: The slots whose archives' chunks the device can copy instead of fetching (edgesdk.agent.local_chunks).
    chunk_slots: tuple[str, ...] = ()
    #: Its runtime's energy per inference above idle (mJ) and average power (W) over its last report window,
    #: where its board has a power sensor (edgesdk.agent.energy_account); None: not in this report.
    energy_mj: float | None = None
    avg_watts: float | None = None
    #: The root-of-trust version the device holds and whether it is stale (its newest timestamp expired), from
    #: its last online report; None for a device without a root of trust (edgesdk.agent.trust_keeper).
    root_version: int | None = None
    stale: bool | None = None
    #: When the device says it sent the report (its ``updated``; None for a last will, which has no time).
    reported: float | None = None
    #: When the run of the agent that sent it began (its online states and its will carry it; None: not said).
    session: float | None = None
    #: The report's details as JSON text: runtime statistics and offload paths, disk, previous version, energy
    #: (what the console shows; :data:`DETAIL_KEYS`); None keeps the stored ones (a last will has none).
    details: str | None = None
    #: The profile and CPU architecture the agent runs as; None keeps the stored ones.
    profile: str | None = None
    arch: str | None = None
    #: Which connection of that run sent it (the will: which one it ends); None: not said.
    connection: int | None = None


@dataclass(frozen=True)
class TargetUpdate:
    """A target's new status (and why), from a device's event."""

    rollout_id: str
    device_id: str
    status: TargetStatus
    reason: str | None = None


@dataclass(frozen=True)
class EventRow:
    """An event log entry to write."""

    type: str
    payload: dict[str, Any]
    device_id: str | None = None
    rollout_id: str | None = None
    ts: float | None = None


@dataclass(frozen=True)
class Release:
    """A group's desired release as stored: the model version its devices should run and the rollout that set it."""

    group: str
    model: str
    version: str
    rollout_id: str
    since: float


@dataclass(frozen=True)
class Provisioning:
    """The group an operator put a device in (``source``: ``devices file``, ``admin api``, ``first report``)."""

    device_id: str
    group: str
    source: str
    updated: float


def release_record(row: Mapping[str, Any]) -> Release:
    """A ``group_releases`` row as a :class:`Release`."""
    return Release(row["grp"], row["model"], row["version"], row["rollout_id"], row["updated"])


def device_record(row: Mapping[str, Any]) -> DeviceRecord:
    """A ``devices`` row as a :class:`DeviceRecord`."""
    return DeviceRecord(row["id"], row["grp"], row["status"], row["model"], row["version"],
                        tuple(json.loads(row["slots"])), row["last_seen"], row["profile"], row["arch"])


def rollout_record(r: Mapping[str, Any], targets: tuple[TargetRecord, ...] = (),
                   counts: Mapping[TargetStatus, int] | None = None,
                   late_counts: Mapping[TargetStatus, int] | None = None) -> RolloutRecord:
    """A ``rollouts`` row as a :class:`RolloutRecord`, with what was read of its targets (none, no counts: as a pass
    that needs only the rollout's state reads it)."""
    counts = dict(counts or {})
    return RolloutRecord(r["id"], r["model"], r["version"], r["grp"], RolloutPolicy.from_dict(json.loads(r["policy"])),
                         RolloutState(r["state"]), r["wave"], r["wave_started"], r["wave_settled"], r["reason"],
                         r["created"], r["updated"], bool(r["rollback"]), targets,
                         tuple(json.loads(r["stages"] or "[]")), counts, sum(counts.values()), r["lease_holder"],
                         dict(late_counts or {}), r["flagged"], verdict=json.loads(r["verdict"]) if r["verdict"] else None)


def target_record(row: Mapping[str, Any]) -> TargetRecord:
    """A ``targets`` row as a :class:`TargetRecord`."""
    return TargetRecord(row["rollout_id"], row["device_id"], row["wave"], TargetStatus(row["status"]), row["reason"],
                        row["previous_version"], row["sent"], row["updated"], bool(row["late"]), row["artifact"])


def where_clause(conditions: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """``WHERE a = ? AND b = ?`` for the conditions that are not None (PostgreSQL cannot type ``? IS NULL``)."""
    given = {column: value for column, value in conditions.items() if value is not None}
    if not given:
        return "", ()
    return " WHERE " + " AND ".join(f"{column} = ?" for column in given), tuple(given.values())



def id_chunks(ids: list[str], size: int = 500) -> list[list[str]]:
    """``ids`` in chunks of at most ``size`` (one ``IN (...)`` query each)."""
    return [ids[start:start + size] for start in range(0, len(ids), size)]
