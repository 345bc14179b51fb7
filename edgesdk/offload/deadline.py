"""A request's deadline: its latency objective counted from submission, and the error of missing it.

Every ``predict_async`` request under an offload policy has a deadline, ``latency_slo_ms``
after it was submitted. A cloud request carries what is left of it to the server (the V2
``timeout`` parameter, in microseconds, as Triton reads it) and waits no longer than that on
its socket. Work that can no longer make its objective is dropped with
:class:`DeadlineExceededError` instead of being run late ahead of work that still can (see
:mod:`edgesdk.offload.dispatcher`).
"""

from __future__ import annotations

from edgesdk.errors import OverloadedError

__all__ = ["DeadlineExceededError"]


class DeadlineExceededError(OverloadedError):
    """A request was dropped because it can no longer meet its latency objective.

    A kind of :class:`~edgesdk.errors.OverloadedError` (load shed, nothing ran to the end), so a
    caller that drops refused frames drops these too. ``objective_ms`` is the objective and
    ``late_ms`` how far past it the request is, or would be, when dropped.
    """

    def __init__(self, message: str, objective_ms: float, late_ms: float) -> None:
        super().__init__(message)
        self.objective_ms = objective_ms
        self.late_ms = late_ms
