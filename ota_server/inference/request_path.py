"""One inference request, whatever carried it: resolve the model, decode, run, select outputs, count.

The HTTP routes (:mod:`.app`) and the gRPC service share this path, so both answer from the
same registry, batcher and metrics, and fail for the same reasons: :func:`run_request` on an
event loop (HTTP), :func:`run_request_blocking` in a worker thread (gRPC). A transport supplies
two callables: ``decode(model)`` turns its request into inputs, the output names asked for
(an empty list asks for all) and, optionally third, the request's ``timeout`` in microseconds
(:mod:`.deadline`; None: none), and ``respond(model, outputs)`` builds its answer (over HTTP it may
be awaitable: big JSON is written in slices). Errors propagate after they are counted; the
transport maps them to its own status (:func:`http_status`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from edgesdk.errors import EdgeSDKError, InputError, NotFoundError

from .batcher import QueueFullError
from .deadline import DeadlineExceededError
from .http_limits import BodyTimeoutError, BusyError
from .json_worker import DecodeWorkerError
from .load_limit import VersionLoadLimitError
from .metrics import UNKNOWN_MODEL, InferenceMetrics
from .models import LoadedModel, ModelRegistry

__all__ = ["BodyTooLargeError", "http_status", "failure_reason", "retry_after", "model_for",
           "run_request", "run_request_blocking"]

T = TypeVar("T")
#: ``(inputs, wanted)`` or ``(inputs, wanted, timeout_us)``.
Decoded = tuple[Any, ...]


class BodyTooLargeError(EdgeSDKError):
    """A request body is over the endpoint's ``max_body_bytes``; answered with 413 (gRPC: RESOURCE_EXHAUSTED)."""


#: Failure -> (HTTP status, ``reason`` label); the first class that matches, else 400 for an
#: EdgeSDKError, else 500.
_FAILURES: tuple[tuple[type[BaseException], int, str], ...] = (
    (NotFoundError, 404, "not_found"),
    (BodyTooLargeError, 413, "too_large"),
    (BodyTimeoutError, 408, "body_timeout"),
    (QueueFullError, 503, "queue_full"),
    (BusyError, 503, "busy"),
    (DecodeWorkerError, 503, "error"),
    (VersionLoadLimitError, 429, "load_limit"),
    (DeadlineExceededError, 504, "deadline"),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status of a failed request: 404 unknown model or version, 413 body too large, 429
    version loads over their budget, 503 queue full or a transport limit, 504 deadline passed, 400
    other bad input, else 500."""
    for kind, status, _ in _FAILURES:
        if isinstance(exc, kind):
            return status
    return 400 if isinstance(exc, EdgeSDKError) else 500


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed request."""
    for kind, _, reason in _FAILURES:
        if isinstance(exc, kind):
            return reason
    return "bad_request" if isinstance(exc, EdgeSDKError) else "error"


def retry_after(exc: BaseException) -> str | None:
    """The ``Retry-After`` header value for a failure a client should retry later, else None."""
    value = getattr(exc, "retry_after", None)
    return value if isinstance(value, str) else None


async def model_for(registry: ModelRegistry, name: str, version: str | None) -> LoadedModel:
    """The loaded model a request names: a dictionary hit once its session is cached, else loaded off the loop."""
    import asyncio

    resolved = registry.resolve(name, version)
    cached = registry.cached(name, resolved)
    return cached if cached is not None else await asyncio.to_thread(registry.load, name, resolved)


def _unknown_model(metrics: InferenceMetrics, exc: EdgeSDKError) -> None:
    metrics.requests.labels(UNKNOWN_MODEL, "").inc()
    metrics.failures.labels(UNKNOWN_MODEL, "", failure_reason(exc)).inc()


@contextmanager
def _counted(model: LoadedModel, started: float) -> Iterator[None]:
    """Count the request on its model: every failure by reason, then raised; its seconds since ``started``."""
    counted = model.metrics
    counted.requests.inc()
    try:
        yield
    except Exception as exc:
        counted.failed(failure_reason(exc))
        raise
    finally:
        counted.request_seconds.observe(time.perf_counter() - started)


def _selected(model: LoadedModel, outputs: dict[str, np.ndarray], wanted: Sequence[str]) -> dict[str, np.ndarray]:
    names = list(wanted) or list(outputs)
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise InputError(f"model {model.name} {model.version} has no outputs {unknown}; it has {list(outputs)}")
    return {n: outputs[n] for n in names}


def _deadline(started: float, decoded: Decoded) -> float | None:
    """The request's deadline in ``time.perf_counter`` seconds: ``started`` plus its timeout, if
    it has one."""
    timeout = decoded[2] if len(decoded) > 2 else None
    return None if timeout is None else started + timeout / 1e6


async def run_request(registry: ModelRegistry, metrics: InferenceMetrics, name: str, version: str | None,
                      decode: Callable[[LoadedModel], Awaitable[Decoded]],
                      respond: Callable[[LoadedModel, dict[str, np.ndarray]],
                                        T | Awaitable[T]]) -> T:
    """Serve one infer request through ``decode`` and ``respond``; every failure is counted, then raised."""
    started = time.perf_counter()
    try:
        model = await model_for(registry, name, version)
    except EdgeSDKError as exc:
        _unknown_model(metrics, exc)
        raise
    with _counted(model, started):
        decoded = await decode(model)
        outputs = await model.infer(decoded[0], _deadline(started, decoded))
        answer = respond(model, _selected(model, outputs, decoded[1]))
        if inspect.isawaitable(answer):
            return await answer  # type: ignore[no-any-return]
        return answer


def run_request_blocking(registry: ModelRegistry, metrics: InferenceMetrics, name: str, version: str | None,
                         decode: Callable[[LoadedModel], Decoded],
                         respond: Callable[[LoadedModel, dict[str, np.ndarray]], T]) -> T:
    """:func:`run_request` for a thread that may wait (the gRPC service's workers): loads and runs in place."""
    started = time.perf_counter()
    try:
        model = registry.get(name, version)
    except EdgeSDKError as exc:
        _unknown_model(metrics, exc)
        raise
    with _counted(model, started):
        decoded = decode(model)
        outputs = model.infer_blocking(decoded[0], _deadline(started, decoded))
        return respond(model, _selected(model, outputs, decoded[1]))
