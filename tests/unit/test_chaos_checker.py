"""The chaos run's checker (benchmarks/fleet/chaos_checker.py): a correct history passes, and each invariant, broken
on its own, is named with the device or rollout behind it; each fault's effect is judged from the devices' logs."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from benchmarks.fleet.chaos_checker import ALL, History, check, fault_effects, minimal_history, online_stretch, releases
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetRecord, TargetStatus

C, RB = TargetStatus.COMMITTED, TargetStatus.REVERTED


def _rollout(rid, version, state, statuses, previous="1.0.0", created=100.0, rollback=False, group="g"):
    targets = tuple(TargetRecord(rid, device, 0, status, None, previous, created, created + 1)
                    for device, status in statuses.items())
    return RolloutRecord(rid, "m", version, group, RolloutPolicy(), state, 0, created, created, None, created,
                         created + 20, rollback, targets, (len(targets),))


def _events(rid, end="rollout_completed"):
    return [{"ts": 1.0, "type": "rollout_started", "rollout_id": rid, "device_id": None, "payload": {}},
            {"ts": 2.0, "type": "stage_sent", "rollout_id": rid, "device_id": None, "payload": {"stage": 0}},
            {"ts": 3.0, "type": end, "rollout_id": rid, "device_id": None, "payload": {}}]


def _action(rid, version, state, at, what="deploy"):
    return {"what": what, "version": version, "id": rid, "state": state, "started_at": at, "ended_at": at + 20}


@pytest.fixture
def good() -> History:
    """r1 puts both devices on 2.0.0; r2 (3.0.0) is aborted and a's commit is reverted; b never got it."""
    r1 = _rollout("r1", "2.0.0", RolloutState.COMPLETED, {"a": C, "b": C})
    r2 = _rollout("r2", "3.0.0", RolloutState.ABORTED, {"a": RB, "b": TargetStatus.PENDING}, previous="2.0.0",
                  created=200.0)
    return History(
        initial_version="1.0.0", started=["r1", "r2"], planned_targets={"r1": 2, "r2": 2},
        deadline_s={"r1": 60, "r2": 60}, rollouts={"r1": r1, "r2": r2},
        actions=[_action("r1", "2.0.0", "completed", 100.0), _action("r2", "3.0.0", "aborted", 200.0)],
        began=90.0, ended=400.0, converge_s=30.0, group="g",
        target_statuses={("r1", "a"): ["pending", "sent", "committed"], ("r1", "b"): ["sent", "committed"],
                         ("r2", "a"): ["sent", "committed", "reverting", "reverted"], ("r2", "b"): ["pending"]},
        events=_events("r1") + _events("r2", "rollout_aborted"),
        install_log={"a": [[110, "r1", "2.0.0", "committed", False], [210, "r2", "3.0.0", "committed", False],
                           [215, "r2-rollback", "2.0.0", "committed", True]],
                     "b": [[111, "r1", "2.0.0", "committed", False]]},
        final={"a": "2.0.0", "b": "2.0.0"},
        server_view={"a": ("online", "2.0.0"), "b": ("online", "2.0.0")}, server_groups={"a": "g", "b": "g"})


def test_a_correct_history_passes(good):
    assert check(good) == []
    assert releases(good) == [(90.0, "1.0.0"), (120.0, "2.0.0")]  # the aborted 3.0.0 changed nothing


def _broken(good, change):
    h = copy.deepcopy(good)
    change(h)
    return [(v.invariant, v.subject) for v in check(h)]


def test_a_device_off_the_release_while_online_breaks_convergence_and_the_server_view_tells_it_apart(good):
    def wrong(h):  # a stayed on the aborted 3.0.0: the revert never reached it, and the server knows
        h.final["a"] = "3.0.0"
        h.server_view["a"] = ("online", "3.0.0")
    assert _broken(good, wrong) == [("convergence", "a")]


@pytest.fixture
def offline_at_the_last_push() -> History:
    """4.0.0 reaches a, b and c; c is offline when 6.0.0 starts (at 200) and back at 240; 6.0.0 targets a and b
    only, and c stays on 4.0.0: by the server's targets c's last rollout left it where it is."""
    r4 = _rollout("r4", "4.0.0", RolloutState.COMPLETED, {"a": C, "b": C, "c": C})
    r6 = _rollout("r6", "6.0.0", RolloutState.COMPLETED, {"a": C, "b": C}, previous="4.0.0", created=200.0)
    return History(
        initial_version="1.0.0", started=["r4", "r6"], planned_targets={"r4": 3, "r6": 2},
        deadline_s={"r4": 60, "r6": 60}, rollouts={"r4": r4, "r6": r6},
        actions=[_action("r4", "4.0.0", "completed", 100.0), _action("r6", "6.0.0", "completed", 200.0)],
        began=90.0, ended=400.0, converge_s=30.0, group="g", offline={"c": [(190.0, 240.0)]},
        target_statuses={("r4", d): ["sent", "committed"] for d in "abc"} | {("r6", d): ["sent", "committed"]
                                                                             for d in "ab"},
        events=_events("r4") + _events("r6"),
        install_log={d: [[110, "r4", "4.0.0", "committed", False]] + ([[210, "r6", "6.0.0", "committed", False]]
                                                                      if d != "c" else []) for d in "abc"},
        final={"a": "6.0.0", "b": "6.0.0", "c": "4.0.0"},
        server_view={"a": ("online", "6.0.0"), "b": ("online", "6.0.0"), "c": ("online", "4.0.0")},
        server_groups=dict.fromkeys("abc", "g"))


def test_a_device_offline_when_the_last_push_started_must_still_end_on_it(offline_at_the_last_push):
    """The case the old check passed (it took the expected version from the server's targets): c was online for
    160 s after it came back, and the server never sent it the release."""
    h = offline_at_the_last_push
    assert [(v.invariant, v.subject) for v in check(h)] == [("convergence", "c")]
    assert online_stretch(h, "c", 220.0) == 160.0

    def caught_up(h):  # the reconciler sent c 6.0.0 when it came back
        h.install_log["c"].append([245, "r6", "6.0.0", "committed", False])
        h.final["c"], h.server_view["c"] = "6.0.0", ("online", "6.0.0")
    assert _broken(h, caught_up) == []

    def back_too_late_to_judge(h):  # back 15 s before the end: not yet online long enough to be judged
        h.offline["c"] = [(190.0, 385.0)]
    assert _broken(h, back_too_late_to_judge) == []

    def the_broker_restarted(h):  # every device offline 300..380: c's longest stretch is 240..300, still 60 s
        h.offline[ALL] = [(300.0, 380.0)]
    assert _broken(h, the_broker_restarted) == [("convergence", "c")]


def test_a_device_provisioned_during_the_run_must_end_on_the_release(offline_at_the_last_push):
    def joined(h, at):
        h.joined["d"] = at
        h.final["d"], h.server_view["d"], h.server_groups["d"] = "1.0.0", ("online", "1.0.0"), "g"
    h = offline_at_the_last_push
    h.final["c"], h.server_view["c"] = "6.0.0", ("online", "6.0.0")
    h.install_log["c"].append([245, "r6", "6.0.0", "committed", False])
    assert _broken(h, lambda h: joined(h, 300.0)) == [("convergence", "d")]
    assert _broken(h, lambda h: joined(h, 390.0)) == []  # joined 10 s before the end


def test_the_release_is_the_last_completed_rollout_a_rollback_included(good):
    good.actions += [_action("r3", "4.0.0", "completed", 250.0), _action("r4", "2.0.0", "completed", 300.0,
                                                                         "rollback"),
                     _action("r5", "5.0.0", "aborted", 330.0, "abort")]
    assert releases(good)[-1] == (320.0, "2.0.0")
    assert check(good) == []  # both devices run 2.0.0 (r3..r5 are not in the database: only the actions count here)
    good.actions.pop(1 + 2)  # without the rollback, the release is 4.0.0 and both have been online long after
    assert [(v.invariant, v.subject) for v in check(good)] == [("convergence", "a"), ("convergence", "b")]


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
    assert _broken(good, timed_out) == [("convergence", "b"), ("lost", "b")]


def test_a_device_claiming_another_group_stays_in_its_own_and_is_judged_by_that_only(good):
    good.claims["b"] = "elsewhere"
    good.server_view["b"] = ("online", "1.0.0")  # its reports are refused: the server cannot know its version
    assert check(good) == []

    def moved(h):
        h.server_groups["b"] = "elsewhere"
    assert _broken(good, moved) == [("group", "b")]

    def targeted(h):
        h.other_rollouts["x"] = _rollout("x", "2.0.0", RolloutState.ABORTED, {"b": TargetStatus.SENT},
                                         group="elsewhere")
    assert _broken(good, targeted) == [("group", "b")]


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

    def reverting_while_offline(h):  # a went offline as r2 was aborted and came back 10 s before the end
        reverting(h)
        h.offline["a"] = [(215.0, 390.0)]
    assert _broken(good, reverting_while_offline) == []


def test_a_device_left_on_an_aborted_version_was_not_reverted(good):
    def left(h):  # the abort sent a no revert: a's target stays committed, a stays on 3.0.0 (and the server knows)
        r2 = h.rollouts["r2"]
        h.rollouts["r2"] = replace(r2, targets=(replace(r2.targets[0], status=C), r2.targets[1]), counts={})
        h.install_log["a"].pop()
        h.target_statuses[("r2", "a")] = ["sent", "committed"]
        h.final["a"], h.server_view["a"] = "3.0.0", ("online", "3.0.0")
    broken = _broken(good, left)
    assert ("not_reverted", "r2") in broken and ("not_reverted", "a") in broken and ("convergence", "a") in broken


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

    def final_to_deferred(h):
        h.target_statuses[("r1", "b")] = ["sent", "rolled_back", "deferred"]
    assert _broken(good, final_to_deferred) == [("went_backwards", "r1/b")]


def test_a_device_that_went_offline_mid_install_may_be_deferred_and_sent_again(good):
    good.target_statuses[("r1", "b")] = ["sent", "downloading", "installing", "deferred", "sent", "downloading",
                                         "committed"]
    good.target_statuses[("r1", "a")] = ["sent", "installing", "downloading", "committed"]  # the deferral unseen
    assert check(good) == []


def test_a_never_sent_deferred_target_may_be_replanned_pending_but_not_a_sent_one(good):
    # Seen in a chaos run: offline at the push, deferred, then moved to a later stage (push_back).
    good.target_statuses[("r1", "b")] = ["pending", "deferred", "pending", "sent", "downloading", "committed"]
    assert check(good) == []

    def sent_then_pending(h):
        h.target_statuses[("r1", "b")] = ["pending", "sent", "deferred", "pending", "sent", "committed"]
    assert _broken(good, sent_then_pending) == [("went_backwards", "r1/b")]


def test_two_drivers_a_lost_rollout_or_lost_targets_break_the_database_invariant(good):
    def two_drivers(h):
        h.events.append({"ts": 2.5, "type": "stage_sent", "rollout_id": "r1", "device_id": None,
                         "payload": {"stage": 0, "holder": "r-1"}})
    h = copy.deepcopy(good)
    two_drivers(h)
    (violation,) = check(h)
    assert (violation.invariant, violation.subject) == ("database", "r1") and "sent more than once" in str(violation)

    def ended_twice(h):
        h.events.append({"ts": 3.5, "type": "rollout_completed", "rollout_id": "r1", "device_id": None, "payload": {}})
    assert _broken(good, ended_twice) == [("database", "r1")]

    def lost(h):
        del h.rollouts["r2"]
    assert ("database", "r2") in _broken(good, lost)

    def fewer_targets(h):
        h.planned_targets["r1"] = 3
    assert _broken(good, fewer_targets) == [("database", "r1")]

    def late_targets_added(h):  # devices that joined later become targets: more is fine
        h.planned_targets["r1"] = 1
    assert _broken(good, late_targets_added) == []


def test_the_minimal_history_shows_the_device_and_rollout_behind_a_violation(good):
    h = copy.deepcopy(good)
    h.final["a"], h.server_view["a"] = "3.0.0", ("online", "3.0.0")
    h.offline["a"] = [(150.0, 160.0)]
    (violation,) = check(h)
    lines = minimal_history(h, violation)
    assert lines[0] == "convergence: a: runs '3.0.0', online 240 s in one stretch after release 2.0.0 (set at +30.0 s)"
    assert "  release 2.0.0 from +30.0s" in lines and "  offline +60.0s .. +70.0s" in lines
    assert any("install +125.0s ['r2-rollback', '2.0.0', 'committed', True]" in line for line in lines)
    assert any(line.startswith("  target r2: sent -> committed -> reverting -> reverted") for line in lines)


def _effect(history, fault):
    history.faults = [{"applied_at": 150.0, "done_s": 60.0, **fault}]
    return fault_effects(history)[0]["effective"]


def test_a_fault_counts_only_when_it_took_effect(good):
    good.sim_counts = {"crashes": 1, "chunks_rejected": 2}
    # a crash armed before an install happened; one armed on b, which installed nothing after, did not
    assert _effect(good, {"kind": "crash", "step": 1, "ids": ["a"], "reached": 1})
    assert not _effect(good, {"kind": "crash", "step": 1, "ids": ["b"], "reached": 1})
    # corrupt chunks reach a device that fetches an archive after (a fetched 3.0.0 at 210); b fetched nothing
    assert _effect(good, {"kind": "corrupt", "step": 1, "ids": ["a"], "reached": 1})
    assert not _effect(good, {"kind": "corrupt", "step": 1, "ids": ["b"], "reached": 1})
    good.sim_counts["chunks_rejected"] = 0  # nothing refused over the whole fleet: no corrupt chunk arrived
    assert not _effect(good, {"kind": "corrupt", "step": 1, "ids": ["a"], "reached": 1})
    # a kill meant for the lease holder of a running rollout
    assert _effect(good, {"kind": "kill_replica", "step": 1, "must_hit_holder": True, "killed": "r0",
                          "hit_holder": "r1"})
    assert not _effect(good, {"kind": "kill_replica", "step": 1, "must_hit_holder": True, "killed": "r0",
                              "hit_holder": None})
    # a device offline at a push is deferred by it
    good.target_statuses[("r2", "b")] = ["pending", "deferred"]
    assert _effect(good, {"kind": "offline_at_push", "step": 1, "ids": ["b"], "reached": 1, "rollout_id": "r2"})
    assert not _effect(good, {"kind": "offline_at_push", "step": 1, "ids": ["a"], "reached": 1, "rollout_id": "r2"})
    # a claim refused, and the push to the claimed group refused too
    claim = {"kind": "claim_group", "step": 0, "ids": ["b"], "reached": 1, "refused_states": 3,
             "push": "refused: group has no device", "params": {"group": "x"}}
    assert _effect(good, claim)
    assert not _effect(good, {**claim, "refused_states": 0})
    assert not _effect(good, {"kind": "partition", "at_s": 3.0, "ids": ["a", "b"], "reached": 1})
    assert not _effect(good, {"kind": "partition", "at_s": 3.0, "ids": ["a"], "error": "OSError: gone"})
