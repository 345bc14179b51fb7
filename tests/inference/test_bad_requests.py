"""Bad requests over raw HTTP: each gets a 4xx with a V2 ``{"error": ...}`` that names the problem, never a 500."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.offload.v2_codec import HEADER_LENGTH, encode_request
from tests.inference.conftest import WIDTH_IN
from tests.inference.http import error_of, raw, request


def infer_url(endpoint, model: str = "mlp", version: str | None = None) -> str:
    return f"{endpoint.url}/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


def binary_body() -> tuple[bytes, dict[str, str]]:
    return encode_request({"input": np.ones((2, WIDTH_IN), np.float32)}, binary_inputs=True, binary_outputs=True)


def test_malformed_json_is_400(endpoint):
    status, message = error_of(request(infer_url(endpoint), b'{"inputs": [', {"Content-Type": "application/json"}))
    assert status == 400 and "not valid JSON" in message


def test_json_that_is_not_an_inference_request_is_400(endpoint):
    for body, words in [(b"[1, 2]", "not an object"), (b"{}", "inputs must be a list"),
                        (json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                                 "data": [0.0] * 15}]}).encode(), "do not fill shape"),
                        (json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "BYTES",
                                                 "data": ["a"] * 16}]}).encode(), "'BYTES' is not supported")]:
        status, message = error_of(request(infer_url(endpoint), body, {"Content-Type": "application/json"}))
        assert status == 400 and words in message, (body, message)


def test_truncated_binary_body_is_400(endpoint):
    body, headers = binary_body()
    status, message = error_of(request(infer_url(endpoint), body[:-10], headers))
    assert status == 400 and "short of its binary data" in message and "truncated" in message


def test_binary_data_size_not_matching_is_400(endpoint):
    body, headers = binary_body()
    length = int(headers[HEADER_LENGTH])
    header = json.loads(body[:length])
    header["inputs"][0]["parameters"]["binary_data_size"] = 100
    text = json.dumps(header).encode()
    status, message = error_of(request(infer_url(endpoint), text + body[length:], {**headers, HEADER_LENGTH: str(len(text))}))
    assert status == 400 and "binary_data_size 100 does not match shape [2, 16]" in message


def test_extra_bytes_after_binary_tensors_are_400(endpoint):
    body, headers = binary_body()
    status, message = error_of(request(infer_url(endpoint), body + b"xxxx", headers))
    assert status == 400 and "4 bytes follow the last binary tensor" in message


@pytest.mark.parametrize("value", ["abc", "999999"])
def test_bad_header_length_is_400(endpoint, value):
    body, headers = binary_body()
    status, message = error_of(request(infer_url(endpoint), body, {**headers, HEADER_LENGTH: value}))
    assert status == 400 and HEADER_LENGTH in message


def test_unknown_output_name_is_400(endpoint):
    body, headers = encode_request({"input": np.ones((1, WIDTH_IN), np.float32)}, binary_inputs=False,
                                   outputs=["logits"])
    status, message = error_of(request(infer_url(endpoint), body, headers))
    assert status == 400 and "no outputs ['logits']" in message and "probabilities" in message


def test_compressed_body_is_400(endpoint):
    body, headers = binary_body()
    status, message = error_of(request(infer_url(endpoint), body, {**headers, "Content-Encoding": "gzip"}))
    assert status == 400 and "'gzip' is not supported" in message


@pytest.mark.parametrize(("url", "words"), [
    ("/v2/models/nope/infer", "'nope' is not in the repository"),
    ("/v2/models/a..b/infer", "'a..b' is not served"),
    ("/v2/models/mlp/versions/7.0.0/infer", "no version '7.0.0'"),
    ("/v2/models/..%2Fetc/infer", "no such path"),
    ("/v2/nothing", "no such path"),
])
def test_unknown_model_version_or_path_is_404(endpoint, url, words):
    body, headers = binary_body()
    status, message = error_of(request(endpoint.url + url, body, headers))
    assert status == 404 and words in message


def test_wrong_method_is_405_with_error(endpoint):
    status, message = error_of(request(infer_url(endpoint), method="GET"))
    assert status == 405 and "not allowed" in message


def test_unknown_model_metadata_is_404(endpoint):
    assert error_of(request(f"{endpoint.url}/v2/models/nope"))[0] == 404
    assert error_of(request(f"{endpoint.url}/v2/models/mlp/versions/3.0.0/ready"))[0] == 404


@pytest.fixture
def small_endpoint(serve):
    from edgesdk.ota_server.inference import InferenceConfig

    return serve(config=InferenceConfig(max_body_bytes=4096))


def test_oversized_content_length_is_413_before_the_body_is_sent(small_endpoint):
    # The body announced is 1 GB, only 10 bytes follow: the answer can only come from the header.
    status, body = raw(infer_url(small_endpoint), ["Content-Type: application/octet-stream",
                                                   "Content-Length: 1000000000"], [b"x" * 10])
    assert status == 413 and "over this endpoint's 4096-byte limit" in json.loads(body)["error"]


def test_oversized_chunked_body_is_413(small_endpoint):
    chunk = b"x" * 1024
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    # Twice the limit, then no terminating chunk: the server must answer from the stream it capped.
    status, body = raw(infer_url(small_endpoint), ["Content-Type: application/octet-stream",
                                                   "Transfer-Encoding: chunked"], [framed] * 8)
    assert status == 413 and "4096-byte limit" in json.loads(body)["error"]


def test_body_under_the_limit_is_served(small_endpoint):
    body, headers = binary_body()
    assert len(body) < 4096
    assert request(infer_url(small_endpoint), body, headers)[0] == 200


def test_tflite_bundle_is_refused_with_a_clear_400(serve, repo, tmp_path):
    from edgesdk.runtime.bundle import BundleSpec
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.testing import random_mlp, write_mlp_tflite

    model = write_mlp_tflite(random_mlp([WIDTH_IN, 8, 4], seed=5), tmp_path / "model.tflite")
    x = np.zeros((1, WIDTH_IN), np.float32)
    bundle_from_model(tmp_path / "lite", model, BundleSpec("lite", "1.0.0", "tflite-fp32", "generic-x86_64", "latency"),
                      {"input": x})
    repo.add(tmp_path / "lite")
    endpoint = serve()
    body, headers = encode_request({"input": x}, binary_inputs=False)
    status, message = error_of(request(infer_url(endpoint, "lite"), body, headers))
    assert status == 400 and "tflite bundle" in message and "ONNX models only" in message
    assert error_of(request(f"{endpoint.url}/v2/models/lite"))[0] == 400
