"""KServe V2 requests encoded once, as real clients send them, and checked one at a time (for the endpoint benchmark).

Each client is a process of its own (no GIL shared between clients) holding one keep-alive
``http.client`` connection or one gRPC channel. The request is encoded once, before the window:
for HTTP by tritonclient's ``InferenceServerClient.generate_request_body`` (JSON or binary
tensors, exactly what ``tritonclient.http`` would send), for gRPC as the serialized
``ModelInferRequest`` with raw tensor contents that ``tritonclient.grpc`` sends. Every HTTP
response is decoded by tritonclient's ``parse_response_body`` and its output read with
``as_numpy``; a gRPC response is parsed and its raw output viewed as an array. Encoding a
1x3x224x224 tensor as JSON costs the client more than the server's decode; doing it per request
would let the client CPU, not the server, set every server's pace alike.

The load itself comes from h2load (``endpoint_h2load.py``): these Python clients saturated their
own core near 5,300 requests/s, before the servers did. :func:`connect` still makes one real
client's request, to check the answer h2load's responses are compared with.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass

import numpy as np

__all__ = ["ENCODINGS", "Request", "encode_request", "connect", "percentiles", "tree_cpu_s"]


@dataclass(frozen=True)
class Request:
    """One pre-encoded infer request: where it goes (``http://`` or ``grpc://HOST:PORT``), its body and headers
    (a serialized ``ModelInferRequest`` for gRPC), and the output to read back."""

    target: str
    model: str
    body: bytes
    headers: dict[str, str]
    output: str


#: How a request's tensors travel: V2 REST with JSON or binary tensors, or V2 gRPC with raw contents.
ENCODINGS = ("json", "binary", "grpc")


def encode_request(target: str, model: str, input_name: str, x: np.ndarray, output: str, encoding: str) -> Request:
    """The request tritonclient would send for ``x`` (HTTP outputs asked back as the inputs were sent)."""
    if encoding == "grpc":
        from tritonclient.grpc import service_pb2

        message = service_pb2.ModelInferRequest(model_name=model)
        message.inputs.add(name=input_name, datatype="FP32", shape=x.shape)
        message.outputs.add(name=output)
        message.raw_input_contents.append(np.ascontiguousarray(x, "<f4").tobytes())
        return Request(target, model, message.SerializeToString(), {}, output)
    import tritonclient.http as triton

    binary = encoding == "binary"
    tensor = triton.InferInput(input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=[triton.InferRequestedOutput(output, binary_data=binary)])
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return Request(target, model, body, headers, output)


class _Http:
    """A keep-alive connection sending one pre-encoded request; responses decoded by tritonclient."""

    def __init__(self, request: Request) -> None:
        host, _, port = request.target.removeprefix("http://").partition(":")
        self.request, self.connection = request, http.client.HTTPConnection(host, int(port), timeout=60)

    def call(self) -> np.ndarray:
        import tritonclient.http as triton

        request = self.request
        self.connection.request("POST", f"/v2/models/{request.model}/infer", request.body, request.headers)
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
        length = response.getheader("Inference-Header-Content-Length")
        result = triton.InferenceServerClient.parse_response_body(
            body, header_length=None if length is None else int(length))
        return result.as_numpy(request.output)

    def close(self) -> None:
        self.connection.close()


class _Grpc:
    """A channel sending one pre-serialized ``ModelInferRequest``; the raw output read back as an array."""

    def __init__(self, request: Request) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        self.request = request
        self.channel = grpc.insecure_channel(request.target.removeprefix("grpc://"))
        self.infer = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                              response_deserializer=service_pb2.ModelInferResponse.FromString)

    def call(self) -> np.ndarray:
        response = self.infer(self.request.body, timeout=60)
        for index, tensor in enumerate(response.outputs):
            if tensor.name == self.request.output:
                return np.frombuffer(response.raw_output_contents[index], "<f4").reshape(tuple(tensor.shape))
        raise RuntimeError(f"the response has no output {self.request.output!r}")

    def close(self) -> None:
        self.channel.close()


def connect(request: Request) -> _Http | _Grpc:
    """A client for ``request``'s target: ``.call()`` sends it once and returns the output; ``.close()``."""
    return _Grpc(request) if request.target.startswith("grpc://") else _Http(request)


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of latencies in seconds, as milliseconds."""
    values = np.asarray(seconds) * 1e3
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children so far (0.0 if it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        total = 0.0
        for process in [root, *root.children(recursive=True)]:
            times = process.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0
