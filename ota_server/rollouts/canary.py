"""Canary analysis: judge a rollout stage on the figures its devices report themselves, against a baseline.

Pure functions over plain data (no store, no clock), so the engine, tests and benchmarks run the same code.

**Where the figures come from.** Each device's last retained state carries ``details["runtime"]``,
:meth:`edgesdk.runtime.stats.StatsSnapshot.as_dict` of its ManagedRuntime: ``count`` and ``errors`` since the
active model was loaded, ``p99_ms`` over its last calls, and ``paths`` (``local``/``cloud`` request counts of
``predict_async``).

**Only post-install figures count.** A ManagedRuntime's overall statistics belong to the active model's
Runtime, so they restart when the model is swapped: a device that reports the new version reports figures of the
new version only (the bundle's health check, about 11 calls with a cold first one, included). The ``paths``
counts survive swaps; where the engine has a snapshot of a device's paths from before its stage was sent (taken
when the previous stage passed), the offload share counts only the requests since; for the canary stage no such
snapshot exists and the share covers the agent's whole run (diluted toward the old version's: a weaker check,
never a false abort from old figures).

**Minimum evidence.** A device counts once it made ``policy.min_calls`` calls on its version (100 by default:
then a p99 over its window is not the cold first call). A stage with no device over that passes, its verdict
saying "no figures" (devices without a ManagedRuntime report none at all, and such fleets must still roll out).

**The aggregate.** A stage's p99 is the median of its devices' p99s: one device with a noisy neighbour or a
throttled CPU does not move it, while a release that is slower is slower on most devices. Calls and errors are
summed (the error rate is errors / calls); the offload share is cloud / (local + cloud) over the summed requests.

**The baseline.** The group's online devices still on another version of the model (not yet sent this rollout)
with figures; when none is left (the last stage, or a canary of the whole group), the baseline the engine stored
when the previous stage passed; with neither, only the error rate is judged, as an absolute rate.

**Boards.** A release may run on several boards (each its own artifact), and a Pi 5's p99 says nothing about a
Jetson's. Where reports name their board (a fourth item, the device's profile) and a board has figures on both
sides, latency is compared board by board, and the stage fails when any board's ratio is over the limit; the
aggregate comparison is the fallback when no board has both (the stored snapshot, or agents too old to say).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from edgesdk.fleet.policy import RolloutPolicy
from edgesdk.fleet.records import iso_time

__all__ = ["Figures", "Report", "figures", "judge", "judge_stage", "paths_of"]


class Report(NamedTuple):
    """One device's last state as the analysis reads it: its id, the version it runs, its ``details`` and its board
    (profile; None: not known) (the store's :meth:`~edgesdk.ota_server.store.verdicts.VerdictStore.stage_reports`
    gives such tuples)."""

    device_id: str
    version: str | None
    details: Mapping[str, Any]
    board: str | None = None


@dataclass(frozen=True)
class Figures:
    """A set of devices' figures: how many had enough calls (``devices``) and how many did not (``too_few``), the
    summed calls and errors, the error rate, the median of the devices' p99 (ms) and the offload share."""

    devices: int
    too_few: int
    calls: int
    errors: int
    error_rate: float | None
    p99_ms: float | None
    offload_share: float | None
    #: The versions the devices ran (the baseline may mix several old versions).
    versions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON (``versions`` as a list)."""
        return {**asdict(self), "versions": list(self.versions)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Figures:
        """Figures from :meth:`to_json`'s JSON."""
        return cls(int(data["devices"]), int(data.get("too_few", 0)), int(data["calls"]), int(data["errors"]),
                   data.get("error_rate"), data.get("p99_ms"), data.get("offload_share"),
                   tuple(data.get("versions", ())))


def paths_of(details: Mapping[str, Any]) -> tuple[int, int]:
    """(local, cloud) predict_async request counts a device reported (0, 0 without paths)."""
    paths = (details.get("runtime") or {}).get("paths") or {}
    return (int((paths.get("local") or {}).get("count") or 0), int((paths.get("cloud") or {}).get("count") or 0))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def figures(reports: Iterable[tuple[Any, ...]], min_calls: int,
            paths_before: Mapping[str, tuple[int, int]] | None = None) -> Figures:
    """The figures of ``reports`` (see the module doc); ``paths_before``: each device's (local, cloud) counts at
    a snapshot, subtracted so only the requests since count (a device whose counts went down restarted: all count)."""
    counted, too_few, calls, errors, local, cloud = [], 0, 0, 0, 0, 0
    versions: set[str] = set()
    for device_id, version, details, *_ in reports:
        runtime = details.get("runtime")
        count = _number((runtime or {}).get("count"))
        p99 = _number((runtime or {}).get("p99_ms"))
        if runtime is None or count is None or count < min_calls or p99 is None:
            too_few += 1
            continue
        counted.append(p99)
        calls += int(count)
        errors += int(_number(runtime.get("errors")) or 0)
        now_local, now_cloud = paths_of(details)
        was_local, was_cloud = (paths_before or {}).get(device_id, (0, 0))
        if now_local >= was_local and now_cloud >= was_cloud:
            now_local, now_cloud = now_local - was_local, now_cloud - was_cloud
        local, cloud = local + now_local, cloud + now_cloud
        if version:
            versions.add(version)
    return Figures(len(counted), too_few, calls, errors, errors / calls if calls else None,
                   statistics.median(counted) if counted else None,
                   cloud / (local + cloud) if local + cloud else None, tuple(sorted(versions)))


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def judge(stage: Figures, baseline: Figures | None, policy: RolloutPolicy,
          boards: Mapping[str, tuple[Figures, Figures]] | None = None) -> tuple[bool, str, list[dict[str, Any]]]:
    """(passed, the reason with the figures, each check as ``{name, value, baseline, limit, passed}``);
    ``boards``: each board's (stage, baseline) figures where both sides have devices: latency is then judged per
    board (checks named ``p99_ratio`` with a ``board``)."""
    if not stage.devices:
        return True, (f"no figures: none of the stage's {stage.too_few} reporting devices made {policy.min_calls} "
                      "calls on the new version yet (or they run no ManagedRuntime); passed on the install reports"
                      ), []
    checks: list[dict[str, Any]] = []
    failures: list[str] = []
    base = baseline if baseline is not None and baseline.devices else None
    if policy.max_p99_ratio is not None and boards:
        for board, (mine, theirs) in sorted(boards.items()):
            if mine.p99_ms is None or not theirs.p99_ms:
                continue
            ratio = mine.p99_ms / theirs.p99_ms
            ok = ratio <= policy.max_p99_ratio
            checks.append({"name": "p99_ratio", "board": board, "value": round(ratio, 3), "canary": mine.p99_ms,
                           "baseline": theirs.p99_ms, "limit": policy.max_p99_ratio, "passed": ok})
            if not ok:
                failures.append(f"on {board}, canary p99 {_ms(mine.p99_ms)} ms is {ratio:.1f}x the baseline's "
                                f"{_ms(theirs.p99_ms)} ms (> {policy.max_p99_ratio:g}x)")
    elif policy.max_p99_ratio is not None and base is not None and stage.p99_ms is not None and base.p99_ms:
        ratio = stage.p99_ms / base.p99_ms
        ok = ratio <= policy.max_p99_ratio
        checks.append({"name": "p99_ratio", "value": round(ratio, 3), "canary": stage.p99_ms,
                       "baseline": base.p99_ms, "limit": policy.max_p99_ratio, "passed": ok})
        if not ok:
            failures.append(f"canary p99 {_ms(stage.p99_ms)} ms is {ratio:.1f}x the baseline's "
                            f"{_ms(base.p99_ms)} ms (> {policy.max_p99_ratio:g}x)")
    if policy.max_error_rate is not None and stage.error_rate is not None:
        floor = base.error_rate if base is not None and base.error_rate is not None else 0.0
        ok = stage.error_rate - floor <= policy.max_error_rate
        checks.append({"name": "error_rate", "value": stage.error_rate, "canary": stage.error_rate,
                       "baseline": floor if base is not None else None, "limit": policy.max_error_rate, "passed": ok})
        if not ok:
            failures.append(f"canary error rate {stage.error_rate:.2%} ({stage.errors}/{stage.calls} calls) is "
                            f"{stage.error_rate - floor:.2%} above the baseline's {floor:.2%} "
                            f"(> {policy.max_error_rate:.2%})" if base is not None else
                            f"canary error rate {stage.error_rate:.2%} ({stage.errors}/{stage.calls} calls) is above "
                            f"{policy.max_error_rate:.2%} (no baseline to compare with)")
    if policy.max_offload_share is not None and stage.offload_share is not None:
        floor = base.offload_share if base is not None and base.offload_share is not None else 0.0
        ok = stage.offload_share - floor <= policy.max_offload_share
        checks.append({"name": "offload_share", "value": stage.offload_share, "canary": stage.offload_share,
                       "baseline": floor if base is not None else None, "limit": policy.max_offload_share,
                       "passed": ok})
        if not ok:
            failures.append(f"canary offload share {stage.offload_share:.0%} is {stage.offload_share - floor:.0%} "
                            f"above the baseline's {floor:.0%} (> {policy.max_offload_share:.0%})")
    if failures:
        return False, "; ".join(failures), checks
    shown = f"canary p99 {_ms(stage.p99_ms)} ms" if stage.p99_ms is not None else "canary"
    if base is not None and base.p99_ms:
        shown += f" vs the baseline's {_ms(base.p99_ms)} ms"
    rate = f", error rate {stage.error_rate:.2%}" if stage.error_rate is not None else ""
    within = "within the policy" if base is not None else "no baseline to compare latency with"
    return True, f"{shown}{rate} over {stage.devices} devices: {within}", checks


def _by_board(new: list[tuple[Any, ...]], old: list[tuple[Any, ...]],
              min_calls: int) -> dict[str, tuple[Figures, Figures]]:
    """Each board's (stage, baseline) figures, for the boards with counted devices on both sides; empty for a
    fleet of one board (or of unknown boards), where the aggregate is the same comparison."""
    found: dict[str, tuple[Figures, Figures]] = {}
    if len({r[3] if len(r) > 3 else None for r in [*new, *old]}) < 2:
        return found
    for board in {r[3] for r in new if len(r) > 3 and r[3]}:
        mine = figures([r for r in new if len(r) > 3 and r[3] == board], min_calls)
        theirs = figures([r for r in old if len(r) > 3 and r[3] == board], min_calls)
        if mine.devices and theirs.devices:
            found[board] = (mine, theirs)
    return found


def judge_stage(policy: RolloutPolicy, stage: int, version: str, new: Iterable[tuple[Any, ...]],
                old: Iterable[tuple[Any, ...]],
                snapshot: Mapping[str, Any] | None, now: float,
                rollback: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The verdict of stage ``stage`` (0-based) of a rollout to ``version`` as JSON, and the baseline snapshot to
    store for the next stage (None: keep the stored one).

    ``new``: the group's devices on ``version``; ``old``: its devices on another version of the model that this
    rollout has not sent yet; ``snapshot``: what the previous stage's verdict stored (``figures`` and ``paths``).
    The verdict is ``{"stage": N (1-based, the canary is 1), "passed", "reason", "judged_at" (ISO), "canary":
    figures, "baseline": figures plus ``source`` ("live" or "snapshot") or None, "checks": [...], "limits": {...}}``.
    """
    new, old = list(new), list(old)
    paths_before = {k: (int(v[0]), int(v[1])) for k, v in ((snapshot or {}).get("paths") or {}).items()}
    canary = figures(new, policy.min_calls, paths_before)
    live = figures(old, policy.min_calls)
    source, base = ("live", live) if live.devices else (None, None)
    if base is None and snapshot and snapshot.get("figures"):
        source, base = "snapshot", Figures.from_json(snapshot["figures"])
    checks: list[dict[str, Any]] = []
    if rollback:
        passed, reason = True, "a rollback: not judged (it returns the group to a version it ran)"
    else:
        passed, reason, checks = judge(canary, base, policy,
                                       _by_board(new, old, policy.min_calls) if source == "live" else None)
    verdict = {"stage": stage + 1, "version": version, "passed": passed, "reason": reason, "judged_at": iso_time(now),
               "canary": canary.to_json(), "baseline": {**base.to_json(), "source": source} if base else None,
               "checks": checks, "limits": {"max_p99_ratio": policy.max_p99_ratio,
                                            "max_error_rate": policy.max_error_rate,
                                            "max_offload_share": policy.max_offload_share,
                                            "min_calls": policy.min_calls}}
    keep = None
    if live.devices:
        keep = {"figures": live.to_json(), "paths": {device: list(paths_of(details)) for device, _, details, *_ in old
                                                     if any(paths_of(details))}}
    return verdict, keep
