"""The KServe V2 gRPC service, driven by tritonclient.grpc and by its published stubs over a real channel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server.inference import BatchingConfig, InferenceConfig, ServedModel
from tests.inference.conftest import WIDTH_IN, WIDTH_OUT, reference
from tests.inference.http import sample, wait_until


@pytest.fixture
def grpc_endpoint(serve):
    return serve(grpc_listen="127.0.0.1:0")


@pytest.fixture
def client(grpc_endpoint):
    c = triton.InferenceServerClient(grpc_endpoint.grpc_address)
    yield c
    c.close()


@pytest.fixture
def stub(grpc_endpoint):
    """The service's published stub (tritonclient's copy of grpc_service.proto) on a plain channel."""
    with grpc.insecure_channel(grpc_endpoint.grpc_address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer(client, x: np.ndarray, model: str = "mlp", version: str = "", datatype: str = "FP32",
          outputs: list[str] | None = None):
    tensor = triton.InferInput("input", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    requested = None if outputs is None else [triton.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, [tensor], model_version=version, outputs=requested, request_id="req-9")


def status_of(call) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status()


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata.name == "edgesdk" and metadata.version


def test_model_metadata_and_readiness(client):
    metadata = client.get_model_metadata("mlp", as_json=True)
    assert metadata == {"name": "mlp", "versions": ["1.0.0"], "platform": "onnxruntime_onnx",
                        "inputs": [{"name": "input", "datatype": "FP32", "shape": ["-1", str(WIDTH_IN)]}],
                        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": ["-1", str(WIDTH_OUT)]}]}
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1.0.0")
    # As Triton answers: an unknown model or version is "not ready", not an error.
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "9.9.9")


def test_infer_with_raw_contents_gives_the_models_answer(client, bundles):
    x = np.random.default_rng(5).standard_normal((3, WIDTH_IN)).astype(np.float32)
    result = infer(client, x)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("mlp", "1.0.0", "req-9")
    np.testing.assert_allclose(result.as_numpy("probabilities"), reference(bundles["mlp-1"], x), rtol=1e-5, atol=1e-6)


def test_a_pushed_version_is_served_and_a_version_can_be_pinned(client, repo, bundles):
    x = np.ones((1, WIDTH_IN), np.float32)
    repo.add(bundles["mlp-2"])
    newest = infer(client, x)
    assert newest.get_response().model_version == "2.0.0"
    np.testing.assert_allclose(newest.as_numpy("probabilities"), reference(bundles["mlp-2"], x), rtol=1e-5)
    pinned = infer(client, x, version="1.0.0")
    np.testing.assert_allclose(pinned.as_numpy("probabilities"), reference(bundles["mlp-1"], x), rtol=1e-5)


def test_typed_contents_are_accepted_as_well_as_raw(stub, bundles):
    x = np.random.default_rng(6).standard_normal((2, WIDTH_IN)).astype(np.float32)
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=x.shape).contents.fp32_contents.extend(x.ravel().tolist())
    response = stub.ModelInfer(request)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("probabilities", "FP32", [2, WIDTH_OUT])
    values = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(output.shape)
    np.testing.assert_allclose(values, reference(bundles["mlp-1"], x), rtol=1e-5, atol=1e-6)


def test_http_and_grpc_share_one_model_session_and_its_metrics(grpc_endpoint, client):
    infer(client, np.ones((1, WIDTH_IN), np.float32))
    with pytest.raises(InferenceServerException):
        infer(client, np.ones((1, WIDTH_IN + 1), np.float32))
    assert sample(grpc_endpoint, "edgesdk_inference_requests", "_total") == 2
    assert sample(grpc_endpoint, "edgesdk_inference_failures", "_total") == 1
    assert grpc_endpoint.registry.cached("mlp", "1.0.0") is not None


@pytest.mark.parametrize(("case", "status", "words"), [
    ("unknown model", "StatusCode.NOT_FOUND", "nope"),
    ("unknown version", "StatusCode.NOT_FOUND", "9.9.9"),
    ("wrong shape", "StatusCode.INVALID_ARGUMENT", "shape [1, 17]"),
    ("wrong datatype", "StatusCode.INVALID_ARGUMENT", "FP64"),
    ("unknown output", "StatusCode.INVALID_ARGUMENT", "no outputs ['logits']"),
])
def test_bad_requests_get_the_right_status_code_and_name_the_value(client, case, status, words):
    x = np.ones((1, WIDTH_IN), np.float32)
    calls = {"unknown model": lambda: infer(client, x, model="nope"),
             "unknown version": lambda: infer(client, x, version="9.9.9"),
             "wrong shape": lambda: infer(client, np.ones((1, WIDTH_IN + 1), np.float32)),
             "wrong datatype": lambda: infer(client, x.astype(np.float64), datatype="FP64"),
             "unknown output": lambda: infer(client, x, outputs=["logits"])}
    with pytest.raises(InferenceServerException) as caught:
        calls[case]()
    assert caught.value.status() == status and words in caught.value.message()
    assert status_of(lambda: client.get_model_metadata("nope")) == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize(("case", "words"), [
    ("raw size", "raw_input_contents has 60 bytes"),
    ("raw count", "raw_input_contents has 2 entries for 1 inputs"),
    ("no inputs", "no inputs"),
    ("fp16 as list", "FP16 has no typed contents list"),
    ("short list", "contents.fp32_contents has 3 values"),
])
def test_malformed_tensors_are_invalid_argument_with_the_reason(stub, case, words):
    request = service_pb2.ModelInferRequest(model_name="mlp")
    if case != "no inputs":
        entry = request.inputs.add(name="input", datatype="FP16" if case == "fp16 as list" else "FP32", shape=[1, WIDTH_IN])
        if case == "raw size":
            request.raw_input_contents.append(b"\0" * 60)
        elif case == "raw count":
            request.raw_input_contents.extend([b"\0" * 64, b"\0" * 64])
        elif case == "short list":
            entry.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in caught.value.details()


def test_a_message_over_the_body_cap_is_resource_exhausted(serve):
    endpoint = serve(config=InferenceConfig(max_body_bytes=4096), grpc_listen="127.0.0.1:0")
    client = triton.InferenceServerClient(endpoint.grpc_address)
    assert status_of(lambda: infer(client, np.ones((100, WIDTH_IN), np.float32))) == "StatusCode.RESOURCE_EXHAUSTED"
    assert infer(client, np.ones((1, WIDTH_IN), np.float32)).as_numpy("probabilities").shape == (1, WIDTH_OUT)
    client.close()


def test_a_full_queue_is_unavailable_and_queued_requests_still_run(serve):
    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(max_queue=2, max_queue_delay_us=0))],
                     grpc_listen="127.0.0.1:0")
    model = endpoint.registry.get("mlp")
    x = np.ones((1, WIDTH_IN), np.float32)
    clients = [triton.InferenceServerClient(endpoint.grpc_address) for _ in range(3)]
    with ThreadPoolExecutor(2) as pool:
        with model.batcher.paused():
            queued = [pool.submit(infer, c, x) for c in clients[:2]]
            wait_until(lambda: model.batcher.depth == 2, "two queued requests")
            assert status_of(lambda: infer(clients[2], x)) == "StatusCode.UNAVAILABLE"
        assert [f.result().as_numpy("probabilities").shape for f in queued] == [(1, WIDTH_OUT)] * 2
    for c in clients:
        c.close()


def test_a_taken_port_fails_to_start_with_the_address(serve, grpc_endpoint):
    taken = grpc_endpoint.grpc_address
    with pytest.raises(EdgeSDKError, match=f"did not start on {taken}"):
        serve(grpc_listen=taken)


def test_methods_it_does_not_serve_are_unimplemented(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="mlp"))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _fields(message) -> dict:
    """A message's fields, recursively: name -> (number, type, repeated, nested fields or None)."""
    return {f.name: (f.number, f.type, f.label == f.LABEL_REPEATED,
                     _fields(f.message_type) if f.message_type is not None else None) for f in message.fields}


def test_every_message_matches_the_published_proto_field_for_field():
    # Only the service name travels on the wire, so numbers, types and nesting must equal the published
    # grpc_service.proto (tritonclient's copy); a renumbered field would decode as garbage, not fail.
    from edgesdk.ota_server.inference import edgesdk_v2_grpc_pb2 as ours

    published = service_pb2.DESCRIPTOR.message_types_by_name
    for name, message in ours.DESCRIPTOR.message_types_by_name.items():
        assert _fields(message) == _fields(published[name]), name
    assert len(ours.DESCRIPTOR.message_types_by_name) == 14


def test_health_and_metadata_answer_while_many_calls_wait_for_their_model(grpc_endpoint, client):
    # Each waiting call holds one of the service's threads; there must be threads left for everything else.
    model = grpc_endpoint.registry.get("mlp")
    x = np.ones((1, WIDTH_IN), np.float32)
    waiting = [triton.InferenceServerClient(grpc_endpoint.grpc_address) for _ in range(8)]
    with ThreadPoolExecutor(len(waiting)) as pool:
        with model.batcher.paused():
            queued = [pool.submit(infer, c, x) for c in waiting]
            wait_until(lambda: model.batcher.depth == len(waiting), "eight calls waiting for the batcher")
            assert client.is_server_live(client_timeout=5) and client.is_model_ready("mlp", client_timeout=5)
            assert client.get_model_metadata("mlp", client_timeout=5).name == "mlp"
        assert [f.result().as_numpy("probabilities").shape for f in queued] == [(1, WIDTH_OUT)] * len(waiting)
    for c in waiting:
        c.close()


def test_an_unbatched_model_is_checked_and_run_over_grpc(serve, bundles):
    endpoint = serve(models=[ServedModel("fixed")], grpc_listen="127.0.0.1:0")  # batch fixed at 1: no batcher
    client = triton.InferenceServerClient(endpoint.grpc_address)
    x = np.random.default_rng(8).standard_normal((1, WIDTH_IN)).astype(np.float32)
    assert endpoint.registry.get("fixed").batcher is None
    for _ in range(3):
        np.testing.assert_allclose(infer(client, x, model="fixed").as_numpy("probabilities"),
                                   reference(bundles["fixed"], x), rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceServerException) as caught:
        infer(client, np.ones((2, WIDTH_IN), np.float32), model="fixed")
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT" and "takes [1, 16]" in caught.value.message()
    assert sample(endpoint, "edgesdk_inference_requests", "_total", model="fixed") == 4
    client.close()
