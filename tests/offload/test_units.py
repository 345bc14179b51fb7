"""OffloadPolicy validation, and the latency predictor and circuit breaker as pure units on a fake clock."""

from __future__ import annotations

import math

import pytest

from edgesdk import OffloadPolicy
from edgesdk.errors import EdgeSDKError, OffloadError
from edgesdk.offload.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from edgesdk.offload.predictor import LatencyPredictor


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_policy_defaults_and_round_trip():
    policy = OffloadPolicy("http://127.0.0.1:8000/", "digits", latency_slo_ms=50, heavy_input_bytes=4096)
    assert policy.base_url == "http://127.0.0.1:8000"
    assert policy.binary is None and policy.version is None
    assert OffloadPolicy.from_dict(policy.to_dict()) == policy
    assert OffloadPolicy.from_dict({"url": "https://cloud.example:443/prefix", "model": "m"}).max_local_queue == 8


@pytest.mark.parametrize(("changes", "words"), [
    ({"url": "ftp://host/x"}, "url 'ftp://host/x'"),
    ({"url": "127.0.0.1:8000"}, "http:// or https://"),
    ({"url": "http://host:99999"}, "invalid port"),
    ({"url": "http://host:8000/?a=1"}, "query"),
    ({"model": ""}, "model ''"),
    ({"model": "a/b"}, "no '/'"),
    ({"version": ""}, "version ''"),
    ({"latency_slo_ms": 0}, "latency_slo_ms must be a number > 0, got 0"),
    ({"latency_slo_ms": float("nan")}, "latency_slo_ms"),
    ({"max_local_queue": 0}, "max_local_queue must be an integer > 0, got 0"),
    ({"max_local_queue": 2.5}, "max_local_queue must be an integer"),
    ({"max_cloud_inflight": -1}, "max_cloud_inflight"),
    ({"timeout_ms": -5}, "timeout_ms must be a number > 0, got -5"),
    ({"connect_timeout_ms": "1"}, "connect_timeout_ms"),
    ({"heavy_input_bytes": 0}, "heavy_input_bytes"),
    ({"breaker_failures": True}, "breaker_failures"),
    ({"breaker_reset_s": 0}, "breaker_reset_s"),
    ({"binary": "yes"}, "binary must be true, false or null"),
    ({"predictor_alpha": 1.5}, "predictor_alpha must be in (0, 1]"),
])
def test_policy_rejects_bad_values_naming_them(changes, words):
    settings = {"url": "http://127.0.0.1:8000", "model": "digits", **changes}
    with pytest.raises(OffloadError) as info:
        OffloadPolicy(**settings)
    assert words in str(info.value)
    assert isinstance(info.value, EdgeSDKError)


def test_policy_from_dict_names_unknown_and_missing_settings():
    with pytest.raises(OffloadError, match=r"unknown setting\(s\) \['slo'\]"):
        OffloadPolicy.from_dict({"url": "http://h:1", "model": "m", "slo": 5})
    with pytest.raises(OffloadError, match=r"missing \['model'\]"):
        OffloadPolicy.from_dict({"url": "http://h:1"})
    with pytest.raises(OffloadError, match="must be a mapping"):
        OffloadPolicy.from_dict(["url"])  # type: ignore[arg-type]


def test_policy_is_frozen():
    policy = OffloadPolicy("http://h:1", "m")
    with pytest.raises(AttributeError):
        policy.model = "other"  # type: ignore[misc]


def test_predictor_admits_one_lone_request_until_it_has_seen_a_run():
    predictor = LatencyPredictor(0.5, FakeClock())
    assert predictor.service_s is None
    assert predictor.predict_s(0) == 0.0  # the lone request that teaches it
    assert predictor.predict_s(10) == math.inf  # nothing queues blind (the old rule said 0)


def test_predictor_multiplies_service_time_by_the_queue_ahead_plus_what_is_left_of_the_running_one():
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    predictor.begin()
    clock.now += 0.010
    predictor.end()
    assert predictor.service_s == pytest.approx(0.010)
    assert predictor.predict(0).expected_s == pytest.approx(0.010)
    assert predictor.predict(3).expected_s == pytest.approx(0.040)
    predictor.begin()  # one running for 4 ms: 6 ms of it left
    clock.now += 0.004
    assert predictor.predict(2).expected_s == pytest.approx(0.030 + 0.006)
    # Overran every run seen: about one deviation (5 ms, half the first run) left, and a run that
    # has already taken 20 ms says the device takes that long now.
    clock.now += 0.016
    assert predictor.predict(0).expected_s == pytest.approx(0.005 + 0.020)
    predictor.end()  # 20 ms, back to back: the first sample of that kind; the one after idle stays apart
    assert predictor.service_s == pytest.approx(0.020)
    assert predictor.idle_service_s == pytest.approx(0.010)


def run(predictor, clock, seconds: float, idle_before: float = 0.0) -> None:
    clock.now += idle_before
    predictor.begin()
    clock.now += seconds
    predictor.end()


def test_queued_requests_are_predicted_at_the_back_to_back_time_not_the_slower_one_after_idle():
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    run(predictor, clock, 0.064, idle_before=1.0)  # cold: 64 ms
    for _ in range(6):
        run(predictor, clock, 0.049)  # back to back: 49 ms each, no spread
    assert predictor.idle_service_s == pytest.approx(0.064)
    assert predictor.service_s == pytest.approx(0.049, rel=0.02)
    clock.now += 1.0  # the worker idles: a lone request will start cold
    assert predictor.predict(0).expected_s == pytest.approx(0.064, rel=0.02)
    # Three queued behind a cold first run: 64 + 3 x 49 (counting each at 64 would say 256 ms).
    assert predictor.predict(3).expected_s == pytest.approx(0.064 + 3 * 0.049, rel=0.02)


def test_the_margin_grows_with_the_spread_of_runs_and_the_runs_counted():
    clock = FakeClock()
    steady, spread = LatencyPredictor(0.5, clock), LatencyPredictor(0.5, clock)
    for took in (0.050,) * 12:
        steady.observe(took)  # the deviation starts at 25 ms (half the first) and halves each run
    for took in (0.040, 0.060) * 6:
        spread.observe(took)
    assert steady.predict_s(3) == pytest.approx(4 * 0.050, rel=0.01)
    margin_1, margin_4 = spread.predict(0).margin_s, spread.predict(3).margin_s
    assert margin_1 > 0.01  # two deviations of about 13 ms
    assert margin_4 == pytest.approx(4 * margin_1)  # linear in the runs: a slowdown hits them all


def test_predictor_ignores_failed_runs_and_takes_outside_samples():
    clock = FakeClock()
    predictor = LatencyPredictor(0.25, clock)
    predictor.observe(0.008)
    predictor.begin()
    clock.now += 5
    predictor.end(record=False)
    assert predictor.service_s == pytest.approx(0.008)
    predictor.observe(0.016)
    assert predictor.service_s == pytest.approx(0.010)
    with pytest.raises(ValueError):
        LatencyPredictor(0)


def test_breaker_opens_after_consecutive_failures_only():
    breaker = CircuitBreaker(3, 10.0, FakeClock())
    assert breaker.failure() is False
    assert breaker.failure() is False
    breaker.success()  # a success in between resets the count
    assert breaker.failure() is False and breaker.failure() is False
    assert breaker.state == CLOSED and breaker.allow()
    assert breaker.failure() is True
    assert breaker.state == OPEN and not breaker.allow() and not breaker.claim_probe()
    assert breaker.failure() is False  # late failures of requests already out do not re-open it
    assert breaker.opened == 1


def test_breaker_half_opens_after_reset_and_lets_one_out_of_band_probe_through():
    clock = FakeClock()
    breaker = CircuitBreaker(1, 10.0, clock)
    breaker.failure()
    clock.now += 9.9
    assert breaker.state == OPEN and not breaker.allow() and not breaker.claim_probe()
    clock.now += 0.1
    assert breaker.state == HALF_OPEN
    assert not breaker.allow()  # user requests never probe
    assert breaker.claim_probe() is True
    assert breaker.claim_probe() is False  # only one
    breaker.probe_success()
    assert breaker.state == CLOSED and breaker.allow() and breaker.allow()


def test_a_stragglers_late_success_does_not_close_an_open_or_half_open_breaker():
    """Requests sent before the breaker opened may still answer; only the probe says the cloud answers now."""
    clock = FakeClock()
    breaker = CircuitBreaker(2, 10.0, clock)
    breaker.failure()
    assert breaker.failure() is True
    breaker.success()  # a request sent while it was closed answers late
    assert breaker.state == OPEN and not breaker.allow()
    clock.now += 10
    assert breaker.state == HALF_OPEN and breaker.claim_probe()
    breaker.success()  # another straggler, while the probe is out
    assert breaker.failure() is False  # and a straggler's failure neither reopens it nor counts
    assert breaker.state == HALF_OPEN and not breaker.allow() and not breaker.claim_probe()
    breaker.probe_success()
    assert breaker.state == CLOSED and breaker.allow()
    assert breaker.failure() is False  # closed again: the count started from zero
    assert breaker.opened == 1


def test_a_failed_probe_opens_the_breaker_for_another_period():
    clock = FakeClock()
    breaker = CircuitBreaker(2, 5.0, clock)
    breaker.trip()
    assert breaker.state == OPEN
    clock.now += 5
    assert breaker.claim_probe()
    breaker.probe_failure()
    assert breaker.state == OPEN
    clock.now += 4.9
    assert not breaker.claim_probe()
    clock.now += 0.1
    assert breaker.claim_probe()
    assert breaker.opened == 2


def test_a_running_request_past_the_mean_is_expected_to_run_as_long_as_the_recent_runs_that_lasted_that_long():
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    for took in (0.010, 0.010, 0.010, 0.050):
        run(predictor, clock, took)
    predictor.begin()
    clock.now += 0.020  # 20 ms in: every recent run, at today's 30 ms average, lasted longer
    each = predictor.service_s
    assert each == pytest.approx(0.030)
    # The runs' shapes (time over the average before each): 1, 1 and 5. At today's 30 ms average a
    # run has 10, 10 and 130 ms left: 50 ms on average; max(mean - 20 ms, 0) said 10.
    assert predictor.predict(0).expected_s == pytest.approx(0.050 + each)


def test_the_margin_becomes_the_p99_of_recent_residuals_once_there_are_enough():
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    for _ in range(10):
        predictor.observe(0.010)  # steady: the deviation (5 ms at first) has halved 9 times
    first = predictor.predict(0)
    assert first.margin_s == pytest.approx(0, abs=1e-4) and first.tail_s == pytest.approx(0.010, abs=1e-4)
    for i in range(100):  # the requests took 0..9.9 ms longer than expected: what the estimate misses
        predictor.settle(first, first.expected_s + i * 1e-4)
    assert predictor.predict(0).margin_s == pytest.approx(0.0099, abs=2e-4)
    assert predictor.predict(3).margin_s == pytest.approx(4 * predictor.predict(0).margin_s)  # 4 runs, linear
    assert predictor.predict_s(0) == pytest.approx(0.010 + 0.0099, abs=2e-4)


def test_a_prediction_made_before_anything_was_known_teaches_nothing():
    predictor = LatencyPredictor(0.5, FakeClock())
    blind = predictor.predict(0)
    predictor.settle(blind, 5.0)
    assert blind.runs == 0 and predictor.calibration() is None


def test_calibration_reports_predicted_and_actual_percentiles_and_the_share_over_the_predicted_tail():
    clock = FakeClock()
    predictor = LatencyPredictor(0.5, clock)
    for _ in range(10):
        predictor.observe(0.010)
    prediction = predictor.predict(0)
    for i in range(200):  # 1% of the requests take 30 ms, the rest 10 ms
        predictor.settle(prediction, 0.030 if i % 100 == 0 else 0.010)
    report = predictor.calibration()
    assert report["requests"] == 200 and report["margin"] == "calibrated"
    assert report["actual_p50_ms"] == pytest.approx(10.0) and report["predicted_p50_ms"] == pytest.approx(10.0)
    assert report["predicted_p99_ms"] == pytest.approx(report["actual_p99_ms"], rel=0.01)
    assert report["over_predicted_tail"] == pytest.approx(0.01)  # admitted on a 10 ms tail, 2 of 200 took longer


def test_calibration_of_the_last_requests_only():
    predictor = LatencyPredictor(0.5, FakeClock())
    for _ in range(10):
        predictor.observe(0.010)
    prediction = predictor.predict(0)
    for _ in range(100):
        predictor.settle(prediction, 0.050)  # an earlier, slower period
    for _ in range(60):
        predictor.settle(prediction, 0.010)
    assert predictor.calibration(last=60)["actual_p99_ms"] == pytest.approx(10.0)
    assert predictor.calibration(last=60)["predicted_p99_ms"] == pytest.approx(10.0)
    assert predictor.calibration()["actual_p99_ms"] == pytest.approx(50.0)
    assert predictor.calibration(last=0) is None and predictor.calibration(last=1000)["requests"] == 160
