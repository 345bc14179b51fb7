"""The latency predictor's margin under correlated slowdowns, its early deviation, its cold start
and its out-of-sample calibration, as pure units on a fake clock (no process, no sleeping).

Each test names a rule of issue 61 that the previous predictor broke: a margin scaled by
sqrt(runs) (independent errors), a deviation starting at 0, a prediction of 0 before the first
run ended, and no calibration figure that leaves out the requests that taught the margin.
"""

from __future__ import annotations

import math

import pytest

from edgesdk.errors import OffloadError
from edgesdk.offload.predictor import MIN_RESIDUALS, LatencyPredictor


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steady(alpha: float = 0.5, service_s: float = 0.010, samples: int = 40) -> LatencyPredictor:
    """A predictor that has seen ``samples`` identical back-to-back runs (its deviation ~0)."""
    predictor = LatencyPredictor(alpha, FakeClock())
    for _ in range(samples):
        predictor.observe(service_s)
    return predictor


def test_the_margin_at_a_deep_queue_covers_a_slowdown_that_hits_every_queued_run():
    """Slow spells make every run X slower at once. Learned at the shallow depths that light load
    gives (1 and 2 runs), the margin at 9 runs must cover 9 x X x service: sqrt(runs) scaling
    gave 3 x p99(residual / sqrt(runs)) there, under half of it."""
    slower = 0.20  # X: every run 20% slower during a slow spell
    predictor = steady()
    for i in range(200):
        prediction = predictor.predict(i % 2)  # 1 or 2 runs: nothing running, 0 or 1 waiting
        in_spell = i % 20 == 0  # 5% of the requests, more than the 1% a p99 may leave out
        actual = prediction.expected_s * (1 + slower) if in_spell else prediction.expected_s
        predictor.settle(prediction, actual)
    deep = predictor.predict(8)  # 8 waiting, nothing running: 9 runs
    assert deep.runs == 9 and deep.expected_s == pytest.approx(0.090)
    excess = slower * deep.expected_s  # what a slow spell adds when it hits all 9 runs
    assert deep.margin_s >= excess * 0.999
    assert deep.margin_s <= 2 * excess  # covered, not by an arbitrary amount


def test_the_margin_at_a_depth_uses_that_depths_residuals_when_they_are_larger():
    """Deep queues build when the device is slow, so their residuals per run can be larger than
    the shallow ones': the depth bucket's own p99 sets the margin there."""
    predictor = steady()
    for i in range(400):
        waiting = 0 if i % 2 else 8  # 1 run or 9 runs, half each
        prediction = predictor.predict(waiting)
        per_run = 0.001 if waiting == 0 else 0.003  # deep requests overran by 3 ms a run
        predictor.settle(prediction, prediction.expected_s + per_run * prediction.runs)
    assert predictor.predict(0).margin_s == pytest.approx(0.003, rel=0.01)  # pooled p99 (deep ones)
    assert predictor.predict(8).margin_s == pytest.approx(9 * 0.003, rel=0.01)
    # a depth with none of its own falls back to the pooled figure, linear in its runs
    assert predictor.predict(3).margin_s == pytest.approx(4 * 0.003, rel=0.01)


def test_the_first_sample_starts_the_deviation_at_half_of_it():
    """RFC 6298's RTTVAR = R / 2: after one 10 ms run the margin is 2 deviations = 10 ms a run,
    not 0 (which made the early margins about 5x too small)."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.2, clock)
    predictor.begin()
    clock.now += 0.010
    predictor.end()
    first = predictor.predict(0)
    assert first.expected_s == pytest.approx(0.010) and first.margin_s == pytest.approx(0.010)
    assert first.basis == "deviation"
    assert predictor.predict(3).margin_s == pytest.approx(0.040)  # linear in the runs summed
    other = LatencyPredictor(0.2, clock)
    other.observe(0.020)  # a sample measured elsewhere starts it too
    assert other.predict(0).margin_s == pytest.approx(0.020)


def test_a_seed_predicts_the_first_burst_until_a_real_run_replaces_it():
    """Seeded with the bundle's measured latency, a burst at start is predicted (not 0): with the
    seed's deviation the tail of a request behind 3 others is 2 x 4 x 50 ms."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.2, clock)
    predictor.seed(0.050)
    assert predictor.service_s == pytest.approx(0.050)
    burst = predictor.predict(3)
    assert burst.basis == "seed" and burst.expected_s == pytest.approx(0.200)
    assert burst.tail_s == pytest.approx(0.400)
    predictor.begin()  # the first request runs: queued ones are still predicted from the seed
    clock.now += 0.010
    assert predictor.predict(0).tail_s > 0.050
    clock.now += 0.010
    predictor.end()  # a real run of 20 ms: the seed is gone, the deviation restarts at 10 ms
    assert predictor.service_s == pytest.approx(0.020)
    assert predictor.predict(0).basis == "deviation"
    assert predictor.predict(0).tail_s == pytest.approx(0.040)
    predictor.seed(0.500)  # a prior after a measurement is ignored: the device's own runs win
    assert predictor.service_s == pytest.approx(0.020)


@pytest.mark.parametrize("bad", [0, -0.01, math.nan, math.inf, "50ms", True])
def test_a_seed_that_is_not_a_positive_number_of_seconds_is_refused_naming_it(bad):
    refused = r"positive finite number of seconds, got .*latency_ms / 1000"
    with pytest.raises(OffloadError, match=refused):
        LatencyPredictor(0.2, FakeClock()).seed(bad)


def test_without_a_seed_only_one_request_is_admitted_before_the_first_run_ends():
    """Nothing known: the lone request on an idle worker runs locally to teach the predictor; one
    queued behind it, or arriving while it runs, is predicted infinite, never 0."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.2, clock)
    lone = predictor.predict(0)
    assert predictor.predict(1).tail_s == math.inf  # one is already waiting to run
    assert (lone.tail_s, lone.runs, lone.basis) == (0.0, 0, "first")
    predictor.begin()
    blind = predictor.predict(0)
    assert blind.tail_s == math.inf and blind.runs == 0 and blind.basis == "unknown"
    clock.now += 0.030
    predictor.end(record=False)  # a failed run teaches nothing: still one lone learner at a time
    assert predictor.predict(0).basis == "first" and predictor.predict(1).tail_s == math.inf
    predictor.begin()
    clock.now += 0.030
    predictor.end()
    assert predictor.predict(1).tail_s >= 0.060


def test_queued_runs_are_counted_at_the_recent_runs_when_the_device_just_slowed_down():
    """Two back-to-back runs 1.5x slower: the next requests are predicted at the new speed, not at
    the moving average (0.2 weight: 12.4 ms a run after two 15 ms runs)."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.2, clock)
    predictor.observe(0.010)
    for _ in range(30):
        predictor.observe(0.010)
    for _ in range(2):
        predictor.observe(0.015)
    assert predictor.service_s < 0.0125  # the average lags
    assert predictor.predict(3).expected_s == pytest.approx(4 * 0.015)


def test_what_is_left_of_the_running_request_follows_the_device_speed_now():
    """The running run's remaining time comes from the shape of recent runs scaled to today's
    speed: after a 2x slowdown, the mean of 110 absolute samples (100 at the old speed) over the
    5 ms it has run said about 6 ms were left, where about 15 ms are."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    for _ in range(100):
        predictor.observe(0.010)
    for _ in range(10):
        predictor.observe(0.020)  # the device is 2x slower now
    predictor.begin()
    clock.now += 0.005
    prediction = predictor.predict(0)
    each = predictor.service_s
    assert each == pytest.approx(0.020, rel=0.01)
    assert prediction.expected_s - each == pytest.approx(0.015, rel=0.05)


def test_calibration_leaves_out_the_requests_that_taught_the_margin():
    """The goal figure counts only requests admitted on a calibrated margin (out of sample); the
    warm-up ones, admitted on the deviation, are reported apart."""
    predictor = steady()
    for _ in range(MIN_RESIDUALS):  # warm-up: admitted on the deviation margin (~0), all overran
        warm = predictor.predict(0)
        predictor.settle(warm, warm.expected_s + 0.005)
    assert warm.basis == "deviation"
    calibrated = predictor.predict(0)
    assert calibrated.basis == "residuals" and calibrated.margin_s == pytest.approx(0.005)
    for i in range(100):  # within the calibrated tail, except 2 of them
        predictor.settle(calibrated, calibrated.tail_s + (0.001 if i < 2 else -0.001))
    report = predictor.calibration()
    assert report["requests"] == 150 and report["requests_after_warmup"] == 100
    assert report["over_after_warmup"] == 2
    assert report["over_tail_after_warmup"] == pytest.approx(0.02)
    assert report["over_predicted_tail"] == pytest.approx(52 / 150)  # warm-up included
    assert predictor.settled_count == 150
    early = steady()
    first = early.predict(0)
    early.settle(first, first.expected_s)
    assert early.calibration()["over_tail_after_warmup"] is None  # no evidence: no figure


def test_calibration_since_a_time_counts_the_requests_admitted_from_then_on():
    """A benchmark's window (a run, or the requests after a slowdown began) by admission time."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    for _ in range(40):
        predictor.observe(0.010)
    for _ in range(MIN_RESIDUALS):
        warm = predictor.predict(0)
        predictor.settle(warm, warm.expected_s)
    clock.now += 1.0
    before = predictor.predict(0)
    clock.now += 1.0
    switch = clock.now
    after = predictor.predict(0)
    predictor.settle(before, before.tail_s + 0.001)  # admitted before the switch: over its tail
    predictor.settle(after, after.tail_s)
    report = predictor.calibration(since=switch)
    assert report["requests"] == 1 and report["over_tail_after_warmup"] == 0.0
    assert predictor.calibration(since=switch - 1.5)["over_after_warmup"] == 1
    assert predictor.calibration(since=clock.now + 1) is None


def test_the_deviation_also_settles_when_every_run_finds_the_worker_idle():
    """Light load, or most work offloaded: every local run starts after idle. Their spread must
    still bring the first sample's deviation (half of it) down, or the margin stays at a whole
    service time a run."""
    clock = FakeClock()
    predictor = LatencyPredictor(0.2, clock)
    for _ in range(30):
        clock.now += 1.0  # idle in between
        predictor.begin()
        clock.now += 0.100
        predictor.end()
    assert predictor.idle_service_s == pytest.approx(0.100)
    assert predictor.predict(0).margin_s < 0.001  # 2 x 50 ms x 0.8^29
