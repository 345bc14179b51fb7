"""One device's figures on one model version, read from its agent's ``details["traffic"]``.

The agent merges what every app on the device handed it (:mod:`edgesdk.agent.app_stats`) and
publishes, per version, the calls, errors, latency percentiles and predict_async paths of a window
it names (:mod:`edgesdk.fleet.traffic`). The server validated that object when it parsed the state;
it is validated again here, with the same rules, because the analysis must never trust what sits in
the store (a state written by an older server, or by a benchmark that fills the store directly).
Anything wrong is a reason, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgesdk.errors import ReportError
from edgesdk.fleet.traffic import parse_traffic

from .confidence import rate_lower, rate_upper

__all__ = ["VersionFigures", "version_figures", "error_verdict"]

@dataclass(frozen=True)
class VersionFigures:
    """What a device reported about one version over one window (device clock seconds)."""

    version: str
    calls: int
    errors: int
    p95_ms: float | None
    p99_ms: float | None
    local: int
    cloud: int
    #: App sessions that started on this version while an earlier session of the same app was in the
    #: window.
    restarts: int
    #: Seconds the figures cover.
    window_s: float
    #: The successful calls' latency histogram (sparse bucket counts), when the agent sent one.
    histogram: tuple[tuple[int, int], ...] | None = None

    @property
    def error_rate(self) -> float | None:
        """Failed calls over calls, None without calls."""
        return self.errors / self.calls if self.calls else None

    @property
    def offload_share(self) -> float | None:
        """Share of predict_async requests sent to the cloud, None when there were none."""
        total = self.local + self.cloud
        return self.cloud / total if total else None

    def to_json(self) -> dict[str, Any]:
        """The figures a verdict cites for this device."""
        return {"version": self.version, "calls": self.calls, "errors": self.errors,
                "p99_ms": self.p99_ms, "offload_share": self.offload_share,
                "restarts": self.restarts, "window_s": round(self.window_s, 1)}


def version_figures(details: Mapping[str, Any] | None, version: str | None) -> VersionFigures | str:
    """The device's figures on ``version``, or why there are none (a sentence the verdict shows)."""
    if version is None:
        return "runs no version of the model"
    traffic = (details or {}).get("traffic")
    if traffic is None:
        return ("reports no app traffic (no app hands its figures to the agent, or the agent "
                "predates traffic reports)")
    if isinstance(traffic, Mapping) and isinstance(traffic.get("refused"), str):
        return f"its figures were refused when its state was read: {traffic['refused']}"
    try:
        checked = parse_traffic(traffic)
    except ReportError as exc:
        return f"its figures are malformed: {exc}"
    entry = checked["versions"].get(version)
    if entry is None:
        return f"reports no traffic on {version}"
    histogram = tuple((int(i), int(c)) for i, c in entry["hist"]) if entry.get("hist") else None
    local, cloud, restarts = (int(entry.get(key, 0)) for key in ("local", "cloud", "restarts"))
    window_s = float(entry["to"]) - float(entry["from"])
    return VersionFigures(version, int(entry["calls"]), int(entry["errors"]), entry.get("p95_ms"),
                          entry.get("p99_ms"), local, cloud, restarts, window_s, histogram)


def error_verdict(figures: VersionFigures, floor: float, limit: float) -> bool | None:
    """Whether the device's error rate is within ``floor + limit``: False when it is above with 95%
    confidence, True when it is within with 95% confidence, None while its calls cannot tell (thin);
    exact binomial bounds (:mod:`.confidence`)."""
    if rate_lower(figures.errors, figures.calls) > floor + limit:
        return False
    return True if rate_upper(figures.errors, figures.calls) <= floor + limit else None
