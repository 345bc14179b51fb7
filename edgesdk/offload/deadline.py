"""A request's deadline: its latency objective counted from submission, and the error of missing it.

Every ``predict_async`` request under an offload policy has a deadline, ``latency_slo_ms``
after it was submitted. A cloud request carries what is left of it to the server (the V2
``timeout`` parameter, in microseconds, as Triton reads it) and waits no longer than that on
its socket. Work that can no longer make its objective is dropped with
:class:`DeadlineExceededError` instead of being run late ahead of work that still can (see
:mod:`edgesdk.offload.dispatcher`).
"""

from __future__ import annotations

from edgesdk.errors import DeadlineExceededError

__all__ = ["DeadlineExceededError"]  # one error for the device and the endpoint (edgesdk.errors)
