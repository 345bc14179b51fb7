"""The fairness and orphans benchmarks of issue 60 (benchmarks/fleet/catch_up_fairness.py,
superseded_late.py) at a small size: their counts, never their timings."""

from __future__ import annotations

from benchmarks.fleet import catch_up_fairness, superseded_late


def test_fairness_phases_alternate_and_every_late_target_commits():
    params, results, goals = catch_up_fairness.run(True, big=24, small=4, cap=8, rounds=1,
                                                   warm_up=False)
    assert params["max_catch_up"] == 8
    assert results["order"] == ["alone", "backlog"]
    alone, backlog = results["phases"]
    assert alone["late"]["big"] == {}  # the big group stayed away: nothing of it in flight
    assert alone["small_committed"] == backlog["small_committed"] == 4
    assert backlog["big_committed"] == 24 and backlog["in_flight_max"]["big"] <= 8
    assert results["alone"]["small_return_to_commit_s"]["n"] == 4
    assert results["backlog"]["small_return_to_commit_s"]["n"] == 4
    assert results["updated_twice"] == 0
    assert goals[0]["met"] and goals[0]["measured"] == 2


def test_a_superseded_release_with_held_late_targets_is_closed_and_the_engine_idles():
    _, results, goals = superseded_late.run(True, devices=10, held=4, timeout_s=5.0)
    assert results["r2_state"] == "completed"
    assert results["r1_held_in_flight_at_r2_end"] == 4  # the scenario made its orphans
    assert results["r1_in_flight_at_check"] == 0
    assert results["r1_held_statuses"] == {"deferred": 2, "timeout": 2}
    assert results["r2_late"] == {"committed": 2}  # the cut-off half caught up to R2 when back
    assert results["versions_at_end"] == {"3.0.0": 10}
    assert [g["met"] for g in goals] == [True, True, True]
