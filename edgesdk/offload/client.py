"""A KServe V2 (Open Inference Protocol) HTTP client on the standard library, for any V2 server.

The device gets no new dependency: :mod:`http.client` with a small pool of keep-alive
connections (one per concurrent request). A connection that failed in any way is closed and
never reused; a request that fails on a *reused* connection before any answer (the server
closed it while idle) is sent once more on a fresh one.

Servers differ, and the client copes:

- binary tensors are used when the server lists ``binary_tensor_data`` in ``GET /v2``
  (or the policy forces them); a server that rejects a binary body (400, 415, 422, 500, 501)
  gets the same request again as JSON, and JSON is remembered once that works;
- errors come as ``{"error": ...}``, FastAPI's ``{"detail": [...]}`` or text: all become an
  :class:`~edgesdk.errors.OffloadError` with the status and the server's words
  (:func:`edgesdk.offload.v2_codec.error_message`);
- results are checked against the local model's outputs: same names, shapes the model
  allows, dtypes cast only within their kind (FP64 -> FP32 yes, FP32 -> INT64 no).

**The deadline travels with the request.** :meth:`V2Client.infer` takes the request's deadline
and sends what is left of it as the V2 ``timeout`` request parameter, in microseconds, as Triton
reads it (in the JSON ``parameters`` object; a binary-tensor request carries the same object in
its JSON header part), so a server can drop work nobody waits for any more. The same deadline,
when it is sooner than ``timeout_ms``, bounds connecting, sending and reading the answer.
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgesdk.errors import InputError, OffloadError
from edgesdk.offload import v2_codec as v2
from edgesdk.offload.policy import OffloadPolicy
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["V2Client", "TIMEOUT_PARAMETER"]

log = logging.getLogger(__name__)

#: The V2 request parameter that carries the time left to the deadline, in microseconds (Triton's name and unit).
TIMEOUT_PARAMETER = "timeout"

#: Statuses with which some servers refuse a binary body they do not understand.
_BINARY_REFUSALS = frozenset({400, 415, 422, 500, 501})


def _dims(shape: Any) -> tuple[int | None, ...] | None:
    """A metadata shape with -1 (or null) as None, or None when it is not a list of integers."""
    if not isinstance(shape, list) or not all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in shape):
        return None
    return tuple(None if d is None or d < 0 else d for d in shape)


def _compatible(local: tuple[int | None, ...], remote: tuple[int | None, ...]) -> bool:
    return len(local) == len(remote) and all(a is None or b is None or a == b for a, b in zip(local, remote))


def _show(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape) + "]"


def _read_until(response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> bytes:
    """The whole body, or TimeoutError once ``deadline`` passes: a server that trickles bytes cannot stretch a
    request beyond ``timeout_ms`` (a socket timeout alone bounds each read, not their sum)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the answer did not arrive in full within timeout_ms")
        if sock.fileno() != -1:  # http.client closes its socket early on "Connection: close"; the reader keeps it
            sock.settimeout(remaining)
        chunk = response.read1(1 << 16)  # at most one recv, so the deadline is checked between them
        if not chunk:
            response.read()  # marks the response finished, so the connection can carry the next request
            return b"".join(chunks)
        chunks.append(chunk)


class V2Client:
    """Talks to one model on one V2 server as ``policy`` says; thread-safe (one connection per concurrent call).

    Call :meth:`configure` with the local model's inputs and outputs before :meth:`infer`.
    """

    def __init__(self, policy: OffloadPolicy) -> None:
        self.policy = policy
        parts = urllib.parse.urlsplit(policy.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        model_path = f"/v2/models/{urllib.parse.quote(policy.model, safe='')}"
        if policy.version is not None:
            model_path += f"/versions/{urllib.parse.quote(policy.version, safe='')}"
        self._model_path = model_path
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False
        #: Whether requests carry binary tensors (decided by :meth:`configure`, revised by a refusal).
        self.binary = bool(policy.binary)
        self._binary_worked = False
        self._outputs: tuple[TensorSpec, ...] = ()
        self.configured = False

    @property
    def model_label(self) -> str:
        """The model as messages name it: ``name`` or ``name version v`` at the server's URL."""
        version = f" version {self.policy.version}" if self.policy.version else ""
        return f"model {self.policy.model!r}{version} at {self.policy.base_url}"

    # --- connections -------------------------------------------------------------------------------------------

    def _connect(self, limit_s: float) -> http.client.HTTPConnection:
        timeout = min(self.policy.connect_timeout_ms / 1e3, limit_s)
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self.policy.timeout_ms / 1e3)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self) -> tuple[http.client.HTTPConnection | None, bool]:
        with self._lock:
            if self._closed:
                raise OffloadError(f"the offload client for {self.model_label} is closed")
            if self._idle:
                return self._idle.pop(), True
        return None, False

    def idle_connections(self) -> int:
        """Kept-alive connections waiting in the pool for the next request."""
        with self._lock:
            return len(self._idle)

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.policy.max_cloud_inflight + 1:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None,
                deadline: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """One HTTP exchange on a pooled connection: (status, headers with lower-case names, body).

        ``deadline`` (:func:`time.monotonic` time) bounds the whole exchange when it is sooner than
        ``timeout_ms``. Connection failures and timeouts raise a transient :class:`OffloadError` (status None).
        """
        url = self._prefix + path
        for attempt in (0, 1):
            conn, reused = self._take()
            try:
                until = time.monotonic() + self.policy.timeout_ms / 1e3
                if deadline is not None and deadline < until:
                    until = deadline
                left = until - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request's deadline passed before it was sent")
                if conn is None:
                    conn = self._connect(left)
                sock = conn.sock
                assert sock is not None
                sock.settimeout(max(until - time.monotonic(), 1e-3))
                conn.request(method, url, body=body, headers=dict(headers or {}))
                response = conn.getresponse()
                data = _read_until(response, sock, until)
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                stale = reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                    BrokenPipeError))
                if stale and attempt == 0:
                    # The server closed an idle keep-alive connection (uvicorn does after 5 s): the other idle
                    # ones are as old, so drop them all and try once more on a fresh connection.
                    self._drop_idle()
                    continue
                what = "timed out" if isinstance(exc, (TimeoutError, socket.timeout)) else "failed"
                raise OffloadError(f"{method} {self.policy.base_url}{path} {what}: {type(exc).__name__}: {exc}; "
                                   "check that the offload server is up and reachable", transient=True) from exc
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
            if response.will_close:
                conn.close()
            else:
                self._give_back(conn)
            return response.status, answer_headers, data
        raise AssertionError("unreachable")

    def _get_json(self, path: str) -> tuple[int, Any, bytes]:
        import json

        status, _, data = self.request("GET", path, headers={"Accept": "application/json"})
        if status != 200:
            return status, None, data
        try:
            return status, json.loads(data), data
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise OffloadError(f"GET {self.policy.base_url}{path} answered 200 with a body that is not JSON: "
                               f"{data[:200]!r}; is {self.policy.base_url} a KServe V2 server?", status=status,
                               transient=True) from None

    # --- the V2 API ----------------------------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        """``GET /v2``: the server's name, version and extensions (``{}`` when the server does not answer it)."""
        status, meta, _ = self._get_json("/v2")
        if status >= 500:
            raise OffloadError(f"GET {self.policy.base_url}/v2 answered {status}", status=status, transient=True)
        return meta if status == 200 and isinstance(meta, dict) else {}

    def model_metadata(self) -> dict[str, Any]:
        """The model's metadata (name, versions, platform, inputs, outputs); OffloadError when the server lacks it."""
        status, meta, data = self._get_json(self._model_path)
        if status != 200:
            message = v2.error_message(data, status)
            if status in (400, 404):
                raise OffloadError(f"the offload server has no {self.model_label} (HTTP {status}: {message}); "
                                   "deploy the model there or fix the policy's model/version", status=status)
            raise OffloadError(f"reading the metadata of {self.model_label} failed: HTTP {status}: {message}",
                               status=status, transient=status >= 500)
        if not isinstance(meta, dict):
            raise OffloadError(f"the metadata of {self.model_label} is not a JSON object: {data[:200]!r}",
                               status=status)
        return meta

    def ready(self) -> bool:
        """``GET .../ready``: True when the server says the model is ready to serve."""
        status, _, _ = self.request("GET", self._model_path + "/ready")
        return status == 200

    def configure(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
        """Read the server's extensions and the model's metadata and check them against the local model.

        Raises OffloadError naming the model, input, datatype or shape and the fix when they
        differ (``transient`` False), or a transient one when the server cannot be reached.
        """
        extensions = self.server_metadata().get("extensions") or []
        meta = self.model_metadata()
        remote = {}
        for entry in meta.get("inputs") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                remote[entry["name"]] = entry
        fix = "convert/deploy the same model on the server, or point the policy at the right model"
        local_names = [s.name for s in inputs]
        missing = [n for n in local_names if n not in remote]
        extra = [n for n in remote if n not in local_names]
        if missing or extra:
            raise OffloadError(f"{self.model_label} takes inputs {sorted(remote)}, the local model takes "
                               f"{local_names} (missing on the server: {missing}, unknown here: {extra}); {fix}")
        for spec in inputs:
            entry = remote[spec.name]
            want = v2.datatype_of(spec.dtype)
            if entry.get("datatype") != want:
                raise OffloadError(f"{self.model_label}: input {spec.name!r} has datatype {entry.get('datatype')!r} on "
                                   f"the server but {want} ({spec.dtype.name}) here; {fix}")
            shape = _dims(entry.get("shape"))
            if shape is None or not _compatible(spec.shape, shape):
                raise OffloadError(f"{self.model_label}: input {spec.name!r} has shape {entry.get('shape')!r} on the "
                                   f"server but {_show(spec.shape)} here (-1 is a free dimension); {fix}")
        remote_outputs = {e.get("name") for e in meta.get("outputs") or [] if isinstance(e, dict)}
        lacking = [s.name for s in outputs if remote_outputs and s.name not in remote_outputs]
        if lacking:
            raise OffloadError(f"{self.model_label} has outputs {sorted(map(str, remote_outputs))}, but the local model "
                               f"returns {[s.name for s in outputs]} ({lacking} missing there); {fix}")
        if self.policy.binary is None:
            self.binary = v2.BINARY_EXTENSION in extensions
        self._outputs = outputs
        self.configured = True

    def infer(self, feeds: Mapping[str, np.ndarray], deadline: float | None = None,
              request_id: str | None = None) -> dict[str, np.ndarray]:
        """Run ``feeds`` (validated local inputs) on the server; outputs by name, as the local model gives them.

        ``deadline`` (:func:`time.monotonic` time) is when the answer is no use any more: what is left of it
        goes to the server as the ``timeout`` parameter and bounds the wait here (see the module doc).
        ``request_id`` is the V2 request ``id`` (the dispatcher marks its probes with it).
        """
        binary = self.binary
        status, headers, data = self._post(feeds, binary, deadline, request_id)
        if status != 200 and binary and not self._binary_worked and status in _BINARY_REFUSALS:
            json_status, json_headers, json_data = self._post(feeds, False, deadline, request_id)
            if json_status == 200:
                log.warning("offload: %s refused binary tensors (HTTP %d: %s); sending JSON tensors from now on",
                            self.model_label, status, v2.error_message(data, status)[:200])
                self.binary = False
            status, headers, data, binary = json_status, json_headers, json_data, False
        if status != 200:
            raise OffloadError(f"{self.model_label} answered HTTP {status}: {v2.error_message(data, status)}",
                               status=status, transient=status >= 500 or status in (408, 429))
        if binary:
            self._binary_worked = True
        length = headers.get(v2.HEADER_LENGTH.lower())
        try:
            response = v2.decode_response(data, int(length) if length is not None else None)
        except (InputError, ValueError) as exc:
            raise OffloadError(f"{self.model_label} sent an answer that does not decode: {exc}", status=status,
                               transient=True) from None
        return self._check(response.outputs)

    def _post(self, feeds: Mapping[str, np.ndarray], binary: bool, deadline: float | None,
              request_id: str | None) -> tuple[int, dict[str, str], bytes]:
        parameters = {}
        if deadline is not None:  # what is left of it, at least 1 us (0 would read as "no timeout" to Triton)
            parameters[TIMEOUT_PARAMETER] = max(int((deadline - time.monotonic()) * 1e6), 1)
        body, headers = v2.encode_request(feeds, binary_inputs=binary, binary_outputs=binary, request_id=request_id,
                                          parameters=parameters)
        return self.request("POST", self._model_path + "/infer", body, headers, deadline)

    def _check(self, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results: dict[str, np.ndarray] = {}
        for spec in self._outputs:
            if spec.name not in got:
                raise OffloadError(f"{self.model_label} answered outputs {sorted(got)} without {spec.name!r}; the "
                                   "server's model is not the local one")
            value = got[spec.name]
            if value.dtype != spec.dtype:
                if value.dtype.kind != spec.dtype.kind:
                    raise OffloadError(f"{self.model_label}: output {spec.name!r} came back as {value.dtype.name}, "
                                       f"the local model gives {spec.dtype.name}; the server's model differs")
                value = value.astype(spec.dtype)
            if not spec.accepts_shape(value.shape):
                raise OffloadError(f"{self.model_label}: output {spec.name!r} came back with shape "
                                   f"{list(value.shape)}, the local model gives {spec.describe()}")
            results[spec.name] = value
        return results

    def close(self) -> None:
        """Close every pooled connection; later calls raise OffloadError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def input_bytes(feeds: Mapping[str, np.ndarray]) -> int:
    """The bytes of all input tensors (what decides whether a request is heavy)."""
    return int(sum(math.prod(v.shape) * v.dtype.itemsize for v in feeds.values()))
