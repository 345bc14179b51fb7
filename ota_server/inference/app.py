"""The Starlette app of the inference endpoint: the KServe V2 (Open Inference Protocol) REST API.

No authentication (it is the data plane; bind it to a private address). Errors are ``{"error":
message}`` with 400 (bad request: malformed JSON, wrong name/datatype/shape, a binary size that does
not match the body, a model that cannot run here), 404 (unknown model, version or path), 413 (body
over ``max_body_bytes``, refused before it is read whole), 429 (a version load over
``version_loads_per_minute``, with Retry-After), 503 (the model's queue is full, or a transport
limit: requests in flight, bytes held; with Retry-After) or 504 (the request's ``timeout`` parameter
passed before it ran); never a 500 for anything a client sends.

    GET  /v2                                            {"name", "version", "extensions"}
    GET  /v2/health/live | /v2/health/ready             200 {"live"|"ready": true}
    GET  /v2/models/{name}[/versions/{v}]               name, versions, platform, inputs, outputs
    GET  /v2/models/{name}[/versions/{v}]/ready         200 {"name", "ready": true}
    POST /v2/models/{name}[/versions/{v}]/infer         JSON or binary tensor data extension
    GET  /metrics                                       Prometheus text exposition

Nothing a request sends or asks for holds the event loop for long: JSON bodies over 64 KiB are
decoded in a thread, over ``json_worker_bytes`` in a worker process (:mod:`.json_worker`); JSON
outputs of more than :data:`~.json_encode.SLICE_VALUES` values are written in slices that yield to
the loop (:mod:`.json_encode`); the transport limits of :mod:`.http_limits` bound requests in flight
and bytes held, and never apply to health. Binary tensors skip all of that work: large tensors are
faster sent and asked for as binary data.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.offload.v2_codec import BINARY_EXTENSION, InferRequest, decode_request, encode_response

from .deadline import timeout_us
from .http_body import header_length, read_body
from .http_limits import BodyBudget, InFlightLimit
from .json_encode import SLICE_VALUES, encode_response_sliced, needs_slices
from .json_worker import JsonDecodeWorker
from .metrics import InferenceMetrics
from .models import LoadedModel, ModelRegistry
from .request_path import http_status, model_for, retry_after, run_request

__all__ = ["create_inference_app", "InferenceRoutes", "SERVER_NAME"]

log = logging.getLogger(__name__)

#: ``name`` in ``GET /v2``.
SERVER_NAME = "edgesdk"
#: JSON parts up to this size are decoded on the event loop; larger ones in a worker thread (then
#: process).
_INLINE_DECODE_BYTES = 64 * 1024


def _error(status: int, message: str, exc: BaseException | None = None) -> Any:
    from starlette.responses import JSONResponse

    retry = retry_after(exc) if exc is not None else None
    return JSONResponse(
        {"error": message}, status_code=status, headers={"Retry-After": retry} if retry else None
    )


def _failure(exc: BaseException, path: str) -> Any:
    """The error answer of a failed request (a 500 is logged with its traceback; a client that
    left before its body was read is not a server fault, and nobody reads its answer)."""
    from starlette.requests import ClientDisconnect

    status = http_status(exc)
    if isinstance(exc, ClientDisconnect):
        log.debug("the client of %s left before its body was read", path)
        return _error(400, "the client disconnected before its body was read")
    if status == 500:
        log.exception("inference request to %s failed", path, exc_info=exc)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")
    return _error(status, str(exc), exc)


class InferenceRoutes:
    """The handlers of the V2 routes over one registry; each is an ``async (request) ->
    response``."""

    def __init__(self, registry: ModelRegistry, metrics: InferenceMetrics) -> None:
        self.registry, self.metrics, self.config = registry, metrics, registry.config
        # Mid-size JSON bodies are decoded off the loop, one at a time in arrival order: decoding
        # holds the GIL,
        # so more threads would only interleave the requests and stretch every one of them (the
        # tail most).
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="v2-json-decode")
        self.json_worker = JsonDecodeWorker()
        self._advised = False
        self.budget = BodyBudget(self.config.max_buffered_bytes, self.refused)
        self.in_flight = InFlightLimit(None, self.config.max_concurrent_requests, self.refused)

    def _advise(self, what: str) -> None:
        """Say once per endpoint that large tensors are faster as binary data."""
        if not self._advised:
            self._advised = True
            log.info("%s went through the big-JSON path (parsed in a worker process, or written in "
                     "slices); clients sending or asking for large tensors as binary data "
                     "(binary_data, binary_data_output) skip that work and are faster", what)

    def refused(self, reason: str) -> None:
        """Count one request refused by a transport limit."""
        self.metrics.refused.labels(reason).inc()

    def close(self) -> None:
        """Stop the decode thread and the decode worker process."""
        self._decoder.shutdown(wait=False)
        self.json_worker.close()

    async def server_metadata(self, request: Any) -> Any:
        """``GET /v2``: the server's name, version and extensions."""
        from starlette.responses import JSONResponse

        from edgesdk import __version__

        return JSONResponse(
            {"name": SERVER_NAME, "version": __version__, "extensions": [BINARY_EXTENSION]}
        )

    async def live(self, request: Any) -> Any:
        """``GET /v2/health/live``: answered from its own path, never behind a limit."""
        from starlette.responses import JSONResponse

        return JSONResponse({"live": True})

    async def ready(self, request: Any) -> Any:
        """``GET /v2/health/ready``: 503 when the repository is not there."""
        from starlette.responses import JSONResponse

        if not self.registry.repository.root.is_dir():
            return _error(503, f"the model repository {self.registry.repository.root} is not there")
        return JSONResponse({"ready": True})

    async def _named_model(self, request: Any) -> LoadedModel:
        return await model_for(
            self.registry, request.path_params["name"], request.path_params.get("version")
        )

    async def model_metadata(self, request: Any) -> Any:
        """``GET /v2/models/{name}[/versions/{v}]``: the V2 model metadata."""
        from starlette.responses import JSONResponse

        try:
            model = await self._named_model(request)
            return JSONResponse(model.metadata(self.registry.versions(model.name)))
        except EdgeSDKError as exc:
            return _error(http_status(exc), str(exc), exc)

    async def model_ready(self, request: Any) -> Any:
        """``GET .../ready``: the model loads (or is loaded); its name and version."""
        from starlette.responses import JSONResponse

        try:
            model = await self._named_model(request)
        except EdgeSDKError as exc:
            return _error(http_status(exc), str(exc), exc)
        return JSONResponse({"name": model.name, "version": model.version, "ready": True})

    async def decode(self, body: bytes | memoryview, length: int | None) -> InferRequest:
        """The request, decoded where it holds the loop least: JSON parts over
        ``json_worker_bytes`` in the worker process, over 64 KiB in a thread, others here; binary
        tensors are views, so only their header counts."""
        size = length if length is not None else len(body)
        if size > self.config.json_worker_bytes:
            self._advise(f"a JSON body of {size} bytes")
            return await self.json_worker.decode(body, length)
        if size > _INLINE_DECODE_BYTES:
            return await asyncio.get_running_loop().run_in_executor(
                self._decoder, decode_request, body, length
            )
        return decode_request(body, length)  # type: ignore[arg-type]

    async def infer(self, request: Any) -> Any:
        """``POST .../infer``: one inference, JSON or binary tensors, within the limits."""
        from starlette.responses import Response, StreamingResponse

        decoded: Any = None
        held = [0]  # bytes of this request's body counted in the budget

        async def decode(model: LoadedModel) -> tuple[Any, ...]:
            nonlocal decoded
            body = await read_body(request, self.config.max_body_bytes, self.budget, held,
                                   self.config.max_body_seconds)
            decoded = await self.decode(body, header_length(request))
            return decoded.inputs, [o.name for o in decoded.outputs], timeout_us(decoded.parameters)

        async def respond(model: LoadedModel, outputs: dict[str, Any]) -> Any:
            binary = {n for n in outputs if decoded.wants_binary(n)}
            if not needs_slices(outputs, binary):
                content, headers = encode_response(
                    model.name, model.version, outputs, binary=binary, request_id=decoded.id
                )
                return Response(content, headers=headers)
            self._advise(f"a JSON answer of more than {SLICE_VALUES} values")
            parts, headers = await encode_response_sliced(
                model.name, model.version, outputs, binary=binary, request_id=decoded.id
            )
            headers["Content-Length"] = str(sum(len(p) for p in parts))
            return StreamingResponse(_each(parts), headers=headers)

        try:
            return await run_request(
                self.registry,
                self.metrics,
                request.path_params["name"],
                request.path_params.get("version"),
                decode,
                respond,
            )
        except Exception as exc:
            return _failure(exc, request.url.path)
        finally:
            self.budget.release(held[0])

    def app(self) -> Any:
        """The ASGI app of these routes behind :class:`~.http_limits.InFlightLimit` (health and
        metrics pass it)."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        paths = [
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]
        for path in ["/v2/models/{name}", "/v2/models/{name}/versions/{version}"]:
            paths += [
                Route(path, self.model_metadata, methods=["GET"]),
                Route(path + "/ready", self.model_ready, methods=["GET"]),
                Route(path + "/infer", self.infer, methods=["POST"]),
            ]
        self.in_flight.app = Starlette(
            routes=paths, exception_handlers={404: self.not_found, 405: self.not_found}
        )
        return self.in_flight

    async def prometheus(self, request: Any) -> Any:
        """``GET /metrics``: the Prometheus exposition."""
        from starlette.responses import Response

        content, content_type = self.metrics.exposition()
        return Response(content, headers={"Content-Type": content_type})

    async def not_found(self, request: Any, exc: Exception) -> Any:
        """404 and 405 answers in the V2 error form, naming the paths there are."""
        from starlette.exceptions import HTTPException

        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return _error(
            status,
            f"{request.method} {request.url.path}: "
            f"{'no such path' if status == 404 else 'not allowed'}; the KServe V2 paths are /v2, "
            "/v2/health/{live,ready}, /v2/models/{name}[/versions/{v}]"
            "[/ready|/infer], and /metrics",
        )


async def _each(parts: list[bytes]) -> Any:
    for part in parts:
        yield part


def create_inference_app(registry: ModelRegistry, metrics: InferenceMetrics) -> Any:
    """The ASGI app serving ``registry``'s models and ``metrics`` at ``/metrics``, behind the
    transport limits
    (:meth:`InferenceRoutes.app`; keep the routes to close them)."""
    return InferenceRoutes(registry, metrics).app()
