"""The Starlette app of the inference endpoint: the KServe V2 (Open Inference Protocol) REST API.

No authentication (it is the data plane; bind it to a private address). Errors are
``{"error": message}`` with 400 (bad request: malformed JSON, wrong name/datatype/shape, a
binary size that does not match the body, a model that cannot run here), 404 (unknown model,
version or path), 413 (body over the cap, refused before it is read whole) or 503 (the model's
queue is full); never a 500 for anything a client sends.

    GET  /v2                                            {"name", "version", "extensions"}
    GET  /v2/health/live | /v2/health/ready             200 {"live"|"ready": true}
    GET  /v2/models/{name}[/versions/{v}]               metadata: name, versions, platform, inputs, outputs
    GET  /v2/models/{name}[/versions/{v}]/ready         200 {"name", "ready": true}
    POST /v2/models/{name}[/versions/{v}]/infer         JSON or binary tensor data extension
    GET  /metrics                                       Prometheus text exposition
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgesdk.errors import EdgeSDKError, InputError
from edgesdk.offload.v2_codec import BINARY_EXTENSION, HEADER_LENGTH, decode_request, encode_response

from .metrics import InferenceMetrics
from .models import LoadedModel, ModelRegistry
from .request_path import BodyTooLargeError, http_status, model_for, run_request

__all__ = ["create_inference_app", "SERVER_NAME"]

log = logging.getLogger(__name__)

#: ``name`` in ``GET /v2``.
SERVER_NAME = "edgesdk"
#: JSON parts up to this size are decoded on the event loop; larger ones in a worker thread.
_INLINE_DECODE_BYTES = 64 * 1024


def create_inference_app(registry: ModelRegistry, metrics: InferenceMetrics) -> Any:
    """The Starlette app serving ``registry``'s models and ``metrics`` at ``/metrics``."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from edgesdk import __version__

    max_body = registry.config.max_body_bytes
    # Large JSON bodies are decoded off the loop, one at a time in arrival order: decoding holds the GIL, so
    # more threads would only interleave the requests and stretch every one of them (the tail most).
    decoder = ThreadPoolExecutor(1, thread_name_prefix="v2-json-decode")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def read_body(request: Request) -> bytes:
        """The body, refused as soon as it is known to be over the cap (by Content-Length, or while streaming)."""
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise InputError(f"Content-Length {declared!r} is not a number") from None
            if size > max_body:
                raise BodyTooLargeError(f"the body of {size} bytes is over this endpoint's {max_body}-byte limit; "
                                        "send a smaller batch")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise InputError(f"Content-Encoding {encoding!r} is not supported; send the body uncompressed")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_body:
                raise BodyTooLargeError(f"the body is over this endpoint's {max_body}-byte limit; send a smaller batch")
            chunks.append(chunk)
        return b"".join(chunks)

    def header_length(request: Request) -> int | None:
        text = request.headers.get(HEADER_LENGTH)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise InputError(f"{HEADER_LENGTH} {text!r} is not a number; send the byte length of the JSON part") \
                from None

    async def server_metadata(request: Request) -> JSONResponse:
        return JSONResponse({"name": SERVER_NAME, "version": __version__, "extensions": [BINARY_EXTENSION]})

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> JSONResponse:
        if not registry.repository.root.is_dir():
            return error(503, f"the model repository {registry.repository.root} is not there")
        return JSONResponse({"ready": True})

    async def named_model(request: Request) -> LoadedModel:
        return await model_for(registry, request.path_params["name"], request.path_params.get("version"))

    async def model_metadata(request: Request) -> JSONResponse:
        try:
            model = await named_model(request)
            return JSONResponse(model.metadata(registry.versions(model.name)))
        except EdgeSDKError as exc:
            return error(http_status(exc), str(exc))

    async def model_ready(request: Request) -> JSONResponse:
        try:
            model = await named_model(request)
        except EdgeSDKError as exc:
            return error(http_status(exc), str(exc))
        return JSONResponse({"name": model.name, "version": model.version, "ready": True})

    async def infer(request: Request) -> Response:
        decoded: Any = None

        async def decode(model: LoadedModel) -> tuple[dict[str, Any], list[str]]:
            nonlocal decoded
            body = await read_body(request)
            length = header_length(request)
            # JSON over this size is decoded off the loop; binary tensors are views, so only their header counts.
            if (length if length is not None else len(body)) > _INLINE_DECODE_BYTES:
                decoded = await asyncio.get_running_loop().run_in_executor(decoder, decode_request, body, length)
            else:
                decoded = decode_request(body, length)
            return decoded.inputs, [o.name for o in decoded.outputs]

        def respond(model: LoadedModel, outputs: dict[str, Any]) -> Response:
            content, headers = encode_response(model.name, model.version, outputs,
                                               binary={n for n in outputs if decoded.wants_binary(n)},
                                               request_id=decoded.id)
            return Response(content, headers=headers)

        try:
            response: Response = await run_request(registry, metrics, request.path_params["name"],
                                                   request.path_params.get("version"), decode, respond)
            return response
        except Exception as exc:
            status = http_status(exc)
            if status == 500:
                log.exception("inference request to %s failed", request.url.path)
                return error(500, f"internal error: {type(exc).__name__}: {exc}")
            return error(status, str(exc))

    async def prometheus(request: Request) -> Response:
        content, content_type = metrics.exposition()
        return Response(content, headers={"Content-Type": content_type})

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return error(status, f"{request.method} {request.url.path}: {'no such path' if status == 404 else 'not allowed'}"
                             "; the KServe V2 paths are /v2, /v2/health/{live,ready}, /v2/models/{name}[/versions/{v}]"
                             "[/ready|/infer], and /metrics")

    model_paths = ["/v2/models/{name}", "/v2/models/{name}/versions/{version}"]
    routes = [Route("/v2", server_metadata, methods=["GET"]),
              Route("/v2/health/live", live, methods=["GET"]),
              Route("/v2/health/ready", ready, methods=["GET"]),
              Route("/metrics", prometheus, methods=["GET"])]
    for path in model_paths:
        routes += [Route(path, model_metadata, methods=["GET"]),
                   Route(path + "/ready", model_ready, methods=["GET"]),
                   Route(path + "/infer", infer, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
