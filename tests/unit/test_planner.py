"""Planner rules on synthetic measurements (the integration tests measure real variants)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from edgesdk.converters.board.emulate import PARALLEL_EFFICIENCY
from edgesdk.converters.board.measure import Measurement
from edgesdk.converters.planning.planner import Candidate, choose, estimate_on_board
from edgesdk.errors import BudgetError
from edgesdk.runtime.profiles import profile_from_dict
from tests.unit.test_scheduling import BIG_LITTLE

HOST = profile_from_dict({
    **copy.deepcopy(BIG_LITTLE), "name": "host", "arch": "x86_64",
    "cpu": {"clusters": [{"name": "cpu", "cores": [0, 1], "microarchitecture": "x86_64", "max_mhz": 3000,
                          "capacity": 1024}]},
    "power_modes": [{"name": "p", "idle_watts": 1.0, "active_watts": {"cpu": 30},
         "clusters": ["cpu"], "serves": ["latency", "balanced", "power"]}],
})
BOARD = profile_from_dict(copy.deepcopy(BIG_LITTLE))  # 1536 MiB budget, 9 W performance / 4 W efficiency


def _m(size_mb=1.0, memory_mb=10.0, latency_ms=1.0, sha="x"):
    return Measurement(size_bytes=int(size_mb * 2**20), sha256=sha, load_ms=1.0, latency_p50_ms=latency_ms,
                       latency_p95_ms=latency_ms, rss_before_mb=50.0, peak_rss_mb=50.0 + memory_mb, threads=2,
                       backend="onnxruntime", accelerator="CPUExecutionProvider", outputs=np.zeros((1, 1)))


def _c(name, precision, drop=0.0, board=BOARD, holdout=None, **m):
    measurement = _m(**m)
    est = estimate_on_board(measurement.latency_p50_ms, HOST, 2, board, "latency")
    return Candidate(name, "onnx", f"{name}.onnx", precision, measurement, drop, est, holdout_drop=holdout)


def test_estimate_scales_host_latency_by_cores_clock_and_ipc():
    est = estimate_on_board(1.0, HOST, 2, BOARD, "latency")
    # host: (1 + e) * 3000 MHz * 1.4; board big cluster: (1 + 3e) * 2400 MHz * 1.0, e the fitted thread efficiency
    e = PARALLEL_EFFICIENCY
    assert est.latency_ms == pytest.approx(((1 + e) * 3000 * 1.4) / ((1 + 3 * e) * 2400 * 1.0))
    # All four big cores busy: the cluster's whole 9 W above idle.
    assert est.energy_mj == pytest.approx(9.0 * est.latency_ms) and est.basis == "estimated"
    slower = estimate_on_board(1.0, HOST, 2, BOARD, "power")  # 4 little A55 cores
    assert slower.latency_ms > est.latency_ms


def test_measured_board_figures_replace_the_estimate():
    est = estimate_on_board(1.0, HOST, 2, BOARD, "latency", measured_ms=3.5)
    assert (est.latency_ms, est.basis, est.energy_mj) == (3.5, "measured on board", pytest.approx(31.5))
    measured = estimate_on_board(1.0, HOST, 2, BOARD, "latency", measured_ms=3.5, measured_energy_mj=12.0)
    assert measured.energy_mj == 12.0


def test_fastest_fitting_variant_within_the_accuracy_bound_wins():
    result = choose([_c("fp32", "fp32", latency_ms=2.0), _c("int8", "int8_static", drop=0.2, latency_ms=1.0),
                     _c("int8-lossy", "int8_static", drop=3.0, latency_ms=0.5)], BOARD, "latency", 0.5)
    assert result.chosen.name == "int8"
    lossy = next(c for c in result.candidates if c.name == "int8-lossy")
    assert "accuracy drop 3 > bound 0.5" in lossy.rejected[0]


def test_quantized_variant_slower_than_fp32_is_never_chosen_when_fp32_fits():
    # On a board of this host's architecture (host timings of another one never veto: tests/unit/test_power.py).
    result = choose([_c("fp32", "fp32", board=HOST, latency_ms=1.0),
                     _c("int8-dyn", "int8_dynamic", board=HOST, size_mb=0.3, latency_ms=3.0)], HOST, "latency", 0.5)
    assert result.chosen.name == "fp32"
    assert "slower than FP32" in result.candidates[1].rejected[0]


def test_slower_quantized_variant_is_chosen_when_size_is_the_only_way_to_fit():
    small = copy.deepcopy(BIG_LITTLE)
    small["memory"] = {"ram_mb": 512, "model_budget_mb": 64}
    board = profile_from_dict(small)
    result = choose([_c("fp32", "fp32", board=board, size_mb=100, memory_mb=150, latency_ms=1.0),
                     _c("int8", "int8_static", board=board, size_mb=25, memory_mb=40, latency_ms=1.5)],
                    board, "latency", 0.5)
    assert result.chosen.name == "int8"
    assert "file 100.0 MiB > budget 64 MiB" in result.candidates[0].rejected[0]


def test_frame_rate_the_board_cannot_keep_up_with_rejects_the_variant():
    slow = _c("fp32", "fp32", latency_ms=200.0)
    e = PARALLEL_EFFICIENCY
    board_ms = 200.0 * ((1 + e) * 3000 * 1.4) / ((1 + 3 * e) * 2400 * 1.0)  # as in the scaling test above
    with pytest.raises(BudgetError, match=rf"30 fps needs {board_ms:.3g} ms <= 33.3 ms per frame \(estimated, "
                                          rf"performance x4\): duty {30 * board_ms / 1000:.2f} > 1"):
        choose([slow], BOARD, "latency", 0.5, target_fps=30)


def test_nothing_fits_names_the_closest_variant_and_the_budget():
    tiny = copy.deepcopy(BIG_LITTLE)
    tiny["memory"] = {"ram_mb": 512, "model_budget_mb": 8}
    board = profile_from_dict(tiny)
    with pytest.raises(BudgetError) as info:
        choose([_c("fp32", "fp32", board=board, size_mb=40, memory_mb=60),
                _c("int8", "int8_static", board=board, size_mb=10, memory_mb=20, drop=0.1)], board, "latency", 0.5)
    message = str(info.value)
    assert "model budget 8 MiB" in message and "closest: int8" in message and "file 10.00 MiB" in message


def test_accuracy_bound_no_variant_meets_reports_the_best():
    tiny = copy.deepcopy(BIG_LITTLE)
    tiny["memory"] = {"ram_mb": 512, "model_budget_mb": 32}
    board = profile_from_dict(tiny)
    with pytest.raises(BudgetError, match=r"closest: mixed .*accuracy drop 0.8.*accuracy drop 0.8 > bound 0.5"):
        choose([_c("fp32", "fp32", board=board, size_mb=40, memory_mb=60),
                _c("int8", "int8_static", board=board, size_mb=10, memory_mb=20, drop=2.0),
                _c("mixed", "mixed", board=board, size_mb=12, memory_mb=22, drop=0.8)], board, "latency", 0.5)


def test_latencies_within_noise_choose_the_smaller_and_say_so():
    # 1.00 vs 1.03 ms: less than the 5% a measurement can tell apart, so size decides, whatever the order.
    fast_big = _c("int8-dynamic", "int8_dynamic", size_mb=2.0, latency_ms=1.00)
    slow_small = _c("int8-static", "int8_static", size_mb=1.0, latency_ms=1.03)
    for order in ([fast_big, slow_small], [slow_small, fast_big]):
        result = choose([_c("fp32", "fp32", size_mb=4.0, latency_ms=2.0), *order], BOARD, "latency", 0.5)
        assert result.chosen.name == "int8-static"
        assert result.reason.startswith("within noise of int8-dynamic") and "chose the smaller" in result.reason


def test_equal_sizes_within_noise_choose_the_more_accurate():
    result = choose([_c("fp32", "fp32", size_mb=4.0, latency_ms=2.0),
                     _c("minmax", "int8_static", drop=0.3, size_mb=1.0, latency_ms=1.00),
                     _c("entropy", "int8_static", drop=0.1, size_mb=1.0, latency_ms=1.02)], BOARD, "latency", 0.5)
    assert result.chosen.name == "entropy" and "chose the more accurate" in result.reason


def test_fastest_that_is_also_smallest_names_the_ones_within_noise():
    result = choose([_c("fp32", "fp32", size_mb=4.0, latency_ms=2.0),
                     _c("a", "int8_static", size_mb=1.0, latency_ms=1.00),
                     _c("b", "int8_static", size_mb=2.0, latency_ms=1.01)], BOARD, "latency", 0.5)
    assert result.chosen.name == "a"
    assert result.reason.startswith("fastest variant within budget, and the smaller of those within noise of it (b)")


def test_a_clear_gain_chooses_the_faster_even_when_larger():
    # 1.00 vs 1.10 ms is a clear gain (at most 0.95x): speed decides, not size.
    result = choose([_c("fp32", "fp32", size_mb=4.0, latency_ms=2.0),
                     _c("fast", "int8_dynamic", size_mb=2.0, latency_ms=1.00),
                     _c("small", "int8_static", size_mb=1.0, latency_ms=1.10)], BOARD, "latency", 0.5)
    assert result.chosen.name == "fast"
    assert result.reason.startswith("fastest variant within budget (") and "noise" not in result.reason


def test_a_chosen_variant_whose_held_out_drop_exceeds_the_bound_is_rejected_and_the_next_one_chosen():
    # int8-static wins on the selection drop (0.2 <= 0.5) but loses 1.5 points on the held-out samples.
    result = choose([_c("fp32", "fp32", latency_ms=2.0, holdout=0.0),
                     _c("int8-static", "int8_static", drop=0.2, holdout=1.5, latency_ms=1.0),
                     _c("int8-dynamic", "int8_dynamic", drop=0.4, holdout=0.3, latency_ms=1.5)], BOARD, "latency", 0.5)
    assert result.chosen.name == "int8-dynamic"
    static = next(c for c in result.candidates if c.name == "int8-static")
    assert static.rejected == ("held-out drop 1.5 > bound 0.5 (selection drop 0.2)",) and not static.chosen
    assert "int8-static chosen first and rejected: held-out drop over the bound" in result.reason
    assert "accuracy drop 0.4, held-out 0.3 <= 0.5" in result.reason


def test_the_held_out_drop_vetoes_only_the_chosen_variant_and_never_ranks_them():
    # Both fit; the faster one's held-out drop (0.45) is worse than the slower one's (0) but within the bound.
    result = choose([_c("fp32", "fp32", latency_ms=2.0, holdout=0.0),
                     _c("fast", "int8_static", drop=0.1, holdout=0.45, latency_ms=1.0),
                     _c("slow", "int8_static", drop=0.0, holdout=0.0, latency_ms=1.5),
                     # Over the bound on held-out data, but never chosen on its selection drop: no verdict from it.
                     _c("lossy", "int8_static", drop=0.9, holdout=3.0, latency_ms=0.5)], BOARD, "latency", 0.5)
    assert result.chosen.name == "fast" and "held-out" not in " ".join(
        r for c in result.candidates for r in c.rejected if c.name != "lossy")
    lossy = next(c for c in result.candidates if c.name == "lossy")
    assert lossy.rejected == ("accuracy drop 0.9 > bound 0.5",)


def test_every_quantized_variant_failing_on_held_out_data_leaves_fp32():
    result = choose([_c("fp32", "fp32", latency_ms=2.0, holdout=0.0),
                     _c("a", "int8_static", drop=0.1, holdout=0.9, latency_ms=1.0),
                     _c("b", "int8_dynamic", drop=0.1, holdout=0.6, latency_ms=1.2)], BOARD, "latency", 0.5)
    assert result.chosen.name == "fp32"
    assert [c.rejected[0].split(" (")[0] for c in result.candidates if c.name != "fp32"] == [
        "held-out drop 0.9 > bound 0.5", "held-out drop 0.6 > bound 0.5"]
    assert "a, b chosen first and rejected" in result.reason


def test_no_held_out_samples_means_no_held_out_check():
    result = choose([_c("fp32", "fp32", latency_ms=2.0), _c("int8", "int8_static", drop=0.2, latency_ms=1.0)],
                    BOARD, "latency", 0.5)
    assert result.chosen.name == "int8" and "held-out" not in result.reason


def test_held_out_failures_when_fp32_does_not_fit_end_in_a_budget_error_not_a_silent_choice():
    small = copy.deepcopy(BIG_LITTLE)
    small["memory"] = {"ram_mb": 512, "model_budget_mb": 64}
    board = profile_from_dict(small)
    with pytest.raises(BudgetError, match=r"closest: int8 .*accuracy drop 0.2 \(held-out 2\).*held-out drop 2 > bound 0.5"):
        choose([_c("fp32", "fp32", board=board, size_mb=100, memory_mb=150, holdout=0.0),
                _c("int8", "int8_static", board=board, size_mb=25, memory_mb=40, drop=0.2, holdout=2.0)],
               board, "latency", 0.5)
