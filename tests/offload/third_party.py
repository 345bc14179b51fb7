"""A third-party KServe V2 server for the offload client's tests: the ``kserve`` Python model server.

**Why a virtualenv of its own.** ``pip install kserve`` beside edgesdk's dev pins installs, but
it downgrades protobuf (7.x -> 6.x, which onnx uses) and psutil (7.x -> 5.9) and pulls in the
Kubernetes client, pandas, grpcio and FastAPI: far too much to ask of every developer for one
test. So :func:`kserve_env` is a cached virtualenv of its own (``benchmarks/_peer_venv.py``,
under ``~/.cache/edgesdk/venvs/kserve-<version>``; ``$EDGESDK_KSERVE_VENV`` overrides the
place) holding the pinned ``kserve`` with the same onnxruntime and numpy versions as this
environment, so the server computes the same bits as a local :class:`edgesdk.Runtime` (about
50 s and 530 MB, once; built aside and renamed into place when complete).

**The server.** :class:`KServeServer` writes a small ``kserve.Model`` subclass (:data:`MODEL_SCRIPT`)
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

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from types import TracebackType

from benchmarks._peer_venv import PeerVenv, clean_env
from edgesdk.ota_server.broker import free_port

__all__ = ["KSERVE_VERSION", "MODEL_SCRIPT", "kserve_env", "KServeServer", "http"]

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


class KServeServer:
    """A kserve ModelServer in a subprocess serving ``model_path`` as ``name`` on 127.0.0.1.

    ``with KServeServer(env, "digits", path, workdir) as server: server.url`` -- started and ready
    on entry (:class:`RuntimeError` with the server's log when it does not get ready in
    ``ready_timeout_s``), stopped on exit.
    """

    def __init__(self, env: PeerVenv, name: str, model_path: Path, workdir: Path, ready_timeout_s: float = 60.0) -> None:
        self.env, self.name, self.model_path, self.workdir = env, name, Path(model_path), Path(workdir)
        self.ready_timeout_s = ready_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        return self.workdir / "kserve.log"

    def start(self) -> KServeServer:
        """Start the subprocess and wait until ``/v2/health/ready`` answers 200."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        script = self.workdir / "kserve_onnx_model.py"
        script.write_text(MODEL_SCRIPT)
        self.port = free_port()
        env = {**clean_env(), "EDGESDK_KSERVE_MODEL": self.name, "EDGESDK_KSERVE_PATH": str(self.model_path),
               "EDGESDK_KSERVE_PORT": str(self.port), "OMP_NUM_THREADS": "1"}
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen([str(self.env.python), str(script)], cwd=self.workdir, env=env,
                                            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kserve exited with {self.process.returncode} before it was ready:\n{self.log()}")
            with contextlib.suppress(OSError):
                if http("GET", f"{self.url}/v2/health/ready", timeout=2.0)[0] == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"kserve was not ready after {self.ready_timeout_s:.0f} s:\n{self.log()}")

    def log(self) -> str:
        """The last 4000 characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s). Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def metadata(self) -> dict[str, object]:
        """``GET /v2/models/{name}`` as a dict."""
        status, _, body = http("GET", f"{self.url}/v2/models/{self.name}")
        if status != 200:
            raise RuntimeError(f"model metadata: HTTP {status}: {body[:300]!r}")
        parsed: dict[str, object] = json.loads(body)
        return parsed

    def __enter__(self) -> KServeServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
