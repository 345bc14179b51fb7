"""Big JSON responses, written on the event loop in slices that give the loop its turn between them.

JSON is the V2 default, and an output of 10^6 floats written the usual way (``tolist`` and one
``json.dumps``) held the loop for about 1 s here: health and every other request waited. Neither a
thread nor orjson alone helps, since both hold the GIL for the whole call. So an output of more than
:data:`SLICE_VALUES` values is written slice by slice, each slice straight from the array by orjson
(``OPT_SERIALIZE_NUMPY``: no Python number per value, about 0.25 ms per slice here), and the loop
runs what is waiting (``await asyncio.sleep(0)``) between slices: a health check waits for at most
one slice. A process would not be cheaper: the values are here already, and sending 4 MB away to get
11 MB of text back costs more than writing it. Binary outputs (the binary data extension) are copied
as they are, which is always faster; clients should ask for them.

The JSON value is the one :func:`~edgesdk.offload.v2_codec.encode_response` writes; floats may be
spelled shorter (FP32 0.1 is ``0.1``, not ``0.10000000149011612``) but read back as the same value.
A slice holding NaN or an infinity is written by :func:`json.dumps` as before (orjson would write
``null``), and so is every slice where orjson is not installed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from edgesdk.offload.v2_codec import DATATYPES, HEADER_LENGTH, all_finite, datatype_of, write_json

__all__ = ["SLICE_VALUES", "needs_slices", "encode_response_sliced"]

#: Values written per slice, between two turns of the loop (orjson: about 0.25 ms of CPU here).
SLICE_VALUES = 8192

def needs_slices(outputs: Mapping[str, np.ndarray], binary: Collection[str]) -> bool:
    """Whether any output sent as JSON has more than :data:`SLICE_VALUES` values."""
    return any(
        name not in binary and np.asarray(value).size > SLICE_VALUES
        for name, value in outputs.items()
    )


async def _turn() -> None:
    """Let the loop run what is waiting (between two slices)."""
    await asyncio.sleep(0)


def _slice_text(values: np.ndarray) -> bytes:
    """The JSON numbers of a 1-D slice, comma-separated, without brackets."""
    return write_json(values, all_finite(values))[1:-1]


async def _data(flat: np.ndarray, parts: list[bytes]) -> None:
    for start in range(0, flat.size, SLICE_VALUES):
        if start:
            parts.append(b",")
            await _turn()
        parts.append(_slice_text(flat[start : start + SLICE_VALUES]))


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def encode_response_sliced(
    model_name: str,
    model_version: str | None,
    outputs: Mapping[str, np.ndarray],
    *,
    binary: Collection[str] = (),
    request_id: str | None = None,
) -> tuple[list[bytes], dict[str, str]]:
    """The body (as parts, in order) and HTTP headers of an inference response, yielding to the
    loop between
    slices of the JSON outputs; outputs named in ``binary`` are sent as bytes after the JSON
    header."""
    parts = [b'{"model_name":', _dumps(model_name)]
    if model_version is not None:
        parts += [b',"model_version":', _dumps(model_version)]
    if request_id is not None:
        parts += [b',"id":', _dumps(request_id)]
    parts.append(b',"outputs":[')
    blobs: list[bytes] = []
    for number, (name, value) in enumerate(outputs.items()):
        array = np.asarray(value)
        datatype = datatype_of(array.dtype)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if number:
            parts.append(b",")
        if name in binary:
            raw = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            parts.append(_dumps(entry))
            blobs.append(raw)
            continue
        parts += [_dumps(entry)[:-1], b',"data":[']
        await _data(np.ascontiguousarray(array).reshape(-1), parts)
        parts.append(b"]}")
    parts.append(b"]}")
    if not any(blobs):
        return parts, {"Content-Type": "application/json"}
    length = sum(len(part) for part in parts)
    return parts + blobs, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(length)}
