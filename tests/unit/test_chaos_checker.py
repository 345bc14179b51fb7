"""The chaos run's checker (benchmarks/_chaos_checker.py): a correct history passes, and each invariant, broken
on its own, is named with the device or rollout behind it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from benchmarks._chaos_checker import History, check, expected_versions, minimal_history
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetRecord, TargetStatus

C, RB = TargetStatus.COMMITTED, TargetStatus.REVERTED


def _rollout(rid, version, state, statuses, previous="1.0.0", created=100.0, rollback=False):
    targets = tuple(TargetRecord(rid, device, 0, status, None, previous, created, created + 1)
                    for device, status in statuses.items())
    return RolloutRecord(rid, "m", version, "g", RolloutPolicy(), state, 0, created, created, None, created,
                         created + 20, rollback, targets, (len(targets),))


def _events(rid, end="rollout_completed"):
    return [{"ts": 1.0, "type": "rollout_started", "rollout_id": rid, "device_id": None, "payload": {}},
            {"ts": 2.0, "type": "stage_sent", "rollout_id": rid, "device_id": None, "payload": {"stage": 0}},
            {"ts": 3.0, "type": end, "rollout_id": rid, "device_id": None, "payload": {}}]


@pytest.fixture
def good() -> History:
    """r1 puts both devices on 2.0.0; r2 (3.0.0) is aborted and a's commit is reverted; b never got it."""
    r1 = _rollout("r1", "2.0.0", RolloutState.COMPLETED, {"a": C, "b": C})
    r2 = _rollout("r2", "3.0.0", RolloutState.ABORTED, {"a": RB, "b": TargetStatus.PENDING}, previous="2.0.0",
                  created=200.0)
    return History(
        initial_version="1.0.0", started=["r1", "r2"], planned_targets={"r1": 2, "r2": 2},
        deadline_s={"r1": 60, "r2": 60}, rollouts={"r1": r1, "r2": r2},
        target_statuses={("r1", "a"): ["pending", "sent", "committed"], ("r1", "b"): ["sent", "committed"],
                         ("r2", "a"): ["sent", "committed", "reverting", "reverted"], ("r2", "b"): ["pending"]},
        events=_events("r1") + _events("r2", "rollout_aborted"),
        install_log={"a": [[110, "r1", "2.0.0", "committed", False], [210, "r2", "3.0.0", "committed", False],
                           [215, "r2-rollback", "2.0.0", "committed", True]],
                     "b": [[111, "r1", "2.0.0", "committed", False]]},
        final={"a": "2.0.0", "b": "2.0.0"},
        server_view={"a": ("online", "2.0.0"), "b": ("online", "2.0.0")})


def test_a_correct_history_passes(good):
    assert check(good) == []
    assert expected_versions(good) == {"a": "2.0.0", "b": "2.0.0"}


def _broken(good, change):
    h = copy.deepcopy(good)
    change(h)
    return [(v.invariant, v.subject) for v in check(h)]


def test_a_device_on_the_wrong_version_breaks_final_version_and_the_server_view_tells_it_apart(good):
    def wrong(h):  # a stayed on the aborted 3.0.0: the revert never reached it, and the server knows
        h.final["a"] = "3.0.0"
        h.server_view["a"] = ("online", "3.0.0")
    assert _broken(good, wrong) == [("final_version", "a")]


def test_a_device_that_never_answered_a_rollout_was_lost(good):
    def timed_out(h):  # b stayed on 1.0.0 and the server agrees: consistent, but the system lost it
        r1 = h.rollouts["r1"]
        h.rollouts["r1"] = replace(r1, targets=(r1.targets[0], replace(r1.targets[1], status=TargetStatus.TIMEOUT)),
                                   counts={})
        h.install_log.pop("b")
        h.final["b"], h.server_view["b"] = "1.0.0", ("online", "1.0.0")
        h.rollouts["r2"] = replace(h.rollouts["r2"], targets=h.rollouts["r2"].targets[:1], counts={})
        h.planned_targets["r2"] = 1
        del h.target_statuses[("r2", "b")]
    assert _broken(good, timed_out) == [("final_version", "b")]


def test_the_server_seeing_another_version_than_the_device_runs(good):
    def stale(h):
        h.server_view["b"] = ("online", "1.0.0")
    assert _broken(good, stale) == [("server_view", "b")]

    def missing(h):
        del h.server_view["b"]
    assert _broken(good, missing) == [("server_view", "b")]


def test_one_version_installed_twice_or_an_aborted_version_after_its_revert(good):
    def twice(h):  # b got 2.0.0 again under another deployment id
        h.install_log["b"].append([120, "r9", "2.0.0", "committed", False])
    assert _broken(good, twice) == [("installed_twice", "b")]

    def after_revert(h):  # a late copy of r2's command after a had been reverted (then a was reverted again)
        h.install_log["a"] += [[230, "r2", "3.0.0", "committed", False], [231, "r2-rollback", "2.0.0", "committed",
                                                                          True]]
    assert _broken(good, after_revert) == [("installed_twice", "a")] * 2  # 3.0.0 twice, and after its revert


def test_a_rollout_still_running_past_its_deadline_or_reverting_is_stuck(good):
    def running(h):
        h.rollouts["r2"] = replace(h.rollouts["r2"], state=RolloutState.RUNNING)
    assert ("stuck", "r2") in _broken(good, running)

    def slow(h):
        h.deadline_s["r1"] = 10
    assert _broken(good, slow) == [("stuck", "r1")]

    def reverting(h):
        r2 = h.rollouts["r2"]
        h.rollouts["r2"] = replace(r2, targets=(replace(r2.targets[0], status=TargetStatus.REVERTING), r2.targets[1]),
                                   counts={})
    assert _broken(good, reverting) == [("stuck", "r2")]


def test_a_device_left_on_an_aborted_version_was_not_reverted(good):
    def left(h):  # the abort sent a no revert: a's target stays committed, a stays on 3.0.0 (and the server knows)
        r2 = h.rollouts["r2"]
        h.rollouts["r2"] = replace(r2, targets=(replace(r2.targets[0], status=C), r2.targets[1]), counts={})
        h.install_log["a"].pop()
        h.target_statuses[("r2", "a")] = ["sent", "committed"]
        h.final["a"], h.server_view["a"] = "3.0.0", ("online", "3.0.0")
    broken = _broken(good, left)
    assert ("not_reverted", "r2") in broken and ("not_reverted", "a") in broken and ("final_version", "a") in broken


def test_a_committed_target_that_moves_back_went_backwards(good):
    def back(h):
        h.target_statuses[("r1", "b")] = ["sent", "committed", "sent"]
    assert _broken(good, back) == [("went_backwards", "r1/b")]

    def revert_in_completed(h):  # reverting belongs to aborted rollouts only
        h.target_statuses[("r1", "a")] = ["committed", "reverting"]
    assert _broken(good, revert_in_completed) == [("went_backwards", "r1/a")]

    def out_of_order(h):
        h.target_statuses[("r2", "a")] = ["sent", "committed", "reverted", "reverting"]
    assert _broken(good, out_of_order) == [("went_backwards", "r2/a")]


def test_two_drivers_a_lost_rollout_or_lost_targets_break_the_database_invariant(good):
    def two_drivers(h):
        h.events.append({"ts": 2.5, "type": "stage_sent", "rollout_id": "r1", "device_id": None,
                         "payload": {"stage": 0}})
    assert _broken(good, two_drivers) == [("database", "r1")]

    def ended_twice(h):
        h.events.append({"ts": 3.5, "type": "rollout_completed", "rollout_id": "r1", "device_id": None, "payload": {}})
    assert _broken(good, ended_twice) == [("database", "r1")]

    def lost(h):
        del h.rollouts["r2"]
    assert ("database", "r2") in _broken(good, lost)

    def fewer_targets(h):
        h.planned_targets["r1"] = 3
    assert _broken(good, fewer_targets) == [("database", "r1")]


def test_the_minimal_history_shows_the_device_and_rollout_behind_a_violation(good):
    h = copy.deepcopy(good)
    h.final["a"], h.server_view["a"] = "3.0.0", ("online", "3.0.0")
    (violation,) = check(h)
    lines = minimal_history(h, violation)
    assert lines[0] == "final_version: a: runs '3.0.0', its last rollout left it on '2.0.0'"
    assert any("install [215, 'r2-rollback', '2.0.0', 'committed', True]" in line for line in lines)
    assert any(line.startswith("  target r2: sent -> committed -> reverting -> reverted") for line in lines)
