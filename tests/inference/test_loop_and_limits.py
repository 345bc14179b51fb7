"""No request stalls the endpoint's event loop, and its transport limits hold (issue 61), over real
HTTP.

Each test fails under the old rules: a 10^6-float JSON answer was written in one call on the loop;
big JSON bodies were parsed in a thread holding the GIL; any number of requests and bodies were
taken; the batcher and ONNX Runtime's pool ran at the loop's priority; any client could make the
endpoint load every stored version; the ``timeout`` parameter was ignored. Waits are on events (or
on the server reaching a state), never against a clock.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from edgesdk.ota_server.inference import BatchingConfig, InferenceConfig, ServedModel, json_encode
from edgesdk.ota_server.inference.priority import RUN_NICENESS, loop_niceness
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model
from tests.inference.conftest import WIDTH_IN, make_bundle, reference
from tests.inference.http import error_of, request, sample, wait_until

SIDE = 1000  # the outer product of a [1, SIDE] input is SIDE**2 = 10^6 floats


def write_outer_onnx(path: Path) -> Path:
    """``x: float32[1, SIDE]`` -> ``y = x^T x: float32[SIDE, SIDE]``: a tiny request with a
    10^6-float answer."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            helper.make_node("MatMul", ["xt", "x"], ["y"]),
        ],
        "outer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIDE, SIDE])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


@pytest.fixture
def outer_endpoint(tmp_path, serve):
    x = np.linspace(-1, 1, SIDE, dtype=np.float32)[None]
    repo = ModelRepository(tmp_path / "outer-repo", allow_unsigned=True)
    spec = BundleSpec("outer", "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
    repo.add(
        bundle_from_model(
            tmp_path / "outer", write_outer_onnx(tmp_path / "outer.onnx"), spec, {"x": x}
        ).path
    )
    return serve(
        repository=repo,
        threads=1,
        models=[ServedModel("outer", batching=BatchingConfig(enabled=False))],
    )


def json_body(name: str, x: np.ndarray, **parameters: object) -> bytes:
    body: dict[str, object] = {
        "inputs": [
            {
                "name": name,
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.reshape(-1).tolist(),
            }
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


def health(endpoint) -> int:
    return request(f"{endpoint.url}/v2/health/live")[0]


def test_health_answers_while_a_big_json_answer_is_written(outer_endpoint, monkeypatch):
    """The writer stops after its first slice until health has been answered: only a loop that runs
    other
    requests between slices gets there (before, the whole answer was one json.dumps in one turn)."""
    writing, answered, waited = threading.Event(), threading.Event(), []
    turn = json_encode._turn

    async def first_turn_waits_for_health() -> None:
        import asyncio

        if not writing.is_set():
            writing.set()
            waited.append(await asyncio.get_running_loop().run_in_executor(None, answered.wait, 60))
        await turn()

    monkeypatch.setattr(json_encode, "_turn", first_turn_waits_for_health)
    x = np.linspace(-1, 1, SIDE, dtype=np.float32)[None]
    result = {}
    infer = threading.Thread(
        target=lambda: result.update(
            answer=request(
                f"{outer_endpoint.url}/v2/models/outer/infer",
                json_body("x", x),
                {"Content-Type": "application/json"},
            )
        )
    )
    infer.start()
    assert writing.wait(60), "the answer was never written in slices"
    assert health(outer_endpoint) == 200
    answered.set()
    infer.join()
    status, _, body = result["answer"]
    assert status == 200 and waited == [True]
    y = np.array(json.loads(body)["outputs"][0]["data"], np.float32).reshape(SIDE, SIDE)
    np.testing.assert_array_equal(y, x.T @ x)


@pytest.fixture
def worker_endpoint(serve):
    return serve(config=InferenceConfig(json_worker_bytes=64 * 1024))


def test_big_json_bodies_are_parsed_in_a_niced_worker_process_while_health_answers(
    worker_endpoint, bundles
):
    """The worker is stopped (SIGSTOP) while it holds a body: health still answers, so the parse
    holds neither
    the loop nor its GIL (before, it ran in a thread holding the GIL for the whole parse)."""
    x = (
        np.random.default_rng(0).standard_normal((400, WIDTH_IN)).astype(np.float32)
    )  # ~130 KB of JSON
    url, headers = (
        f"{worker_endpoint.url}/v2/models/mlp/infer",
        {"Content-Type": "application/json"},
    )
    status, _, body = request(url, json_body("input", x), headers)
    assert status == 200
    worker = worker_endpoint.routes.json_worker
    assert worker.decoded == 1 and worker.pid not in (None, os.getpid())
    nice = int(Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert nice >= min(19, loop_niceness() + RUN_NICENESS)
    os.kill(worker.pid, signal.SIGSTOP)
    result = {}
    try:
        infer = threading.Thread(
            target=lambda: result.update(answer=request(url, json_body("input", x), headers))
        )
        infer.start()
        wait_until(worker._lock.locked, "the second body to reach the worker")
        assert health(worker_endpoint) == 200 and infer.is_alive()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    infer.join()
    status, _, body = result["answer"]
    assert status == 200 and worker.decoded == 2
    y = np.array(json.loads(body)["outputs"][0]["data"], np.float32).reshape(400, -1)
    np.testing.assert_allclose(y, reference(bundles["mlp-1"], x), rtol=1e-5, atol=1e-6)


class SlowUpload:
    """An infer request whose headers are sent and whose body is held back until :meth:`finish`
    (every one is closed when its test ends, however it ends)."""

    opened: list[SlowUpload] = []

    def __init__(self, url: str, body: bytes, sent: int = 10) -> None:
        SlowUpload.opened.append(self)
        parts = urlsplit(url)
        self.body, self.conn = (
            body,
            http.client.HTTPConnection(parts.hostname, parts.port, timeout=60),
        )
        self.conn.putrequest("POST", parts.path)
        self.conn.putheader("Content-Type", "application/json")
        self.conn.putheader("Content-Length", str(len(body)))
        self.conn.endheaders()
        self.conn.send(body[:sent])
        self.sent = sent

    def finish(self) -> int:
        self.conn.send(self.body[self.sent :])
        response = self.conn.getresponse()
        response.read()
        self.conn.close()
        return response.status


@pytest.fixture(autouse=True)
def close_uploads():
    yield
    while SlowUpload.opened:
        SlowUpload.opened.pop().conn.close()


@pytest.fixture
def limited_endpoint(serve):
    return serve(
        config=InferenceConfig(
            max_concurrent_requests=2, max_body_bytes=4096, max_buffered_bytes=6000
        )
    )


def test_requests_over_the_concurrency_limit_get_503_at_once_and_health_still_answers(
    limited_endpoint,
):
    """Before, every request was taken: the third one waited with the others."""
    url = f"{limited_endpoint.url}/v2/models/mlp/infer"
    body = json_body("input", np.ones((1, WIDTH_IN), np.float32))
    uploads = [SlowUpload(url, body), SlowUpload(url, body)]
    wait_until(lambda: limited_endpoint.routes.in_flight.in_flight == 2, "both uploads in flight")
    status, headers, answer = request(url, body, {"Content-Type": "application/json"})
    assert (
        status == 503
        and headers["Retry-After"] == "1"
        and "max_concurrent_requests" in json.loads(answer)["error"]
    )
    assert (
        health(limited_endpoint) == 200
        and request(f"{limited_endpoint.url}/v2/health/ready")[0] == 200
    )
    assert [upload.finish() for upload in uploads] == [200, 200]
    assert request(url, body, {"Content-Type": "application/json"})[0] == 200
    assert sample(limited_endpoint, "edgesdk_inference_refused", "_total", model=None) == 1


def test_bodies_over_the_memory_budget_get_503_before_they_are_read(limited_endpoint):
    """Two bodies of 4,000 declared bytes do not fit a 6,000-byte budget: the second is refused
    from its header."""
    url = f"{limited_endpoint.url}/v2/models/mlp/infer"
    held = SlowUpload(url, b" " * 4000)
    wait_until(lambda: limited_endpoint.routes.budget.held == 4000, "the first body to be counted")
    second = SlowUpload(url, b" " * 4000)
    response = second.conn.getresponse()  # answered with 3,990 bytes of its body still unsent
    assert response.status == 503 and "max_buffered_bytes" in json.loads(response.read())["error"]
    second.conn.close()
    assert held.finish() == 400  # spaces are not a V2 request, but it was read
    assert limited_endpoint.routes.budget.held == 0


def test_the_batcher_and_onnx_runtime_pool_threads_run_below_the_loop(serve):
    """Sessions are built in a niced thread, so ORT's intra-op pool inherits it (before: the loop's
    priority)."""
    endpoint = serve(threads=2)
    before = set(os.listdir("/proc/self/task"))
    model = endpoint.registry.get(
        "mlp"
    )  # batched: a batch thread, and a 2-thread session (one pool thread)
    created = set(os.listdir("/proc/self/task")) - before

    def niceness(tid: str) -> int:
        return int(Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    names = {tid: Path(f"/proc/self/task/{tid}/comm").read_text().strip() for tid in created}
    python = {str(t.native_id) for t in threading.enumerate()}
    assert model.batcher is not None and str(model.batcher._thread.native_id) in created
    assert created - python, f"no ONNX Runtime pool thread appeared: {names}"
    floor = loop_niceness() + RUN_NICENESS
    assert {tid: niceness(tid) for tid in created if niceness(tid) < floor} == {}, names


def test_a_request_whose_timeout_passed_is_answered_504_and_not_run(endpoint):
    """Triton's ``timeout`` parameter (microseconds): 1 us is over before the request can run.
    Before: run, 200."""
    model = endpoint.registry.get("fixed")  # unbatched: its runs go through model.run
    runs = []
    run = model.run
    model.run = lambda inputs: runs.append(1) or run(inputs)  # type: ignore[method-assign]
    url, headers = f"{endpoint.url}/v2/models/fixed/infer", {"Content-Type": "application/json"}
    x = np.ones((1, WIDTH_IN), np.float32)
    status, message = error_of(request(url, json_body("input", x, timeout=1), headers))
    assert status == 504 and "Request timeout expired" in message and runs == []
    assert request(url, json_body("input", x, timeout=60_000_000), headers)[0] == 200 and runs == [
        1
    ]
    metrics = request(f"{endpoint.url}/metrics")[2].decode()
    assert (
        'edgesdk_inference_failures_total{model="fixed",reason="deadline",version="1.0.0"} 1.0'
        in metrics
    )


def test_tritonclients_timeout_is_honoured_on_binary_requests(endpoint):
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    with triton.InferenceServerClient(endpoint.url.removeprefix("http://")) as client:
        tensor = triton.InferInput("input", [1, WIDTH_IN], "FP32")
        tensor.set_data_from_numpy(np.ones((1, WIDTH_IN), np.float32), binary_data=True)
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            client.infer("mlp", [tensor], timeout=1)


def test_loading_versions_other_than_the_default_is_rate_limited(tmp_path, repo, bundles, serve):
    """One load a minute: a client cycling through stored versions gets 429 after the first, the
    default version
    and versions already loaded are served. Before: every version was loaded on demand."""
    repo.add(bundles["mlp-2"])
    repo.add(make_bundle(tmp_path / "mlp-15", "mlp", "1.5.0", seed=5))
    endpoint = serve(config=InferenceConfig(version_loads_per_minute=1))
    ready = f"{endpoint.url}/v2/models/mlp/versions/{{}}/ready"
    assert request(ready.format("1.0.0"))[0] == 200
    status, headers, body = request(ready.format("1.5.0"))
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "version_loads_per_minute" in json.loads(body)["error"]
    assert request(ready.format("1.0.0"))[0] == 200  # loaded already: no load needed
    assert (
        request(f"{endpoint.url}/v2/models/mlp/ready")[0] == 200
    )  # the default (2.0.0) is never limited


def test_a_body_that_does_not_arrive_in_time_is_408_and_frees_its_place(serve):
    """A slow upload held one of the in-flight places for as long as it liked (before: no limit)."""
    endpoint = serve(config=InferenceConfig(max_concurrent_requests=1, max_body_seconds=0.2))
    url = f"{endpoint.url}/v2/models/mlp/infer"
    stalled = SlowUpload(url, json_body("input", np.ones((1, WIDTH_IN), np.float32)))
    response = stalled.conn.getresponse()  # the server's own timer ends it; the rest is never sent
    assert response.status == 408 and "max_body_seconds" in json.loads(response.read())["error"]
    stalled.conn.close()
    wait_until(lambda: endpoint.routes.in_flight.in_flight == 0, "the place to be freed")
    body = json_body("input", np.ones((1, WIDTH_IN), np.float32))
    assert request(url, body, {"Content-Type": "application/json"})[0] == 200
