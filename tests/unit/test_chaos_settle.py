"""The chaos run's wait for the fleet to settle (benchmarks/fleet/chaos_run.py ``_settle``) judges device by device.

Seed 7 once failed ``server_view``: the wait compared devices per version, so a device claiming another group that
ran the release stood in for one still on the old version, and the run ended while that one was installing.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from benchmarks.fleet.chaos_checker import History
from benchmarks.fleet.chaos_run import ChaosConfig, _settle


class _Fleet:
    """Three devices; ``late`` moves to the release on the third look."""

    def __init__(self) -> None:
        self.looks = 0

    def device_versions(self) -> dict[str, str | None]:
        self.looks += 1
        return {"c1": "6.0.0", "late": "6.0.0" if self.looks >= 3 else "2.0.0", "claimer": "6.0.0"}


class _Store:
    """The server's view: it follows the fleet (as a server hearing every state would)."""

    def __init__(self, fleet: _Fleet) -> None:
        self.fleet = fleet

    def devices(self, group: str, status: str | None = None) -> list[SimpleNamespace]:
        late = "6.0.0" if self.fleet.looks >= 3 else "2.0.0"
        return [SimpleNamespace(id="c1", version="6.0.0"), SimpleNamespace(id="late", version=late)]

    def targets(self, rollout_id: str, status: object = None) -> list[object]:
        return []


def test_a_claiming_device_on_the_release_does_not_stand_in_for_one_still_installing():
    now = time.time()
    history = History(initial_version="1.0.0", began=now - 10, converge_s=2.0, group="chaos",
                      claims={"claimer": "elsewhere"},
                      actions=[{"what": "deploy", "version": "6.0.0", "state": "completed", "ended_at": now}])
    fleet = _Fleet()
    _settle(_Store(fleet), [fleet], history, ChaosConfig(converge_s=20.0, settle_s=5.0))  # type: ignore[arg-type]
    assert fleet.looks >= 3, "the wait ended while a device that is not claiming another group was still on 2.0.0"
    assert time.time() < now + 20.0, "it waited for the judging time instead of ending once every device converged"
