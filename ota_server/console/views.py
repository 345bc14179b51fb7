"""What the console's pages show, read from the server's store and repository (no HTTP here).

Each function returns plain data for one page's template. Lists are paged by id (keyset), so a
page costs the same at 10 devices or 10,000.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from edgesdk.fleet.records import RolloutRecord, RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.analysis.rollback_rules import rollback_refusal as refusal_of
from edgesdk.ota_server.server import OTAServer

from .details import TEXT_MAX, DeviceDetails, Figures, parse_details
from .display import STATUS_TEXT, board, stage_label, verdict_view

__all__ = ["STALE_AFTER_S", "PAGE", "fleet", "groups", "device", "rollouts", "rollout", "progress", "repository",
           "VersionFigures", "rollback_refusal", "resumable", "phase_of"]

#: A device silent for longer than this is shown as stale (its agent reports state every 30 s by default).
STALE_AFTER_S = 300.0
#: Devices per fleet page.
PAGE = 100


def _device_row(record: Any, now: float) -> dict[str, Any]:
    """A device as a page lists it: its record (``last_seen`` as epoch seconds, for :func:`.display.when`), its board
    in words, and whether it is stale."""
    return {**record.to_json(), "last_seen": record.last_seen, "board": board(record.profile, record.arch),
            "stale": record.status != "online" or now - record.last_seen > STALE_AFTER_S}


def fleet(server: OTAServer, group: str | None, status: str | None, after: str | None,
          now: float | None = None) -> dict[str, Any]:
    """Devices by group with counts by status, model and version, and one page of devices (stale marked)."""
    now = time.time() if now is None else now
    groups: dict[str, dict[str, Any]] = {}
    for grp, state, model, version, n in server.db.group_counts():
        entry = groups.setdefault(grp, {"total": 0, "status": {}, "versions": {}})
        entry["total"] += n
        entry["status"][state] = entry["status"].get(state, 0) + n
        running = f"{model} {version}" if model else "nothing installed"
        entry["versions"][running] = entry["versions"].get(running, 0) + n
    found = server.db.devices(group or None, status=status or None, after=after or None, limit=PAGE + 1)
    more = len(found) > PAGE
    found = found[:PAGE]
    devices = [_device_row(d, now) for d in found]
    return {"groups": groups, "devices": devices, "next": found[-1].id if more and found else None,
            "total": server.db.device_total(group or None, status or None), "group": group or "",
            "status": status or "", "statuses": ("online", "offline")}


def groups(server: OTAServer) -> list[dict[str, Any]]:
    """Each group's release (desired state), how many of its devices run it and how many are behind, online or
    offline, the rollout running now and why the release is flagged."""
    out = []
    for g in server.groups_status():
        entry = g.to_json()
        entry["converged_share"] = g.converged / g.devices if g.devices else None
        out.append(entry)
    return out


def device(server: OTAServer, device_id: str, now: float | None = None) -> dict[str, Any] | None:
    """One device: its record, its last reported details (typed: :func:`parse_details`) and its last events; None if
    it never reported."""
    now = time.time() if now is None else now
    record = server.db.device(device_id)
    if record is None:
        return None
    try:
        details = parse_details(server.db.details([device_id]).get(device_id))
    except ValueError:  # the stored text is not JSON at all (not written by this server)
        details = DeviceDetails(malformed=("details",))
    events = server.db.events(device_id=device_id)[-20:]
    return {"device": _device_row(record, now),
            "details": details, "runtime": details.runtime, "paths": details.paths,
            "energy": details.energy, "disk": details.disk,
            "events": [{"type": e.type, "rollout": e.rollout_id, "ts": e.ts,
                        "detail": _event_detail(e.type, e.payload)} for e in reversed(events)]}


#: Payload keys an event's Detail leaves out: the Event and Rollout columns and the When column already show them,
#: or they are protocol bookkeeping.
_EVENT_SHOWN = frozenset({"event", "type", "time", "ts", "rollout", "rollout_id", "deployment_id", "device",
                          "device_id"})


def _event_detail(kind: str, payload: Any) -> str:
    """What an event's Detail column adds to its Event column: its reason, else its other facts ("digits 2.0.0,
    bytes 1234"); never the event's own name again."""
    if not isinstance(payload, dict):
        return ""
    reason = payload.get("reason")
    if reason:
        text = reason if isinstance(reason, str) else json.dumps(reason, default=str)[:4 * TEXT_MAX]
    else:
        named = isinstance(payload.get("name"), str)
        facts = [f"{payload['name']} {payload.get('version') or ''}".strip()] if named else []
        facts += [f"{key} {json.dumps(value, default=str) if isinstance(value, dict | list) else value}"
                  for key, value in payload.items() if key not in _EVENT_SHOWN
                  and not (named and key in ("name", "version")) and value not in (None, "", {}, [])]
        text = ", ".join(f for f in facts if f and f != kind)
    return text if len(text) <= 4 * TEXT_MAX else text[:4 * TEXT_MAX - 1] + "…"


def phase_of(record: Any) -> str | None:
    """The rollout's phase as text (e.g. ``waiting_for_promote``), or None while the engine does not say one."""
    phase = getattr(record, "phase", None)
    value = getattr(phase, "value", phase)
    return value if isinstance(value, str) and value else None


def rollouts(server: OTAServer) -> list[dict[str, Any]]:
    """Every rollout, newest first: its stage as "k of N", whether it is a rollback, why it ended, and its phase.

    A completed rollout sent all its stages (N is its last stage + 1); for the others the count comes from their
    record (one read each: the running ones and the aborted ones).
    """
    out = []
    for r in reversed(server.db.rollouts()):
        entry = r.to_json()
        entry["rollback"] = bool(getattr(r, "rollback", False))
        if r.state == RolloutState.COMPLETED:
            entry["stage_label"], entry["phase"] = stage_label(r.stage, r.stage + 1), None
        else:
            record = server.status(r.id, targets=False)
            entry["stage_label"], entry["phase"] = stage_label(r.stage, record.stage_count), phase_of(record)
            entry["rollback"] = entry["rollback"] or record.rollback
        entry["sent"] = r.stage >= 0
        out.append(entry)
    return out


def progress(server: OTAServer, rollout_id: str) -> dict[str, Any]:
    """A rollout's state and each stage's device counts by status (what the live view pushes when it changes).

    Stages keep their 0-based ``index`` (as the API's JSON does) and are named 1-based, "1 of 3", the canary first.
    """
    record = server.status(rollout_id, targets=False)
    counts = server.db.target_counts(rollout_id)
    sizes = list(record.stage_sizes)
    total = max(len(sizes), 1 + max((s for s, _ in counts), default=-1), 1)
    running = record.state == RolloutState.RUNNING
    stages = []
    for index in range(total):
        by_status = {status.value: counts.get((index, status), 0) for status in TargetStatus
                     if counts.get((index, status), 0)}
        size = sizes[index] - (sizes[index - 1] if index else 0) if index < len(sizes) else sum(by_status.values())
        done = by_status.get(TargetStatus.COMMITTED.value, 0)
        sent = index <= record.stage
        stages.append({"index": index, "name": stage_label(index, total), "canary": index == 0, "size": size,
                       "by_status": by_status, "done": done, "sent": sent,
                       "note": "canary" if index == 0 and sent else "" if sent else
                       "not sent yet" if running else "never sent"})
    return {"id": record.id, "state": record.state.value, "stage": record.stage, "reason": record.reason,
            "phase": phase_of(record), "stages": stages,
            "counts": {s.value: n for s, n in record.counts.items()}, "deferred": record.deferred,
            "late": {s.value: n for s in TargetStatus if (n := record.late_counts.get(s, 0))},
            "flagged": record.flagged, "labels": {k: list(v) for k, v in STATUS_TEXT.items()}}


def rollback_refusal(server: OTAServer, record: RolloutRecord, to: str | None = None) -> str | None:
    """Why rolling ``record`` back (to version ``to``; None: the most recent version allowed) is
    refused, in the words the API refuses it with, or None when the console offers it: the rules
    are one function (:func:`edgesdk.ota_server.rollouts.analysis.rollback_rules.plan_rollback`),
    read with the group's release history and the repository as the engine reads them."""
    history = server.db.group_history(record.group, record.model)
    return refusal_of(record, history, to,
                      stored=lambda version: bool(server.repo.artifacts(record.model, version)))


def resumable(server: OTAServer, record: RolloutRecord) -> bool:
    """Whether the console offers "Resume…" on ``record``: it is flagged, and running or its
    group's release (the check :meth:`OTAServer.resume` makes)."""
    if not record.flagged:
        return False
    release = server.db.release(record.group)
    return record.state == RolloutState.RUNNING or (release is not None
                                                    and release.rollout_id == record.id)


@dataclass
class VersionFigures:
    """Runtime figures of the rollout's devices that run one version (from their last reports)."""

    version: str
    devices: int = 0
    p99_ms: list[float] = field(default_factory=list)
    local: int = 0
    cloud: int = 0

    def to_json(self) -> dict[str, Any]:
        """Devices, how many report runtime figures, their median p99 and the share of requests offloaded."""
        ran = self.local + self.cloud
        return {"version": self.version, "devices": self.devices, "reporting": len(self.p99_ms),
                "median_p99_ms": statistics.median(self.p99_ms) if self.p99_ms else None,
                "offload_share": self.cloud / ran if ran else None}


def _by_version(server: OTAServer, rollout_id: str) -> list[dict[str, Any]] | None:
    """Per version now running on the rollout's devices: how many, and their reported p99 and offload share (None when
    the store's details cannot be read; a device's malformed figures are left out of the medians and shares)."""
    figures: dict[str, VersionFigures] = {}
    try:
        targets = server.db.target_devices(rollout_id)
    except ValueError:  # a device's stored details are not JSON at all (not written by this server)
        return None
    for running_version, raw in targets:
        version = running_version or "unknown"
        entry = figures.setdefault(version, VersionFigures(version))
        entry.devices += 1
        details = parse_details(raw)
        if details.runtime.p99_ms is not None:
            entry.p99_ms.append(details.runtime.p99_ms)
        entry.local += _count_of(details.paths.get("local"))
        entry.cloud += _count_of(details.paths.get("cloud"))
    return [figures[v].to_json() for v in sorted(figures)]


def _count_of(path: Figures | None) -> int:
    return path.count or 0 if path is not None else 0


def rollout(server: OTAServer, rollout_id: str) -> dict[str, Any]:
    """A rollout's progress, its canary verdict, its failures with reasons, a page of its targets (stage, status, the
    artifact each gets, the device's board), latency p99 and offload share per version on its devices, and the
    actions that would do something."""
    record = server.status(rollout_id, targets=False)
    count = max(record.stage_count, 1)
    failures = [{**t.to_json(), "stage_label": stage_label(t.stage, count)}
                for t in server.db.failed_targets(rollout_id, 50)]
    page = server.status(rollout_id, targets=True, limit=PAGE).targets
    targets = []
    for t in page:
        found = server.db.device(t.device_id)
        targets.append({**t.to_json(), "stage_label": stage_label(t.stage, count),
                        "board": board(found.profile, found.arch) if found is not None else "unknown"})
    refusal = rollback_refusal(server, record)
    verdict = verdict_view(getattr(record, "verdict", None))
    if verdict is not None and verdict["stage"] is not None:
        verdict["stage_label"] = stage_label(verdict["stage"] - 1, count)
    actions: tuple[str, ...] = ("promote", "abort") if record.state == RolloutState.RUNNING else ()
    if refusal is None:
        actions += ("rollback",)
    if resumable(server, record):
        actions += ("resume",)
    return {"rollout": {**record.to_json(), "stage_label": stage_label(record.stage, count)},
            "progress": progress(server, rollout_id), "failures": failures, "targets": targets,
            "targets_total": record.targets_total, "versions": _by_version(server, rollout_id),
            "verdict": verdict, "phase": phase_of(record), "actions": actions,
            "no_rollback": refusal}


def repository(server: OTAServer) -> list[dict[str, Any]]:
    """Every stored model version, one row per board's bundle (artifact): size, signers, the variant and what its
    conversion measured and chose."""
    from edgesdk.runtime.bundle import signers

    models = []
    for name in server.repo.models():
        versions = []
        for version, artifact in [(v, a) for v in reversed(server.repo.versions(name))
                                  for a in server.repo.artifacts(name, v)]:
            path = server.repo.path(name, version, artifact)
            manifest = server.repo.manifest(name, version, artifact)
            size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            versions.append({"version": version, "size_bytes": size, "signers": list(signers(path)),
                             "variant": manifest.variant, "target_profile": manifest.target_profile,
                             "power_mode": manifest.power_mode, "created": manifest.created_at,
                             "measured": dict(manifest.measured), "pinned": version in server.repo.pins(name)})
        models.append({"name": name, "versions": versions})
    return models
