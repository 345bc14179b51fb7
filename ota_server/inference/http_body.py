"""Reading an infer request's body within the limits: 413 before it is read whole, bytes held
counted.

A body is refused with :class:`BodyTooLargeError` (413) as soon as it is known to be over
``max_body_bytes``: by its Content-Length before any of it is read, or while a body of unknown
length streams. The bytes it will hold are counted against the server's ``max_buffered_bytes``
(:class:`~.http_limits.BodyBudget`) from the start, so the caller releases them when the request
ends. A body with a Content-Length is copied piece by piece into one buffer of that size, allocated
untouched (``np.empty``: the pages are the kernel's zero pages until written): the loop never copies
or zero-fills the whole body at once (a join of 64 MiB held it for several milliseconds).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import HEADER_LENGTH

from .http_limits import BodyBudget, BodyTimeoutError
from .request_path import BodyTooLargeError

__all__ = ["read_body", "header_length"]


def _declared(request: Any, max_body: int) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        size = int(declared)
    except ValueError:
        raise InputError(f"Content-Length {declared!r} is not a number") from None
    if size > max_body:
        raise BodyTooLargeError(
            f"the body of {size} bytes is over this endpoint's {max_body}-byte limit; "
            "send a smaller batch"
        )
    return size


async def read_body(
    request: Any, max_body: int, budget: BodyBudget, held: list[int], seconds: float = 60.0
) -> bytes | memoryview:
    """The whole body within ``seconds``; every byte counted in ``budget`` is added to ``held[0]``
    for the caller to release."""
    try:
        return await asyncio.wait_for(_read(request, max_body, budget, held), seconds)
    except asyncio.TimeoutError:
        raise BodyTimeoutError(
            f"the body did not arrive within this endpoint's max_body_seconds ({seconds:g} s); "
            "send it faster, or smaller"
        ) from None


async def _read(
    request: Any, max_body: int, budget: BodyBudget, held: list[int]
) -> bytes | memoryview:
    size = _declared(request, max_body)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise InputError(
            f"Content-Encoding {encoding!r} is not supported; send the body uncompressed"
        )
    if size is not None:
        budget.reserve(size)
        held[0] += size
        return await _into_buffer(request, size)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_body:
            raise BodyTooLargeError(
                f"the body is over this endpoint's {max_body}-byte limit; send a smaller batch"
            )
        budget.reserve(len(chunk))
        held[0] += len(chunk)
        chunks.append(chunk)
    return b"".join(chunks)


async def _into_buffer(request: Any, size: int) -> bytes | memoryview:
    buffer: memoryview | None = None
    offset = 0
    async for chunk in request.stream():
        if not chunk:
            continue
        if buffer is None and len(chunk) == size:
            return chunk  # the whole body in one piece: no copy
        if buffer is None:
            buffer = np.empty(size, dtype=np.uint8).data  # untouched pages: not zero-filled here
        if offset + len(chunk) > size:
            raise InputError(f"the body is longer than its Content-Length ({size} bytes)")
        buffer[offset : offset + len(chunk)] = chunk
        offset += len(chunk)
    if offset != size and not (buffer is None and size == 0):
        raise InputError(f"the body ended after {offset} of its Content-Length's {size} bytes")
    return buffer if buffer is not None else b""


def header_length(request: Any) -> int | None:
    """The ``Inference-Header-Content-Length`` of a binary request, or None."""
    text = request.headers.get(HEADER_LENGTH)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(
            f"{HEADER_LENGTH} {text!r} is not a number; send the byte length of the JSON part"
        ) from None
