"""The KServe V2 gRPC service (``inference.GRPCInferenceService``) beside the REST endpoint.

It serves the same :class:`~.models.ModelRegistry` (so the same sessions, batchers and
``/metrics``) through the same request path as HTTP (:func:`~.request_path.run_request_blocking`). Implemented methods:
``ServerLive``, ``ServerReady``, ``ServerMetadata``, ``ModelReady``, ``ModelMetadata`` and
``ModelInfer``; gRPC answers UNIMPLEMENTED for the others (streaming, model control, statistics).

Tensors: input data comes either as ``raw_input_contents`` (one little-endian blob per input,
all inputs or none, as tritonclient sends them) or in the typed ``contents`` lists; FP16 only
raw, since the protocol has no FP16 list. Outputs always go back as ``raw_output_contents``.
``ModelInfer`` messages skip protobuf's copies of the tensors (:mod:`.grpc_wire`): raw inputs are
views of the bytes grpc received, raw outputs are written once.

Failures map to gRPC status codes the way the REST routes map them to HTTP ones (through
:func:`~.request_path.http_status`): unknown model or version NOT_FOUND, a bad request
INVALID_ARGUMENT, a full queue UNAVAILABLE (retryable), a message over ``max_body_bytes``, a
transport limit or a version load over its budget RESOURCE_EXHAUSTED, a deadline passed before the
run DEADLINE_EXCEEDED (:func:`call_timeout_us`: the ``timeout`` parameter or the call's own
deadline, whichever is sooner), anything else INTERNAL. ``ModelReady`` of an unknown model answers
``ready: false``, as Triton does, rather than failing.

The server is grpcio's synchronous one: each call runs whole in one worker thread (decode, then
:meth:`~.models.LoadedModel.infer_blocking`: the model's batcher or runner, as over HTTP; a provably
short run in place). On a 16-8-4 MLP it costs less server CPU per request than ``grpc.aio`` did
(0.61-0.81 ms against 0.75-1.03 ms, one core, 1 and 8 clients): aio hands every call from grpc's
completion queue to its event loop and back.

Limits (:class:`GrpcServer`'s parameters; defaults below): a call waiting for its model holds its
thread, so there are at least as many workers as the largest model queue (``max_queue``) plus
twice :data:`SPARE_WORKERS` (some for calls past the queue, some for health and metadata): a full
queue answers UNAVAILABLE from the model, it
does not wait unseen for a thread. At most ``max_concurrent_calls`` inference calls (default: the
workers less :data:`SPARE_WORKERS`) run at once: one more gets RESOURCE_EXHAUSTED at once, and the
spare workers stay free for health, readiness and metadata whatever the inference load. grpc
itself counts every call, before it reads the message, up to the workers: past that a call of any
kind gets RESOURCE_EXHAUSTED, so no call waits for a thread and the memory held is at most the
workers times ``max_receive_bytes`` (default: the HTTP body cap, ``max_body_bytes``, 64 MiB).
That outer count is the one place health can be refused: by calls that hold a worker while their
message arrives (slow uploads, which grpc reads on the call's thread) filling every worker. An
answer over ``max_send_bytes`` (:data:`MAX_SEND_BYTES`) fails RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from edgesdk.errors import EdgeSDKError, InputError, NotFoundError
from edgesdk.offload.v2_codec import datatype_of, declared_shape, dtype_of

from . import edgesdk_v2_grpc_pb2 as pb
from .config import InferenceConfig
from .deadline import TIMEOUT_PARAMETER, timeout_us
from .grpc_wire import join_response, split_request
from .http_limits import BusyError
from .metrics import InferenceMetrics
from .models import LoadedModel, ModelRegistry
from .request_path import http_status, run_request_blocking

__all__ = ["SERVICE", "MAX_SEND_BYTES", "MIN_WORKERS", "SPARE_WORKERS", "GrpcServer",
           "decode_inputs", "default_workers"]

log = logging.getLogger(__name__)

#: The service's full name, as the V2 protocol publishes it (method paths are ``/SERVICE/Method``).
SERVICE = "inference.GRPCInferenceService"
#: Worker threads beyond the largest model queue: health, readiness and metadata answer while a
#: model's whole queue waits for it (each waiting call holds a thread).
SPARE_WORKERS = 8
#: Fewest worker threads, whatever the queues (the service's default before the queue rule was 32).
MIN_WORKERS = 32
#: Largest answer the service sends (64 MiB, the HTTP body cap's default): a bigger one fails
#: RESOURCE_EXHAUSTED.
MAX_SEND_BYTES = 64 * 1024 * 1024


def default_workers(config: InferenceConfig) -> int:
    """Worker threads for ``config``: its largest model queue plus twice :data:`SPARE_WORKERS`, at
    least :data:`MIN_WORKERS`: the inference cap (workers less the spare) then lies past the
    queue, so a full queue is answered by the model (UNAVAILABLE, retry soon), and the spare
    workers are left for health."""
    queues = [m.batching.max_queue for m in config.models or ()] \
        or [config.default_batching.max_queue]
    return max(MIN_WORKERS, max(queues) + 2 * SPARE_WORKERS)


#: V2 datatype -> the ``InferTensorContents`` list that carries it (FP16 has none: send it raw).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents"}


def _grpc_code(exc: BaseException) -> Any:
    import grpc

    if isinstance(exc, BusyError):  # a transport limit: over HTTP 503, in gRPC's words this
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return {404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
            429: grpc.StatusCode.RESOURCE_EXHAUSTED, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
            503: grpc.StatusCode.UNAVAILABLE, 400: grpc.StatusCode.INVALID_ARGUMENT}.get(http_status(exc),
                                                                                         grpc.StatusCode.INTERNAL)


def call_timeout_us(request: Any, context: Any) -> int | None:
    """The call's deadline in microseconds: the sooner of the request's ``timeout`` parameter (as
    tritonclient sends it, ``deadline.py``) and the gRPC call's own deadline; None for neither."""
    timeouts = []
    if TIMEOUT_PARAMETER in request.parameters:
        entry = request.parameters[TIMEOUT_PARAMETER]
        choice = entry.WhichOneof("parameter_choice")
        value = getattr(entry, choice) if choice in ("int64_param", "uint64_param") else entry
        timeouts.append(timeout_us({TIMEOUT_PARAMETER: value if isinstance(value, int)
                                    else str(value).strip() or None}))
    remaining = context.time_remaining() if context is not None else None
    if remaining is not None:
        timeouts.append(max(int(remaining * 1e6), 1))
    known = [t for t in timeouts if t is not None]
    return min(known) if known else None


def _tensor(entry: Any, raw: bytes | None) -> np.ndarray:
    """One input tensor from its proto entry and, when the request sends raw contents, its blob."""
    name = entry.name
    shape, dtype, count = declared_shape(name, list(entry.shape), entry.datatype)
    if raw is not None:
        expected = count * dtype.itemsize
        if len(raw) != expected:
            raise InputError(f"input {name!r}: raw_input_contents has {len(raw)} bytes but shape {list(shape)} of "
                             f"{entry.datatype} takes {expected}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field = _CONTENTS.get(entry.datatype)
    if field is None:
        raise InputError(f"input {name!r}: {entry.datatype} has no typed contents list in the V2 protocol; send it in "
                         "raw_input_contents")
    values = getattr(entry.contents, field)
    if len(values) != count:
        raise InputError(f"input {name!r}: contents.{field} has {len(values)} values but shape {list(shape)} takes "
                         f"{count}")
    try:
        return np.asarray(values, dtype=dtype).reshape(shape)
    except OverflowError as exc:
        raise InputError(f"input {name!r}: a value in contents.{field} does not fit {entry.datatype} ({exc})") from None


def decode_inputs(request: Any, raw_contents: list[Any] | None = None) -> dict[str, np.ndarray]:
    """The input tensors of a ``ModelInferRequest``; InputError naming the tensor and the misfit.

    ``raw_contents``: the raw inputs when they were taken out of the message
    (:func:`~.grpc_wire.split_request`: views of the received bytes); None reads
    ``request.raw_input_contents``.
    """
    entries = list(request.inputs)
    raw = list(request.raw_input_contents) if raw_contents is None else raw_contents
    if not entries:
        raise InputError("the request has no inputs; send at least one tensor in 'inputs'")
    if raw and len(raw) != len(entries):
        raise InputError(f"raw_input_contents has {len(raw)} entries for {len(entries)} inputs; send every input's "
                         "data raw, in the order of 'inputs', or none")
    tensors: dict[str, np.ndarray] = {}
    for i, entry in enumerate(entries):
        if entry.name in tensors:
            raise InputError(f"input {entry.name!r} appears twice in the request")
        tensors[entry.name] = _tensor(entry, raw[i] if raw else None)
    return tensors


def _infer_response(model: LoadedModel, request_id: str, outputs: dict[str, np.ndarray]) -> bytes:
    """The serialized ``ModelInferResponse``: raw outputs, each copied once (:mod:`.grpc_wire`)."""
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=request_id)
    raw = []
    for name, value in outputs.items():
        datatype = datatype_of(value.dtype)
        response.outputs.add(name=name, datatype=datatype, shape=value.shape)
        raw.append(np.ascontiguousarray(value, dtype=dtype_of(datatype)))
    return join_response(response, raw)


class _Servicer:
    """The service's methods; each takes the request message and the call's context."""

    def __init__(self, registry: ModelRegistry, metrics: InferenceMetrics,
                 max_infer_calls: int) -> None:
        self.registry, self.metrics = registry, metrics
        self.max_infer_calls = max_infer_calls
        self._infer_slots = threading.BoundedSemaphore(max_infer_calls)

    def server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.registry.repository.root.is_dir())

    def server_metadata(self, request: Any, context: Any) -> Any:
        from edgesdk import __version__

        from .app import SERVER_NAME

        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__)

    def model_ready(self, request: Any, context: Any) -> Any:
        try:
            self.registry.get(request.name, request.version or None)
        except NotFoundError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    def model_metadata(self, request: Any, context: Any) -> Any:
        model = self.registry.get(request.name, request.version or None)
        meta = model.metadata(self.registry.versions(model.name))
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for side in ("inputs", "outputs"):
            for tensor in meta[side]:
                getattr(response, side).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    def model_infer(self, data: bytes, context: Any) -> bytes:
        """One inference: ``data`` is the request as grpc received it; returns the reply's bytes.

        Past ``max_infer_calls`` running at once, RESOURCE_EXHAUSTED at once (the spare workers
        are health's)."""
        if not self._infer_slots.acquire(blocking=False):
            raise BusyError(f"{self.max_infer_calls} inference calls are running, the most this "
                            "server takes at once; retry later, or raise grpc_max_concurrent_calls in the "
                            "inference config's limits")
        try:
            return self._infer(data, context)
        finally:
            self._infer_slots.release()

    def _infer(self, data: bytes, context: Any) -> bytes:
        request, raw = split_request(data)

        def decode(model: LoadedModel) -> tuple[dict[str, np.ndarray], list[str], int | None]:
            return (decode_inputs(request, raw), [output.name for output in request.outputs],
                    call_timeout_us(request, context))

        return run_request_blocking(self.registry, self.metrics, request.model_name,
                                    request.model_version or None, decode,
                                    lambda model, outputs: _infer_response(model, request.id, outputs))


Method = Callable[[Any, Any], Any]


def _guarded(method: Method, name: str) -> Method:
    """``method`` with every failure turned into its gRPC status (INTERNAL ones logged with their traceback)."""
    def call(request: Any, context: Any) -> Any:
        try:
            return method(request, context)
        except Exception as exc:
            message = str(exc)
            if not isinstance(exc, EdgeSDKError):
                log.exception("gRPC %s failed", name)
                message = f"internal error: {type(exc).__name__}: {exc}"
            context.abort(_grpc_code(exc), message)
    return call


def _handlers(servicer: _Servicer) -> Any:
    import grpc

    # ModelInfer takes and gives bytes: its tensors skip protobuf's copies (see grpc_wire.py).
    methods: dict[str, tuple[Method, Any, Any]] = {
        "ServerLive": (servicer.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": (servicer.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ServerMetadata": (servicer.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelReady": (servicer.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ModelMetadata": (servicer.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelInfer": (servicer.model_infer, None, None)}
    return grpc.method_handlers_generic_handler(SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(
            _guarded(method, name), request_deserializer=request and request.FromString,
            response_serializer=response and response.SerializeToString)
        for name, (method, request, response) in methods.items()})


class GrpcServer:
    """grpcio serving ``registry`` on ``host:port``; :meth:`start`, :meth:`stop`.

    ``workers`` (None: :func:`default_workers` of the registry's config; grpc refuses calls past
    it), ``max_concurrent_calls`` (inference calls; None: ``workers`` less
    :data:`SPARE_WORKERS`, at least 1; it must leave one worker for health), ``max_receive_bytes`` (None:
    the config's ``max_body_bytes``) and ``max_send_bytes`` are the limits the module docstring
    states.
    """

    def __init__(self, registry: ModelRegistry, metrics: InferenceMetrics, host: str, port: int, *,
                 workers: int | None = None, max_concurrent_calls: int | None = None,
                 max_receive_bytes: int | None = None,
                 max_send_bytes: int = MAX_SEND_BYTES) -> None:
        self.registry, self.metrics, self.host, self.port = registry, metrics, host, port
        self.workers = default_workers(registry.config) if workers is None else workers
        self.max_concurrent_calls = max(self.workers - SPARE_WORKERS, 1) \
            if max_concurrent_calls is None else max_concurrent_calls
        self.max_receive_bytes = registry.config.max_body_bytes if max_receive_bytes is None \
            else max_receive_bytes
        self.max_send_bytes = max_send_bytes
        for what, value in (("workers", self.workers),
                            ("max_concurrent_calls", self.max_concurrent_calls),
                            ("max_receive_bytes", self.max_receive_bytes),
                            ("max_send_bytes", max_send_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"the inference gRPC service's {what} is {value!r}; it must be a "
                                 "positive integer")
        if self.workers > 1 and self.max_concurrent_calls >= self.workers:
            raise InputError(f"the inference gRPC service's max_concurrent_calls is "
                             f"{self.max_concurrent_calls} with {self.workers} workers; leave "
                             "workers for health and metadata (at most workers - 1)")
        self._server: Any = None

    @property
    def address(self) -> str:
        """``HOST:PORT``, what a gRPC client connects to."""
        return f"{self.host}:{self.port}"

    def start(self) -> GrpcServer:
        """Serve in the background; returns once the port is bound (EdgeSDKError naming the address otherwise)."""
        import grpc

        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="inference-grpc")
        server = grpc.server(pool, maximum_concurrent_rpcs=self.workers, options=[
            ("grpc.max_receive_message_length", self.max_receive_bytes),
            ("grpc.max_send_message_length", self.max_send_bytes),
            # grpc sets SO_REUSEPORT by default: a second server on a taken port would bind and split the calls.
            ("grpc.so_reuseport", 0),
        ])
        servicer = _Servicer(self.registry, self.metrics, self.max_concurrent_calls)
        server.add_generic_rpc_handlers((_handlers(servicer),))
        try:
            bound = server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpc raises when the address cannot be bound
            raise EdgeSDKError(f"the inference gRPC service did not start on {self.address}: cannot bind it ({exc}); "
                               "pick a free port for --inference-grpc") from None
        if bound == 0:
            raise EdgeSDKError(f"the inference gRPC service did not start on {self.address}: cannot bind it; "
                               "pick a free port for --inference-grpc")
        self.port = bound
        server.start()
        self._server = server
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls and wait up to ``grace_s`` for running ones to finish."""
        if self._server is not None:
            self._server.stop(grace_s).wait()
