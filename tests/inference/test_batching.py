"""Dynamic batching: concurrent requests share one ONNX Runtime call, a full queue answers 503 at once."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import HEADER_LENGTH, decode_response, encode_request
from edgesdk.ota_server.inference import BatchingConfig, InferenceConfig, ServedModel
from edgesdk.ota_server.inference.batcher import Batcher, QueueFullError
from edgesdk.ota_server.inference.run_cost import RunCost
from tests.inference.conftest import WIDTH_IN, reference
from tests.inference.http import error_of, request, sample, wait_until


def post(endpoint, x: np.ndarray, model: str = "mlp"):
    body, headers = encode_request({"input": x}, binary_inputs=True, binary_outputs=True)
    return request(f"{endpoint.url}/v2/models/{model}/infer", body, headers)


def test_concurrent_requests_run_as_one_batch_with_single_request_outputs(serve, bundles):
    # A generous delay: the batcher waits for all 8 rows, so the batch is 8 whatever the scheduling.
    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(preferred_batch_size=8,
                                                                        max_queue_delay_us=20_000_000))])
    xs = [np.random.default_rng(i).standard_normal((1, WIDTH_IN)).astype(np.float32) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: post(endpoint, x), xs))
    for x, (status, headers, body) in zip(xs, answers):
        assert status == 200
        got = decode_response(body, int(headers[HEADER_LENGTH])).outputs["probabilities"]
        np.testing.assert_allclose(got, reference(bundles["mlp-1"], x), rtol=1e-5, atol=1e-6)
    assert sample(endpoint, "edgesdk_inference_batch_size", "_count") == 1
    assert sample(endpoint, "edgesdk_inference_batch_size", "_sum") == 8


def test_full_queue_answers_503_at_once_and_queued_requests_still_run(serve):
    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(max_queue=2, max_queue_delay_us=0))])
    model = endpoint.registry.get("mlp")
    x = np.ones((1, WIDTH_IN), np.float32)
    with ThreadPoolExecutor(2) as pool:
        with model.batcher.paused():
            queued = [pool.submit(post, endpoint, x) for _ in range(2)]
            wait_until(lambda: model.batcher.depth == 2, "two queued requests")
            status, message = error_of(post(endpoint, x))
            assert status == 503 and "max_queue" in message
            assert sample(endpoint, "edgesdk_inference_queue_depth", "") == 2
        assert [f.result()[0] for f in queued] == [200, 200]
    assert sample(endpoint, "edgesdk_inference_failures", "_total") == 1


def busy(seconds: float) -> None:
    """Hold this thread's CPU for ``seconds`` of its own CPU time (a sleep would be off the CPU, and not costed)."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_unbatched_runs_under_the_inline_threshold_run_on_the_event_loop_and_longer_ones_in_a_worker(serve):
    """The wiring of the inline rule (its numbers are tests/unit/test_run_cost.py's). Costed by CPU time (one intra-op
    thread) against a threshold of 5 ms: the MLP's runs measured 0.06 to 0.16 ms of CPU here, the slow model's 20 ms,
    so no preemption on a busy machine moves a run across it (CI saw wall-clock runs over the real 0.5 ms for 60 runs)."""
    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(enabled=False))], threads=1)
    model = endpoint.registry.get("mlp")
    model.run_cost = RunCost(inline_s=5e-3)
    ran_on: list[str] = []
    run = model.run

    def recorded(inputs, busy_s: float = 0.0):
        ran_on.append(threading.current_thread().name)
        busy(busy_s)
        return run(inputs)

    model.run = recorded
    x = np.ones((1, WIDTH_IN), np.float32)
    assert post(endpoint, x)[0] == 200
    assert ran_on == ["run-mlp-1.0.0_0"], "the first run has no estimate: it goes to a worker"
    # Once every recent run (the window of the last 8) was short, the loop runs it; bounded, for a cold first run.
    for _ in range(20):
        assert post(endpoint, x)[0] == 200
        if ran_on[-3:] == ["admin-http"] * 3:
            break
    assert ran_on[-3:] == ["admin-http"] * 3, ran_on
    model.run = lambda inputs: recorded(inputs, busy_s=0.02)  # now a model slower than the threshold
    slow_from = len(ran_on)
    for _ in range(6):
        assert post(endpoint, x)[0] == 200
    # The first slow run was decided on the fast ones; from the next on, the slowest recent run keeps it off the loop.
    assert ran_on[slow_from] == "admin-http" and "admin-http" not in ran_on[slow_from + 1:], ran_on[slow_from:]


def test_unbatched_runs_take_turns_on_as_many_threads_as_fill_the_cpus(serve):
    cpus = len(os.sched_getaffinity(0))
    endpoint = serve(config=InferenceConfig(models=(ServedModel("mlp", batching=BatchingConfig(enabled=False)),),
                                            threads=cpus))  # one session fills the CPUs: one run at a time
    model = endpoint.registry.get("mlp")
    running, most = [0], [0]
    lock = threading.Lock()
    run = model.run

    def counted(inputs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)  # slower than the inline threshold: these go to the runner
        with lock:
            running[0] -= 1
        return run(inputs)

    model.run = counted
    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda _: post(endpoint, np.ones((1, WIDTH_IN), np.float32))[0], range(6)))
    assert statuses == [200] * 6 and most[0] == 1
    assert serve(config=InferenceConfig(threads=1)).registry.get("mlp")._runner._max_workers == cpus


def test_batching_off_and_fixed_batch_models_run_each_request_alone(serve):
    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(enabled=False)), ServedModel("fixed")])
    assert endpoint.registry.get("mlp").batcher is None and endpoint.registry.get("fixed").batcher is None
    assert post(endpoint, np.ones((3, WIDTH_IN), np.float32))[0] == 200
    assert post(endpoint, np.ones((1, WIDTH_IN), np.float32), "fixed")[0] == 200
    assert sample(endpoint, "edgesdk_inference_batch_size", "_sum") == 3


class Recorder:
    """A run function that records the shapes it was called with and answers each row's sum."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, inputs):
        x = inputs["x"]
        self.calls.append(x.shape)
        return {"y": x.reshape(len(x), -1).sum(axis=1)}


def test_requests_of_different_shapes_are_not_concatenated():
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=8, max_queue_delay_us=0))
    try:
        with batcher.paused():
            futures = [batcher.submit({"x": np.full((1, 3), i, np.float32)}) for i in (1, 2)]
            futures.append(batcher.submit({"x": np.full((2, 5), 3, np.float32)}))
            futures.append(batcher.submit({"x": np.full((1, 3), 4, np.float32)}))
        results = [f.result(timeout=10)["y"].tolist() for f in futures]
    finally:
        batcher.close()
    assert results == [[3.0], [6.0], [15.0, 15.0], [12.0]]
    assert recorder.calls == [(3, 3), (2, 5)]


def test_batch_never_exceeds_preferred_size_and_failures_reach_every_request():
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=4, max_queue_delay_us=0, max_queue=3))
    try:
        with batcher.paused():
            futures = [batcher.submit({"x": np.ones((rows, 2), np.float32)}) for rows in (2, 3, 2)]
            with pytest.raises(QueueFullError):
                batcher.submit({"x": np.ones((1, 2), np.float32)})
        [f.result(timeout=10) for f in futures]
        assert recorder.calls == [(4, 2), (3, 2)]
    finally:
        batcher.close()

    def broken(inputs):
        raise ValueError("kernel exploded")

    batcher = Batcher(broken, BatchingConfig(preferred_batch_size=4, max_queue_delay_us=0))
    try:
        with batcher.paused():
            futures = [batcher.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(2)]
        for f in futures:
            with pytest.raises(ValueError, match="kernel exploded"):
                f.result(timeout=10)
    finally:
        batcher.close()


def test_close_runs_what_is_queued():
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=100, max_queue_delay_us=60_000_000))
    futures = [batcher.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(3)]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    assert [f.result(timeout=10)["y"].tolist() for f in futures] == [[2.0]] * 3
    closer.join(10)
    assert batcher.closed and not closer.is_alive()


def test_metrics_parse_and_count_per_model_and_version(serve, repo, bundles):
    endpoint = serve()
    assert post(endpoint, np.ones((2, WIDTH_IN), np.float32))[0] == 200
    assert error_of(post(endpoint, np.ones((2, WIDTH_IN + 1), np.float32)))[0] == 400
    assert error_of(post(endpoint, np.ones((1, WIDTH_IN), np.float32), "nope"))[0] == 404
    status, headers, body = request(f"{endpoint.url}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {"edgesdk_inference_requests", "edgesdk_inference_failures", "edgesdk_inference_request_seconds",
            "edgesdk_inference_queue_seconds", "edgesdk_inference_compute_seconds", "edgesdk_inference_batch_size",
            "edgesdk_inference_queue_depth"} <= set(families)
    requests = {(s.labels["model"], s.labels["version"]): s.value for s in families["edgesdk_inference_requests"].samples
                if s.name.endswith("_total")}
    assert requests == {("mlp", "1.0.0"): 2.0, ("_unknown", ""): 1.0}
    failures = {(s.labels["model"], s.labels["reason"]): s.value for s in families["edgesdk_inference_failures"].samples
                if s.name.endswith("_total")}
    assert failures == {("mlp", "bad_request"): 1.0, ("_unknown", "not_found"): 1.0}
    assert sample(endpoint, "edgesdk_inference_request_seconds", "_count") == 2
    assert json.loads(request(f"{endpoint.url}/v2/health/ready")[2]) == {"ready": True}


class SlowRecorder(Recorder):
    """A Recorder whose every call takes ``seconds`` (a model with real compute time)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(self, inputs):
        time.sleep(self.seconds)
        return super().__call__(inputs)


def test_adaptive_delay_does_not_hold_a_lone_clients_requests():
    # The configured delay is 3 s. Only the first request, before any arrival gap or compute time
    # is known, waits it; a lone client's later requests arrive one gap (> a batch's compute) apart,
    # so each runs at once. The 1.5 s bound is the behaviour (no wait), not a performance figure.
    recorder = SlowRecorder(0.002)
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=8, max_queue_delay_us=3_000_000))
    try:
        batcher.submit({"x": np.ones((1, 2), np.float32)}).result(timeout=10)
        for _ in range(5):
            started = time.perf_counter()
            batcher.submit({"x": np.ones((1, 2), np.float32)}).result(timeout=10)
            assert time.perf_counter() - started < 1.5, "a lone client's request waited for the queue delay"
    finally:
        batcher.close()
    assert recorder.calls == [(1, 2)] * 6


def test_adaptive_delay_still_fills_batches_for_a_crowd():
    # Eight closed-loop clients against 100 ms of compute, client i sending 5i ms after its answer:
    # each round's requests arrive 5 ms apart, far faster than a batch finishes, so the batcher
    # waits for them. Running whatever is queued instead would alternate batches of 1 and 7
    # (20 calls or more). At 1 ms apart (a wait of 2 ms for each arrival), a CI host running 4
    # workers on 2 cores woke the clients late often enough to split batches (15 calls).
    recorder = SlowRecorder(0.1)
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=8, max_queue_delay_us=1_000_000))

    def client(i: int) -> None:
        for _ in range(10):
            time.sleep(0.005 * i)
            batcher.submit({"x": np.ones((1, 2), np.float32)}).result(timeout=30)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))
    finally:
        batcher.close()
    sizes = [shape[0] for shape in recorder.calls]
    assert sum(sizes) == 80
    assert len(sizes) <= 14, f"the crowd's 80 requests ran in {len(sizes)} calls: {sizes}"


def test_adaptive_delay_is_a_setting_and_off_waits_as_configured():
    assert BatchingConfig().adaptive_queue_delay is True
    with pytest.raises(InputError, match="adaptive_queue_delay is 'yes'"):
        BatchingConfig(adaptive_queue_delay="yes")  # type: ignore[arg-type]
    recorder = SlowRecorder(0.0)
    batcher = Batcher(recorder, BatchingConfig(preferred_batch_size=2, max_queue_delay_us=300_000,
                                               adaptive_queue_delay=False))
    try:
        for _ in range(3):  # with averages known, off still waits the whole delay for a second row
            started = time.perf_counter()
            batcher.submit({"x": np.ones((1, 2), np.float32)}).result(timeout=10)
            assert time.perf_counter() - started >= 0.3
    finally:
        batcher.close()


def test_a_single_threaded_session_is_costed_by_its_cpu_time_not_the_time_others_held_the_core(serve):
    """On a worker thread sharing one core, a run's wall time also counts the loop's turns: 92% of a tiny MLP's runs
    measured over the threshold at 8 clients. Time off the CPU (a sleep here) is not what the run would block for."""
    for threads, inline_expected in ((1, True), (None, False)):
        endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(enabled=False))], threads=threads)
        model = endpoint.registry.get("mlp")
        ran_on: list[str] = []
        run = model.run

        def off_the_cpu(inputs, run=run, ran_on=ran_on):
            ran_on.append(threading.current_thread().name)
            time.sleep(0.002)  # 2 ms of wall time, none of it on this thread's CPU
            return run(inputs)

        model.run = off_the_cpu
        x = np.ones((1, WIDTH_IN), np.float32)
        for _ in range(40):  # bounded: a cold first run keeps it off the loop for the next 8
            assert post(endpoint, x)[0] == 200
            if ran_on[-3:] == ["admin-http"] * 3:
                break
        if inline_expected:
            assert ran_on[-3:] == ["admin-http"] * 3, ran_on
        else:  # by its wall time every run takes 2 ms: none is provably short
            assert "admin-http" not in ran_on, ran_on
