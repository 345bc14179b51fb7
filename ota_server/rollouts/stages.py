"""The deterministic order in which a group's devices get a new version, stage by stage.

Stages are cumulative fractions of the group (:class:`edgesdk.fleet.records.RolloutPolicy`):
the canary first, then the later stages (``--canary 10% --waves 50,100`` → 10%, 50%,
100%). The canary holds ceil(fraction × devices) devices and at least one (34% of 3 → 2,
1% of 3 → 1, 100% of 3 → 3). Every later stage holds ceil(its fraction × devices), but at
least one more device than the stage before, and never more than the group: a wave left
with no device of its own (``--waves 67,100`` on 3 devices: 67% already takes all 3) is
**collapsed** into the stage before it; :func:`stage_plan` reports it so the operator
hears of it. Devices are ordered by SHA-256 of ``group/device``, so the same devices are
canaries every time and the order needs no state; with boards known, the order takes the
boards in turn (:func:`board_balanced_order`), so a canary of a mixed group holds devices of
every board in proportion, and each board's verdict (a majority of its devices) rests on more
than one device wherever the stage is big enough.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.records import RolloutPolicy, RolloutRecord

#: RolloutPolicy is re-exported for server-side code that imported it from here.
__all__ = ["RolloutPolicy", "PlannedStage", "stage_plan", "stage_sizes", "collapsed", "plan_json", "canary_order",
           "board_balanced_order"]

#: ``0.07 * 100`` is ``7.000000000000001`` in floating point: a product this close to an integer is that integer,
#: so 7% of 100 devices is 7, not 8.
_EPSILON = 1e-9


@dataclass(frozen=True)
class PlannedStage:
    """One requested stage of a rollout over a group of a given size."""

    #: The stage's cumulative fraction as asked for (``--canary`` or one of ``--waves``).
    fraction: float
    #: Devices that have the version once this stage is sent (cumulative), and how many it adds.
    devices: int
    added: int

    @property
    def collapsed(self) -> bool:
        """True for a wave that adds no device: it is merged into the stage before it (never the canary)."""
        return self.added == 0 and self.devices > 0

    def to_json(self) -> dict[str, Any]:
        """The stage in the API's ``plan`` list."""
        return {"percent": round(self.fraction * 100, 6), "devices": self.devices, "added": self.added,
                "collapsed": self.collapsed}


def _ceil(fraction: float, n_devices: int) -> int:
    """ceil(fraction × n_devices), without floating point's 7.000000000000001 becoming 8."""
    return math.ceil(fraction * n_devices - _EPSILON)


def stage_plan(n_devices: int, policy: RolloutPolicy) -> list[PlannedStage]:
    """Every stage the policy asks for over ``n_devices``, collapsed ones included (see the module's rule)."""
    plan: list[PlannedStage] = []
    before = 0
    for fraction in policy.stages:
        least = before + 1 if plan else 1
        size = min(n_devices, max(_ceil(fraction, n_devices), least))
        size = max(size, before)
        plan.append(PlannedStage(fraction, size, size - before))
        before = size
    return plan


def stage_sizes(n_devices: int, policy: RolloutPolicy) -> list[int]:
    """Cumulative device counts of the stages actually sent (collapsed waves left out); each adds a device."""
    plan = stage_plan(n_devices, policy)
    return [plan[0].devices, *(s.devices for s in plan[1:] if s.added)]


def collapsed(plan: Iterable[PlannedStage]) -> list[PlannedStage]:
    """The waves of ``plan`` that add no device."""
    return [s for s in plan if s.collapsed]


def plan_json(r: RolloutRecord) -> list[dict[str, Any]]:
    """The rollout's ``plan`` JSON: every stage asked for, over the devices it had when it started."""
    n_devices = r.stage_sizes[-1] if r.stage_sizes else r.targets_total or 0
    return [s.to_json() for s in stage_plan(n_devices, r.policy)]


def canary_order(group: str, device_ids: Iterable[str]) -> list[str]:
    """``device_ids`` in the group's fixed rollout order (SHA-256 of ``group/device``): canaries first."""
    return sorted(device_ids, key=lambda d: hashlib.sha256(f"{group}/{d}".encode()).hexdigest())


def board_balanced_order(group: str, boards: Mapping[str, str | None]) -> list[str]:
    """The devices of ``boards`` (device id -> its board) in the group's rollout order, taking the boards in turn in
    proportion to their size: each board's devices keep their :func:`canary_order`; every board's first device comes
    before any board's second (a canary at least as big as the number of boards holds each board), then the board
    furthest behind its share goes next, so any stage holds about every board's share of it."""
    by_board: dict[str, list[str]] = {}
    for device in canary_order(group, boards):
        by_board.setdefault(boards[device] or "", []).append(device)
    total = len(boards)
    taken = dict.fromkeys(by_board, 0)
    order: list[str] = []
    while len(order) < total:
        # The board furthest behind its share of the order so far goes next (ties: the larger board, then by name).
        board = min((b for b in by_board if taken[b] < len(by_board[b])),
                    key=lambda b: (taken[b] / len(by_board[b]), -len(by_board[b]), b))
        order.append(by_board[board][taken[board]])
        taken[board] += 1
    return order
