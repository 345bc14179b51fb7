"""What the fuzz suite found, each kept as a plain test: the input, and the refusal it now gets."""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError, InputError, TransferError
from edgesdk.fleet.measurement import decode_array, encode_array, parse_result
from edgesdk.fleet.protocol import parse_command
from edgesdk.offload.v2_codec import decode_request
from tests.fuzz.targets import KEYS, _command_manifest, _seal


def _npy(header: dict, data: bytes = b"") -> str:
    from numpy.lib import format as npy

    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, header)
    return base64.b64encode(buffer.getvalue() + data).decode()


def test_a_command_that_never_expires_or_names_an_impossible_time_is_refused():
    keys = KEYS.root.keyset("commands")
    for fields in ({"expires_at": float("inf")}, {"expires_at": float("nan")},
                   {"issued_at": 9223372036854775807, "expires_at": 6}):
        with pytest.raises(EdgeSDKError):  # was: accepted as never expiring, or OverflowError formatting the time
            parse_command(_seal({**_command_manifest(), **fields}), keys)
    assert parse_command(_seal(_command_manifest()), keys).version == "1.2.0"


def test_a_command_manifest_that_is_not_an_object_is_refused():
    with pytest.raises(TransferError):  # was: AttributeError
        parse_command(_seal(2147483648), KEYS.root.keyset("commands"))


def test_a_measured_output_whose_npy_header_lies_is_refused_before_any_array_exists():
    good = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(decode_array(encode_array(good)), good)
    huge = _npy({"descr": "<f4", "fortran_order": False, "shape": (2**40,)}, b"\0" * 16)
    broken = _npy({"descr": "<f4", "fortran_order": False, "shape": (2, 3)})[:-8]  # header cut: was TokenError
    short = _npy({"descr": "<f4", "fortran_order": False, "shape": (2, 3)}, b"\0" * 8)  # was EOFError
    objects = _npy({"descr": "|O", "fortran_order": False, "shape": (1,)}, b"\0" * 8)
    for text in (huge, broken, short, objects):
        with pytest.raises(TransferError, match="not base64 .npy data"):
            decode_array(text)
    result = {"measurement_id": "m1", "status": "done", "figures": {}, "outputs": {"y": huge}}
    assert parse_result(json.dumps(result).encode())["outputs"]["y"] == huge  # decoded only where it is used


def test_v2_requests_with_outputs_or_parameters_of_the_wrong_kind_are_refused():
    request = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    for outputs in (2147483648, [{"name": "y", "parameters": 5}]):
        with pytest.raises(InputError):  # was: TypeError, AttributeError
            decode_request(json.dumps({**request, "outputs": outputs}).encode(), None)


def test_a_grpc_shape_with_a_dimension_past_two_to_the_31_is_refused():
    from edgesdk.ota_server.inference import edgesdk_v2_grpc_pb2 as pb
    from edgesdk.ota_server.inference.grpc_service import decode_inputs

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="input", datatype="FP32", shape=[2**62, 0])
    with pytest.raises(InputError, match="over"):  # was: numpy's ValueError "array is too big"
        decode_inputs(request)


def test_root_and_timestamp_versions_past_64_bits_are_refused():
    from edgesdk.errors import TrustError
    from edgesdk.fleet.trust import new_timestamp, parse_root, parse_timestamp, sign_metadata

    with pytest.raises(TrustError, match="from 1 to"):
        parse_root(sign_metadata(KEYS.root_signed(2**70), KEYS.root_keys))
    with pytest.raises(TrustError, match="from 1 to"):
        parse_timestamp(sign_metadata(new_timestamp(2**63, time.time() + 60, 1, {}), [KEYS.timestamp]), KEYS.root)
    assert parse_timestamp(sign_metadata(new_timestamp(2**63 - 1, time.time() + 60, 1, {}), [KEYS.timestamp]),
                           KEYS.root).version == 2**63 - 1


def test_a_json_value_beyond_the_tensors_datatype_is_refused_not_made_infinite():
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e308]}]}
    with pytest.raises(InputError, match="not a list of FP32 values"):  # was: a RuntimeWarning, and inf
        decode_request(json.dumps(body).encode(), None)
    body["inputs"][0]["data"] = [float("inf")]  # said outright, infinity is a value like any other
    assert np.isinf(decode_request(json.dumps(body).encode(), None).inputs["x"]).all()
