"""The KServe V2 tensor codec both the offload client and the inference endpoint use."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import (
    DATATYPES,
    HEADER_LENGTH,
    datatype_of,
    decode_request,
    decode_response,
    dtype_of,
    encode_request,
    encode_response,
    error_message,
)


def _length(headers: dict[str, str]) -> int | None:
    return int(headers[HEADER_LENGTH]) if HEADER_LENGTH in headers else None


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_every_datatype_round_trips_as_json_and_binary(datatype, binary):
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((2, 3)) * 50).astype(DATATYPES[datatype])
    body, headers = encode_request({"x": value}, binary_inputs=binary)
    assert (HEADER_LENGTH in headers) == binary
    request = decode_request(body, _length(headers))
    assert request.inputs["x"].dtype == value.dtype and request.inputs["x"].shape == (2, 3)
    np.testing.assert_array_equal(request.inputs["x"], value)


def test_a_big_endian_array_is_sent_little_endian():
    value = np.arange(4, dtype=">f4")
    body, headers = encode_request({"x": value}, binary_inputs=True)
    assert body[int(headers[HEADER_LENGTH]):] == np.arange(4, dtype="<f4").tobytes()


def test_binary_outputs_are_asked_for_per_output_or_for_all():
    x = np.ones((1, 4), np.float32)
    named = decode_request(*_pair(encode_request({"x": x}, binary_inputs=False, outputs=["y"], binary_outputs=True)))
    assert named.wants_binary("y") and not named.wants_binary("z")
    every = decode_request(*_pair(encode_request({"x": x}, binary_inputs=False, binary_outputs=True)))
    assert every.wants_binary("y") and every.outputs == ()


def _pair(encoded):
    body, headers = encoded
    return body, _length(headers)


def test_a_response_mixes_binary_and_json_outputs():
    y, z = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], np.int64)
    body, headers = encode_response("digits", "3", {"y": y, "z": z}, binary={"y"}, request_id="7")
    response = decode_response(body, _length(headers))
    assert (response.model_name, response.model_version, response.id) == ("digits", "3", "7")
    np.testing.assert_array_equal(response.outputs["y"], y)
    np.testing.assert_array_equal(response.outputs["z"], z)
    assert json.loads(body[:int(headers[HEADER_LENGTH])])["outputs"][1]["data"] == [1, 2]


def test_nested_json_data_is_accepted():
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]})
    assert decode_request(body.encode(), None).inputs["x"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"inputs": []}', "no inputs"),
    (b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]}', "do not fill shape"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}', "'BYTES' is not supported"),
    (b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}', "non-negative integers"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', "neither 'data'"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["a"]}]}', "not a list of FP32"),
])
def test_malformed_requests_are_input_errors_that_say_what(body, message):
    with pytest.raises(InputError, match=message):
        decode_request(body, None)


def test_a_truncated_binary_body_is_refused():
    body, headers = encode_request({"x": np.ones((1, 64), np.float32)}, binary_inputs=True)
    with pytest.raises(InputError, match="truncated"):
        decode_request(body[:-10], _length(headers))


def test_binary_sizes_must_match_shape_and_body():
    body, headers = encode_request({"x": np.ones((1, 4), np.float32)}, binary_inputs=True)
    n = _length(headers)
    assert n is not None
    header = json.loads(body[:n])
    header["inputs"][0]["parameters"]["binary_data_size"] = 12
    text = json.dumps(header).encode()
    with pytest.raises(InputError, match="binary_data_size 12 does not match"):
        decode_request(text + body[n:], len(text))
    with pytest.raises(InputError, match="do not add up"):
        decode_request(body + b"\0\0\0\0", n)
    with pytest.raises(InputError, match=HEADER_LENGTH):
        decode_request(body, len(body) + 1)


def test_unknown_dtypes_are_named():
    with pytest.raises(InputError, match="complex128"):
        datatype_of(np.complex128)
    with pytest.raises(InputError, match="'FP8'"):
        dtype_of("FP8")


@pytest.mark.parametrize("body, expected", [
    (b'{"error": "model digits has no version 9"}', "model digits has no version 9"),
    (b'{"detail": [{"loc": ["body", "inputs", 0], "msg": "field required"}]}', "body.inputs.0: field required"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b"Internal Server Error", "Internal Server Error"),
    (b"", "HTTP 502 with an empty body"),
])
def test_error_messages_of_every_server_style(body, expected):
    assert error_message(body, 502) == expected


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "standard-library"])
def test_json_tensors_decode_with_and_without_orjson_nan_included(monkeypatch, fast):
    # The server has orjson (the [server] extra); a device has only the standard library. Both read the same
    # bodies, including the NaN and Infinity tokens Python's json writes, which orjson alone would refuse.
    import edgesdk.offload.v2_codec as codec

    if not fast:
        monkeypatch.setattr(codec, "_fast_loads", None)
    else:
        assert codec._fast_loads is not None, "orjson is part of the [server] extra and should be installed here"
    x = np.array([[1.5, float("nan"), float("inf"), -2.0]], np.float32)
    body, _ = encode_request({"x": x}, binary_inputs=False)
    got = decode_request(body, None).inputs["x"]
    np.testing.assert_array_equal(got, x)
    plain = json.dumps({"inputs": [{"name": "y", "shape": [2], "datatype": "INT64", "data": [3, 4]}]}).encode()
    assert decode_request(plain, None).inputs["y"].tolist() == [3, 4]
