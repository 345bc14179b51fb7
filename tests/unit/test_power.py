"""The power model and budgeted planning, on the shipped profiles' figures and synthetic measurements."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.converters.board.board_latency import OperatingPoint, operating_points, target_point
from edgesdk.converters.board.measure import Measurement
from edgesdk.converters.board.power import SHARED_ACTIVE_SHARE, PowerBudget, busy_watts, check_feasible, power_at
from edgesdk.converters.planning.planner import Candidate, choose, estimate_on_board
from edgesdk.errors import BudgetError, ConversionError, InfeasibleBudgetError, ProfileError
from edgesdk.runtime.profiles import load_profile
from tests.unit.test_planner import HOST

PI4, PI5, RK3588 = load_profile("raspberry-pi-4"), load_profile("raspberry-pi-5"), load_profile("rk3588")


def _candidate(name: str, precision: str, host_ms: float, board, drop: float = 0.0, size_mb: float = 1.0,
               measured_ms: float | None = None, measured_energy_mj: float | None = None) -> Candidate:
    m = Measurement(size_bytes=int(size_mb * 2**20), sha256=name, load_ms=1.0, latency_p50_ms=host_ms,
                    latency_p95_ms=host_ms, rss_before_mb=50.0, peak_rss_mb=60.0, threads=2, backend="onnxruntime",
                    accelerator="CPUExecutionProvider", outputs=np.zeros((1, 1)))
    estimate = estimate_on_board(host_ms, HOST, 2, board, "latency", measured_ms=measured_ms,
                                 measured_energy_mj=measured_energy_mj, measured_energy_basis="measured on board (test)")
    return Candidate(name, "onnx", f"{name}.onnx", precision, m, drop, estimate)


def test_busy_power_is_a_shared_part_plus_each_busy_cores_share():
    pi5 = target_point(PI5, "latency")
    assert pi5.cores == (0, 1, 2, 3) and pi5.threads == 4
    assert busy_watts(PI5, pi5) == pytest.approx(6.9)
    one = OperatingPoint(pi5.power_mode, pi5.cores, 1)
    assert busy_watts(PI5, one) == pytest.approx(6.9 * (SHARED_ACTIVE_SHARE + (1 - SHARED_ACTIVE_SHARE) / 4))


def test_every_mode_and_thread_count_is_an_operating_point():
    points = operating_points(RK3588)
    assert [(p.power_mode, p.threads) for p in points] == [
        ("performance", t) for t in range(1, 5)] + [("efficiency", t) for t in range(1, 5)]
    assert {p.cores for p in points} == {(4, 5, 6, 7), (0, 1, 2, 3)}
    # The Pi 4's powersave mode keeps two cores online: at most two threads there.
    assert [p.threads for p in operating_points(PI4) if p.power_mode == "powersave"] == [1, 2]


def test_continuous_average_power_is_idle_plus_rate_times_energy():
    point = target_point(PI4, "latency")
    figures = power_at(PI4, point, 100.0, "estimated", PowerBudget(fps=5, watts=3.0))
    energy = 3.4 * 100.0  # all four cores busy for 100 ms: mJ
    assert figures.energy_mj == pytest.approx(energy)
    assert figures.avg_watts == pytest.approx(1.6 + 5 * energy / 1000)
    assert figures.duty == pytest.approx(0.5) and figures.avg_watts > 3.0
    assert "average 3.3 W (idle 1.6 W + 340 mJ per inference, modelled from estimated, performance x4) > budget 3 W" \
        in figures.problem


def test_duty_cycled_average_counts_wakes_and_sleep_where_the_board_sleeps():
    budget = PowerBudget(wake_every_s=60, frames_per_wake=4, watts=1.5)
    point = target_point(PI5, "latency")
    figures = power_at(PI5, point, 50.0, "estimated", budget)
    run_s, energy_j = 4 * 0.05, 6.9 * 50.0 / 1000
    awake = 15 + run_s
    expected = (52.5 + 2.8 * run_s + 4 * energy_j + 0.01 * (60 - awake)) / 60
    assert figures.avg_watts == pytest.approx(expected) and figures.duty == pytest.approx(awake / 60)
    # The Pi 4 cannot sleep: it idles between wakes.
    pi4 = power_at(PI4, target_point(PI4, "latency"), 50.0, "estimated", budget)
    assert pi4.avg_watts == pytest.approx(1.6 + 4 * (3.4 * 50.0 / 1000) / 60)
    # A wake that cannot finish before the next one does not fit.
    tight = power_at(PI5, point, 50.0, "estimated", PowerBudget(wake_every_s=10, frames_per_wake=4, watts=9))
    assert "4 frames take 15.2 s awake (estimated) > the 10 s between wakes" in tight.problem


def test_budget_arguments_are_checked_together():
    with pytest.raises(ConversionError, match="needs a rate"):
        PowerBudget(watts=3)
    with pytest.raises(ConversionError, match="either --power-budget W or --energy-budget"):
        PowerBudget(fps=5, watts=3, energy_mwh_per_h=3000)
    with pytest.raises(ConversionError, match="--wake-every and --frames-per-wake together"):
        PowerBudget(wake_every_s=60, watts=1)
    with pytest.raises(ConversionError, match="either --fps .* or --wake-every"):
        PowerBudget(fps=1, wake_every_s=60, frames_per_wake=2)
    with pytest.raises(ConversionError, match="watts must be a number > 0, got -1"):
        PowerBudget(fps=1, watts=-1)
    assert PowerBudget(fps=5, energy_mwh_per_h=2500).limit_watts == 2.5


def test_idle_above_the_budget_is_infeasible_in_any_mode_before_anything_is_measured():
    with pytest.raises(InfeasibleBudgetError, match=r"infeasible on raspberry-pi-5 in any mode: idle 2.8 W "
                                                    r"\(power mode performance\) > budget 2.5 W"):
        check_feasible(PI5, PowerBudget(fps=1, watts=2.5))
    assert issubclass(InfeasibleBudgetError, BudgetError)
    # Duty-cycled, the Pi 5 sleeps at 0.01 W: the same budget is feasible when it wakes rarely enough.
    check_feasible(PI5, PowerBudget(wake_every_s=600, frames_per_wake=1, watts=2.5))
    with pytest.raises(InfeasibleBudgetError, match="sleeping and waking every 20 s alone averages 2.63 W"):
        check_feasible(PI5, PowerBudget(wake_every_s=20, frames_per_wake=1, watts=2.5))


def test_a_variant_that_keeps_up_but_exceeds_the_budget_is_rejected_with_its_average_power():
    # The old check (energy x fps <= mode watts) only asked whether the board keeps up. Both variants keep up at
    # 5 fps on a Pi 4; only the int8 one fits 2.6 W.
    fp32 = _candidate("fp32", "fp32", 40.0, PI4)
    int8 = _candidate("int8", "int8_static", 15.0, PI4, drop=0.2)
    plan = choose([fp32, int8], PI4, "latency", 0.5, budget=PowerBudget(fps=5, watts=2.6))
    assert plan.chosen.name == "int8"
    judged = next(c for c in plan.candidates if c.name == "fp32")
    assert judged.power is not None and judged.power.duty is not None and judged.power.duty < 1
    assert judged.rejected and "no power mode and thread count meets 5 fps within 2.6 W" in judged.rejected[0]
    assert "> budget 2.6 W" in judged.rejected[0]
    assert plan.reason.startswith("fastest variant at 5 fps within 2.6 W")


def _slower_with_more_budget(sweep: list[tuple[float, float]]) -> list[str]:
    """The steps of a (budget W, chosen latency ms) sweep, loosest budget last, where more watts bought a slower
    choice: what the latency objective must never do."""
    return [f"{b:g} W: {ms:.3f} ms after {pb:g} W: {pms:.3f} ms" for (pb, pms), (b, ms) in zip(sweep, sweep[1:])
            if ms > pms * (1 + 1e-9)]


RK3588_CANDIDATES = [_candidate("fp32", "fp32", 40.0, RK3588), _candidate("fp16", "fp16", 30.0, RK3588, drop=0.1),
                     _candidate("int8", "int8_static", 18.0, RK3588, drop=0.3, size_mb=0.3)]


def _sweep(objective: str = "latency") -> list[tuple[float, float, str]]:
    """(budget, chosen latency, choice) over RK3588 budgets from below the big cores' draw to far above it."""
    found = []
    for budget in np.round(np.arange(3.7, 12.0, 0.1), 2):
        try:
            plan = choose(RK3588_CANDIDATES, RK3588, "latency", 0.5,
                          budget=PowerBudget(fps=8, watts=float(budget), objective=objective))
        except BudgetError:
            continue
        power = plan.chosen.power
        assert power is not None and power.avg_watts is not None and power.avg_watts <= budget
        found.append((float(budget), power.latency_ms, f"{plan.chosen.name}@{power.point.power_mode}/"
                                                       f"{power.point.threads}"))
    return found


def test_a_looser_budget_never_buys_a_slower_choice_and_the_sweep_is_not_constant():
    sweep = _sweep()
    assert _slower_with_more_budget([(b, ms) for b, ms, _ in sweep]) == []
    assert len({choice for _, _, choice in sweep}) >= 2, "a sweep whose choice never changes proves nothing"
    unbudgeted = choose(RK3588_CANDIDATES, RK3588, "latency", 0.5, budget=PowerBudget(fps=8)).chosen.power
    assert unbudgeted is not None and sweep[-1][1] <= unbudgeted.latency_ms  # a budget that fits it: never slower


def test_the_sweep_check_fails_on_a_planted_non_monotone_choice():
    planted = [(b, ms) for b, ms, _ in _sweep()]
    middle = len(planted) // 2
    planted[middle] = (planted[middle][0], planted[middle - 1][1] * 1.5)  # more watts, yet 1.5x slower
    assert len(_slower_with_more_budget(planted)) == 1


def test_a_budget_constrains_and_never_changes_the_objective():
    """Issue 38: stating any budget, even 100 W, moved an RK3588 to its little cores, about 3x slower."""
    free = choose(RK3588_CANDIDATES, RK3588, "latency", 0.5, budget=PowerBudget(fps=8))
    generous = choose(RK3588_CANDIDATES, RK3588, "latency", 0.5, budget=PowerBudget(fps=8, watts=100.0))
    assert (generous.chosen.name, generous.point) == (free.chosen.name, free.point)
    assert generous.point.power_mode == "performance"
    frugal = choose(RK3588_CANDIDATES, RK3588, "latency", 0.5, budget=PowerBudget(fps=8, watts=100.0,
                                                                                  objective="energy"))
    assert frugal.chosen.power is not None and generous.chosen.power is not None
    assert frugal.chosen.power.energy_mj <= generous.chosen.power.energy_mj
    assert frugal.reason.startswith("lowest energy per inference at 8 fps within 100 W")


def test_the_noise_rule_applies_to_the_energy_objective_too():
    # Two equally accurate variants 3% apart in energy: within noise, so the smaller file wins, and the reason says so.
    big = _candidate("fp16", "fp16", 20.0, RK3588, size_mb=2.0, drop=0.1)
    small = _candidate("int8", "int8_static", 20.6, RK3588, size_mb=0.5, drop=0.1)
    plan = choose([big, small], RK3588, "latency", 0.5, budget=PowerBudget(fps=5, objective="energy"))
    assert plan.chosen.name == "int8" and "within noise of fp16" in plan.reason and "mJ" in plan.reason
    with pytest.raises(ConversionError, match="objective 'cheapest' is not one of latency, energy"):
        PowerBudget(objective="cheapest")


def test_mode_and_threads_change_when_that_is_what_fits():
    # FP32 at 6 fps: four big cores keep up but cost about 5.6 W; the little cores fit 5 W.
    fp32 = _candidate("fp32", "fp32", 40.0, RK3588)
    unbounded = choose([fp32], RK3588, "latency", 0.5, budget=PowerBudget(fps=6))
    assert unbounded.point.power_mode == "performance" and unbounded.point.threads == 4
    plan = choose([fp32], RK3588, "latency", 0.5, budget=PowerBudget(fps=6, watts=5.0))
    assert plan.point.power_mode == "efficiency"
    power = plan.chosen.power
    assert power is not None and power.avg_watts is not None and power.avg_watts <= 5.0 and power.duty <= 1
    assert f"in power mode efficiency with {plan.point.threads} thread(s)" in plan.reason


def test_a_measured_energy_replaces_the_model_at_its_point():
    measured = _candidate("fp32", "fp32", 40.0, PI4, measured_ms=50.0, measured_energy_mj=100.0)
    plan = choose([measured], PI4, "latency", 0.5, budget=PowerBudget(fps=5, watts=5.0))
    power = plan.chosen.power
    assert power is not None
    if power.point == target_point(PI4, "latency"):
        assert power.energy_mj == 100.0 and power.energy_basis == "measured on board (test)"
    else:  # another point is scaled from the measured latency and modelled
        assert power.basis.startswith("measured on board, scaled to") and power.energy_basis.startswith("modelled")


def test_nothing_fits_a_budget_names_it():
    fp32 = _candidate("fp32", "fp32", 400.0, PI4)
    with pytest.raises(BudgetError, match=r"no variant fits raspberry-pi-4 \(latency, model budget \d+ MiB, 5 fps "
                                          r"within 2 W"):
        choose([fp32], PI4, "latency", 0.5, budget=PowerBudget(fps=5, watts=2.0))


def test_thread_scaling_and_the_shared_power_share_are_the_profiles_own_parameters():
    from edgesdk.converters.board.board_latency import perf
    from edgesdk.runtime.profile_json import profile_to_dict
    from edgesdk.runtime.profiles import profile_from_dict

    data = profile_to_dict(PI5)
    data["cpu"]["clusters"][0].update(parallel_efficiency=0.35, shared_power_share=0.0)
    measured = profile_from_dict(data)
    four = target_point(PI5, "latency")
    one = OperatingPoint(four.power_mode, four.cores, 1)
    # Four threads: 1 + 3e singles, e the profile's fitted figure (0.25 for the Pi 5), or PARALLEL_EFFICIENCY (the
    # median of every board's published pairs) for a cluster without one; 1 + 3 x 0.35 = 2.05 with 0.35.
    from edgesdk.converters.board.emulate import PARALLEL_EFFICIENCY

    assert perf(PI5, four) / perf(PI5, one) == pytest.approx(1 + 3 * 0.25)
    data["cpu"]["clusters"][0].update(parallel_efficiency=None)
    unfitted = profile_from_dict(data)
    assert perf(unfitted, four) / perf(unfitted, one) == pytest.approx(1 + 3 * PARALLEL_EFFICIENCY)
    data["cpu"]["clusters"][0].update(parallel_efficiency=0.35)
    assert perf(measured, four) / perf(measured, one) == pytest.approx(2.05)
    # No shared share: one busy core of four draws a quarter of the cluster's active power.
    assert busy_watts(measured, one) == pytest.approx(6.9 / 4)
    with pytest.raises(ProfileError, match="parallel_efficiency must be in \\(0, 1\\]"):
        profile_from_dict({**data, "cpu": {"clusters": [{**data["cpu"]["clusters"][0], "parallel_efficiency": 1.5}]}})


def test_host_timings_alone_never_veto_an_arm_int8_variant_but_do_on_this_hosts_own_arch():
    """An int8 preset for arm64 kernels runs slowly on x86: that says nothing about a Pi 5 (issue 38)."""
    fp32, int8 = _candidate("fp32", "fp32", 10.0, PI5), _candidate("int8", "int8_static", 14.0, PI5, drop=0.1)
    plan = choose([fp32, int8], PI5, "latency", 0.5)
    assert plan.chosen.name == "fp32"  # still the faster by the only figures there are
    assert not next(c for c in plan.candidates if c.name == "int8").rejected
    x86 = load_profile("generic-x86_64")
    here = choose([_candidate("fp32", "fp32", 10.0, x86), _candidate("int8", "int8_static", 14.0, x86, drop=0.1)],
                  x86, "latency", 0.5)
    assert any("slower than FP32" in r for r in next(c for c in here.candidates if c.name == "int8").rejected)


def test_an_arm_board_without_the_emulator_warns_how_to_set_it_up(tmp_path, monkeypatch, caplog):
    import logging

    from edgesdk.converters.board.conversion_costs import ConversionCosts

    monkeypatch.setenv("EDGESDK_EMULATOR_CACHE", str(tmp_path))  # an empty cache: no userland built
    monkeypatch.delenv("EDGESDK_EMULATE", raising=False)
    with caplog.at_level(logging.WARNING, logger="edgesdk.converters.board.board_latency"):
        costs = ConversionCosts(None, PI5, "latency", {"input": np.zeros((1, 4), np.float32)})
    assert not costs.active and costs.note.startswith("board latency scaled from this host's timings, not emulated")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "raspberry-pi-5 is aarch64 and the board emulator is not set up" in warning
    assert "`edgesdk emulator setup`" in warning
