"""One inference request, whatever carried it: resolve the model, decode, run, select outputs, count.

The HTTP routes (:mod:`.app`) and the gRPC service share this path, so both answer from the
same registry, batcher and metrics, and fail for the same reasons: :func:`run_request` on an
event loop (HTTP), :func:`run_request_blocking` in a worker thread (gRPC). A transport supplies
two callables: ``decode(model)`` turns its request into inputs and the output names asked for
(an empty list asks for all), and ``respond(model, outputs)`` builds its answer. Errors propagate
after they are counted; the transport maps them to its own status (:func:`http_status`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import numpy as np

from edgesdk.errors import EdgeSDKError, InputError, NotFoundError

from .batcher import QueueFullError
from .metrics import UNKNOWN_MODEL, InferenceMetrics
from .models import LoadedModel, ModelRegistry, failure_reason

__all__ = ["BodyTooLargeError", "http_status", "model_for", "run_request", "run_request_blocking"]

T = TypeVar("T")
Decoded = tuple[dict[str, np.ndarray], Sequence[str]]


class BodyTooLargeError(EdgeSDKError):
    """A request body is over the endpoint's ``max_body_bytes``; answered with 413 (gRPC: RESOURCE_EXHAUSTED)."""


def http_status(exc: BaseException) -> int:
    """The HTTP status of a failed request: 404 unknown model or version, 413, 503 queue full, 400, else 500."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, BodyTooLargeError):
        return 413
    if isinstance(exc, QueueFullError):
        return 503
    if isinstance(exc, EdgeSDKError):
        return 400
    return 500


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


async def run_request(registry: ModelRegistry, metrics: InferenceMetrics, name: str, version: str | None,
                      decode: Callable[[LoadedModel], Awaitable[Decoded]],
                      respond: Callable[[LoadedModel, dict[str, np.ndarray]], T]) -> T:
    """Serve one infer request through ``decode`` and ``respond``; every failure is counted, then raised."""
    started = time.perf_counter()
    try:
        model = await model_for(registry, name, version)
    except EdgeSDKError as exc:
        _unknown_model(metrics, exc)
        raise
    with _counted(model, started):
        inputs, wanted = await decode(model)
        return respond(model, _selected(model, await model.infer(inputs), wanted))


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
        inputs, wanted = decode(model)
        return respond(model, _selected(model, model.infer_blocking(inputs), wanted))
