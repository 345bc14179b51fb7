"""Rollout policy and the deterministic order in which a group's devices get a new version.

Stages are cumulative fractions of the group: the canary first, then each wave
(``--canary 10% --waves 50,100`` → 10%, 50%, 100%). Every stage holds at least one more
device than the last. Devices are ordered by SHA-256 of ``group/device``, so the same
devices are canaries every time and the order needs no state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["RolloutPolicy", "stage_sizes", "canary_order", "parse_percent", "parse_duration"]


def parse_percent(text: str | float) -> float:
    """``"10%"``, ``"10"`` or ``0.1`` -> 0.1."""
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
    """``"60s"``, ``"2m"``, ``"1.5"`` -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    raw = text.strip().lower()
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if raw.endswith(suffix):
            raw, factor = raw[: -len(suffix)], scale[suffix]
            break
    else:
        factor = 1.0
    try:
        return float(raw) * factor
    except ValueError:
        raise EdgeSDKError(f"{text!r} is not a duration; write e.g. 60s or 2m") from None


@dataclass(frozen=True)
class RolloutPolicy:
    """How a version spreads over a group, and when it stops."""

    canary: float = 0.1
    waves: tuple[float, ...] = (0.5, 1.0)
    #: After a stage's devices all report, wait this long for late failures before the next stage.
    health_window_s: float = 60.0
    #: Abort (and roll the stage's devices back) when more than this fraction of targets failed.
    max_failure_rate: float = 0.05
    #: A device that has not reported this long after its command counts as failed.
    deploy_timeout_s: float = 300.0
    #: Promote to the next stage by itself once the health window passes (else wait for `promote`).
    auto_promote: bool = True

    def __post_init__(self) -> None:
        fractions = (self.canary, *self.waves)
        shown = ",".join(f"{f * 100:g}%" for f in fractions)
        if not all(0 < f <= 1 for f in fractions):
            raise EdgeSDKError(f"canary and waves must be percentages in (0, 100], got {shown}")
        all_at_once = self.canary == 1.0 and self.waves in ((), (1.0,))
        if not all_at_once and (any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[-1] != 1.0):
            raise EdgeSDKError(f"stages canary,waves = {shown} must increase and end at 100%; "
                               "write e.g. --canary 10% --waves 50,100")
        if not 0 <= self.max_failure_rate < 1 or self.health_window_s < 0 or self.deploy_timeout_s <= 0:
            raise EdgeSDKError("max failure rate must be in [0, 100%), health window >= 0 and timeout > 0")

    @property
    def stages(self) -> tuple[float, ...]:
        return tuple(dict.fromkeys((self.canary, *self.waves)))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "waves": list(self.waves)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutPolicy:
        return cls(**{**data, "waves": tuple(data.get("waves", (0.5, 1.0)))})


def stage_sizes(n_devices: int, policy: RolloutPolicy) -> list[int]:
    """Cumulative device counts per stage; each stage adds at least one device."""
    sizes: list[int] = []
    for fraction in policy.stages:
        size = min(n_devices, max(math.ceil(fraction * n_devices), (sizes[-1] + 1) if sizes else 1))
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return sizes


def canary_order(group: str, device_ids: Iterable[str]) -> list[str]:
    return sorted(device_ids, key=lambda d: hashlib.sha256(f"{group}/{d}".encode()).hexdigest())
