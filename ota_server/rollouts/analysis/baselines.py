"""What a board's canary devices are compared with: the baseline of each board.

A Pi 5's p99 says nothing about a Jetson's, so every figure is compared board by board. For a board,
in order:

1. **live**: the group's devices of that board still on another version of the model (not sent this
  rollout's stages yet), whose figures the server heard within ``max_baseline_age_s`` and that made
  ``min_calls`` calls;
2. **snapshot**: that board's live baseline as it was when an earlier stage of this rollout passed
  (kept in the store), when it is younger than ``max_baseline_age_s`` (the last stage, or a board
  whose devices are all canaries);
3. **the device's own previous version**: a canary device's figures on the version it ran before,
  when its agent still reports them (they cover the minutes before its swap) and they have
  ``min_calls`` calls;
4. none: the board's latency cannot be judged, and its verdict is inconclusive, never skipped.

A board's baseline figure is the **median** over its devices (p99, error rate, offload share), so
one device reporting a low p99 or a high error rate does not move the floor the canaries are held
to.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from edgesdk.fleet.policy import RolloutPolicy

from .evidence import BaselineDevice
from .figures import VersionFigures, version_figures

__all__ = ["Baseline", "live_baselines", "stored_baselines", "own_baseline", "snapshot_of"]


@dataclass(frozen=True)
class Baseline:
    """One board's baseline: where it comes from, over how many devices, its medians, and when it
    was measured."""

    source: str
    devices: int
    p99_ms: float | None
    error_rate: float | None
    offload_share: float | None
    #: Server time of the newest figures it is made of.
    at: float

    def to_json(self, now: float) -> dict[str, Any]:
        """The baseline as a verdict shows it (``age_s`` instead of the time)."""
        data = asdict(self)
        data["age_s"] = round(max(0.0, now - data.pop("at")), 1)
        return data


def _median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def _baseline(source: str, figures: list[VersionFigures], at: float) -> Baseline:
    return Baseline(source, len(figures), _median(f.p99_ms for f in figures),
                    _median(f.error_rate for f in figures),
                    _median(f.offload_share for f in figures), at)


def live_baselines(devices: Iterable[BaselineDevice], policy: RolloutPolicy,
                   now: float) -> dict[str, Baseline]:
    """Each board's live baseline, from the devices still on another version (see the module
    doc)."""
    found: dict[str, list[tuple[VersionFigures, float]]] = {}
    for device in devices:
        if device.heard_at is None or now - device.heard_at > policy.max_baseline_age_s:
            continue
        figures = version_figures(device.details, device.version)
        if isinstance(figures, VersionFigures) and figures.calls >= policy.min_calls:
            found.setdefault(device.board, []).append((figures, device.heard_at))
    return {board: _baseline("live", [f for f, _ in entries], max(at for _, at in entries))
            for board, entries in found.items()}


def stored_baselines(snapshot: Mapping[str, Any] | None, policy: RolloutPolicy,
                     now: float) -> dict[str, Baseline]:
    """The boards' baselines an earlier stage kept (:func:`snapshot_of`), those young enough to
    use."""
    boards = (snapshot or {}).get("boards")
    if not isinstance(boards, Mapping):
        return {}
    found = {}
    for board, data in boards.items():
        try:
            kept = Baseline("snapshot", int(data["devices"]), data.get("p99_ms"),
                            data.get("error_rate"),
                            data.get("offload_share"), float(data["at"]))
        except (KeyError, TypeError, ValueError):
            continue
        if now - kept.at <= policy.max_baseline_age_s:
            found[str(board)] = kept
    return found


def own_baseline(details: Mapping[str, Any] | None, previous: str | None, policy: RolloutPolicy,
                 heard_at: float | None) -> Baseline | None:
    """A canary device's figures on the version it ran before, when it still reports enough of
    them."""
    figures = version_figures(details, previous)
    if not isinstance(figures, VersionFigures) or heard_at is None:
        return None
    if figures.calls < policy.min_calls:
        return None
    return _baseline("own previous version", [figures], heard_at)


def snapshot_of(live: Mapping[str, Baseline], kept: Mapping[str, Any] | None) -> dict[str, Any]:
    """The snapshot to keep after a stage passed: each board's live baseline now, and the boards
    kept before that have no live baseline any more."""
    boards = dict((kept or {}).get("boards") or {})
    for board, baseline in live.items():
        boards[board] = {k: v for k, v in asdict(baseline).items() if k != "source"}
    return {"boards": boards}
