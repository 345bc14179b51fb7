"""Declared tensor shapes are checked in Python ints before NumPy sees them (HTTP and gRPC).

The fuzz suite found gRPC requests whose shape holds a zero beside dimensions that multiply past the
address space: no data, yet NumPy could not describe even the empty array and raised
``ValueError: array is too big`` out of the parser. The HTTP codec let the same shapes through.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import (
    HEADER_LENGTH,
    MAX_RANK,
    MAX_TENSOR_BYTES,
    declared_shape,
    decode_request,
    encode_request,
)
from edgesdk.ota_server.inference import edgesdk_v2_grpc_pb2 as pb
from edgesdk.ota_server.inference.grpc_service import decode_inputs

#: Each names no data (a zero dimension) or more than any tensor may hold; the first three made
#: NumPy raise.
OVERFLOWING = [[0, 2**31, 2**31, 2**31], [0, 2**62, 2**62], [2**31, 2**31, 0], [2**40]]


def _grpc(shape: list[int], raw: bytes | None = b"",
          values: list[float] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    entry = request.inputs.add(name="x", datatype="FP32", shape=shape)
    if values is not None:
        entry.contents.fp32_contents.extend(values)
    elif raw is not None:
        request.raw_input_contents.append(raw)
    return request


@pytest.mark.parametrize("shape", OVERFLOWING)
def test_an_overflowing_grpc_shape_is_refused_naming_it(shape):
    for request in (_grpc(shape), _grpc(shape, values=[])):  # raw contents and typed contents
        with pytest.raises(InputError, match=r"tensor 'x': shape \[.*bytes a tensor may have"):
            decode_inputs(request)


@pytest.mark.parametrize("shape", OVERFLOWING)
def test_an_overflowing_http_shape_is_refused_as_json_and_binary(shape):
    as_json = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                                      "data": []}]}).encode()
    binary = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    for body, length in ((as_json, None), (binary, len(binary))):
        with pytest.raises(InputError, match="bytes a tensor may have"):
            decode_request(body, length)


def test_negative_and_too_many_dimensions_are_refused_over_grpc():
    with pytest.raises(InputError, match=r"shape \[1, -4\] must be a list of non-negative"):
        decode_inputs(_grpc([1, -4]))
    with pytest.raises(InputError, match=f"has {MAX_RANK + 1} dimensions, over the {MAX_RANK}"):
        decode_inputs(_grpc([1] * (MAX_RANK + 1), raw=b"\0" * 4))


def test_the_limit_is_counted_with_zeros_as_one_and_the_item_size():
    limit_fp32 = MAX_TENSOR_BYTES // 4
    assert declared_shape("x", [0, limit_fp32], "FP32")[2] == 0  # at the limit: an empty tensor
    with pytest.raises(InputError, match=f"describes {MAX_TENSOR_BYTES * 2} bytes"):
        declared_shape("x", [0, limit_fp32], "FP64")
    assert declared_shape("x", [2, 3], "INT64") == ((2, 3), np.dtype("<i8"), 6)


def test_empty_and_ordinary_tensors_still_decode():
    assert decode_inputs(_grpc([0, 16])).get("x").shape == (0, 16)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(decode_inputs(_grpc([2, 4], raw=x.tobytes()))["x"], x)
    body, headers = encode_request({"x": x}, binary_inputs=True)
    assert np.array_equal(decode_request(body, int(headers[HEADER_LENGTH])).inputs["x"], x)
