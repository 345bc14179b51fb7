"""The inline rule of the inference endpoint (ota_server/inference/run_cost.py): on the event loop only when provably short."""

from __future__ import annotations

import numpy as np

from edgesdk.ota_server.inference.run_cost import INLINE_RUN_S, RECENT_RUNS, RunCost, elements


def test_elements_count_every_dimension_of_every_input():
    inputs = {"tokens": np.zeros((1, 4096, 64), np.float32), "mask": np.zeros((1, 4096), np.int64)}
    assert elements(inputs) == 4096 * 64 + 4096
    assert elements({"scalar": np.float32(1.0) * np.ones(())}) == 1


def test_nothing_runs_inline_before_a_run_was_measured():
    assert not RunCost().inline(1)


def test_a_short_request_no_larger_than_a_measured_one_runs_inline():
    cost = RunCost()
    cost.observe(16 * 64, 0.05e-3)
    assert cost.inline(16 * 64) and cost.inline(8 * 64)


def test_a_single_row_request_longer_than_any_seen_never_runs_inline():
    """The issue's stand-in: cheap at length 16, so a per-row (or per-element) estimate of length 512 looks short."""
    cost = RunCost()
    for _ in range(8):
        cost.observe(16 * 64, 0.01e-3)  # 10 us per run: 512 x 64 elements would be estimated at 0.32 ms
    assert (0.01e-3 / (16 * 64)) * 512 * 64 < INLINE_RUN_S  # what a linear estimate says
    assert not cost.inline(512 * 64)


def test_one_slow_recent_run_keeps_the_model_off_the_loop():
    """The maximum cost per element decides, not the minimum: a model that is sometimes slow is not provably short."""
    cost = RunCost()
    for _ in range(7):
        cost.observe(100, 0.05e-3)
    cost.observe(100, 2e-3)
    assert not cost.inline(100)
    for _ in range(RECENT_RUNS):  # once the slow run is out of the recent window, short runs go inline again
        cost.observe(100, 0.05e-3)
    assert cost.inline(100)
