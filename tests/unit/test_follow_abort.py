"""`push --wait` after an abort: the final state waits for a canary device still in its health check."""

from __future__ import annotations

from edgesdk.cli import fleet
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetStatus


def _record(state: RolloutState, counts: dict[TargetStatus, int]) -> RolloutRecord:
    return RolloutRecord("r1", "digits", "3.0.0", "cams", RolloutPolicy(), state, 0, 1.0, None, "1/2 devices failed",
                         1.0, 2.0, False, stage_sizes=(2, 20), counts=counts)


class _Server:
    """Answers the rollout's polls in turn: aborted with one canary device still installing, then settled."""

    def __init__(self, records: list[RolloutRecord]) -> None:
        self.records, self.polls = records, 0

    def rollout(self, rollout_id: str, **page: object) -> RolloutRecord:
        record = self.records[min(self.polls, len(self.records) - 1)]
        self.polls += 1
        return record


def test_an_aborted_rollout_is_followed_until_its_installing_devices_answered(monkeypatch):
    monkeypatch.setattr(fleet.time, "sleep", lambda s: None)
    installing = _record(RolloutState.ABORTED, {TargetStatus.INSTALLING: 1, TargetStatus.ROLLED_BACK: 1,
                                                TargetStatus.SKIPPED: 18})
    settled = _record(RolloutState.ABORTED, {TargetStatus.ROLLED_BACK: 2, TargetStatus.SKIPPED: 18})
    server = _Server([installing, installing, settled])
    final = fleet._follow(server, "r1", timeout=60)  # type: ignore[arg-type]
    assert final.count(TargetStatus.ROLLED_BACK) == 2 and server.polls == 4  # three polls, then the full record


def test_a_completed_rollout_is_not_held_by_anything_installing(monkeypatch):
    monkeypatch.setattr(fleet.time, "sleep", lambda s: None)
    done = _record(RolloutState.COMPLETED, {TargetStatus.COMMITTED: 20})
    server = _Server([done])
    assert fleet._follow(server, "r1", timeout=60) is done and server.polls == 2  # type: ignore[arg-type]
