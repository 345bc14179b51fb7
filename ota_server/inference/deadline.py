"""A request's deadline: the KServe V2 / Triton ``timeout`` request parameter, in microseconds.

A client that will give up on an answer after some time says so with ``parameters.timeout`` (JSON
requests carry it in their body, binary ones in their JSON header, gRPC in the request's
``parameters``); 0 or absent means no deadline, as in Triton. The deadline counts from when the
endpoint began the request. A request whose deadline passes while it waits (for its body, its
model's load, its batch or a runner) is dropped before it runs and answered with
:class:`DeadlineExceededError`: HTTP 504 (the answer would come too late to be used; 503 stays
"overloaded, retry"), counted as ``reason="deadline"``. A request already running finishes: ONNX
Runtime cannot be interrupted, and its rows may share a batch with live requests.
"""

from __future__ import annotations

from typing import Any

from edgesdk.errors import DeadlineExceededError, InputError

__all__ = ["DeadlineExceededError", "TIMEOUT_PARAMETER", "timeout_us", "check"]

#: The request parameter carrying the deadline (Triton's name and unit: microseconds).
TIMEOUT_PARAMETER = "timeout"


def timeout_us(parameters: dict[str, Any]) -> int | None:
    """The request's ``timeout`` in microseconds, or None for none; InputError naming a value that
    is not one."""
    value = parameters.get(TIMEOUT_PARAMETER)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise InputError(
            f"parameters.timeout is {value!r:.40}; it must be a whole number of microseconds, "
            "0 to 2**63 - 1 "
            "(0: no deadline)"
        )
    return value or None


def check(deadline: float | None, now: float, where: str) -> None:
    """DeadlineExceededError when ``deadline`` (perf_counter seconds) has passed at ``now``;
    ``where`` says what
    the request was waiting for."""
    if deadline is not None and now >= deadline:
        raise DeadlineExceededError(
            f"Request timeout expired: the request's deadline passed {1e3 * (now - deadline):.1f} "
            f"ms ago while it waited {where}; it was not run. Send a longer "
            "parameters.timeout, or retry where the queue is shorter"
        )
