"""How the V2 codec writes JSON: orjson where installed and exact, else the standard library."""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgesdk.offload.v2_codec as codec
from edgesdk.offload.v2_codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)


def test_orjson_writes_finite_bodies_with_the_same_values():
    assert codec._fast_dumps is not None, "orjson is in the [server] extra: it should be installed"
    y = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    labels = np.array([3, -1, 2**40], np.int64)
    body, headers = encode_response("m", "1", {"y": y, "labels": labels}, request_id="r\u00e9")
    header = {"model_name": "m", "model_version": "1", "id": "r\u00e9", "outputs": [
        {"name": "y", "shape": [2, 5], "datatype": "FP32", "data": y.reshape(-1).tolist()},
        {"name": "labels", "shape": [3], "datatype": "INT64", "data": labels.tolist()}]}
    assert json.loads(body) == header and headers == {"Content-Type": "application/json"}
    assert body == codec._fast_dumps(header)  # orjson wrote it
    decoded = decode_response(body, None)
    assert decoded.outputs["y"].tobytes() == y.tobytes() and decoded.id == "r\u00e9"


@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_keep_the_standard_librarys_spelling(special):
    # orjson would write null, which reads back as no number at all.
    y = np.array([[1.0, special]], np.float32)
    body, _ = encode_response("m", "1", {"y": y})
    assert b"null" not in body and json.dumps(special).encode() in body
    np.testing.assert_array_equal(decode_response(body, None).outputs["y"], y)
    request, _ = encode_request({"x": y}, binary_inputs=False)
    np.testing.assert_array_equal(decode_request(request, None).inputs["x"], y)


def test_without_orjson_the_standard_library_writes(monkeypatch):
    monkeypatch.setattr(codec, "_fast_dumps", None)
    y = np.arange(4, dtype=np.float32).reshape(1, 4)
    body, _ = encode_response("m", "1", {"y": y})
    assert body == json.dumps({"model_name": "m", "model_version": "1", "outputs": [
        {"name": "y", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]},
        separators=(",", ":")).encode()
