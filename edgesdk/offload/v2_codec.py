"""Tensors of the Open Inference Protocol (KServe V2) over HTTP, both directions, for client and server.

One codec serves the offload client on the device (:mod:`edgesdk.offload`) and the inference
endpoint of the server (:mod:`edgesdk.ota_server.inference`), so both read and write the same
bytes. A request or response body is either plain JSON, with every tensor as a ``data`` list,
or, with the binary tensor data extension, a JSON header followed by raw little-endian tensor
bytes; then the ``Inference-Header-Content-Length`` HTTP header gives the JSON header's length
and each binary tensor carries ``parameters.binary_data_size``::

    body, headers = encode_request({"input": x}, binary_inputs=True, binary_outputs=True)
    request = decode_request(body, int(headers[HEADER_LENGTH]))        # the server's side
    body, headers = encode_response("digits", "1", {"probabilities": y}, binary={"probabilities"})
    response = decode_response(body, int(headers[HEADER_LENGTH]))      # the client's side

Anything that does not decode (malformed JSON, a shape that does not match the data, a
``binary_data_size`` that does not match the body, a datatype it does not know) raises
:class:`~edgesdk.errors.InputError` naming the tensor and the value. ``BYTES`` tensors are
not supported: edgesdk models take numeric tensors only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from edgesdk.errors import InputError

from .v2_json import NotExact, Numbers, fast_header

T = TypeVar("T")
#: A body as received: bytes, or a view of a buffer the server read it into (one byte per item).
Body = bytes | bytearray | memoryview

_fast_loads: Callable[[bytes], Any] | None
_fast_dumps: Callable[..., bytes] | None
_NUMPY_OPTION = 0
try:  # the [server] extra installs orjson: several times faster on tensors sent as JSON; a device needs none
    from orjson import OPT_SERIALIZE_NUMPY as _NUMPY_OPTION
    from orjson import dumps as _fast_dumps
    from orjson import loads as _fast_loads
except ImportError:
    _fast_loads = _fast_dumps = None


def all_finite(values: np.ndarray) -> bool:
    """Whether every number of ``values`` is finite (integers always are)."""
    return values.dtype.kind != "f" or bool(np.isfinite(values).all())


def write_json(value: Any, finite: bool) -> bytes:
    """``value`` (JSON-ready, or a NumPy array) as compact JSON. orjson writes it when it is
    installed and ``finite`` says every number is finite (the same values, faster); else the
    standard library, which spells NaN and infinities as the V2 peers read them (orjson would
    write ``null``)."""
    if finite and _fast_dumps is not None:
        return _fast_dumps(value, option=_NUMPY_OPTION)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    if _fast_loads is not None:
        try:
            return _fast_loads(data)
        except ValueError:
            pass  # NaN or Infinity tokens, which orjson refuses and the standard library (and its writers) accept
    return json.loads(data)

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "BINARY_EXTENSION",
    "InferRequest",
    "InferResponse",
    "RequestedOutput",
    "MAX_RANK",
    "MAX_TENSOR_BYTES",
    "all_finite",
    "write_json",
    "datatype_of",
    "declared_shape",
    "dtype_of",
    "encode_request",
    "decode_request",
    "encode_response",
    "decode_response",
    "error_message",
]

#: The HTTP header that carries the length of the JSON part of a body with binary tensors.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: The name a server lists in ``GET /v2`` ``extensions`` when it takes and sends binary tensors.
BINARY_EXTENSION = "binary_tensor_data"

#: V2 datatype name -> NumPy dtype (little-endian, as the binary extension stores them).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_NAMES = {dtype.newbyteorder("="): name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: Any) -> str:
    """The V2 datatype name of a NumPy dtype (``float32`` -> ``"FP32"``); InputError for any other kind."""
    resolved = np.dtype(dtype)
    name = _NAMES.get(resolved.newbyteorder("="))
    if name is None:
        raise InputError(f"dtype {resolved} has no KServe V2 datatype edgesdk sends; use one of "
                         f"{', '.join(str(d) for d in _NAMES)}")
    return name


def dtype_of(datatype: str) -> np.dtype[Any]:
    """The NumPy dtype of a V2 datatype name (``"FP32"`` -> ``float32``); InputError for unknown or BYTES."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise InputError(f"datatype {datatype!r} is not supported; use one of {', '.join(DATATYPES)}") from None


@dataclass(frozen=True)
class RequestedOutput:
    """An output a request asks for; ``binary`` None means the request-level default."""

    name: str
    binary: bool | None = None


@dataclass(frozen=True)
class InferRequest:
    """A decoded inference request: its id, input tensors by name, the outputs it asks for (empty: all)."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...] = ()
    #: The request-level ``binary_data_output`` parameter: outputs not named otherwise come back binary.
    binary_outputs: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)

    def wants_binary(self, output: str) -> bool:
        """Whether ``output`` should be returned as binary data."""
        for requested in self.outputs:
            if requested.name == output and requested.binary is not None:
                return requested.binary
        return self.binary_outputs


@dataclass(frozen=True)
class InferResponse:
    """A decoded inference response: which model answered and its output tensors by name."""

    model_name: str
    model_version: str | None
    id: str | None
    outputs: dict[str, np.ndarray]


def _header(tensor: np.ndarray, name: str, binary: bool) -> tuple[dict[str, Any], bytes, bool]:
    """The JSON description of one tensor; if binary, its bytes (C order, little-endian); and
    whether its JSON holds only finite numbers (orjson would write NaN and infinities as null)."""
    datatype = datatype_of(tensor.dtype)
    entry: dict[str, Any] = {"name": name, "shape": list(tensor.shape), "datatype": datatype}
    if binary:
        raw = np.ascontiguousarray(tensor, dtype=DATATYPES[datatype]).tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw, True
    entry["data"] = tensor.reshape(-1).tolist()
    return entry, b"", all_finite(tensor)


def _body(header: dict[str, Any], blobs: list[bytes], finite: bool) -> tuple[bytes, dict[str, str]]:
    """The body and headers (the JSON part by :func:`write_json`)."""
    text = write_json(header, finite)
    if not any(blobs):
        return text, {"Content-Type": "application/json"}
    return text + b"".join(blobs), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}


def encode_request(inputs: Mapping[str, np.ndarray], *, binary_inputs: bool, outputs: Sequence[str] | None = None,
                   binary_outputs: bool = False, request_id: str | None = None,
                   parameters: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and HTTP headers of ``POST .../infer`` for ``inputs``.

    ``binary_inputs`` sends tensor bytes after the JSON header; ``binary_outputs`` asks for the
    outputs the same way (named ``outputs`` only, or all of them when ``outputs`` is None).
    """
    header: dict[str, Any] = {}
    if request_id is not None:
        header["id"] = request_id
    params = dict(parameters or {})
    if binary_outputs and outputs is None:
        params["binary_data_output"] = True
    if params:
        header["parameters"] = params
    blobs: list[bytes] = []
    header["inputs"] = []
    finite = True
    for name, value in inputs.items():
        entry, raw, plain = _header(np.asarray(value), name, binary_inputs)
        header["inputs"].append(entry)
        blobs.append(raw)
        finite = finite and plain
    if outputs is not None:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": binary_outputs}} for name in outputs]
    return _body(header, blobs, finite)


def encode_response(model_name: str, model_version: str | None, outputs: Mapping[str, np.ndarray], *,
                    binary: Collection[str] = (), request_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and HTTP headers of an inference response; outputs named in ``binary`` are sent as bytes."""
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    blobs: list[bytes] = []
    header["outputs"] = []
    finite = True
    for name, value in outputs.items():
        entry, raw, plain = _header(np.asarray(value), name, name in binary)
        header["outputs"].append(entry)
        blobs.append(raw)
        finite = finite and plain
    return _body(header, blobs, finite)


def _split(body: Body, header_length: int | None, fast: bool) -> tuple[dict[str, Any], memoryview]:
    """The JSON header as a dict and the binary part that follows it.

    ``fast``: tensors' ``data`` lists may come back as :class:`~.v2_json.Numbers` (see :mod:`.v2_json`).
    """
    if header_length is None:
        header_length = len(body)
    if not 0 < header_length <= len(body):
        raise InputError(f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes; send the length "
                         "of the JSON part of the body")
    text = body if header_length == len(body) and isinstance(body, bytes) else bytes(body[:header_length])
    header = fast_header(text) if fast else None
    if header is None:
        try:
            header = _loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"the body is not valid JSON ({exc}); send a KServe V2 inference JSON object") from None
    if not isinstance(header, dict):
        raise InputError(f"the body is JSON {type(header).__name__}, not an object; send a KServe V2 inference object")
    return header, memoryview(body)[header_length:]


#: Most dimensions a tensor may declare: NumPy describes no array of more (64 since NumPy 2), and no
#: model edgesdk serves takes over a handful.
MAX_RANK = 32
#: Most bytes a declared shape may describe, counting every zero dimension as 1 (1 TiB). A shape
#: like ``[0, 2**62, 2**62]`` holds no data, yet NumPy cannot describe even that empty array
#: ("array is too big") once its other dimensions multiply past the address space; no tensor a
#: server takes is this big.
MAX_TENSOR_BYTES = 2**40


def declared_shape(name: str, shape: Any, datatype: Any
                   ) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """The shape, dtype and element count a tensor declares, checked before NumPy sees them.

    InputError naming the tensor and the value for anything but a list of at most :data:`MAX_RANK`
    non-negative integers whose extent (zeros counted as 1) times the item size is at most
    :data:`MAX_TENSOR_BYTES`, or a datatype :func:`dtype_of` does not know. HTTP (JSON and binary)
    and gRPC requests go through this one check, in Python ints (which do not overflow).
    """
    if not isinstance(shape, (list, tuple)) \
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InputError(f"tensor {name!r}: shape {shape!r:.200} must be a list of non-negative "
                         "integers; send the tensor's actual sizes")
    dtype = dtype_of(datatype)
    if len(shape) > MAX_RANK:
        raise InputError(f"tensor {name!r}: shape has {len(shape)} dimensions, over the {MAX_RANK} "
                         "a tensor may have; send the tensor's actual shape")
    extent = math.prod(max(d, 1) for d in shape) * dtype.itemsize
    if extent > MAX_TENSOR_BYTES:
        raise InputError(f"tensor {name!r}: shape {list(shape)} of {datatype} describes {extent} "
                         f"bytes (a zero dimension counted as 1), over the {MAX_TENSOR_BYTES} "
                         "bytes a tensor may have; send the tensor's actual shape")
    return tuple(shape), dtype, math.prod(shape)


def _tensors(entries: Any, rest: memoryview, what: str, copy: bool) -> dict[str, np.ndarray]:
    """Decode a list of V2 tensor entries, taking binary data from ``rest`` in order.

    ``copy`` False leaves binary tensors as read-only views of the body (the server's requests:
    no copy before ONNX Runtime); True gives the caller arrays of its own (the client's outputs).
    """
    if not isinstance(entries, list):
        raise InputError(f"{what} must be a list of tensors, got {type(entries).__name__}")
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InputError(f"every entry of {what} must be an object with a string 'name', got {entry!r:.200}")
        name = entry["name"]
        if name in tensors:
            raise InputError(f"tensor {name!r} appears twice in {what}")
        shape, dtype, count = declared_shape(name, entry.get("shape"), entry.get("datatype", ""))
        params = entry.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            expected = count * dtype.itemsize
            if not isinstance(size, int) or size != expected:
                raise InputError(f"tensor {name!r}: binary_data_size {size!r} does not match shape {list(shape)} of "
                                 f"{entry['datatype']} ({expected} bytes)")
            if offset + size > len(rest):
                raise InputError(f"tensor {name!r}: the body ends {offset + size - len(rest)} bytes short of its "
                                 f"binary data ({size} bytes); the body was truncated")
            view = np.frombuffer(rest[offset:offset + size], dtype=dtype).reshape(shape)
            tensors[name] = view.copy() if copy else view
            offset += size
            continue
        if "data" not in entry:
            raise InputError(f"tensor {name!r} has neither 'data' nor parameters.binary_data_size")
        data = entry["data"]
        if isinstance(data, Numbers):
            flat = data.values(dtype)
        else:
            try:
                with np.errstate(over="raise"):  # 1e308 as FP32 would otherwise arrive as inf, silently
                    flat = np.asarray(data, dtype=dtype).reshape(-1)
            except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
                raise InputError(f"tensor {name!r}: data is not a list of {entry['datatype']} values ({exc})") \
                    from None
        if flat.size != count:
            raise InputError(f"tensor {name!r}: {flat.size} data values do not fill shape {list(shape)} "
                             f"({count} values)")
        tensors[name] = flat.reshape(shape)
    if offset != len(rest):
        raise InputError(f"{len(rest) - offset} bytes follow the last binary tensor of {what}; the "
                         "binary_data_size values do not add up to the body")
    return tensors


def _exactly(decode: Callable[[Body, int | None, bool], T], body: Body,
             header_length: int | None) -> T:
    """``decode`` with the fast JSON path, or the standard one when the fast one is not sure or finds a fault
    (then the standard path's answer and error message are the ones given)."""
    try:
        return decode(body, header_length, True)
    except (NotExact, InputError):
        return decode(body, header_length, False)


def decode_request(body: Body, header_length: int | None) -> InferRequest:
    """Decode an inference request body; ``header_length`` is the ``Inference-Header-Content-Length`` (or None).

    Binary input tensors are read-only views of ``body``; JSON ones are parsed as :mod:`.v2_json` says.
    """
    return _exactly(_decode_request, body, header_length)


def decode_response(body: Body, header_length: int | None) -> InferResponse:
    """Decode an inference response body; ``header_length`` is the ``Inference-Header-Content-Length`` (or None)."""
    return _exactly(_decode_response, body, header_length)


def _decode_request(body: Body, header_length: int | None, fast: bool) -> InferRequest:
    header, rest = _split(body, header_length, fast)
    inputs = _tensors(header.get("inputs"), rest, "inputs", copy=False)
    if not inputs:
        raise InputError("the request has no inputs; send at least one tensor in 'inputs'")
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError(f"request parameters must be an object, got {params!r:.200}")
    outputs = []
    requested = header.get("outputs") or []
    if not isinstance(requested, list):
        raise InputError(f"'outputs' must be a list of objects, got {requested!r:.200}")
    for entry in requested:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                or not isinstance(entry.get("parameters") or {}, dict):
            raise InputError(f"every requested output must be an object with a string 'name' (and an object "
                             f"'parameters'), got {entry!r:.200}")
        binary = (entry.get("parameters") or {}).get("binary_data")
        outputs.append(RequestedOutput(entry["name"], None if binary is None else bool(binary)))
    request_id = header.get("id")
    return InferRequest(None if request_id is None else str(request_id), inputs, tuple(outputs),
                        bool(params.get("binary_data_output", False)), params)


def _decode_response(body: Body, header_length: int | None, fast: bool) -> InferResponse:
    header, rest = _split(body, header_length, fast)
    if not isinstance(header.get("model_name"), str):
        raise InputError(f"the response has no model_name; not a KServe V2 inference response: {header!r:.200}")
    outputs = _tensors(header.get("outputs"), rest, "outputs", copy=True)
    version = header.get("model_version")
    response_id = header.get("id")
    return InferResponse(header["model_name"], None if version is None else str(version),
                         None if response_id is None else str(response_id), outputs)


def error_message(body: bytes, status: int) -> str:
    """The message of an error answer, whichever form the server uses.

    KServe V2 says ``{"error": "..."}``; FastAPI-based servers answer validation errors as
    ``{"detail": [{"loc": [...], "msg": "..."}]}`` or ``{"detail": "..."}``; others send text.
    """
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text[:500] or f"HTTP {status} with an empty body"
    if isinstance(parsed, dict):
        if isinstance(parsed.get("error"), str):
            return parsed["error"]
        detail = parsed.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):
            parts = []
            for item in detail:
                if isinstance(item, dict):
                    where = ".".join(str(p) for p in item.get("loc", []))
                    parts.append(f"{where}: {item.get('msg', item)}" if where else str(item.get("msg", item)))
                else:
                    parts.append(str(item))
            return "; ".join(parts)
    return text[:500]
