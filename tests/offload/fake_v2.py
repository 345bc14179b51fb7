"""A small fault-injecting KServe V2 server for the offload tests: stdlib HTTP, edgesdk.offload.v2_codec, onnxruntime.

It serves one ONNX model the way a V2 server does (``GET /v2``, model metadata, ready,
``POST .../infer`` in JSON or binary) and, when told through :attr:`FakeV2Server.mode`, fails
the ways real servers fail:

- ``ok``: answer;
- ``status``: answer ``fault_status`` with ``fault_body`` (``{"error": ...}``, ``{"detail": [...]}`` or text);
- ``malformed``: 200 with a body that is not JSON;
- ``reject_binary``: 422 ``{"detail": [...]}`` for a binary body, answers JSON ones (like FastAPI servers);
- ``hold``: wait on :attr:`release` before answering (tests block the cloud deterministically);
- ``slow``: wait on :attr:`release` (at most 30 s) and answer only then, beyond any client timeout;
- ``kill``: wait on :attr:`release`, then drop the connection without an answer;
- ``trickle``: send the headers, then a byte every 20 ms until :attr:`release`.

:meth:`wait_held` waits (with a deadline) until a number of requests are inside the handler.
The dispatcher's probe inferences (request id ``edgesdk-probe-N``) are counted in :attr:`probes`, not in
:attr:`infers`/:attr:`binary_bodies` (user requests); :attr:`requests` keeps every inference request's decoded
``id`` and ``parameters`` (the deadline travels there); :attr:`on_infer`, when set, is called before each answer
(tests advance a fake clock with it: a cloud that is slow on the dispatcher's clock).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import InputError
from edgesdk.offload import v2_codec as v2
from edgesdk.ota_server.broker import free_port

__all__ = ["FakeV2Server"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.fake.cond:
            self.server.fake.connections += 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's signature)
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {"Content-Type": "application/json"}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode())

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        fake = self.server.fake
        fake.gets += 1
        base = f"/v2/models/{fake.name}"
        if self.path == "/v2":
            extensions = [v2.BINARY_EXTENSION] if fake.advertise_binary else []
            self._json(200, {"name": "fake-v2", "version": "0", "extensions": extensions})
        elif self.path in (base, f"{base}/versions/1"):
            self._json(200, fake.metadata())
        elif self.path in (f"{base}/ready", f"{base}/versions/1/ready"):
            self._json(200, {"name": fake.name, "ready": True})
        elif self.path in ("/v2/health/live", "/v2/health/ready"):
            self._json(200, {"live": True})
        else:
            self._json(404, {"error": f"no model at {self.path}"})

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        fake = self.server.fake
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        length = self.headers.get(v2.HEADER_LENGTH)
        if self.path not in (f"/v2/models/{fake.name}/infer", f"/v2/models/{fake.name}/versions/1/infer"):
            self._json(404, {"error": f"unknown model at {self.path}"})
            return
        probe = _request_id(body, length).startswith("edgesdk-probe")
        with fake.cond:
            if probe:
                fake.probes += 1
            else:
                fake.infers += 1
                fake.binary_bodies += length is not None
            fake.held += 1
            fake.cond.notify_all()
        try:
            self._infer(fake, body, length)
        finally:
            with fake.cond:
                fake.held -= 1
                fake.cond.notify_all()

    def _infer(self, fake: FakeV2Server, body: bytes, length: str | None) -> None:
        if fake.on_infer is not None:
            fake.on_infer()
        mode = fake.mode
        if mode in ("hold", "slow", "kill"):
            fake.release.wait(30)
            if mode == "kill":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
        if mode == "trickle":  # headers at once, then one byte every 20 ms: each read is quick, the whole is not
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while not fake.release.wait(0.02):
                self.wfile.write(b" ")
                self.wfile.flush()
            self.close_connection = True
            return
        if mode == "status":
            self._send(fake.fault_status, fake.fault_body, {"Content-Type": fake.fault_type})
            return
        if mode == "malformed":
            self._send(200, b"{this is not json")
            return
        if mode == "reject_binary" and length is not None:
            self._json(422, {"detail": [{"loc": ["body", "inputs"], "msg": "field required", "type": "missing"}]})
            return
        try:
            request = v2.decode_request(body, int(length) if length is not None else None)
            fake.requests.append({"id": request.id, "parameters": dict(request.parameters), "binary": bool(length)})
            names = [i.name for i in fake.session.get_inputs()]
            outputs = fake.session.run(None, {n: request.inputs[n] for n in names})
        except (InputError, KeyError, ValueError) as exc:
            self._json(400, {"error": str(exc)})
            return
        values = {o.name: np.asarray(v) for o, v in zip(fake.session.get_outputs(), outputs)}
        if fake.output_dtype is not None:
            values = {k: v.astype(fake.output_dtype) for k, v in values.items()}
        binary = {name for name in values if request.wants_binary(name)}
        answer, headers = v2.encode_response(fake.name, "1", values, binary=binary, request_id=request.id)
        self._send(200, answer, headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeV2Server

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out leave broken pipes behind; that is the point of those tests


class FakeV2Server:
    """One ONNX model behind a V2 HTTP server on a free loopback port; a context manager."""

    def __init__(self, model_path: str | Path, name: str = "mlp", advertise_binary: bool = True,
                 metadata_inputs: list[dict[str, Any]] | None = None, port: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.name = name
        self.advertise_binary = advertise_binary
        self.metadata_inputs = metadata_inputs
        self.mode = "ok"
        self.fault_status, self.fault_body, self.fault_type = 500, b'{"error": "boom"}', "application/json"
        self.output_dtype: Any = None
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.infers = self.binary_bodies = self.gets = self.held = self.connections = self.probes = 0
        self.requests: list[dict[str, Any]] = []
        self.on_infer: Any = None
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: _Server | None = None

    def metadata(self) -> dict[str, Any]:
        """The model's V2 metadata (inputs from the session unless overridden)."""
        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": v2.datatype_of(_ORT_DTYPES[t.type]),
                     "shape": [d if isinstance(d, int) else -1 for d in t.shape]} for t in items]
        inputs = self.metadata_inputs if self.metadata_inputs is not None else tensors(self.session.get_inputs())
        return {"name": self.name, "versions": ["1"], "platform": "onnxruntime_onnx", "inputs": inputs,
                "outputs": tensors(self.session.get_outputs())}

    def fail(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        """Answer every inference with ``status`` and ``body`` from now on."""
        self.fault_status, self.fault_body, self.fault_type = status, body, content_type
        self.mode = "status"

    def wait_held(self, count: int, timeout_s: float = 20.0) -> None:
        """Wait until ``count`` inference requests are inside the handler (AssertionError at the deadline)."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.held >= count, timeout_s), f"{self.held} held, wanted {count}"

    def start(self) -> FakeV2Server:
        """Listen and serve in a thread."""
        self._server = _Server(("127.0.0.1", self.port), _Handler)
        self._server.fake = self
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-v2", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening (connections already open stay until their handlers finish)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeV2Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.stop()


def _request_id(body: bytes, length: str | None) -> str:
    """The V2 request's ``id`` ('' when it has none or does not decode)."""
    try:
        header = json.loads(body[:int(length)] if length is not None else body)
    except (ValueError, UnicodeDecodeError):
        return ""
    value = header.get("id") if isinstance(header, dict) else None
    return value if isinstance(value, str) else ""


_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
               "tensor(int32)": np.int32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8,
               "tensor(int8)": np.int8, "tensor(bool)": np.bool_}


def wait_until(predicate: Any, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
