"""The gRPC service's own walk of ModelInfer messages (grpc_wire.py) against protobuf's parser.

The service no longer hands requests to protobuf whole: it takes the raw input tensors out as views
of the received bytes. These tests hold it to protobuf's answers on valid, damaged and random
messages, and check that the tensors are not copied.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk.errors import InputError
from edgesdk.ota_server.inference import edgesdk_v2_grpc_pb2 as pb
from edgesdk.ota_server.inference.grpc_service import decode_inputs
from edgesdk.ota_server.inference.grpc_wire import join_response, split_request
from tests.fuzz.hostile import damaged
from tests.fuzz.targets import _grpc_requests


def _request(x: np.ndarray, *more: bytes) -> bytes:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id="req-1")
    message.inputs.add(name="x", datatype="FP32", shape=x.shape)
    message.outputs.add(name="y")
    message.raw_input_contents.extend([x.tobytes(), *more])
    return message.SerializeToString()


def test_raw_inputs_are_views_of_the_received_bytes_not_copies():
    x = np.arange(12, dtype="<f4").reshape(3, 4)
    data = _request(x)
    request, raw = split_request(data)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "req-1")
    assert not request.raw_input_contents and [bytes(r) for r in raw] == [x.tobytes()]
    tensor = decode_inputs(request, raw)["x"]
    assert np.array_equal(tensor, x) and not tensor.flags.writeable
    owner = tensor.base
    while isinstance(owner, np.ndarray):
        owner = owner.base
    # grpc's bytes themselves: protobuf's parser copied them twice.
    assert isinstance(owner, memoryview) and owner.obj is data


def _same_as_protobuf(data: bytes) -> None:
    try:
        expected = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        expected = None
    try:
        request, raw = split_request(data)
    except InputError as exc:
        # Refused where protobuf refuses, or for an obsolete group field (not read by the service).
        assert expected is None or "wire type" in str(exc), (data, exc)
        return
    assert expected is not None, data
    request.raw_input_contents.extend(bytes(r) for r in raw)
    assert request == expected
    assert request.SerializeToString(deterministic=True) \
        == expected.SerializeToString(deterministic=True)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(_grpc_requests(), st.binary(max_size=80),
                 damaged(_request(np.ones((2, 2), "<f4"), b"\x01\x02"))))
def test_every_message_reads_as_protobuf_reads_it_or_is_refused_where_protobuf_refuses(data):
    _same_as_protobuf(data)


@pytest.mark.parametrize(("data", "words"), [
    (b"\x3a\x85", "does not end"),  # field 7's length varint cut off
    (b"\x3a\x10abc", "13 bytes short"),  # field 7 says 16 bytes, 3 follow
    (b"\x0b\x0c", "wire type 3"),  # a group
])
def test_a_broken_message_is_an_input_error_naming_where(data, words):
    with pytest.raises(InputError, match=words):
        split_request(data)


def test_an_answer_is_the_bytes_protobuf_would_write():
    outputs = {"y": np.arange(6, dtype="<f4").reshape(2, 3), "z": np.array([1, 2], "<i8")}
    response = pb.ModelInferResponse(model_name="m", model_version="1.0.0", id="7")
    for name, value in outputs.items():
        datatype = "FP32" if value.dtype.kind == "f" else "INT64"
        response.outputs.add(name=name, datatype=datatype, shape=value.shape)
    data = join_response(response, outputs.values())
    response.raw_output_contents.extend(v.tobytes() for v in outputs.values())
    assert data == response.SerializeToString()
    assert pb.ModelInferResponse.FromString(data) == response
