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

from edgesdk.fleet.records import TargetStatus
from edgesdk.ota_server.server import OTAServer

from .details import TEXT_MAX, DeviceDetails, Figures, parse_details

__all__ = ["STALE_AFTER_S", "PAGE", "fleet", "groups", "device", "rollouts", "rollout", "progress", "repository",
           "VersionFigures"]

#: A device silent for longer than this is shown as stale (its agent reports state every 30 s by default).
STALE_AFTER_S = 300.0
#: Devices per fleet page.
PAGE = 100


def _age(last_seen: float, now: float) -> str:
    seconds = max(0, int(now - last_seen))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


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
    devices = [{**d.to_json(), "age": _age(d.last_seen, now),
                "stale": d.status != "online" or now - d.last_seen > STALE_AFTER_S} for d in found]
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
    return {"device": {**record.to_json(), "age": _age(record.last_seen, now),
                       "stale": record.status != "online" or now - record.last_seen > STALE_AFTER_S},
            "details": details, "runtime": details.runtime, "paths": details.paths,
            "energy": details.energy, "disk": details.disk,
            "events": [{"type": e.type, "rollout": e.rollout_id, "age": _age(e.ts, now),
                        "detail": _event_detail(e.payload)} for e in reversed(events)]}


def _event_detail(payload: Any) -> str:
    """What an event's line says: its reason or event name, as short text."""
    if not isinstance(payload, dict):
        return ""
    value = payload.get("reason") or payload.get("event") or ""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:TEXT_MAX]
    return text if len(text) <= 4 * TEXT_MAX else text[:4 * TEXT_MAX - 1] + "…"


def rollouts(server: OTAServer) -> list[dict[str, Any]]:
    """Every rollout, newest first."""
    return [r.to_json() for r in reversed(server.db.rollouts())]


def progress(server: OTAServer, rollout_id: str) -> dict[str, Any]:
    """A rollout's state and each stage's device counts by status (what the live view pushes when it changes)."""
    record = server.status(rollout_id, targets=False)
    counts = server.db.target_counts(rollout_id)
    sizes = list(record.stage_sizes)
    stages = []
    for index in range(max(len(sizes), 1 + max((s for s, _ in counts), default=-1))):
        by_status = {status.value: counts.get((index, status), 0) for status in TargetStatus
                     if counts.get((index, status), 0)}
        size = sizes[index] - (sizes[index - 1] if index else 0) if index < len(sizes) else sum(by_status.values())
        done = by_status.get(TargetStatus.COMMITTED.value, 0)
        stages.append({"index": index, "name": "canary" if index == 0 else f"stage {index}", "size": size,
                       "by_status": by_status, "done": done, "sent": index <= record.stage})
    return {"id": record.id, "state": record.state.value, "stage": record.stage, "reason": record.reason,
            "stages": stages, "counts": {s.value: n for s, n in record.counts.items()}, "deferred": record.deferred,
            "late": {s.value: n for s in TargetStatus if (n := record.late_counts.get(s, 0))},
            "flagged": record.flagged}


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
    """A rollout's progress, its failures with reasons, and latency p99 and offload share per version on its devices."""
    record = server.status(rollout_id, targets=False)
    failures = [t.to_json() for t in server.db.failed_targets(rollout_id, 50)]
    return {"rollout": record.to_json(), "progress": progress(server, rollout_id), "failures": failures,
            "versions": _by_version(server, rollout_id),
            "actions": ("promote", "abort") if record.state.value == "running" else ("rollback",)}


def repository(server: OTAServer) -> list[dict[str, Any]]:
    """Every stored model version: size, signers, the variant and what its conversion measured and chose."""
    from edgesdk.runtime.bundle import signers

    models = []
    for name in server.repo.models():
        versions = []
        for version in reversed(server.repo.versions(name)):
            path = server.repo.path(name, version)
            manifest = server.repo.manifest(name, version)
            size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            versions.append({"version": version, "size_bytes": size, "signers": list(signers(path)),
                             "variant": manifest.variant, "target_profile": manifest.target_profile,
                             "power_mode": manifest.power_mode, "created": manifest.created_at,
                             "measured": dict(manifest.measured), "pinned": version in server.repo.pins(name)})
        models.append({"name": name, "versions": versions})
    return models
