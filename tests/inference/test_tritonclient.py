"""The endpoint driven by the official KServe V2 client, tritonclient.http: metadata, readiness, JSON and binary."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.inference.conftest import WIDTH_IN, WIDTH_OUT, host_port, reference


@pytest.fixture
def client(endpoint):
    c = triton.InferenceServerClient(host_port(endpoint))
    yield c
    c.close()


def infer(client, model: str, x: np.ndarray, *, binary_in: bool, binary_out: bool | None, version: str = "",
          datatype: str = "FP32", name: str = "input"):
    tensor = triton.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=binary_in)
    outputs = None if binary_out is None else [triton.InferRequestedOutput("probabilities", binary_data=binary_out)]
    return client.infer(model, [tensor], model_version=version, outputs=outputs, request_id="req-7")


def test_server_metadata_advertises_binary_extension_and_health(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "edgesdk" and "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_uses_minus_one_for_dynamic_dims(client):
    metadata = client.get_model_metadata("mlp")
    assert metadata == {"name": "mlp", "versions": ["1.0.0"], "platform": "onnxruntime_onnx",
                        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, WIDTH_IN]}],
                        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, WIDTH_OUT]}]}
    fixed = client.get_model_metadata("fixed", "1.0.0")
    assert fixed["inputs"][0]["shape"] == [1, WIDTH_IN]
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1.0.0")
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "9.0.0")


@pytest.mark.parametrize(("binary_in", "binary_out"), [(False, False), (True, True), (True, False), (False, True),
                                                       (True, None)])
def test_outputs_equal_onnxruntime_json_and_binary(client, bundles, binary_in, binary_out):
    x = np.random.default_rng(0).standard_normal((3, WIDTH_IN)).astype(np.float32)
    result = infer(client, "mlp", x, binary_in=binary_in, binary_out=binary_out)
    response = result.get_response()
    assert response["model_name"] == "mlp" and response["model_version"] == "1.0.0" and response["id"] == "req-7"
    (output,) = response["outputs"]
    # binary_out None: tritonclient asks for every output in binary (binary_data_output)
    assert ("parameters" in output) == (binary_out is not False) and ("data" in output) == (binary_out is False)
    got = result.as_numpy("probabilities")
    assert got.dtype == np.float32 and got.shape == (3, WIDTH_OUT)
    np.testing.assert_allclose(got, reference(bundles["mlp-1"], x), rtol=1e-6, atol=1e-7)


def test_fixed_batch_model_runs_unbatched(client, bundles):
    x = np.random.default_rng(1).standard_normal((1, WIDTH_IN)).astype(np.float32)
    got = infer(client, "fixed", x, binary_in=True, binary_out=True).as_numpy("probabilities")
    np.testing.assert_allclose(got, reference(bundles["fixed"], x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("kwargs", "status", "words"), [
    ({"x": np.zeros((2, WIDTH_IN - 1), np.float32)}, "400", ["shape [2, 15]", "[-1, 16]"]),
    ({"x": np.zeros((2, WIDTH_IN), np.float64), "datatype": "FP64"}, "400", ["datatype FP64", "takes FP32"]),
    ({"x": np.zeros((2, WIDTH_IN), np.float32), "name": "pixels"}, "400", ["missing ['input']", "['pixels']"]),
    ({"x": np.zeros((1, WIDTH_IN), np.float32), "model": "nope"}, "404", ["'nope'", "served: ['fixed', 'mlp']"]),
    ({"x": np.zeros((1, WIDTH_IN), np.float32), "version": "9.0.0"}, "404", ["no version '9.0.0'", "['1.0.0']"]),
    ({"x": np.zeros((2, WIDTH_IN), np.float32), "model": "fixed"}, "400", ["shape [2, 16]", "[1, 16]"]),
])
@pytest.mark.parametrize("binary", [False, True])
def test_errors_reach_tritonclient_with_their_message(client, kwargs, status, words, binary):
    kwargs = dict(kwargs)
    model = kwargs.pop("model", "mlp")
    x = kwargs.pop("x")
    with pytest.raises(InferenceServerException) as caught:
        infer(client, model, x, binary_in=binary, binary_out=binary, **kwargs)
    assert caught.value.status() == status
    for word in words:
        assert word in caught.value.message()
