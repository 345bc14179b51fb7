"""The V2 client against a real (fake-fault) V2 HTTP server on loopback: metadata checks, both encodings, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk import OffloadPolicy
from edgesdk.errors import OffloadError
from edgesdk.offload.client import V2Client
from tests.offload.fake_v2 import FakeV2Server

_OPEN: list[V2Client] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _new(policy: OffloadPolicy) -> V2Client:
    _OPEN.append(V2Client(policy))
    return _OPEN[-1]


def _client(server: FakeV2Server, **settings) -> V2Client:
    return _new(OffloadPolicy(server.url, server.name, **settings))


def _configured(server: FakeV2Server, local, **settings) -> V2Client:
    client = _client(server, **settings)
    client.configure(local.inputs, local.outputs)
    return client


def test_binary_when_the_server_advertises_it_and_results_equal_local_ones(cloud, local, frames):
    client = _configured(cloud, local)
    assert client.binary is True
    assert client.ready()
    batch = np.concatenate(frames[0][:3])
    got = client.infer({"input": batch})
    want = local.predict(batch)
    assert list(got) == [local.outputs[0].name]
    out = got[local.outputs[0].name]
    assert out.shape == want.shape and out.dtype == want.dtype
    assert np.allclose(out, want, atol=1e-6)
    assert cloud.binary_bodies == 1
    client.infer({"input": batch})
    assert cloud.connections == 1  # GET /v2, the metadata, ready and both inferences on one kept-alive connection
    client.close()


def test_json_when_the_server_does_not_advertise_binary_or_the_policy_says_so(wide_onnx, local, frames):
    with FakeV2Server(wide_onnx, advertise_binary=False) as server:
        client = _configured(server, local)
        assert client.binary is False
        out = client.infer({"input": frames[0][0]})["probabilities"]
        assert np.allclose(out, local.predict(frames[0][0]), atol=1e-6)
        assert server.binary_bodies == 0
        forced = _configured(server, local, binary=True)
        assert forced.binary is True
        forced.infer({"input": frames[0][0]})
        assert server.binary_bodies == 1
        client.close()
        forced.close()


def test_a_server_that_refuses_binary_bodies_gets_json_and_that_is_remembered(cloud, local, frames, caplog):
    cloud.mode = "reject_binary"
    client = _configured(cloud, local)
    assert client.binary is True
    out = client.infer({"input": frames[0][1]})["probabilities"]
    assert np.allclose(out, local.predict(frames[0][1]), atol=1e-6)
    assert client.binary is False
    assert "refused binary tensors (HTTP 422" in caplog.text
    client.infer({"input": frames[0][1]})
    assert (cloud.infers, cloud.binary_bodies) == (3, 1)  # one refused binary, then JSON only
    client.close()


@pytest.mark.parametrize(("status", "body", "content_type", "words"), [
    (500, b'{"error": "CUDA out of memory"}', "application/json", "HTTP 500: CUDA out of memory"),
    (400, b'{"error": "bad input shape"}', "application/json", "HTTP 400: bad input shape"),
    (422, json.dumps({"detail": [{"loc": ["body", "inputs", 0, "shape"], "msg": "field required"}]}).encode(),
     "application/json", "HTTP 422: body.inputs.0.shape: field required"),
    (503, b"upstream connect error", "text/plain", "HTTP 503: upstream connect error"),
])
def test_every_error_form_becomes_an_offload_error_with_the_status_and_the_servers_words(
        cloud, local, frames, status, body, content_type, words):
    client = _configured(cloud, local, binary=False)
    cloud.fail(status, body, content_type)
    with pytest.raises(OffloadError) as info:
        client.infer({"input": frames[0][0]})
    assert words in str(info.value) and "model 'mlp'" in str(info.value)
    assert info.value.status == status
    assert info.value.transient is (status >= 500)
    client.close()


def test_a_malformed_answer_is_a_transient_offload_error(cloud, local, frames):
    client = _configured(cloud, local)
    cloud.mode = "malformed"
    with pytest.raises(OffloadError, match="does not decode.*not valid JSON") as info:
        client.infer({"input": frames[0][0]})
    assert info.value.transient and info.value.status == 200
    client.close()


def test_an_answer_slower_than_the_timeout_is_a_transient_offload_error(cloud, local, frames):
    client = _configured(cloud, local, timeout_ms=200)
    cloud.mode = "slow"
    with pytest.raises(OffloadError, match="timed out") as info:
        client.infer({"input": frames[0][0]})
    assert info.value.transient and info.value.status is None
    cloud.release.set()
    cloud.mode = "ok"
    client.infer({"input": frames[0][0]})  # the timed-out connection was discarded, a new one works
    client.close()


def test_a_server_that_trickles_its_answer_cannot_stretch_a_request_beyond_the_timeout(cloud, local, frames):
    client = _configured(cloud, local, timeout_ms=300)
    cloud.mode = "trickle"
    with pytest.raises(OffloadError, match="infer timed out: TimeoutError") as info:
        client.infer({"input": frames[0][0]})
    assert info.value.transient
    cloud.release.set()


def test_a_model_the_server_lacks_is_a_configuration_error(cloud, local):
    client = _new(OffloadPolicy(cloud.url, "resnet"))
    with pytest.raises(OffloadError, match=r"has no model 'resnet' at http://127.0.0.1:\d+ \(HTTP 404") as info:
        client.configure(local.inputs, local.outputs)
    assert not info.value.transient
    versioned = _new(OffloadPolicy(cloud.url, "mlp", version="7"))
    with pytest.raises(OffloadError, match="no model 'mlp' version 7"):
        versioned.configure(local.inputs, local.outputs)
    pinned = _new(OffloadPolicy(cloud.url, "mlp", version="1"))
    pinned.configure(local.inputs, local.outputs)


@pytest.mark.parametrize(("inputs", "words"), [
    ([{"name": "image", "datatype": "FP32", "shape": [-1, 256]}], "missing on the server: ['input']"),
    ([{"name": "input", "datatype": "FP16", "shape": [-1, 256]}], "input 'input' has datatype 'FP16' on the server "
                                                                  "but FP32 (float32) here"),
    ([{"name": "input", "datatype": "FP32", "shape": [-1, 64]}], "input 'input' has shape [-1, 64] on the server "
                                                                 "but [-1, 256] here"),
    ([{"name": "input", "datatype": "FP32", "shape": [-1, 256, 1]}], "has shape [-1, 256, 1]"),
    ([{"name": "input", "datatype": "FP32", "shape": [-1, 256]}, {"name": "mask", "datatype": "BOOL", "shape": [-1]}],
     "unknown here: ['mask']"),
])
def test_inputs_that_differ_from_the_local_model_are_a_configuration_error(wide_onnx, local, inputs, words):
    with FakeV2Server(wide_onnx, metadata_inputs=inputs) as server:
        client = _client(server)
        with pytest.raises(OffloadError) as info:
            client.configure(local.inputs, local.outputs)
        assert words in str(info.value), str(info.value)
        assert "model 'mlp'" in str(info.value) and "deploy the same model" in str(info.value)
        assert not info.value.transient


def test_fixed_dimensions_on_either_side_match_free_ones(wide_onnx, local):
    with FakeV2Server(wide_onnx, metadata_inputs=[{"name": "input", "datatype": "FP32", "shape": [8, 256]}]) as server:
        _client(server).configure(local.inputs, local.outputs)


def test_outputs_are_cast_within_their_kind_and_refused_across_kinds(cloud, local, frames):
    client = _configured(cloud, local)
    cloud.output_dtype = np.float64
    out = client.infer({"input": frames[0][0]})["probabilities"]
    assert out.dtype == np.float32
    cloud.output_dtype = np.int64
    with pytest.raises(OffloadError, match="output 'probabilities' came back as int64, the local model gives float32"):
        client.infer({"input": frames[0][0]})
    client.close()


def test_an_unreachable_server_is_a_transient_error(local):
    from edgesdk.ota_server.broker import free_port

    client = _new(OffloadPolicy(f"http://127.0.0.1:{free_port()}", "mlp", connect_timeout_ms=500))
    with pytest.raises(OffloadError, match="failed: ConnectionRefusedError") as info:
        client.configure(local.inputs, local.outputs)
    assert info.value.transient and info.value.status is None
    client.close()
    with pytest.raises(OffloadError, match="is closed"):
        client.ready()
