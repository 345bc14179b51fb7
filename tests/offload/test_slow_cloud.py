"""The cloud as a predicted path: a slow cloud gets no user work, the deadline travels, late work
is dropped.

A real local model and a real V2 HTTP server on loopback. The cloud is made slow on the
dispatcher's fake clock (the server moves it forward before answering: ``FakeV2Server.on_infer``),
so what the dispatcher measures does not depend on this machine's speed; deadlines that must
really pass are met by a server that never answers (``hold``), never by a sleep. Requests that do
go to the cloud have an objective as long as the other waits in these tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import ManagedRuntime, Runtime
from edgesdk.errors import OverloadedError
from edgesdk.offload.deadline import DeadlineExceededError
from edgesdk.offload.dispatcher import Dispatcher
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from tests.offload.conftest import GatedModel
from tests.offload.fake_v2 import wait_until
from tests.offload.test_dispatch import SLO_MS, SLOW_DEVICE_S, _check, _policy

#: The objective (s); the slow cloud takes 3x as long on the fake clock.
SLO_S = SLO_MS / 1e3


@pytest.fixture
def dispatchers():
    made: list[Dispatcher] = []

    def make(model, policy, clock, **options) -> Dispatcher:
        dispatcher = Dispatcher(lambda: model, policy, clock=clock, **options)
        made.append(dispatcher)
        return dispatcher

    yield make
    for dispatcher in made:
        dispatcher.close()


def _slow_on_the_clock(cloud, clock, seconds: float) -> None:
    def answer_late() -> None:
        clock.now += seconds

    cloud.on_infer = answer_late


def _user_requests(cloud) -> list[dict]:
    return [r for r in cloud.requests if not (r["id"] or "").startswith("edgesdk-probe")]


def test_a_cloud_three_times_slower_than_the_objective_gets_no_user_request_and_overflow_is_refused(
        local, cloud, frames, clock, dispatchers):
    """The old rule sent it work when the local queue was full, and queued work here past the
    objective before that."""
    _slow_on_the_clock(cloud, clock, 3 * SLO_S)
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, _policy(cloud, max_local_queue=4), clock)
    assert cloud.probes == 1  # measured at construction by one small inference
    assert dispatcher.cloud_latency.predict().tail_s == pytest.approx(3 * SLO_S)
    for _ in range(60):  # two requests make the objective here, a third does not
        dispatcher.predictor.observe(0.4 * SLO_S)
    running = dispatcher.submit(frames[0][0])
    assert gated.entered.acquire(timeout=30)
    waiting = dispatcher.submit(frames[0][1])
    refusal = (r"local predicted 36000\.\d ms with 1 queued \(2/4 in the local queue\), cloud "
               r"predicted 90000\.0 ms \(p99 of 1 round trips, 0 in flight\), objective 30000 ms")
    with pytest.raises(OverloadedError, match=refusal):
        dispatcher.submit(frames[0][2])  # at once: room here, but neither side would make it
    # Heavy work is not sent there either.
    assert dispatcher.route({"input": frames[0][3]}, heavy=True) == "refused"
    gated.gate.set()
    _check([running, waiting], frames)
    stats = dispatcher.snapshot(local.stats())
    counts = (cloud.infers, stats.paths["cloud"].count, stats.paths["local"].count, stats.refused)
    assert counts == (0, 0, 2, 1)


def test_a_slow_cloud_is_measured_again_by_the_probe_and_gets_work_once_it_is_fast(
        local, cloud, frames, clock, dispatchers):
    _slow_on_the_clock(cloud, clock, 3 * SLO_S)
    dispatcher = dispatchers(local, _policy(cloud, breaker_reset_s=10), clock)
    dispatcher.predictor.observe(SLOW_DEVICE_S)
    assert dispatcher.route({"input": frames[0][0]}) == "local"  # the device is idle: soonest here
    cloud.on_infer = None  # the cloud recovers; only a measurement can tell
    clock.now += 31  # the slow round trip leaves the horizon once a newer one is measured
    _check([dispatcher.submit(frames[0][0])], frames)  # local; and a probe goes out: it is due
    dispatcher._probe.join(timeout=10)  # noqa: SLF001 - the probe's thread, to read its outcome
    assert (cloud.probes, cloud.infers) == (2, 0)
    assert dispatcher.cloud_latency.predict().tail_s == pytest.approx(0.0)
    _check([dispatcher.submit(frames[0][1])], frames, [1])
    assert cloud.infers == 1


def test_an_overloaded_but_ready_cloud_does_not_make_the_breaker_flap(local, cloud, frames, clock,
                                                                     dispatchers):
    """The old probe asked for readiness only: the breaker closed and user work went to a cloud
    too slow for it."""
    dispatcher = dispatchers(local, _policy(cloud, breaker_reset_s=10), clock)
    dispatcher.predictor.observe(SLOW_DEVICE_S)
    _slow_on_the_clock(cloud, clock, 3 * SLO_S)  # fast when measured; now overloaded, yet "ready"
    assert dispatcher.breaker is not None
    dispatcher.breaker.trip()  # as its timeouts would have
    for round_ in range(3):  # heavy requests: the cloud first, whenever it may take them
        clock.now += 10  # half-open, then due again: the request that finds it so sends the probe
        try:
            dispatcher.submit(frames[0][round_], heavy=True).result(timeout=30)  # here: idle
        except OverloadedError:
            pass  # not expected; the probe is the point
        dispatcher._probe.join(timeout=10)  # noqa: SLF001
        assert dispatcher.breaker.state == "closed"  # the probe answered: the cloud works...
        # ...too slowly for the objective: no user request goes there.
        assert dispatcher.route({"input": frames[0][0]}, heavy=True) == "local"
    assert (cloud.infers, dispatcher.breaker.opened) == (0, 1)


def test_a_stragglers_late_success_does_not_close_the_open_breaker(local, cloud, frames, clock,
                                                                   dispatchers):
    dispatcher = dispatchers(local, _policy(cloud), clock)
    dispatcher.predictor.observe(SLOW_DEVICE_S)
    cloud.mode = "hold"
    straggler = dispatcher.submit(frames[0][0])
    cloud.wait_held(1)
    assert dispatcher.breaker is not None
    dispatcher.breaker.trip()  # other requests failed meanwhile
    cloud.mode = "ok"
    cloud.release.set()
    _check([straggler], frames)  # it answered, late
    assert dispatcher.breaker.state == "open"  # the old rule closed it here
    assert dispatcher.route({"input": frames[0][1]}) == "local"  # the cloud is down: local-only


@pytest.mark.parametrize("binary", [True, False])
def test_the_deadline_travels_as_the_v2_timeout_parameter_in_microseconds(local, cloud, frames,
                                                                          clock, dispatchers,
                                                                          binary):
    dispatcher = dispatchers(local, _policy(cloud, binary=binary), clock)
    dispatcher.predictor.observe(SLOW_DEVICE_S)
    _check([dispatcher.submit(frames[0][0])], frames)
    [sent] = _user_requests(cloud)
    assert sent["binary"] is binary  # a binary request carries it in its JSON header part
    timeout_us = sent["parameters"].get("timeout")
    assert isinstance(timeout_us, int) and 0 < timeout_us <= SLO_MS * 1000  # what was left of it
    [probe] = [r for r in cloud.requests if r not in _user_requests(cloud)]
    assert probe["id"] == "edgesdk-probe-1" and 0 < probe["parameters"]["timeout"] <= 2_000_000


def test_a_timed_out_cloud_request_is_not_run_ahead_of_local_work_that_can_still_make_it(
        local, cloud, frames, clock, dispatchers):
    """The old rule waited out timeout_ms and then ran the late request first among the waiting
    ones."""
    gated = GatedModel(local)
    policy = _policy(cloud, latency_slo_ms=2000, timeout_ms=20_000, max_local_queue=4)
    dispatcher = dispatchers(gated, policy, clock)
    for _ in range(60):
        dispatcher.predictor.observe(0.001)  # a fast device: the queued requests make the objective
    running = dispatcher.submit(frames[0][0])
    assert gated.entered.acquire(timeout=30)
    cloud.mode = "hold"
    late = dispatcher.submit(frames[0][1], heavy=True)  # to the cloud first, which never answers
    cloud.wait_held(1)
    waiting = dispatcher.submit(frames[0][2])  # submitted after it: it would wait behind it
    with pytest.raises(DeadlineExceededError,
                       match=r"2000 ms objective .* the cloud timed out .* not re-queued"):
        late.result(timeout=15)  # at its 2 s deadline, not at timeout_ms
    gated.gate.set()
    _check([running, waiting], frames, [0, 2])
    ran = [next(i for i, x in enumerate(frames[0]) if np.array_equal(c, x)) for c in gated.calls]
    assert ran == [0, 2]
    assert (dispatcher.fallbacks, dispatcher.dropped) == (0, 1)


def test_the_local_predictor_starts_from_the_latency_the_bundle_measured(tmp_path, wide_mlp,
                                                                         frames):
    """Before the first local run ends, a burst is predicted at the bundle's figure, not blind."""
    spec = BundleSpec("wide", "1.0.0", "onnx-fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(), measured={"host": {"latency_p50_ms": 40.0}})
    bundle_from_model(tmp_path / "b", wide_mlp[1], spec, {"input": frames[0][0]})
    for made in (Runtime, ManagedRuntime):  # a managed app reads its active bundle's figure
        with made(tmp_path / "b", profile="generic-x86_64") as rt:
            assert rt.expected_latency_s == pytest.approx(0.040)
            dispatcher = rt._ensure_dispatcher()  # noqa: SLF001 - made at the first predict_async
            assert dispatcher.predictor.predict(3).expected_s == pytest.approx(0.040 * 4,
                                                                               rel=0.01)


def test_a_cloud_failure_before_the_devices_first_run_ends_falls_back_here_not_dropped(
        local, cloud, frames, clock, dispatchers):
    """With no run ended and no seed the device's expectation is unknown (infinite); that is no
    evidence the request would be late here, so it waits here, as it would without offload (it
    was dropped as "predicted to take inf ms")."""
    gated = GatedModel(local)
    dispatcher = dispatchers(gated, _policy(cloud, max_local_queue=4), clock)
    running = dispatcher.submit(frames[0][0])
    assert gated.entered.acquire(timeout=30)  # the device's first run has begun, not ended
    assert dispatcher.predictor.predict(0).basis == "unknown"
    cloud.fail(500, b'{"error": "boom"}')
    fell_back = dispatcher.submit(frames[0][1], heavy=True)  # heavy: to the cloud, which fails
    wait_until(lambda: dispatcher.fallbacks + dispatcher.dropped == 1, 30,
               "the cloud's failure handled while the first run still runs")
    gated.gate.set()
    _check([running, fell_back], frames, [0, 1])
    assert (dispatcher.fallbacks, dispatcher.dropped) == (1, 0)
