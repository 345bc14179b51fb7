"""The canary judge on given figures: each device against its board's baseline, boards by majority, failing closed.

The figures are the ``traffic`` object an agent publishes (:mod:`edgesdk.fleet.traffic`), built here by hand so each
rule is checked on exact numbers; the engine acting on verdicts is in ``test_canary_engine.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutPolicy, TargetStatus
from edgesdk.ota_server.rollouts.analysis.confidence import p99_rank, rate_lower, rate_upper
from edgesdk.ota_server.rollouts.analysis.evidence import BaselineDevice, StageDevice
from edgesdk.ota_server.rollouts.analysis.stage import judge_stage

NOW = 1_000_000.0
POLICY = RolloutPolicy()


def traffic(version: str, p99: float | None, calls: int = 500, errors: int = 0, restarts: int = 0, local: int = 0,
            cloud: int = 0, window_s: float = 60.0, **more: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's ``traffic`` object with one version's figures (``more``: other versions' entries)."""
    entry = {"from": NOW - window_s, "to": NOW, "calls": calls, "errors": errors,
             "p50_ms": None if p99 is None else p99 / 3, "p95_ms": None if p99 is None else p99 / 1.1, "p99_ms": p99,
             "local": local, "cloud": cloud, "apps": 1, "starts": 1 + restarts, "restarts": restarts}
    return {"format": 1, "at": NOW, "horizon_s": 900, "versions": {version: entry, **more}}


def canary(device: str, figures: Mapping[str, Any] | None, board: str = "rk3588", status=TargetStatus.COMMITTED,
           online: bool = True, heard: float = NOW - 5, previous: str | None = "1.0.0") -> StageDevice:
    """A device of the stage whose agent reported ``figures`` as its ``traffic`` (None: no traffic at all)."""
    return StageDevice(device, board, status, None if status == TargetStatus.COMMITTED else "health check failed",
                       previous, online, heard, NOW - 100, {} if figures is None else {"traffic": figures})


def base(device: str, p99: float, board: str = "rk3588", heard: float = NOW - 5, **kw) -> BaselineDevice:
    return BaselineDevice(device, board, "1.0.0", heard, {"traffic": traffic("1.0.0", p99, **kw)})


def old_fleet(n: int = 5, p99: float = 5.0, board: str = "rk3588", **kw) -> list[BaselineDevice]:
    return [base(f"{board}-old{i}", p99 * (1 + i / 100), board, **kw) for i in range(n)]


def judge(devices, baseline=(), snapshot=None, policy=POLICY, final=True):
    verdict, keep = judge_stage(policy, 0, "2.0.0", devices, baseline, snapshot, NOW, final=final)
    return verdict, keep


def new_fleet(p99s: list[float], board: str = "rk3588", **kw) -> list[StageDevice]:
    return [canary(f"{board}-new{i}", traffic("2.0.0", p99, **kw), board) for i, p99 in enumerate(p99s)]


# latency ---------------------------------------------------------------------------------------
def test_a_slower_release_fails_each_device_against_its_board_and_the_verdict_cites_them():
    verdict, keep = judge(new_fleet([15.0, 15.2, 14.9]), old_fleet())
    assert (verdict["outcome"], verdict["passed"], verdict["final"]) == ("failed", False, True)
    assert verdict["reason"].startswith("on rk3588, 3 of 3 devices failed: rk3588-new0: p99 15 ms is 2.9x the live "
                                        "baseline's 5.1 ms (> 1.5x; at least 2.7x with 95% confidence)")
    assert keep is None and {d["outcome"] for d in verdict["devices"]} == {"fail"}


def test_a_release_as_fast_as_the_old_one_passes_and_keeps_each_boards_baseline():
    verdict, keep = judge(new_fleet([5.1, 5.0, 4.9]), old_fleet())
    assert verdict["outcome"] == "passed" and verdict["reason"].startswith("3 of 3 devices passed over 1 board")
    assert keep["boards"]["rk3588"]["devices"] == 5 and keep["boards"]["rk3588"]["p99_ms"] == pytest.approx(5.1)


def test_one_lying_device_can_neither_force_an_abort_nor_lift_the_floor():
    liar = canary("liar", traffic("2.0.0", 500.0, errors=400))
    verdict, _ = judge(new_fleet([5.1, 5.0, 5.2]) + [liar], old_fleet())
    assert verdict["outcome"] == "passed", verdict["reason"]
    slow = new_fleet([12.0, 12.1, 11.9])
    fast_liar = base("fast-liar", 0.01)  # a baseline device claiming a tiny p99 does not move the median
    assert judge(slow, old_fleet() + [fast_liar])[0]["outcome"] == "failed"
    hidden = judge(slow, old_fleet() + [base("slow-liar", 1000.0, calls=10**6)])[0]
    assert hidden["outcome"] == "failed", "a baseline liar's huge figures do not lift the floor either"


def test_a_mixed_fleet_is_judged_board_by_board_not_on_the_mix():
    """A Jetson canary 1.8x slower than the Jetsons still on the old version fails, although against the whole
    mix (Pis at 20 ms, Jetsons at 5 ms) it looks faster."""
    new = new_fleet([9.0, 9.1, 9.2], "jetson") + new_fleet([20.0, 20.5], "raspberry-pi-5")
    old = old_fleet(2, 5.0, "jetson") + old_fleet(4, 20.0, "raspberry-pi-5")
    verdict, _ = judge(new, old)
    assert verdict["outcome"] == "failed" and verdict["reason"].startswith("on jetson, 3 of 3 devices failed")
    assert {b["board"]: b["outcome"] for b in verdict["boards"]} == {"jetson": "failed", "raspberry-pi-5": "passed"}


def test_a_board_without_a_baseline_of_its_own_uses_its_snapshot_or_its_own_previous_version_never_skipped():
    jetsons = new_fleet([50.0, 51.0], "jetson")  # 10x slower than the Jetsons were; no Jetson left on 1.0.0
    pis = new_fleet([20.0, 20.5], "raspberry-pi-5")
    old = old_fleet(4, 20.0, "raspberry-pi-5")
    alone, _ = judge(jetsons + pis, old)
    assert alone["outcome"] == "inconclusive" and "on jetson, 0 of 2 devices have evidence" in alone["reason"]
    assert "no baseline for its board" in alone["reason"]
    snapshot = {"boards": {"jetson": {"devices": 3, "p99_ms": 5.0, "error_rate": 0.0, "offload_share": None,
                                      "at": NOW - 600}}}
    kept, _ = judge(jetsons + pis, old, snapshot)
    assert kept["outcome"] == "failed" and "the snapshot baseline's 5 ms" in kept["reason"]
    own = [canary(f"jetson-new{i}", traffic("2.0.0", 50.0, **{"1.0.0": traffic("1.0.0", 5.0)["versions"]["1.0.0"]}),
                  "jetson") for i in range(2)]
    assert judge(own + pis, old)[0]["outcome"] == "failed"


def test_baselines_older_than_the_stated_age_are_not_used():
    stale = old_fleet(heard=NOW - 2 * 3600)
    verdict, _ = judge([canary(f"n{i}", traffic("2.0.0", 15.0), previous=None) for i in range(3)], stale)
    assert verdict["outcome"] == "inconclusive" and "no baseline" in verdict["reason"]
    old_snapshot = {"boards": {"rk3588": {"devices": 3, "p99_ms": 5.0, "error_rate": 0.0, "offload_share": None,
                                          "at": NOW - 2 * 3600}}}
    assert judge([canary("n", traffic("2.0.0", 15.0), previous=None)], (), old_snapshot)[0]["outcome"] == "inconclusive"


# errors -----------------------------------------------------------------------------------------
def test_every_call_failing_is_a_failure_not_missing_figures():
    verdict, _ = judge([canary(f"n{i}", traffic("2.0.0", None, calls=40, errors=40)) for i in range(3)], old_fleet())
    assert verdict["outcome"] == "failed" and "error rate 100.00% (40/40 calls)" in verdict["reason"]


def test_the_error_rule_is_a_significance_test_both_ways():
    """2 errors in 100 calls against a 0.5% baseline and a 1-point limit is not an abort, nor yet a pass; 50 in 1,000
    is an abort; 3 in 1,000 is a pass; no error in 300 calls is within a 1-point limit, none in 100 is not yet."""
    assert rate_lower(2, 100) < 0.015 < rate_lower(50, 1000)
    assert rate_upper(3, 1000) < 0.015 < rate_upper(2, 100)
    assert rate_upper(0, 300) < 0.01 < rate_upper(0, 100)
    baseline = old_fleet(calls=1000, errors=5)
    lucky = judge([canary(f"n{i}", traffic("2.0.0", 5.0, calls=100, errors=2)) for i in range(3)], baseline)[0]
    assert lucky["outcome"] == "inconclusive" and "too few calls yet to be 95% sure" in lucky["reason"]
    fine = judge([canary(f"n{i}", traffic("2.0.0", 5.0, calls=1000, errors=3)) for i in range(3)], baseline)[0]
    assert fine["outcome"] == "passed", fine["reason"]
    worse = judge([canary(f"n{i}", traffic("2.0.0", 5.0, calls=1000, errors=50)) for i in range(3)], baseline)[0]
    assert worse["outcome"] == "failed" and "above the baseline's 0.50% + 1.00%" in worse["reason"]


def test_one_device_with_a_huge_call_count_does_not_hide_the_others_errors():
    liar = canary("liar", traffic("2.0.0", 5.0, calls=10**7, errors=0, window_s=3600))
    honest = [canary(f"n{i}", traffic("2.0.0", 5.0, calls=1000, errors=500)) for i in range(3)]
    assert judge(honest + [liar], old_fleet())[0]["outcome"] == "failed"


# devices that count against the stage ------------------------------------------------------------
def test_failed_installs_silent_and_offline_canaries_and_crash_loops_count_against_the_stage():
    fine = traffic("2.0.0", 5.0)
    against = [canary("rolled-back", None, status=TargetStatus.ROLLED_BACK), canary("offline", fine, online=False),
               canary("silent", fine, heard=NOW - 600), canary("looping", traffic("2.0.0", 5.0, restarts=3))]
    verdict, _ = judge(against + [canary("ok", fine)], old_fleet())
    assert verdict["outcome"] == "failed", verdict["reason"]
    reasons = {d["device"]: d["reason"] for d in verdict["devices"]}
    assert reasons["rolled-back"].startswith("its install failed (rolled_back)")
    assert reasons["offline"] == "went offline after it committed"
    assert reasons["silent"] == "silent: no state for 600 s (none since it committed)"
    assert reasons["looping"] == "its app restarted 3 times on 2.0.0 (a crash loop)"


# thin evidence ------------------------------------------------------------------------------------
def test_thin_evidence_waits_until_the_deadline_then_is_inconclusive_never_a_pass():
    thin = [canary(f"n{i}", traffic("2.0.0", 5.0, calls=30)) for i in range(4)]
    waiting, keep = judge(thin, old_fleet(), final=False)
    assert (waiting["outcome"], waiting["passed"], waiting["final"], keep) == ("waiting", False, False, None)
    final, _ = judge(thin, old_fleet(), final=True)
    assert final["outcome"] == "inconclusive" and "0 of 4 devices have evidence, 2 needed" in final["reason"]
    assert "made 30 of the 100 calls needed on 2.0.0" in final["reason"]
    nothing, _ = judge([canary(f"n{i}", None) for i in range(4)], old_fleet())
    assert nothing["outcome"] == "inconclusive" and "reports no app traffic" in nothing["reason"]


def test_half_the_stage_with_evidence_is_enough_and_one_device_is_never_too_few():
    half = new_fleet([5.0, 5.1]) + [canary(f"thin{i}", traffic("2.0.0", 5.0, calls=10)) for i in range(2)]
    assert judge(half, old_fleet())[0]["outcome"] == "passed"
    assert judge(new_fleet([5.0]), old_fleet())[0]["outcome"] == "passed"
    one_in_three = new_fleet([5.0]) + [canary(f"thin{i}", traffic("2.0.0", 5.0, calls=10)) for i in range(2)]
    assert judge(one_in_three, old_fleet())[0]["outcome"] == "inconclusive"


def test_a_board_is_judged_as_if_its_one_failing_device_were_not_there():
    """Two pass, the liar fails, two are thin: without the liar, 2 of 4 devices passed, which is half: passed. With
    only one pass besides the liar, 1 of 4 is not: inconclusive, as it would be without the liar."""
    liar = canary("liar", traffic("2.0.0", 500.0, calls=1000, errors=500))
    thin = [canary(f"thin{i}", traffic("2.0.0", 5.0, calls=10)) for i in range(2)]
    verdict, _ = judge(new_fleet([5.0, 5.1]) + [liar] + thin, old_fleet())
    assert verdict["outcome"] == "passed" and "outvoted: liar" in verdict["reason"], verdict["reason"]
    fewer, _ = judge(new_fleet([5.0]) + [liar] + thin + [canary("thin9", traffic("2.0.0", 5.0, calls=10))],
                     old_fleet())
    assert fewer["outcome"] == "inconclusive"


def test_one_failing_device_is_outvoted_but_a_split_board_is_inconclusive():
    assert judge(new_fleet([5.0, 15.0]), old_fleet())[0]["outcome"] == "passed"
    split, _ = judge(new_fleet([5.0, 5.1, 15.0, 15.2]), old_fleet())
    assert split["outcome"] == "inconclusive" and "2 passed and 2 failed of 4 devices" in split["reason"]
    few, _ = judge(new_fleet([15.0, 15.1]) + [canary(f"thin{i}", traffic("2.0.0", 5.0, calls=10)) for i in range(3)],
                   old_fleet())
    assert few["outcome"] == "inconclusive", "2 failing of 5 are not the 3 a board needs to fail"


@pytest.mark.parametrize("bad, why", [
    ({"calls": -5}, "calls"), ({"errors": 600}, "errors"), ({"p99_ms": float("nan")}, "p99"),
    ({"p50_ms": 9.0, "p99_ms": 1.0}, "p50"), ({"calls": 10**9}, "calls"), ({"from": NOW + 10}, "from")])
def test_figures_that_break_the_rules_are_refused_and_never_pass(bad, why):
    details = traffic("2.0.0", 5.0)
    details["versions"]["2.0.0"].update(bad)
    verdict, _ = judge([canary("n0", details)], old_fleet())
    assert verdict["outcome"] == "inconclusive"
    (device,) = verdict["devices"]
    assert device["outcome"] == "thin" and device["reason"].startswith("its figures are malformed") and why in \
        device["reason"]


def test_no_analysis_passes_on_install_reports_and_says_what_was_not_judged():
    verdict, _ = judge([], (), policy=RolloutPolicy(analysis=False))
    assert verdict["passed"] and verdict["reason"].startswith("not judged: canary analysis is off")
    off = RolloutPolicy(max_p99_ratio=None, max_error_rate=None, max_offload_share=None)
    assert not off.judged and off.not_judged() == ["every threshold is off: stages pass on install reports alone"]
    assert RolloutPolicy(max_p99_ratio=None).not_judged() == ["latency (--max-p99-ratio off)"]


def test_more_offload_than_the_baseline_fails():
    offloading = [canary(f"n{i}", traffic("2.0.0", 5.0, local=50, cloud=50)) for i in range(3)]
    verdict, _ = judge(offloading, old_fleet(local=95, cloud=5))
    assert verdict["outcome"] == "failed" and "offloads 50% of its requests, 45% above the baseline's 5%" in \
        verdict["reason"]


def test_the_policy_checks_its_new_limits():
    for bad in ({"min_evidence": 0}, {"min_evidence": 1.5}, {"evidence_grace_s": -1}, {"max_baseline_age_s": 0},
                {"on_inconclusive": "ignore"}):
        with pytest.raises(EdgeSDKError):
            RolloutPolicy(**bad)
    assert RolloutPolicy.from_dict({"canary": 0.1}) == RolloutPolicy()


def _timed(version: str, latencies_ms: list[float]) -> dict[str, Any]:
    """The traffic of a device whose calls took ``latencies_ms``, with their histogram as the agent sends it."""
    from edgesdk.runtime.latency_histogram import bucket_of, merge

    p50, p95, p99 = (float(v) for v in np.percentile(latencies_ms, [50, 95, 99]))
    figures = traffic(version, p99, calls=len(latencies_ms))
    entry = figures["versions"][version]
    entry.update(p50_ms=p50, p95_ms=p95, hist=merge([[[bucket_of(int(ms * 1e6)), 1]] for ms in latencies_ms]))
    return figures


def test_a_p99_over_the_limit_fails_a_device_only_when_its_calls_make_it_sure():
    """Over 120 calls a p99 is about the slowest call: three slow ones (a page fault, a preempted thread) put it at
    1.8x the baseline's while the 117th call, its 95% lower bound, is under 1x: not yet evidence either way. A
    release whose every call is 1.8x slower fails on as few calls. Without a histogram, the p95 stands for the
    bound."""
    assert p99_rank(120) == 117 and p99_rank(1000) == 984
    unlucky = [5.0] * 117 + [9.0] * 3
    verdict, _ = judge([canary(f"n{i}", _timed("2.0.0", unlucky)) for i in range(3)], old_fleet())
    assert verdict["outcome"] == "inconclusive" and "is 1.8x the live baseline's" in verdict["reason"]
    assert "only 0.9x is sure" in verdict["reason"]
    slower = [9.0] * 120
    assert judge([canary(f"n{i}", _timed("2.0.0", slower)) for i in range(3)], old_fleet())[0]["outcome"] == "failed"
    without = judge([canary(f"n{i}", traffic("2.0.0", 9.0, calls=120)) for i in range(3)], old_fleet())[0]
    assert without["outcome"] == "failed" and "at least 1.6x with 95% confidence" in without["reason"]


def test_the_error_bounds_are_exact_at_one_error_in_few_calls():
    """One error in 10 calls says the rate is at least 0.5% (exact), not 2.3% (Wilson): no failure at a 1% limit."""
    assert rate_lower(1, 10) == pytest.approx(0.00512, abs=1e-4)
    one = [canary(f"n{i}", traffic("2.0.0", 5.0, calls=10, errors=1)) for i in range(3)]
    assert judge(one, ())[0]["outcome"] == "inconclusive"
