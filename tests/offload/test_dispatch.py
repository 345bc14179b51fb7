"""Routing between a real local ONNX Runtime model and a real V2 HTTP server, and every fault on the way.

Routing is made deterministic by the dispatcher's fake clock and by telling the predictor a
service time (``predictor.observe``): no test depends on how fast this machine is.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from edgesdk import OffloadPolicy, Runtime
from edgesdk.errors import BackendError, InputError, OffloadError, OverloadedError
from edgesdk.offload.deadline import DeadlineExceededError
from edgesdk.offload.dispatcher import Dispatcher
from edgesdk.ota_server.broker import free_port
from tests.offload.conftest import GatedModel
from tests.offload.fake_v2 import FakeV2Server, wait_until

SLOW_DEVICE_S = 1000.0  # what the predictor is told a local run takes, so that every request would break the SLO
#: The objective of these tests: a deadline cloud requests really wait for, as long as the other waits in these tests.
SLO_MS = 30_000


def _policy(server_or_url, **settings) -> OffloadPolicy:
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
    return OffloadPolicy(url, "mlp", **{"latency_slo_ms": SLO_MS, "max_local_queue": 16, "max_cloud_inflight": 8,
                                        "timeout_ms": 2000, **settings})


@pytest.fixture
def dispatchers():
    made: list[Dispatcher] = []

    def make(model, policy, clock, slow_device: bool = True, **options) -> Dispatcher:
        dispatcher = Dispatcher(lambda: model, policy, clock=clock, **options)
        made.append(dispatcher)
        if slow_device:
            dispatcher.predictor.observe(SLOW_DEVICE_S)
        return dispatcher

    yield make
    for dispatcher in made:
        dispatcher.close()


def _check(futures, frames, indexes=None):
    xs, wants = frames
    for i, future in zip(indexes or range(len(futures)), futures):
        got = future.result(timeout=30)
        assert got.dtype == np.float32 and got.shape == wants[i].shape
        assert np.allclose(got, wants[i], atol=1e-5)


def _offload_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("edgesdk.offload") and r.levelno >= logging.WARNING]


def test_a_saturated_device_sends_work_to_the_cloud_and_gets_the_local_results(local, cloud, frames, clock, dispatchers):
    dispatcher = dispatchers(local, _policy(cloud), clock)
    futures = [dispatcher.submit(x) for x in frames[0]]
    _check(futures, frames)
    stats = dispatcher.snapshot(local.stats())
    assert (stats.paths["cloud"].count, stats.paths["local"].count) == (8, 0)
    assert stats.breaker == "closed" and stats.refused == 0 and stats.fallbacks == 0
    assert cloud.infers == 8 and cloud.binary_bodies == 8
    assert stats.as_dict()["paths"]["cloud"]["p99_ms"] is not None


def test_work_stays_local_while_the_device_keeps_its_slo(wide_onnx, cloud, frames):
    with Runtime(wide_onnx, threads=1, offload=_policy(cloud, latency_slo_ms=60_000)) as rt:
        results = [rt.predict_async(x).result(timeout=30) for x in frames[0]]
        stats = rt.stats()
    assert all(np.allclose(r, w, atol=1e-5) for r, w in zip(results, frames[1]))
    assert (stats.paths["local"].count, stats.paths["cloud"].count, cloud.infers) == (8, 0, 0)
    assert stats.count == 8  # the overall figures keep counting the local model's runs


def test_when_the_device_has_room_again_work_comes_back(local, cloud, frames, clock, dispatchers):
    dispatcher = dispatchers(local, _policy(cloud), clock)
    assert dispatcher.route(dispatcher_feeds(frames)) == "cloud"
    dispatcher.predictor.observe(0.001)  # the device got faster (the other model stopped)
    for _ in range(40):
        dispatcher.predictor.observe(0.001)
    assert dispatcher.route(dispatcher_feeds(frames)) == "local"
    _check([dispatcher.submit(frames[0][0])], frames)
    assert cloud.infers == 0


def _fast_again(dispatcher) -> None:
    for _ in range(60):
        dispatcher.predictor.observe(0.001)


def dispatcher_feeds(frames):
    return {"input": frames[0][0]}


def test_heavy_requests_go_to_the_cloud_first(local, cloud, frames, clock, dispatchers):
    dispatcher = dispatchers(local, _policy(cloud, heavy_input_bytes=1024, latency_slo_ms=60_000), clock,
                             slow_device=False)
    small = frames[0][0][:, :128].copy()  # not this model's shape: only the size matters to route()
    assert dispatcher.route({"input": small}) == "local"
    assert dispatcher.route({"input": frames[0][0]}) == "cloud"  # 256 float32 = 1024 bytes
    assert dispatcher.route({"input": frames[0][0]}, heavy=False) == "local"
    _check([dispatcher.submit(frames[0][0]), dispatcher.submit(frames[0][1], heavy=False),
            dispatcher.submit(frames[0][2], heavy=True)], frames)
    stats = dispatcher.snapshot(local.stats())
    assert (stats.paths["cloud"].count, stats.paths["local"].count) == (2, 1)


def test_cloud_unreachable_at_start_runs_local_warns_once_and_the_probe_reconnects(local, frames, clock, dispatchers,
                                                                                caplog):
    port = free_port()
    policy = _policy(f"http://127.0.0.1:{port}", connect_timeout_ms=500, breaker_reset_s=30)
    with caplog.at_level(logging.WARNING):
        dispatcher = dispatchers(local, policy, clock)
        _check([dispatcher.submit(x) for x in frames[0]], frames)
    warnings = _offload_warnings(caplog)
    assert len(warnings) == 1 and "cannot be reached" in warnings[0] and "running locally" in warnings[0]
    stats = dispatcher.snapshot(local.stats())
    assert (stats.paths["local"].count, stats.paths["cloud"].count, stats.breaker) == (8, 0, "open")

    with caplog.at_level(logging.WARNING):
        clock.now += 30  # half-open: a probe goes out in the background; the request itself runs locally
        _check([dispatcher.submit(frames[0][2])], frames, [2])
        dispatcher._probe.join(timeout=10)  # noqa: SLF001 - the probe's thread, to read its outcome
    stats = dispatcher.snapshot(local.stats())
    # No user request was the probe: none failed in the cloud, none fell back; the probe's failure reopened it.
    assert (stats.fallbacks, stats.paths["cloud"].errors, stats.paths["local"].count, stats.breaker) == (0, 0, 9, "open")
    assert len(_offload_warnings(caplog)) == 1  # still the one warning: a failed probe is not news

    with FakeV2Server(local.info.model, port=port) as server:
        clock.now += 30  # half-open again: the probe configures the client (metadata) and sends one small inference
        _check([dispatcher.submit(frames[0][3])], frames, [3])
        dispatcher._probe.join(timeout=10)  # noqa: SLF001
        assert dispatcher.snapshot(local.stats()).breaker == "closed"
        assert (server.infers, server.probes) == (0, 1), "the probe is its own small inference, not a user request"
        assert dispatcher.cloud_latency.predict().samples == 1  # and its round trip is the cloud's first measurement
        _check([dispatcher.submit(x) for x in frames[0]], frames)
        assert server.infers == 8


def test_a_runtime_with_an_unreachable_cloud_starts_and_serves(wide_onnx, frames, caplog):
    policy = _policy(f"http://127.0.0.1:{free_port()}", connect_timeout_ms=500)
    with caplog.at_level(logging.WARNING), Runtime(wide_onnx, threads=1, offload=policy) as rt:
        _check([rt.predict_async(x) for x in frames[0]], frames)
        assert rt.stats().breaker == "open"
    assert len(_offload_warnings(caplog)) == 1


def test_cloud_killed_mid_run_every_request_finishes_locally(local, cloud, frames, clock, dispatchers):
    dispatcher = dispatchers(local, _policy(cloud, max_cloud_inflight=4, breaker_failures=3), clock)
    cloud.mode = "kill"
    futures = [dispatcher.submit(x) for x in frames[0][:4]]
    cloud.wait_held(4)
    _fast_again(dispatcher)  # so the failed requests can still make their objective here
    cloud.stop()  # nothing listens any more; the held requests are dropped without an answer
    cloud.release.set()
    _check(futures, frames)  # all four ran locally after their cloud connection dropped
    futures += [dispatcher.submit(x) for x in frames[0][4:]]  # the breaker is open: these stay local
    _check(futures, frames)
    stats = dispatcher.snapshot(local.stats())
    assert stats.fallbacks == 4 and stats.paths["cloud"].errors == 4 and stats.paths["local"].count == 8
    assert stats.breaker == "open"


@pytest.mark.parametrize("fault", ["500 error", "422 detail", "text", "malformed"])
def test_cloud_errors_are_typed_counted_by_the_breaker_and_served_locally(local, cloud, frames, clock, dispatchers,
                                                                         fault):
    # Measured at construction while it answered; heavy requests go to it first and, failing, run here in time.
    dispatcher = dispatchers(local, _policy(cloud, breaker_failures=2, binary=False), clock, slow_device=False)
    if fault == "500 error":
        cloud.fail(500, b'{"error": "model crashed"}')
    elif fault == "422 detail":
        cloud.fail(422, b'{"detail": [{"loc": ["body", "inputs"], "msg": "field required"}]}')
    elif fault == "text":
        cloud.fail(502, b"Bad Gateway", "text/plain")
    else:
        cloud.mode = "malformed"
    for i in range(4):  # one at a time: two go to the cloud and fail over, then the open breaker keeps work local
        _check([dispatcher.submit(frames[0][i], heavy=True)], frames, [i])
    stats = dispatcher.snapshot(local.stats())
    assert (stats.paths["cloud"].errors, stats.fallbacks, stats.paths["local"].count) == (2, 2, 4)
    assert stats.breaker == "open" and cloud.infers == 2


def test_a_cloud_request_that_times_out_at_its_deadline_is_dropped_not_run_late_here(local, cloud, frames, clock,
                                                                                    dispatchers, caplog):
    """The deadline (200 ms), not timeout_ms (20 s), bounds the wait; the late request is not run locally after it."""
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, _policy(cloud, latency_slo_ms=200, timeout_ms=20_000, breaker_failures=1), clock)
    cloud.mode = "slow"
    with caplog.at_level(logging.WARNING):
        future = dispatcher.submit(frames[0][0])
        with pytest.raises(DeadlineExceededError, match=r"cannot meet its 200 ms objective any more \(\d+\.\d ms "
                                                        r"late\): the cloud timed out") as caught:
            future.result(timeout=15)  # the old rule waited the 20 s timeout, then ran it here
    assert caught.value.objective_ms == 200 and caught.value.late_ms > 0
    stats = dispatcher.snapshot(local.stats())
    assert (stats.paths["cloud"].errors, stats.fallbacks, stats.breaker, gated.calls) == (1, 0, "open", [])
    assert dispatcher.dropped == 1
    assert any("breaker open" in w and "timed out" in w for w in _offload_warnings(caplog))


def test_a_model_the_cloud_lacks_is_an_error_at_construction(wide_onnx, cloud):
    with pytest.raises(OffloadError, match="has no model 'resnet'.*deploy the model there"):
        Runtime(wide_onnx, threads=1, offload=OffloadPolicy(cloud.url, "resnet"))


def test_a_cloud_model_with_other_inputs_is_an_error_at_construction(wide_onnx):
    other = [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    with FakeV2Server(wide_onnx, metadata_inputs=other) as server, \
            pytest.raises(OffloadError, match=r"input 'input' has shape \[-1, 64\] on the server but \[-1, 256\] here"):
        Runtime(wide_onnx, threads=1, offload=_policy(server))


def test_both_sides_full_is_refused_at_once_and_nothing_is_lost(local, cloud, frames, clock, dispatchers):
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, _policy(cloud, max_local_queue=2, max_cloud_inflight=1), clock)
    cloud.mode = "hold"
    to_cloud = dispatcher.submit(frames[0][0])
    cloud.wait_held(1)
    running = dispatcher.submit(frames[0][1])  # the cloud is full: local, and the worker blocks on the gate
    assert gated.entered.acquire(timeout=30)
    waiting = dispatcher.submit(frames[0][2])
    with pytest.raises(OverloadedError, match=r"local predicted [\d.]+ ms with 1 queued \(2/2 in the local "
                                                 r"queue, full\), 1/1 cloud requests open, objective 30000 ms"):
        dispatcher.submit(frames[0][3])
    assert dispatcher.snapshot(local.stats()).refused == 1
    gated.gate.set()
    cloud.mode = "ok"
    cloud.release.set()
    _check([to_cloud, running, waiting], frames)


def _cloud_dies_with_two_local(local, cloud, frames, clock, dispatchers, max_local_queue):
    """One request held by a dying cloud, one running locally (gated), one waiting; then the cloud drops its request."""
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, _policy(cloud, max_local_queue=max_local_queue, max_cloud_inflight=1), clock)
    cloud.mode = "kill"
    to_cloud = dispatcher.submit(frames[0][0])
    cloud.wait_held(1)
    running = dispatcher.submit(frames[0][1])
    assert gated.entered.acquire(timeout=30)
    waiting = dispatcher.submit(frames[0][2])
    _fast_again(dispatcher)  # the failed cloud request could still make its objective here
    cloud.release.set()
    return gated, dispatcher, (to_cloud, running, waiting)


def test_a_failed_cloud_request_is_refused_when_the_local_queue_is_full(local, cloud, frames, clock, dispatchers):
    """The local bound holds for fallbacks too: at the bound a failed cloud request ends in OverloadedError."""
    # Two local requests against a bound of 2: the failed cloud request comes back to a full queue.
    gated, dispatcher, (to_cloud, running, waiting) = _cloud_dies_with_two_local(local, cloud, frames, clock,
                                                                                 dispatchers, max_local_queue=2)
    with pytest.raises(OverloadedError, match=r"the cloud failed .* local queue is full \(2/2\)"):
        to_cloud.result(timeout=30)
    gated.gate.set()
    _check([running, waiting], frames, indexes=[1, 2])
    stats = dispatcher.snapshot(local.stats())
    assert (stats.fallbacks, stats.refused, len(gated.calls)) == (0, 1, 2)


def test_a_failed_cloud_request_runs_locally_ahead_of_the_waiting_ones(local, cloud, frames, clock, dispatchers):
    # Two local requests against a bound of 3: room for the fallback.
    gated, dispatcher, (to_cloud, running, waiting) = _cloud_dies_with_two_local(local, cloud, frames, clock,
                                                                                 dispatchers, max_local_queue=3)
    wait_until(lambda: dispatcher.snapshot(local.stats()).fallbacks == 1, what="the fallback")
    gated.gate.set()
    _check([to_cloud, running, waiting], frames)
    order = [next(i for i, x in enumerate(frames[0]) if x is call) for call in gated.calls]
    assert order == [1, 0, 2]


def test_predict_async_without_a_policy_has_a_bounded_local_queue(local, frames, dispatchers):
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, None, clock=lambda: 0.0, slow_device=False, max_local_queue=2)
    first = dispatcher.submit(frames[0][0])
    assert gated.entered.acquire(timeout=30)
    second = dispatcher.submit(frames[0][1])
    with pytest.raises(OverloadedError, match=r"\(2/2\) and no offload policy"):
        dispatcher.submit(frames[0][2])
    with pytest.raises(InputError, match="expects dtype float32, got float64"):
        dispatcher.submit(frames[0][2].astype(np.float64))
    gated.gate.set()
    _check([first, second], frames)
    stats = dispatcher.snapshot(local.stats())
    assert stats.breaker is None and stats.refused == 1


def test_close_fails_waiting_requests_finishes_the_running_one_and_returns(local, frames, dispatchers):
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, None, clock=lambda: 0.0, slow_device=False, max_local_queue=4)
    running = dispatcher.submit(frames[0][0])
    assert gated.entered.acquire(timeout=30)
    waiting = [dispatcher.submit(x) for x in frames[0][1:3]]
    closer = threading.Thread(target=dispatcher.close)
    closer.start()
    for future in waiting:
        with pytest.raises(BackendError, match="closed before this request ran"):
            future.result(timeout=30)
    gated.gate.set()
    closer.join(30)
    assert not closer.is_alive()
    _check([running], frames)
    with pytest.raises(BackendError, match="closed"):
        dispatcher.submit(frames[0][0])


def test_runtime_close_with_requests_queued_never_hangs(wide_onnx, frames):
    rt = Runtime(wide_onnx, threads=1, max_local_queue=64)
    futures = [rt.predict_async(x) for x in frames[0] * 4]
    rt.close()
    for future in futures:  # each one either ran or says why not
        try:
            assert future.result(timeout=30).shape == (1, 10)
        except BackendError as exc:
            assert "closed" in str(exc)
    with pytest.raises(BackendError, match="closed"):
        rt.predict_async(frames[0][0])


def test_runtime_rejects_a_queue_bound_that_contradicts_its_policy(wide_onnx, cloud):
    with pytest.raises(BackendError, match="max_local_queue=3 contradicts the offload policy's max_local_queue=16"):
        Runtime(wide_onnx, threads=1, offload=_policy(cloud), max_local_queue=3)
    with pytest.raises(BackendError, match="offload must be an OffloadPolicy"):
        Runtime(wide_onnx, threads=1, offload={"url": cloud.url})  # type: ignore[arg-type]


def test_the_real_predictor_learns_from_the_first_local_run(wide_onnx, cloud, frames):
    """No fake clock: the first request runs locally (nothing known yet); no local run fits a 1 µs
    SLO after that, nor does the cloud's measured round trip: the next one, on an idle device, runs
    here (the soonest answer there is), not on a cloud predicted to miss the objective."""
    with Runtime(wide_onnx, threads=1, offload=_policy(cloud, latency_slo_ms=0.001)) as rt:
        results = [rt.predict_async(x).result(timeout=30) for x in frames[0][:2]]
        stats = rt.stats()
        assert rt.dispatcher is not None and rt.dispatcher.predictor.predict(0).tail_s > 1e-6
        assert rt.dispatcher.cloud_latency.predict().tail_s > 1e-6
    assert all(np.allclose(r, w, atol=1e-5) for r, w in zip(results, frames[1]))
    assert (stats.paths["local"].count, stats.paths["cloud"].count, stats.refused) == (2, 0, 0)
    assert (cloud.infers, cloud.probes) == (0, 1)


def test_stats_as_dict_is_json_with_the_paths(local, cloud, frames, clock, dispatchers):
    import json

    dispatcher = dispatchers(local, _policy(cloud), clock)
    _check([dispatcher.submit(frames[0][0])], frames)
    data = json.loads(json.dumps(dispatcher.snapshot(local.stats()).as_dict()))
    assert set(data) == {"count", "errors", "window", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "paths", "refused",
                         "fallbacks", "breaker", "calibration"}
    assert set(data["paths"]) == {"local", "cloud"}
    assert set(data["paths"]["cloud"]) == {"count", "errors", "window", "p50_ms", "p95_ms", "p99_ms", "mean_ms"}
    assert data["paths"]["cloud"]["count"] == 1 and data["breaker"] == "closed"


def test_a_request_whose_cloud_call_fails_at_once_waits_behind_those_submitted_before_it(local, frames, clock,
                                                                                         dispatchers):
    """Re-queued at the front, it would push every waiting request back by one service time (12% of p99 at 2x)."""
    gated = GatedModel(local)
    down = _policy(f"http://127.0.0.1:{free_port()}", connect_timeout_ms=500, breaker_failures=5)
    dispatcher = dispatchers(gated, down, clock, slow_device=False, configure=False)
    for _ in range(20):
        dispatcher.predictor.observe(0.001)  # a fast device: the first three stay local
    futures = [dispatcher.submit(x) for x in frames[0][:3]]
    assert gated.entered.acquire(timeout=10)  # the first runs (held); two wait
    futures.append(dispatcher.submit(frames[0][3], heavy=True))  # to the cloud first, which refuses at once
    wait_until(lambda: dispatcher.fallbacks == 1, what="the cloud failure's fallback")
    gated.gate.set()
    _check(futures, frames)
    order = [next(i for i, x in enumerate(frames[0]) if np.array_equal(call, x)) for call in gated.calls]
    assert order == [0, 1, 2, 3], order


def test_runtime_stats_report_how_the_latency_predictions_held(wide_onnx, frames):
    with Runtime(wide_onnx, threads=1) as rt:
        for i in range(20):  # one at a time: each after the first is predicted from the runs before it
            rt.predict_async(frames[0][i % 8]).result(timeout=30)
        calibration = rt.stats().calibration
    assert calibration is not None and calibration["requests"] == 19  # the first had nothing to go on
    assert calibration["margin"] == "deviation"  # fewer than MIN_RESIDUALS settled requests so far
    assert 0 < calibration["actual_p50_ms"] <= calibration["actual_p99_ms"]
    assert 0 < calibration["predicted_p50_ms"] <= calibration["predicted_p99_ms"]
    assert 0 <= calibration["over_predicted_tail"] <= 1
