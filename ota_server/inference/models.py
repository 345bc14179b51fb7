"""Models of the inference endpoint: names and versions resolved in the OTA repository, ONNX Runtime sessions.

A request without a version runs the version pinned in the endpoint's configuration, or else the
newest stored version, looked up again on every request (a version pushed a moment ago is served
without a restart). Sessions are kept per (name, version), the least recently used dropped beyond
``InferenceConfig.max_sessions``; a batched model's session comes with its :class:`Batcher`.
Sessions are built in a thread below the event loop's priority, so ONNX Runtime's intra-op pool
threads (created with the session) inherit it (:mod:`.priority`); loads of a version other than a
model's default are rate-limited (:mod:`.load_limit`). A request's deadline (:mod:`.deadline`) is
checked before it waits and again before it runs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from edgesdk.errors import BackendError, BundleError, InputError, ModelFormatError, NotFoundError
from edgesdk.offload.v2_codec import datatype_of
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.tensors import TensorSpec

from .batcher import Batcher, BatcherClosedError, QueueFullError
from .config import BatchingConfig, InferenceConfig, ServedModel
from .deadline import check
from .load_limit import LoadBudget
from .metrics import InferenceMetrics, ModelMetrics
from .priority import RUN_NICENESS, below_the_event_loop
from .run_cost import RunCost, elements

__all__ = ["LoadedModel", "ModelRegistry", "PLATFORM", "RUN_NICENESS"]

#: The ``platform`` of every model in ``GET /v2/models/{name}`` (Triton's name for ONNX Runtime models).
PLATFORM = "onnxruntime_onnx"
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16", "tensor(uint16)": "uint16",
              "tensor(int32)": "int32", "tensor(uint32)": "uint32", "tensor(int64)": "int64",
              "tensor(uint64)": "uint64", "tensor(bool)": "bool"}


def _spec(arg: Any, where: str) -> TensorSpec:
    if arg.type not in _ORT_TYPES:
        raise ModelFormatError(f"{where}: tensor {arg.name!r} has type {arg.type}, which the endpoint cannot serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape)
    return TensorSpec(arg.name, shape, np.dtype(_ORT_TYPES[arg.type]))


def v2_shape(spec: TensorSpec) -> list[int]:
    """The shape as V2 metadata writes it: -1 for a dynamic dim."""
    return [-1 if d is None else d for d in spec.shape]


class LoadedModel:
    """One model version in an ONNX Runtime session, with its batcher when batching applies."""

    def __init__(self, name: str, version: str, session: Any, batching: BatchingConfig, metrics: ModelMetrics,
                 instances: int = 1, single_threaded: bool = False) -> None:
        where = f"model {name} {version}"
        self.name, self.version, self.session, self.metrics = name, version, session, metrics
        self.inputs = tuple(_spec(arg, where) for arg in session.get_inputs())
        self.outputs = tuple(_spec(arg, where) for arg in session.get_outputs())
        dynamic = all(s.shape and s.shape[0] is None for s in (*self.inputs, *self.outputs))
        self.batching = batching
        self.batcher = Batcher(self.run, batching, metrics, f"{name}-{version}") if batching.enabled and dynamic \
            else None
        # Unbatched models: the same bound on requests at once as a batcher's queue, and ``instances`` runs at
        # a time in first-come order (like Triton's instance count). Runs sharing one core in more threads than
        # it has would all be slowed: at 8 clients on one core that put p99 at 111 ms against Triton's 88 ms.
        self._slots = threading.BoundedSemaphore(batching.max_queue)
        self._runner = ThreadPoolExecutor(instances, thread_name_prefix=f"run-{name}-{version}",
                                          initializer=below_the_event_loop)
        #: Recent unbatched runs: whether the next one may go on the event loop (only when provably short).
        self.run_cost = RunCost()
        # What a run would block the loop for. A session on one intra-op thread computes on the calling thread, so
        # that thread's CPU time: its wall time on a worker also counts the loop's own turns on a shared core (at 8
        # clients on one core, 92% of a tiny MLP's runs measured over the threshold and went to the worker).
        # A multi-threaded session's calling thread waits for its pool: the wall time.
        self._run_clock = time.thread_time if single_threaded else time.perf_counter

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The V2 model metadata object."""
        def tensor(spec: TensorSpec) -> dict[str, Any]:
            return {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": v2_shape(spec)}
        return {"name": self.name, "versions": versions, "platform": PLATFORM,
                "inputs": [tensor(s) for s in self.inputs], "outputs": [tensor(s) for s in self.outputs]}

    def check(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs if their names, datatypes and shapes fit the model; InputError naming the misfit otherwise."""
        expected = [s.name for s in self.inputs]
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        if missing or unknown:
            raise InputError(f"model {self.name} {self.version} takes inputs {expected}; missing {missing}, "
                             f"unexpected {unknown}")
        for spec in self.inputs:
            value = inputs[spec.name]
            if value.dtype != spec.dtype:
                raise InputError(f"input {spec.name!r} has datatype {datatype_of(value.dtype)} but model {self.name} "
                                 f"{self.version} takes {datatype_of(spec.dtype)}; send {datatype_of(spec.dtype)}")
            if not spec.accepts_shape(tuple(value.shape)):
                raise InputError(f"input {spec.name!r} has shape {list(value.shape)} but model {self.name} "
                                 f"{self.version} takes {v2_shape(spec)} (-1: any size)")
        return {s.name: inputs[s.name] for s in self.inputs}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One ONNX Runtime call; its failure is a BackendError with ORT's message."""
        try:
            values = self.session.run(None, inputs)
        except Exception as exc:  # onnxruntime raises its own exception types; translate at the boundary
            raise BackendError(f"model {self.name} {self.version} failed on this input: {exc}") from None
        return {spec.name: np.asarray(value) for spec, value in zip(self.outputs, values)}

    def submit(self, inputs: dict[str, np.ndarray],
               deadline: float | None = None) -> Future[dict[str, np.ndarray]] | None:
        """Queue checked inputs with the batcher; None when the model runs unbatched (QueueFullError when full)."""
        if self.batcher is None:
            return None
        try:
            return self.batcher.submit(inputs, deadline)
        except BatcherClosedError:
            return None  # unloaded a moment ago: the session still works, run it directly

    async def infer(self, inputs: dict[str, np.ndarray],
                    deadline: float | None = None) -> dict[str, np.ndarray]:
        """Check and run one request, batched when the model batches; QueueFullError when its queue
        is full, DeadlineExceededError when ``deadline`` (``time.perf_counter`` seconds) passes
        before it runs."""
        inputs = self.check(inputs)
        check(deadline, time.perf_counter(), "for its body and model")
        future = self.submit(inputs, deadline)
        if future is not None:
            return await asyncio.wrap_future(future)
        with self._slot():
            if self.run_cost.inline(elements(inputs)):
                return self._run_measured(inputs)
            try:
                running = asyncio.get_running_loop().run_in_executor(
                    self._runner, self._run_measured, inputs, deadline)
            except RuntimeError:  # evicted from the cache a moment ago: the session still works, run it anyway
                return await asyncio.to_thread(self._run_measured, inputs, deadline)
            return await running

    @contextmanager
    def _slot(self) -> Iterator[None]:
        """One of the ``max_queue`` places of an unbatched request, or QueueFullError at once."""
        if not self._slots.acquire(blocking=False):
            raise QueueFullError(f"model {self.name} {self.version} is running {self.batching.max_queue} requests, "
                                 "its max_queue; retry later, or raise max_queue in the inference config")
        try:
            yield
        finally:
            self._slots.release()

    def _run_measured(self, inputs: dict[str, np.ndarray],
                      deadline: float | None = None) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        check(deadline, started, "for a runner")
        cost_from = self._run_clock()
        outputs = self.run(inputs)
        cost = self._run_clock() - cost_from
        self.metrics.compute_seconds.observe(time.perf_counter() - started)
        first = next(iter(inputs.values()))
        self.metrics.batch_size.observe(int(first.shape[0]) if first.ndim else 1)
        self.run_cost.observe(elements(inputs), cost)
        return outputs

    def close(self) -> None:
        """Stop the batcher (queued requests still run) and the unbatched runner once its runs end."""
        if self.batcher is not None:
            self.batcher.close()
        self._runner.shutdown(wait=False)

    def infer_blocking(self, inputs: dict[str, np.ndarray],
                       deadline: float | None = None) -> dict[str, np.ndarray]:
        """:meth:`infer` for a thread that may wait for the answer (the gRPC service's workers): the
        same batcher, ``max_queue``, runner and deadline; a run provably short by
        :attr:`run_cost` goes in the calling thread."""
        inputs = self.check(inputs)
        check(deadline, time.perf_counter(), "for its body and model")
        future = self.submit(inputs, deadline)
        if future is not None:
            return future.result()
        with self._slot():
            if self.run_cost.inline(elements(inputs)):
                return self._run_measured(inputs)
            try:
                running = self._runner.submit(self._run_measured, inputs, deadline)
            except RuntimeError:  # evicted from the cache a moment ago: the session still works, run it here
                return self._run_measured(inputs, deadline)
            return running.result()


class ModelRegistry:
    """The served models over an OTA :class:`ModelRepository`, with an LRU cache of loaded sessions."""

    def __init__(self, repository: ModelRepository, config: InferenceConfig, metrics: InferenceMetrics) -> None:
        self.repository, self.config, self.metrics = repository, config, metrics
        self._loaded: OrderedDict[tuple[str, str], LoadedModel] = OrderedDict()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._versions: dict[str, tuple[int, list[str]]] = {}
        self._served: dict[str, ServedModel] = {}
        self.load_budget = LoadBudget(config.version_loads_per_minute)
        # Sessions are built here, below the loop's priority: ORT's pool threads inherit this
        # thread's nice value.
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="model-loader",
                                          initializer=below_the_event_loop)

    def names(self) -> list[str]:
        """The models this endpoint serves that have a stored version."""
        return [n for n in self.repository.models() if self.served(n) is not None]

    def versions(self, name: str) -> list[str]:
        """The stored versions of a served model, oldest first; NotFoundError when it is not served or stored.

        Listed again only when the model's folder changed (one ``stat``): a pushed version lands by
        an atomic rename into that folder, which moves its mtime, so it is served on the next request.
        """
        served = self.served(name)
        if served is None:
            raise NotFoundError(f"model {name!r} is not served by this endpoint; served: {self.names()}")
        try:
            changed = os.stat(self.repository.root / name).st_mtime_ns
        except OSError:
            changed = None
        cached = self._versions.get(name)
        if cached is not None and changed is not None and cached[0] == changed:
            versions = cached[1]
        else:
            try:
                versions = self.repository.versions(name)
            except BundleError:
                versions = []  # a name that could not be a directory is simply not there
            if changed is not None:
                self._versions[name] = (changed, versions)
        if not versions:
            raise NotFoundError(f"model {name!r} is not in the repository; served: {self.names()}")
        return versions

    def served(self, name: str) -> ServedModel | None:
        """The configuration of model ``name`` (:meth:`InferenceConfig.served`, kept per name)."""
        served = self._served.get(name)
        if served is None:
            served = self.config.served(name)
            if served is not None:  # unknown names are not kept: a client must not grow this dict
                self._served[name] = served
        return served

    def resolve(self, name: str, version: str | None) -> str:
        """The version a request runs: ``version`` if stored, else the configured pin, else the newest."""
        versions = self.versions(name)
        served = self.served(name)
        wanted = version if version is not None else served.version if served is not None else None
        if wanted is None:
            return versions[-1]
        if wanted not in versions:
            raise NotFoundError(f"model {name!r} has no version {wanted!r}; stored versions: {versions}")
        return wanted

    def cached(self, name: str, version: str) -> LoadedModel | None:
        """The loaded model, if its session is in the cache (marks it recently used)."""
        with self._lock:
            model = self._loaded.get((name, version))
            if model is not None:
                self._loaded.move_to_end((name, version))
            return model

    def load(self, name: str, version: str) -> LoadedModel:
        """The model's session, loaded from its bundle when not cached (blocking: ORT builds the
        session in a thread below the loop's priority); VersionLoadLimitError when ``version`` is
        not the model's default one and loading it now would go over
        ``version_loads_per_minute``."""
        with self._load_lock:
            model = self.cached(name, version)
            if model is not None:
                return model
            if version != self.resolve(name, None):
                self.load_budget.take(f"model {name} version {version}")
            model = self._loader.submit(self._open, name, version).result()
            with self._lock:
                self._loaded[(name, version)] = model
                evicted = []
                while len(self._loaded) > self.config.max_sessions:
                    evicted.append(self._loaded.popitem(last=False)[1])
        for old in evicted:
            old.close()
        return model

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """Resolve and load in one call (blocking)."""
        resolved = self.resolve(name, version)
        return self.cached(name, resolved) or self.load(name, resolved)

    def _open(self, name: str, version: str) -> LoadedModel:
        import onnxruntime as ort

        from edgesdk.runtime.bundle import read_bundle
        from edgesdk.runtime.model_file import ModelFormat

        bundle = read_bundle(self.repository.path(name, version), verify_model=False)
        if bundle.manifest.model_format is not ModelFormat.ONNX:
            raise ModelFormatError(f"model {name} {version} is a {bundle.manifest.model_format.value} bundle; the "
                                   "inference endpoint runs ONNX models only: push an onnx variant of it")
        content = bundle.read_model().content
        options = ort.SessionOptions()
        if self.config.threads is not None:
            options.intra_op_num_threads = self.config.threads
            options.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(content, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types
            raise ModelFormatError(f"model {name} {version}: ONNX Runtime cannot load it ({exc})") from None
        served = self.served(name)
        batching = served.batching if served is not None else self.config.default_batching
        return LoadedModel(name, version, session, batching, self.metrics.model(name, version), self._instances(),
                           single_threaded=self.config.threads == 1)

    def _instances(self) -> int:
        """Unbatched runs at a time: as many as fill this process's CPUs at ``threads`` each (one without a
        thread count: ONNX Runtime's default already uses every core)."""
        if self.config.threads is None:
            return 1
        return max(1, len(os.sched_getaffinity(0)) // self.config.threads)

    def close(self) -> None:
        """Stop every batcher and drop the sessions."""
        with self._lock:
            models, self._loaded = list(self._loaded.values()), OrderedDict()
        for model in models:
            model.close()
        self._loader.shutdown(wait=False)

