"""``ModelInfer`` messages with their raw tensors left where they arrived: no copy in, one copy out.

Why: with protobuf's own parser, the gRPC service copied every raw input twice after grpc handed
it the message (into the parser's arena, then into a new ``bytes`` on reading the field), where
the HTTP endpoint reads binary tensors as views of the body. On the 1x3x224x224 page (602 KB)
the two copies, each into fresh pages, cost about as much as the rest of the service's decoding,
and the service answered later than HTTP binary (gRPC p50 / HTTP binary p50 was 1.033, one
client). Outputs went through three copies (``tobytes``, into the message, serializing it).

So the service's request deserializer is the identity and :func:`split_request` walks the
message's top-level fields itself (protobuf's wire format: a varint key, then a varint, 8 or 4
bytes, or a varint length and that many bytes): each ``raw_input_contents`` entry becomes a
``memoryview`` of the received bytes, everything else goes to protobuf's parser, which is small.
Answers are built the other way (:func:`join_response`): the message without its raw outputs,
serialized by protobuf, then each output's field written after it (protobuf lets a repeated
field's entries follow the rest; parsers read them in order), the tensors copied once.

Anything that is not a well-formed message raises :class:`~edgesdk.errors.InputError` (the
service answers INVALID_ARGUMENT), as a message protobuf's parser refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from edgesdk.errors import InputError

from . import edgesdk_v2_grpc_pb2 as pb

__all__ = ["split_request", "join_response"]

_RAW_INPUTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_RAW_OUTPUTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_LENGTH_DELIMITED = 2
#: Bytes a field of each fixed-size wire type takes after its key (1: 64-bit, 5: 32-bit).
_FIXED = {1: 8, 5: 4}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it.

    InputError when it runs off the end or past 10 bytes.
    """
    value = shift = 0
    for end in range(pos, min(pos + 10, len(data))):
        byte = data[end]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, end + 1
        shift += 7
    raise InputError(f"the ModelInferRequest is not a protobuf message: a varint at byte {pos} of "
                     f"{len(data)} does not end; send a serialized inference.ModelInferRequest")


def _field_end(data: bytes, pos: int, wire: int) -> tuple[int, int]:
    """Where the value of a field of wire type ``wire`` starting at ``pos`` begins and ends."""
    if wire == 0:
        return pos, _varint(data, pos)[1]
    if wire in _FIXED:
        return pos, pos + _FIXED[wire]
    if wire == _LENGTH_DELIMITED:
        length, start = _varint(data, pos)
        return start, start + length
    raise InputError(f"the ModelInferRequest has a field of wire type {wire} at byte {pos}, which "
                     "this service does not read (groups are obsolete); send a serialized "
                     "inference.ModelInferRequest")


def split_request(data: bytes) -> tuple[Any, list[memoryview]]:
    """A ``ModelInferRequest`` without its ``raw_input_contents``, and those as views of ``data``"""
    view = memoryview(data)
    kept: list[memoryview] = []
    raw: list[memoryview] = []
    pos = 0
    while pos < len(data):
        key, value_at = _varint(data, pos)
        start, end = _field_end(data, value_at, key & 7)
        if end > len(data):
            raise InputError(f"the ModelInferRequest ends {end - len(data)} bytes short of its "
                             f"field {key >> 3} (at byte {pos} of {len(data)}); it was cut off")
        if key >> 3 == _RAW_INPUTS and key & 7 == _LENGTH_DELIMITED:
            raw.append(view[start:end])
        else:
            kept.append(view[pos:end])
        pos = end
    from google.protobuf.message import DecodeError

    try:
        return pb.ModelInferRequest.FromString(b"".join(kept)), raw
    except DecodeError as exc:
        raise InputError(f"the ModelInferRequest is not a valid message ({exc}); send a serialized "
                         "inference.ModelInferRequest") from None


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def join_response(response: Any, raw_outputs: Iterable[Any]) -> bytes:
    """``response`` (a ``ModelInferResponse`` without raw outputs) serialized, then each of
    ``raw_outputs`` (bytes-like, C-contiguous) as one ``raw_output_contents`` entry: the bytes
    protobuf would write, each tensor copied once."""
    key = _varint_bytes(_RAW_OUTPUTS << 3 | _LENGTH_DELIMITED)
    parts: list[Any] = [response.SerializeToString()]
    for blob in raw_outputs:
        size = memoryview(blob).nbytes
        parts += [key, _varint_bytes(size), blob]
    return b"".join(parts)
