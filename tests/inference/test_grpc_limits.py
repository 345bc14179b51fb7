"""The gRPC service's limits, over a real grpc server on loopback: calls, workers, message sizes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from edgesdk.errors import InputError
from edgesdk.ota_server.inference import BatchingConfig, InferenceConfig, ServedModel
from edgesdk.ota_server.inference.grpc_service import MAX_SEND_BYTES, SPARE_WORKERS, GrpcServer
from tests.inference.conftest import WIDTH_IN, WIDTH_OUT
from tests.inference.http import wait_until

#: Bounds each call: one that waits where it should have been refused fails the test, not hang it.
CALL_TIMEOUT_S = 30


def _request(rows: int = 1) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[rows, WIDTH_IN])
    request.raw_input_contents.append(np.ones((rows, WIDTH_IN), "<f4").tobytes())
    return request


@pytest.fixture
def grpc_of(serve):
    """Factory: ``grpc_of(max_queue, **GrpcServer limits)`` -> (server, stub, the mlp's batcher)."""
    started: list[tuple[GrpcServer, grpc.Channel]] = []

    def factory(max_queue: int = 8, **limits: int):
        batching = BatchingConfig(max_queue=max_queue, max_queue_delay_us=0)
        endpoint = serve(models=[ServedModel("mlp", batching=batching)])
        server = GrpcServer(endpoint.registry, endpoint.metrics, "127.0.0.1", 0, **limits).start()
        channel = grpc.insecure_channel(server.address)
        started.append((server, channel))
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return server, stub, endpoint.registry.get("mlp").batcher

    yield factory
    for server, channel in started:
        channel.close()
        server.stop(0)


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def test_a_call_over_the_concurrency_cap_is_resource_exhausted_and_the_held_ones_finish(grpc_of):
    server, stub, batcher = grpc_of(max_queue=8, max_concurrent_calls=2)
    with batcher.paused():
        held = [stub.ModelInfer.future(_request(), timeout=CALL_TIMEOUT_S) for _ in range(2)]
        wait_until(lambda: batcher.depth == 2, "two calls waiting for the batcher")
        # Without a cap the third call would queue behind the paused batcher until its timeout.
        assert _code(lambda: stub.ModelInfer(_request(), timeout=CALL_TIMEOUT_S)) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The cap is the inference calls': health and readiness still answer at it.
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=CALL_TIMEOUT_S).live
        ready = service_pb2.ModelReadyRequest(name="mlp")
        assert stub.ModelReady(ready, timeout=CALL_TIMEOUT_S).ready
    assert [len(f.result().raw_output_contents[0]) for f in held] == [WIDTH_OUT * 4] * 2
    answer = stub.ModelInfer(_request(), timeout=CALL_TIMEOUT_S)
    assert len(answer.raw_output_contents[0]) == WIDTH_OUT * 4


def test_a_whole_model_queue_waits_on_workers_and_health_still_answers(grpc_of):
    queue = 40  # more than the 32 workers the service had: 8 calls waited unseen for a thread
    server, stub, batcher = grpc_of(max_queue=queue)
    assert server.workers >= queue + SPARE_WORKERS
    assert server.max_concurrent_calls == server.workers - SPARE_WORKERS >= queue
    with batcher.paused():
        held = [stub.ModelInfer.future(_request(), timeout=CALL_TIMEOUT_S) for _ in range(queue)]
        wait_until(lambda: batcher.depth == queue, f"{queue} calls in the model's queue")
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=CALL_TIMEOUT_S).live
        ready = service_pb2.ModelReadyRequest(name="mlp")
        assert stub.ModelReady(ready, timeout=CALL_TIMEOUT_S).ready
        # The queue is full: the model refuses at once (retryable); no call waits for a thread.
        assert _code(lambda: stub.ModelInfer(_request(), timeout=CALL_TIMEOUT_S)) \
            == grpc.StatusCode.UNAVAILABLE
    assert sum(len(f.result().raw_output_contents[0]) == WIDTH_OUT * 4 for f in held) == queue


def test_messages_over_the_receive_or_send_limit_are_resource_exhausted(grpc_of):
    server, stub, _ = grpc_of(max_receive_bytes=2048, max_send_bytes=256)
    assert _code(lambda: stub.ModelInfer(_request(rows=40), timeout=CALL_TIMEOUT_S)) \
        == grpc.StatusCode.RESOURCE_EXHAUSTED  # 40 x 16 float32 = 2,560 bytes in
    assert _code(lambda: stub.ModelInfer(_request(rows=20), timeout=CALL_TIMEOUT_S)) \
        == grpc.StatusCode.RESOURCE_EXHAUSTED  # 1,280 bytes in, 320 bytes of output out
    answer = stub.ModelInfer(_request(rows=2), timeout=CALL_TIMEOUT_S)
    assert len(answer.raw_output_contents[0]) == 2 * WIDTH_OUT * 4


def test_the_stated_defaults_and_bad_limits(serve):
    endpoint = serve(config=InferenceConfig(max_body_bytes=4096))
    server = GrpcServer(endpoint.registry, endpoint.metrics, "127.0.0.1", 0)
    assert (server.max_receive_bytes, server.max_send_bytes) == (4096, MAX_SEND_BYTES)
    assert server.workers >= InferenceConfig().default_batching.max_queue + SPARE_WORKERS
    for bad in ({"workers": 0}, {"max_concurrent_calls": -1}, {"max_send_bytes": True},
                {"workers": 4, "max_concurrent_calls": 4}):
        with pytest.raises(InputError, match="max_concurrent_calls is|workers is|bytes is"):
            GrpcServer(endpoint.registry, endpoint.metrics, "127.0.0.1", 0, **bad)


def test_a_call_whose_deadline_passed_before_it_ran_is_deadline_exceeded(grpc_of):
    """Triton's ``timeout`` parameter (microseconds), as tritonclient.grpc sends it: 1 us is over
    before the call can run. (The call's own gRPC deadline is read the same way, but a client
    gives up by itself at it, so only the parameter shows what the server does.)"""
    server, stub, batcher = grpc_of(max_queue=8)
    late = _request()
    late.parameters["timeout"].int64_param = 1
    assert _code(lambda: stub.ModelInfer(late, timeout=CALL_TIMEOUT_S)) \
        == grpc.StatusCode.DEADLINE_EXCEEDED
    assert batcher.depth == 0
    in_time = _request()
    in_time.parameters["timeout"].int64_param = 60_000_000
    assert len(stub.ModelInfer(in_time, timeout=CALL_TIMEOUT_S).raw_output_contents[0]) \
        == WIDTH_OUT * 4


def test_the_inference_config_files_limits_reach_the_grpc_server(serve, tmp_path):
    """``limits:`` in the file ``--inference-config`` names (the CLI reads it whole) set the gRPC
    service's workers, inference-call cap and answer size, and a bad one is refused by name."""
    from edgesdk.ota_server.inference.config import inference_config_from_file

    path = tmp_path / "inference.yaml"
    path.write_text("models:\n  - name: mlp\nlimits:\n  grpc_workers: 12\n"
                    "  grpc_max_concurrent_calls: 3\n  grpc_max_send_bytes: 4096\n")
    endpoint = serve(config=inference_config_from_file(path), grpc_listen="127.0.0.1:0")
    grpc_server = endpoint.grpc
    assert (grpc_server.workers, grpc_server.max_concurrent_calls, grpc_server.max_send_bytes) \
        == (12, 3, 4096)
    path.write_text("models:\n  - name: mlp\nlimits:\n  grpc_max_concurrent_calls: 0\n")
    with pytest.raises(InputError, match="grpc_max_concurrent_calls"):
        inference_config_from_file(path)
