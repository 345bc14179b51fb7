"""What a stage is judged on, as the store hands it over: its devices and the baseline devices.

Plain records (no store, no clock), so the engine, the tests and the benchmarks feed the judge the
same way (:meth:`edgesdk.ota_server.store.verdicts.VerdictStore.stage_evidence` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesdk.fleet.records import TargetStatus

__all__ = ["StageDevice", "BaselineDevice", "UNKNOWN_BOARD"]

#: The board of a device whose agent did not say (its figures are compared with other such devices
#: only).
UNKNOWN_BOARD = "unknown"


@dataclass(frozen=True)
class StageDevice:
    """A device the stage sent the release to, as its target and its last state show it."""

    device_id: str
    board: str
    #: Where its target is (committed, or a failure status; in-flight ones are not judged yet).
    status: TargetStatus
    reason: str | None
    #: The version it ran before (its own baseline when no other device of its board has one).
    previous_version: str | None
    #: Whether its last state says it is online.
    online: bool
    #: Server time of its last state (None: it never reported).
    heard_at: float | None
    #: When its target last changed (its commit, for a committed one).
    updated: float
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class BaselineDevice:
    """A device of the group still on another version of the model, not sent any of the stages
    judged so far."""

    device_id: str
    board: str
    version: str | None
    heard_at: float | None
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)
