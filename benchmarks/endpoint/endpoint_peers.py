"""The endpoint benchmark's peers: MLServer and PyTriton serving one ONNX file through onnxruntime.

Each runs from a virtualenv of its own (:class:`_peer_venv.PeerVenv`, built on first use) as a
subprocess pinned to one CPU, in its own process group, on free loopback ports (HTTP and
gRPC), with onnxruntime on one intra-op and one inter-op thread and no dynamic batching, like
the endpoint it is compared with. :class:`PeerServer` starts it, waits for
``/v2/models/<name>/ready`` (stricter than ``/v2/health/ready``) and stops its process group.

**MLServer 1.7.1** (``mlserver==1.7.1``, onnxruntime and numpy at edgesdk's versions): a
custom runtime (:data:`MLSERVER_RUNTIME`, an ``MLModel`` decoding with ``NumpyCodec`` and
calling onnxruntime), adaptive batching off (``max_batch_size: 0``), metrics off
(``metrics_endpoint: null``: no metrics server, no Prometheus REST middleware or gRPC
interceptor; on, it cost about 5% more server CPU per request, within the noise). Inference runs
in the server process (``parallel_workers: 0``, :data:`MLSERVER_WORKERS`), its best setting
here. Measured on a 16-8-4 MLP, 8 client processes on CPU 1, server on CPU 0, 4 s windows,
2 rounds each (on a machine busy with other work, so the server CPU per request is the steadier
figure): JSON 990-1,570 requests/s at 0.63-0.77 ms of server CPU per request with
``parallel_workers: 0``, against 410-690/s at 1.42-1.71 ms with one worker process (the
default); gRPC 1,070-1,270/s at 0.75-0.80 ms against 350-650/s at 1.50-1.84 ms. One worker
process needs ``uvloop<0.21`` (measured with 0.20.0): with uvloop 0.23, which pip picks, the
worker dies at start ("RuntimeError: There is no current event loop in thread 'MainThread'")
and the model never loads. Over HTTP MLServer takes JSON only: ``GET /v2`` lists no extensions
and a binary body is refused (422 "JSON decode error" for tritonclient's, 500 for the
benchmark's pre-encoded one); over gRPC it takes raw tensor contents. Its model metadata lists
no inputs or outputs (the runtime declares none). Errors: 404 ``{"error": "Model nope not
found"}``; a wrong shape, input name or FP16 JSON tensor reaches onnxruntime and comes back as a
bare 500 "Internal Server Error"; a body without ``inputs`` is FastAPI's 422 ``{"detail":
[...]}``.

**PyTriton 0.7.0** (``nvidia-pytriton==0.7.0``, Triton server 2.51 in the wheel): a Python
function bound as a model (:data:`PYTRITON_SCRIPT`, ``ModelConfig(batching=False)``, inputs
and outputs declared from the ONNX session, dynamic dimensions as -1), reached through Triton's
Python backend stub. The stub links the system's ``libpython3.11`` (Debian's 3.11.2), so the
environment is made from ``/usr/bin/python3.11``: made from another 3.11 build, the stub loads
that build's standard library and fails (``'_thread.RLock' object has no attribute
'_recursion_count'``). No apt package was needed. PyTriton pins numpy below 2, so that
environment has numpy 1.26.4 (onnxruntime is edgesdk's 1.32.0). Triton lists
``binary_tensor_data`` (and classification, sequence, model_repository, shared memory,
statistics, trace, logging...) and serves JSON, binary and gRPC; its errors are 400 with
``{"error": "unexpected shape for input 'input' for model 'mlp'. Expected [-1,16], got
[1,15]"}`` (also an unknown input, FP16 as JSON), 404 for an unknown model, 500 for a body
without ``inputs``. The script turns SIGTERM into CTRL+C, so PyTriton stops Triton and removes
its workspace (``~/.cache/pytriton/workspace_*``, 22 MB each, left behind on a plain SIGTERM
or a SIGKILL); Triton and its stub take a few seconds more to exit, which :meth:`PeerServer.stop`
waits for. Triton waits for open client connections at exit, up to ``exit_timeout_secs`` (30 s
by default, more than ``stop()``'s 10 s before SIGKILL), so it is set to 2 s.
Measured as above: MLP 400-480/s binary, 380-450/s JSON, 320-430/s gRPC (2.1-3.0 ms of server
CPU per request: the hop through the stub and PyTriton's proxy costs more than the MLP);
orientation (1x3x224x224) 102-105/s binary and 107-111/s gRPC at 9.0-9.7 ms per request, where
MLServer does 42-43/s JSON (23.6 ms) and 70-72/s gRPC (14.0 ms), and onnxruntime alone takes
4.8 ms of CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from benchmarks.shared.peer_venv import PeerVenv, PeerVenvError, clean_env
from edgesdk.ota_server.broker import free_port

__all__ = ["MLSERVER", "PYTRITON", "PEERS", "PeerServer", "PeerUnavailable", "mlserver_peer", "pytriton_peer"]

_ORT = f"onnxruntime=={metadata.version('onnxruntime')}"
MLSERVER = PeerVenv.named("mlserver-1.7.1", ("mlserver==1.7.1", _ORT, f"numpy=={metadata.version('numpy')}"),
                          "import mlserver, onnxruntime", "EDGESDK_MLSERVER_VENV")
#: MLServer's ``parallel_workers``: inference in the server process, its best here (see the module docstring).
MLSERVER_WORKERS = 0
#: Debian's interpreter: the one whose libpython3.11 Triton's Python backend stub links (see the docstring).
SYSTEM_PYTHON = "/usr/bin/python3.11"
PYTRITON = PeerVenv.named("pytriton-0.7.0", ("nvidia-pytriton==0.7.0", _ORT), "import pytriton, onnxruntime",
                          "EDGESDK_PYTRITON_VENV", base_python=SYSTEM_PYTHON)

MLSERVER_RUNTIME = '''
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.settings.parameters.uri, options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {t.name: NumpyCodec.decode_input(t) for t in payload.inputs}
        results = self.session.run(None, feeds)
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self.output_names, results)])
'''

PYTRITON_SCRIPT = '''
import os
import signal

import numpy as np
import onnxruntime as ort
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

options = ort.SessionOptions()
options.intra_op_num_threads = options.inter_op_num_threads = 1
session = ort.InferenceSession(os.environ["PEER_MODEL_PATH"], options, providers=["CPUExecutionProvider"])
inputs, outputs = session.get_inputs(), session.get_outputs()
TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
         "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def infer(requests):
    answers = []
    for request in requests:
        results = session.run(None, {i.name: request[i.name] for i in inputs})
        answers.append({o.name: r for o, r in zip(outputs, results)})
    return answers


def tensors(args):
    return [Tensor(name=a.name, dtype=TYPES[a.type], shape=tuple(d if isinstance(d, int) else -1 for d in a.shape))
            for a in args]


config = TritonConfig(http_address="127.0.0.1", http_port=int(os.environ["PEER_HTTP_PORT"]),
                      grpc_address="127.0.0.1", grpc_port=int(os.environ["PEER_GRPC_PORT"]),
                      metrics_port=int(os.environ["PEER_METRICS_PORT"]), allow_metrics=False,
                      exit_timeout_secs=2)  # Triton waits this long for open client connections at exit (default 30 s)
# SIGTERM as CTRL+C: serve() then stops Triton and removes its workspace (~/.cache/pytriton/workspace_*)
signal.signal(signal.SIGTERM, signal.default_int_handler)
with Triton(config=config) as triton:
    triton.bind(model_name=os.environ["PEER_MODEL_NAME"], infer_func=infer, inputs=tensors(inputs),
                outputs=tensors(outputs), config=ModelConfig(batching=False))
    triton.serve()
'''


class PeerUnavailable(RuntimeError):
    """The peer cannot run on this machine (its environment did not install, or its server would not start)."""


class PeerServer:
    """A peer's server process: ``with PeerServer(...) as server: server.url`` (ready on entry, stopped on exit)."""

    def __init__(self, label: str, command: list[str], env: dict[str, str], name: str, workdir: Path,
                 cpu: int | None, http_port: int, grpc_port: int | None, ready_timeout_s: float = 120.0) -> None:
        self.label, self.command, self.env, self.name, self.workdir = label, command, env, name, workdir
        self.cpu, self.http_port, self.grpc_port, self.ready_timeout_s = cpu, http_port, grpc_port, ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str | None:
        """``127.0.0.1:PORT`` of its V2 gRPC service (None for a server without one)."""
        return f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None

    @property
    def pid(self) -> int | None:
        """The server's main process (its children, e.g. Triton's, are counted by tree CPU accounting)."""
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        """The server's stdout and stderr, in its workdir (appended to across starts)."""
        return self.workdir / f"{self.label}.log"

    def log(self) -> str:
        """The last 4000 characters of the server's output."""
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def start(self) -> PeerServer:
        """Start the process and wait until the model answers ready; PeerUnavailable with the log otherwise."""
        cpu = self.cpu
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(self.command, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()  # what it started may outlive it
                raise PeerUnavailable(f"{self.label} exited ({self.process.returncode}) before it was ready:\n{self.log()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/v2/models/{self.name}/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            time.sleep(0.2)
        self.stop()
        raise PeerUnavailable(f"{self.label} was not ready after {self.ready_timeout_s:.0f} s:\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 10 s; returns when every process of the group is gone.

        Safe to call twice. The whole group counts: Triton's server and stub outlive PyTriton's script by seconds.
        """
        if self.process is None or (self.process.poll() is not None and not _group_alive(self.process.pid)):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (self.process.poll() is None or _group_alive(self.process.pid)):
            time.sleep(0.1)
        if self.process.poll() is None or _group_alive(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies waiting for init to reap them do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def _ensure(venv: PeerVenv) -> None:
    try:
        venv.ensure()
    except (PeerVenvError, OSError) as exc:
        raise PeerUnavailable(f"{venv.location.name} did not install: {exc}") from exc


def mlserver_peer(model_path: Path, name: str, workdir: Path, cpu: int, *,
                  parallel_workers: int = MLSERVER_WORKERS) -> PeerServer:
    """MLServer serving ``model_path`` as ``name`` (not started); metrics off, no adaptive batching.

    ``parallel_workers``: 0 runs inference in the server process (the default: see the module docstring).
    """
    _ensure(MLSERVER)
    (workdir / name).mkdir(parents=True, exist_ok=True)
    (workdir / "ort_runtime.py").write_text(MLSERVER_RUNTIME)
    http_port, grpc_port = free_port(), free_port()
    (workdir / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port, "parallel_workers": parallel_workers,
        "metrics_endpoint": None, "debug": False}))  # no metrics server, REST middleware or gRPC interceptor
    (workdir / name / "model-settings.json").write_text(json.dumps({
        "name": name, "implementation": "ort_runtime.OnnxRuntimeModel", "max_batch_size": 0, "max_batch_time": 0,
        "parameters": {"uri": str(Path(model_path).resolve())}}))
    command = [str(MLSERVER.python), "-c", "import sys; from mlserver.cli import main; sys.argv[0] = 'mlserver'; "
               "sys.exit(main())", "start", str(workdir)]
    return PeerServer("mlserver", command, clean_env({"OMP_NUM_THREADS": "1"}), name, workdir, cpu, http_port,
                      grpc_port)


def pytriton_peer(model_path: Path, name: str, workdir: Path, cpu: int) -> PeerServer:
    """PyTriton serving ``model_path`` as ``name`` (not started)."""
    if not Path(SYSTEM_PYTHON).exists():
        raise PeerUnavailable(f"{SYSTEM_PYTHON} is missing; PyTriton's backend stub needs the system Python 3.11")
    _ensure(PYTRITON)
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "pytriton_serve.py"
    script.write_text(PYTRITON_SCRIPT)
    http_port, grpc_port = free_port(), free_port()
    env = clean_env({"OMP_NUM_THREADS": "1", "PEER_MODEL_PATH": str(Path(model_path).resolve()),
                     "PEER_MODEL_NAME": name, "PEER_HTTP_PORT": str(http_port), "PEER_GRPC_PORT": str(grpc_port),
                     "PEER_METRICS_PORT": str(free_port())})
    return PeerServer("pytriton", [str(PYTRITON.python), str(script)], env, name, workdir, cpu, http_port, grpc_port)


#: Factory by peer name: ``(model_path, name, workdir, cpu) -> PeerServer`` (not yet started).
PEERS: dict[str, Callable[[Path, str, Path, int], PeerServer]] = {"mlserver": mlserver_peer,
                                                                   "pytriton": pytriton_peer}
