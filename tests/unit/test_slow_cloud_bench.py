"""The slow-cloud benchmark's verdicts: each needs evidence, and no data is never a pass."""

from __future__ import annotations

import copy

from benchmarks.endpoint.slow_cloud import goals_of

ROUND = {"cloud_user_requests_server": 0.0, "cloud_user_requests_device": 0}
GOOD = {
    "slo_ms": 20.0,
    "cloud": {"round_trip_over_slo": 3.4, "server_requests_total": 7.0, "probes_total": 1},
    "rounds": [dict(ROUND)],
    "pooled": {"p99_ms": 19.0, "refused": 100, "refusal_p99_ms": 0.4, "dropped": 0, "failed": 0,
               "unfinished": 0},
}


def _met(results) -> list[bool]:
    return [g["met"] for g in goals_of(results)]


def test_all_three_goals_are_met_on_good_figures():
    assert _met(GOOD) == [True, True, True]


def test_a_user_request_on_either_side_fails_the_first_goal():
    for key in ROUND:
        results = copy.deepcopy(GOOD)
        results["rounds"][0][key] = 1
        assert _met(results)[0] is False


def test_a_server_counter_that_did_not_see_the_probes_makes_zero_user_requests_inconclusive():
    results = copy.deepcopy(GOOD)
    results["cloud"]["server_requests_total"] = 0.0
    [first, *_] = goals_of(results)
    assert first["met"] is False and "inconclusive" in first["name"]


def test_a_cloud_not_three_times_slower_counts_for_nothing():
    results = copy.deepcopy(GOOD)
    results["cloud"]["round_trip_over_slo"] = 2.9
    assert _met(results)[:2] == [False, False]


def test_no_refusal_and_no_admitted_request_are_not_passes():
    results = copy.deepcopy(GOOD)
    results["pooled"].update(refused=0, refusal_p99_ms=None, p99_ms=None)
    assert _met(results)[1:] == [False, False]
