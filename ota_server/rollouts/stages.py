"""The deterministic order in which a group's devices get a new version, stage by stage.

Stages are cumulative fractions of the group (:class:`edgesdk.fleet.records.RolloutPolicy`):
the canary first, then the later stages (``--canary 10% --waves 50,100`` → 10%, 50%,
100%). Every stage holds at least one more device than the last. Devices are ordered by
SHA-256 of ``group/device``, so the same devices are canaries every time and the order
needs no state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from edgesdk.fleet.records import RolloutPolicy

#: RolloutPolicy is re-exported for server-side code that imported it from here.
__all__ = ["RolloutPolicy", "stage_sizes", "canary_order"]


def stage_sizes(n_devices: int, policy: RolloutPolicy) -> list[int]:
    """Cumulative device counts per stage; each stage adds at least one device."""
    sizes: list[int] = []
    for fraction in policy.stages:
        size = min(n_devices, max(math.ceil(fraction * n_devices), (sizes[-1] + 1) if sizes else 1))
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return sizes


def canary_order(group: str, device_ids: Iterable[str]) -> list[str]:
    """``device_ids`` in the group's fixed rollout order (SHA-256 of ``group/device``): canaries first."""
    return sorted(device_ids, key=lambda d: hashlib.sha256(f"{group}/{d}".encode()).hexdigest())
