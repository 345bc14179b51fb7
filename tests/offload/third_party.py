"""A third-party KServe V2 server for the offload client's tests: the ``kserve`` Python model server.

**Why a virtualenv of its own.** ``pip install kserve`` beside edgesdk's dev pins installs, but
it downgrades protobuf (7.x -> 6.x, which onnx uses) and psutil (7.x -> 5.9) and pulls in the
Kubernetes client, pandas, grpcio and FastAPI: far too much to ask of every developer for one
test. So :func:`kserve_env` is a cached virtualenv of its own (``benchmarks/shared/peer_venv.py``,
under ``~/.cache/edgesdk/venvs/kserve-<version>``; ``$EDGESDK_KSERVE_VENV`` overrides the
place) holding the pinned ``kserve`` with the same onnxruntime and numpy versions as this
environment, so the server computes the same bits as a local :class:`edgesdk.Runtime` (about
50 s and 530 MB, once; built aside and renamed into place when complete).

**The server.** :func:`kserve_server` writes a small ``kserve.Model`` subclass (:data:`MODEL_SCRIPT`)
that serves one ONNX file through onnxruntime, starts it with that environment's Python on a
free loopback port (REST only, no gRPC), waits for ``/v2/health/ready`` and stops it.

**What kserve 0.21 does, as seen by hand** (and what our client must handle):

- ``GET /v2`` lists ``extensions: ["model_repository_extension"]``: it does **not** advertise
  ``binary_tensor_data``, although ``POST .../infer`` does read binary bodies when the
  ``Inference-Header-Content-Length`` header is present and answers binary outputs when asked.
  A client that follows the advertisement sends JSON tensors here.
- It refuses FP16 tensors sent as JSON data: 400 ``{"error": "Receiving FP16 data via JSON is
  not supported. ..."}``.
- Its own errors are ``{"error": "..."}`` (400 invalid input, 404 unknown model, 500 inference
  error, 501 a model version in the path: "Model versioning not supported yet."); FastAPI's request
  validation answers 422 ``{"detail": [{"loc": [...], "msg": ...}]}`` (e.g. a JSON body without
  ``inputs``).
- Wrong shapes or input names reach onnxruntime and come back as 500 ``{"error": "InvalidArgument :
  ..."}``; a truncated binary body is a 500 too (``"ValueError : buffer size must be a multiple of
  element size"``); binary bytes without the length header are a 400.
- A model's JSON (not binary) response with a null ``id`` fails kserve's own response validation
  (500 ``ValidationError``), so the model below answers with a generated id when the request has
  none, as kserve's bundled servers do.
- The metadata has ``versions: null`` and dynamic dimensions as -1; responses carry
  ``model_version: null``.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

from benchmarks.endpoint.endpoint_peers import PeerServer
from benchmarks.shared.peer_venv import PeerVenv, clean_env
from edgesdk.ota_server.broker import free_port

__all__ = ["KSERVE_VERSION", "MODEL_SCRIPT", "kserve_env", "kserve_server", "http"]

KSERVE_VERSION = "0.21.0"

#: The kserve model server: one ONNX file on onnxruntime (one thread), named by the environment.
MODEL_SCRIPT = '''
import os

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid


class OnnxModel(Model):
    def __init__(self, name, path):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.ready = True
        return self.ready

    def _types(self, tensors):
        return [{"name": t.name, "datatype": from_np_dtype(np.dtype(_DTYPES[t.type])),
                 "shape": [d if isinstance(d, int) else -1 for d in t.shape]} for t in tensors]

    def get_input_types(self):
        return self._types(self.session.get_inputs())

    def get_output_types(self):
        return self._types(self.session.get_outputs())

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        results = self.session.run(None, feeds)
        outputs = []
        for spec, value in zip(self.session.get_outputs(), results):
            output = InferOutput(name=spec.name, shape=list(value.shape), datatype=from_np_dtype(value.dtype))
            output.set_data_from_numpy(value, binary_data=payload.use_binary_outputs)
            outputs.append(output)
        # As kserve's own servers do: its JSON response model refuses a null id (500 ValidationError).
        return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name, infer_outputs=outputs,
                             use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
           "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
           "tensor(bool)": "bool"}

if __name__ == "__main__":
    model = OnnxModel(os.environ["EDGESDK_KSERVE_MODEL"], os.environ["EDGESDK_KSERVE_PATH"])
    ModelServer(http_port=int(os.environ["EDGESDK_KSERVE_PORT"]), enable_grpc=False, workers=1,
                enable_latency_logging=False).start([model])
'''


def _requirements() -> tuple[str, ...]:
    """kserve pinned, with this environment's onnxruntime and numpy so both sides compute the same bits."""
    return (f"kserve=={KSERVE_VERSION}", f"onnxruntime=={metadata.version('onnxruntime')}",
            f"numpy=={metadata.version('numpy')}")


def kserve_env() -> PeerVenv:
    """The virtualenv holding the pinned kserve (see the module docstring); ``.ensure()`` installs it."""
    return PeerVenv.named(f"kserve-{KSERVE_VERSION}", _requirements(), "import kserve, onnxruntime",
                          "EDGESDK_KSERVE_VENV")


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One plain urllib request: status, headers (lower-case names) and body, also for 4xx/5xx answers."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def kserve_server(env: PeerVenv, name: str, model_path: Path, workdir: Path, ready_timeout_s: float = 60.0) -> PeerServer:
    """A kserve ModelServer serving ``model_path`` as ``name`` on 127.0.0.1 (REST only), not yet started.

    ``with kserve_server(env, "digits", path, workdir) as server: server.url`` -- started and ready on
    entry (:class:`PeerUnavailable` with the server's log when it is not ready in ``ready_timeout_s``),
    its process group stopped on exit.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "kserve_onnx_model.py"
    script.write_text(MODEL_SCRIPT)
    port = free_port()
    variables = {**clean_env(), "EDGESDK_KSERVE_MODEL": name, "EDGESDK_KSERVE_PATH": str(model_path),
                 "EDGESDK_KSERVE_PORT": str(port), "OMP_NUM_THREADS": "1"}
    return PeerServer("kserve", [str(env.python), str(script)], variables, name, workdir, None, port, None,
                      ready_timeout_s)
