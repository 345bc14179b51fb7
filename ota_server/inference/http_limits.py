"""The HTTP endpoint's transport limits: requests in flight and request bytes held in memory.

Without them every request was taken, and every body buffered whole up to ``max_body_bytes`` (64
MiB): 500 slow uploads could make the server hold 500 bodies. Now (defaults in
:class:`~.config.InferenceConfig`):

- at most ``max_concurrent_requests`` requests are in flight on the limited paths (everything but
  health, ``/metrics`` and ``GET /v2``); one more is answered 503 with ``Retry-After`` before its
  body is read, by :class:`InFlightLimit`, an ASGI middleware in front of the routes;
- at most ``max_buffered_bytes`` of request bodies are held at once, counted by :class:`BodyBudget`
  when a body is admitted (by its Content-Length) or as it streams (no length); a body that would go
  over is answered 503 with ``Retry-After``, without waiting;
- a body over ``max_body_bytes`` is answered 413, and one that has not arrived within
  ``max_body_seconds`` 408, so slow uploads hold a place for a bounded time (:mod:`.http_body`).

Health is answered from its own path: it passes the middleware without being counted and never waits
for anything a request holds. Refusals are counted in ``edgesdk_inference_refused_total``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["BusyError", "BodyBudget", "BodyTimeoutError", "InFlightLimit", "UNLIMITED_PATHS",
           "RETRY_AFTER_S"]

#: Paths the limits never apply to: health must answer under any load, metrics must show it.
UNLIMITED_PATHS = ("/v2/health/live", "/v2/health/ready", "/metrics", "/v2")
#: The ``Retry-After`` of a 503 for a limit: a request in flight or a body in memory is usually
#: gone by then.
RETRY_AFTER_S = 1

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BusyError(EdgeSDKError):
    """A transport limit is reached (requests in flight, bytes held); answered 503 with
    ``Retry-After``."""

    retry_after = str(RETRY_AFTER_S)


class BodyTimeoutError(EdgeSDKError):
    """The body did not arrive within ``max_body_seconds``; answered 408 (a slow upload must not
    hold one of the ``max_concurrent_requests`` places for ever)."""


class BodyBudget:
    """Bytes of request bodies held now, against ``limit`` (used on the event loop only: no
    lock)."""

    def __init__(self, limit: int, refused: Callable[[str], None] = lambda reason: None) -> None:
        self.limit, self.held, self._refused = limit, 0, refused

    def reserve(self, size: int) -> None:
        """Count ``size`` more bytes held, or BusyError when that would go over the limit."""
        if self.held + size > self.limit:
            self._refused("memory")
            raise BusyError(
                f"the endpoint holds {self.held} bytes of request bodies and this one needs "
                f"{size} more, "
                f"over its max_buffered_bytes ({self.limit}); retry in {RETRY_AFTER_S} s"
            )
        self.held += size

    def release(self, size: int) -> None:
        """``size`` bytes are no longer held."""
        self.held -= size


class InFlightLimit:
    """ASGI middleware: at most ``limit`` requests in flight on the limited paths, the next one 503
    at once."""

    def __init__(
        self, app: Any, limit: int, refused: Callable[[str], None] = lambda reason: None
    ) -> None:
        self.app, self.limit, self.in_flight, self._refused = app, limit, 0, refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self._refused("in_flight")
            await _refuse(
                send,
                f"the endpoint has {self.in_flight} requests in flight, its "
                f"max_concurrent_requests; retry in {RETRY_AFTER_S} s",
            )
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
