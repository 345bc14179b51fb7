"""The fast JSON path of the V2 codec (pysimdjson): the same arrays and the same errors as the standard path."""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgesdk.offload.v2_codec as codec
import edgesdk.offload.v2_json as v2_json
from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import decode_request, decode_response, encode_request, encode_response


def _body(data: object, shape: list[int], datatype: str = "FP32", name: str = "x") -> bytes:
    return json.dumps({"id": "7", "inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()


def _standard(monkeypatch: pytest.MonkeyPatch, body: bytes) -> object:
    with monkeypatch.context() as patched:
        patched.setattr(v2_json, "_simdjson", None)
        return _outcome(body)


def _outcome(body: bytes) -> object:
    """The decoded inputs as (dtype, shape, bytes) per tensor, or the InputError's message."""
    try:
        request = decode_request(body, None)
    except InputError as exc:
        return str(exc)
    return {n: (str(v.dtype), v.shape, v.tobytes()) for n, v in request.inputs.items()}, request.outputs, request.id


@pytest.fixture
def no_standard_parse(monkeypatch):
    """The standard parser refuses to run: whatever decodes, the fast path decoded."""
    def refuse(data: bytes) -> None:
        raise AssertionError("the standard JSON path ran")

    monkeypatch.setattr(codec, "_loads", refuse)


def test_pysimdjson_is_installed_with_the_server_extra():
    assert v2_json._simdjson is not None, "pysimdjson is part of the [server] extra and should be installed here"


def test_a_page_as_json_is_parsed_by_the_fast_path_bit_for_bit(no_standard_parse):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 3.4e38, 1e-45]
    body, _ = encode_request({"x": x}, binary_inputs=False, outputs=["y"], request_id="r1")
    request = decode_request(body, None)
    assert request.inputs["x"].dtype == np.float32 and request.inputs["x"].shape == x.shape
    assert request.inputs["x"].tobytes() == x.tobytes() and request.id == "r1"
    assert request.outputs[0].name == "y"


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT64"])
def test_every_numeric_datatype_takes_the_fast_path(no_standard_parse, datatype):
    x = (np.arange(12).reshape(3, 4) * 7).astype(codec.DATATYPES[datatype])
    body, _ = encode_request({"x": x}, binary_inputs=False)
    got = decode_request(body, None).inputs["x"]
    assert got.dtype == x.dtype and got.tobytes() == x.tobytes()


def test_a_response_decodes_on_the_fast_path_too(no_standard_parse):
    y = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    body, _ = encode_response("m", "1", {"y": y})
    assert decode_response(body, None).outputs["y"].tobytes() == y.tobytes()


# Bodies the fast path must decode exactly as the standard path does, or step aside for it.
CASES = {
    "flat": (_body([1.5, -2, 3e-2, 4E+3, -0.0, 1e-300], [6]), True),
    "whitespace": (b'{"inputs": [ {"name": "x", "shape": [2, 2], "datatype": "FP32",\n "data": [ 1 ,2,\t3 , 4 ] } ]}',
                   True),
    "regular nest": (_body([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], [2, 2, 2]), True),
    "nest for a flat shape": (_body([[1, 2], [3, 4]], [4]), True),
    "empty": (_body([], [0]), True),
    "empty nest": (_body([[], []], [2, 0]), True),
    "int64 extremes": (_body([-(2**63), 2**63 - 1], [2], "INT64"), True),
    "uint64 max": (_body([2**64 - 1], [1], "UINT64"), True),
    "ragged": (_body([[1, 2], [3]], [3]), False),
    "ragged, same count": (_body([[1, 2], [3], [4, 5, 6]], [6]), False),
    "list among numbers": (_body([1, [2]], [2]), False),
    "deeper list among a nest": (_body([[1, 2], [3, [4]]], [4]), False),
    "scalar among lists": (_body([[1, 2], 3], [3]), False),
    "bool in FP32": (_body([1.0, True], [2]), False),
    "string in FP32": (_body([1.0, "2.5"], [2]), False),
    "not a number": (_body([1.0, "a"], [2]), False),
    "float in INT64": (_body([1, 2.5], [2], "INT64"), False),
    "over INT8": (_body([1, 300], [2], "INT8"), False),
    "negative UINT8": (_body([1, -1], [2], "UINT8"), False),
    "over FP32": (_body([1.0, 1e308], [2]), False),
    "over FP16": (_body([1.0, 1e6], [2], "FP16"), False),
    "BOOL": (_body([True, False], [2], "BOOL"), False),
    "NaN token": (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [NaN, 1]}]}', False),
    "duplicate key": (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP64", "datatype": "FP32", "data": [1, 2]}]}',
                      False),
    "escaped bracket in a name": (_body([1, [2]], [2], name="x[").replace(b"x[", b"x\\u005b"), False),
    "count short of the shape": (_body([1, 2, 3], [2, 2]), True),
    "data not a list": (_body(5, [1]), True),
    "not an object": (b"[1, 2]", False),
    "malformed": (b'{"inputs": [', False),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fast_path_answers_as_the_standard_path_does(monkeypatch, case):
    body, _ = CASES[case]
    assert _outcome(body) == _standard(monkeypatch, body)


@pytest.mark.parametrize("case", CASES)
def test_the_fast_path_steps_aside_when_it_cannot_be_exact(case):
    body, fast = CASES[case]
    header = v2_json.fast_header(body)
    if header is None:
        assert not fast
        return
    try:
        for entry in header.get("inputs", []):
            if isinstance(entry.get("data"), v2_json.Numbers):
                entry["data"].values(codec.dtype_of(entry["datatype"]))
    except v2_json.NotExact:
        assert not fast
        return
    assert fast


def test_a_document_still_referenced_does_not_block_the_next_parse():
    kept = v2_json.fast_header(_body([1, 2], [2]))
    assert kept is not None
    again = v2_json.fast_header(_body([3, 4], [2]))  # the first one's arrays are alive: a new parser is taken
    assert again is not None and again["inputs"][0]["data"].values(np.dtype(np.float32)).tolist() == [3, 4]
    assert kept["inputs"][0]["data"].values(np.dtype(np.float32)).tolist() == [1, 2]


def test_a_big_body_is_parsed_by_a_parser_of_its_own(monkeypatch):
    # A thread keeps its parser, and a parser keeps buffers several times the largest body it parsed.
    monkeypatch.setattr(v2_json, "KEEP_PARSER_BYTES", 64)
    small = v2_json._parse(b"[1]")
    del small
    kept = v2_json._local.parser
    header = v2_json.fast_header(_body(list(range(50)), [50]))
    assert header is not None and header["inputs"][0]["data"].values(np.dtype(np.int64)).tolist() == list(range(50))
    assert v2_json._local.parser is kept
    kept.parse(b"[2]")  # holds no document of the big body (it would refuse to parse while one is alive)
