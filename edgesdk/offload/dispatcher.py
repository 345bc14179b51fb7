"""The dispatcher behind ``predict_async``: one bounded local queue, the cloud, and the rule between them.

Routing of each request, decided at once when it is submitted:

1. heavy (``heavy=True``, or inputs of at least ``heavy_input_bytes``) -> the cloud, if it is available;
2. local, if the predicted local latency (:class:`~edgesdk.offload.predictor.LatencyPredictor`:
   its calibrated tail) is within ``latency_slo_ms`` and the local queue has room;
3. the cloud, if it is available and either the local queue is full or the cloud's recent round
   trips (a moving average of successful ones; unknown counts as 0) are shorter than the
   predicted local latency: a cloud slower than waiting here does not get the work;
4. local, if the queue has room (never worse than local-only when the cloud is down or slow);
5. otherwise :class:`~edgesdk.errors.OverloadedError`, at once; nothing is queued.

The cloud estimate is refreshed only by cloud requests, so a cloud that was slow is tried again
when the local queue fills (step 3) or for heavy requests.

The cloud is *available* when offload is configured, not disabled by a configuration error,
below ``max_cloud_inflight``, and the circuit breaker is closed.

**Probes out of band.** No user request probes a cloud the breaker has given up on. Once the
breaker half-opens, the request that finds it so starts a probe in the background (the model's V2
readiness call, after checking its metadata if that is still due) and is itself routed as if the
cloud were down. The probe's answer closes the breaker or opens it again; nobody waits on it.

**Fallback.** A cloud request that fails or times out is run locally, when the local queue has
room, in the order of its submission among the waiting requests: one that timed out is the
oldest admitted work and goes first, one that failed at once waits behind those submitted before
it (re-queuing it at the front would push every one of them back by a service time). At the bound
its future fails with :class:`~edgesdk.errors.OverloadedError`, as a new request would be
refused: the bound is what keeps local latency bounded, and a cloud that dies under load
would otherwise add up to ``max_cloud_inflight`` requests to a full queue (measured by
benchmarks/endpoint/offload.py: the local p99 rose 27% over local-only at 2x load). Nothing is lost:
every future ends with a result or an error.

One worker thread runs local requests one at a time (the model itself uses the runtime's
threads and cores); cloud requests run on up to ``max_cloud_inflight`` threads, one
keep-alive connection each. :meth:`Dispatcher.close` fails the requests still waiting with a
clear :class:`~edgesdk.errors.BackendError`, lets the running ones finish (cloud ones within
their timeout) and returns: it never hangs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from edgesdk.errors import BackendError, OffloadError, OverloadedError
from edgesdk.offload.breaker import CircuitBreaker
from edgesdk.offload.client import V2Client, input_bytes
from edgesdk.offload.policy import OffloadPolicy
from edgesdk.offload.predictor import LatencyPredictor, Prediction
from edgesdk.runtime.stats import LatencyStats, StatsSnapshot
from edgesdk.runtime.tensors import TensorSpec, validate_inputs

__all__ = ["Dispatcher", "LocalModel", "DEFAULT_LOCAL_QUEUE"]

log = logging.getLogger(__name__)

#: The local queue bound of ``predict_async`` without an offload policy.
DEFAULT_LOCAL_QUEUE = 8


class LocalModel(Protocol):
    """What the dispatcher runs locally: a Runtime, or a ManagedRuntime's active model."""

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's inputs."""

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The model's outputs."""

    def predict(self, inputs: Any) -> Any:
        """Run one inference synchronously."""

    @property
    def check_finite(self) -> bool:
        """Refuse NaN and Inf in floating inputs (as the model's own ``predict`` does), also before offloading."""


@dataclass
class _Job:
    feeds: dict[str, np.ndarray]
    outputs: tuple[TensorSpec, ...]
    future: Future[Any] = field(default_factory=Future)
    submitted_ns: int = field(default_factory=time.perf_counter_ns)
    started: bool = False
    #: What the local prediction was when the job was admitted locally (None: routed to the cloud).
    prediction: Prediction | None = None


class Dispatcher:
    """Routes ``predict_async`` requests between a local model and, with a policy, a KServe V2 endpoint.

    ``model`` is read at every request (so a ManagedRuntime may swap what it returns). With a
    ``policy`` the cloud model is checked against ``model``'s inputs at construction: an
    unknown model or different inputs raise OffloadError; an unreachable server only logs
    one warning and opens the breaker, and the check is retried by the half-open probe.
    ``clock`` drives the predictor and the breaker (tests pass a fake one).
    """

    def __init__(self, model: Callable[[], LocalModel], policy: OffloadPolicy | None = None,
                 max_local_queue: int = DEFAULT_LOCAL_QUEUE, clock: Callable[[], float] = time.monotonic,
                 configure: bool = True, stats_window: int = 1000) -> None:
        if not isinstance(max_local_queue, int) or isinstance(max_local_queue, bool) or max_local_queue < 1:
            raise BackendError(f"max_local_queue must be an integer >= 1, got {max_local_queue!r}")
        self._model = model
        self.policy = policy
        self.max_local_queue = policy.max_local_queue if policy is not None else max_local_queue
        self.predictor = LatencyPredictor(policy.predictor_alpha if policy else 0.2, clock)
        #: Recent cloud round trips (sent -> answered), fed by observe(); unknown (None) counts as 0.
        self.cloud_latency = LatencyPredictor(policy.predictor_alpha if policy else 0.2, clock)
        self.breaker: CircuitBreaker | None = None
        self._client: V2Client | None = None
        self._retired_clients: list[V2Client] = []
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Condition()
        self._configure_lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._running = False
        self._cloud_inflight = 0
        self._probe: threading.Thread | None = None
        self._closed = False
        self._worker: threading.Thread | None = None
        self._disabled: str | None = None
        self._paths = {"local": LatencyStats(stats_window), "cloud": LatencyStats(stats_window)}
        self.refused = 0
        self.fallbacks = 0
        if policy is not None:
            self.breaker = CircuitBreaker(policy.breaker_failures, policy.breaker_reset_s, clock)
            self._client = V2Client(policy)
            self._executor = ThreadPoolExecutor(policy.max_cloud_inflight, thread_name_prefix="edgesdk-offload")
            if configure:
                self._configure_at_start()

    # --- configuration -------------------------------------------------------------------------------------------

    def _configure_at_start(self) -> None:
        assert self._client is not None and self.breaker is not None
        try:
            model = self._model()
            inputs, outputs = model.inputs, model.outputs
        except BackendError:
            return  # no model yet (a ManagedRuntime before its first install): the first cloud request configures
        try:
            self._client.configure(inputs, outputs)
        except OffloadError as exc:
            if not exc.transient:
                self.close()
                raise
            self.breaker.trip()
            log.warning("offload: %s cannot be reached (%s); running locally, retrying in %g s", self._client.model_label,
                        exc, self.breaker_reset_s)

    @property
    def breaker_reset_s(self) -> float:
        """Seconds between probes of an open breaker (0 without offload)."""
        return self.policy.breaker_reset_s if self.policy else 0.0

    def model_changed(self, policy: OffloadPolicy | None = None) -> None:
        """The local model was replaced: check the cloud model against it again before the next cloud request.

        ``policy`` retargets the cloud side (e.g. the version of the endpoint that matches the new local
        model); it must keep the queue and concurrency settings. Cloud requests in flight finish on the old client.
        """
        if policy is not None and self.policy is not None and policy != self.policy:
            if (policy.max_local_queue, policy.max_cloud_inflight) != (self.policy.max_local_queue,
                                                                       self.policy.max_cloud_inflight):
                raise OffloadError("a retargeted offload policy must keep max_local_queue and max_cloud_inflight")
            if self._client is not None:
                self._retired_clients.append(self._client)  # closed in close(): requests may still be using it
            self.policy, self._client = policy, V2Client(policy)
        if self._client is not None:
            self._client.configured = False
            self._disabled = None  # a model that did not match the cloud's may have been replaced by one that does

    def _ensure_configured(self) -> None:
        assert self._client is not None
        if self._client.configured:
            return
        with self._configure_lock:
            if self._client.configured:
                return
            model = self._model()
            try:
                self._client.configure(model.inputs, model.outputs)
            except OffloadError as exc:
                if not exc.transient:
                    self._disabled = str(exc)
                    log.error("offload disabled: %s", exc)
                raise
            log.info("offload: %s configured (binary tensors: %s)", self._client.model_label, self._client.binary)

    # --- submission ----------------------------------------------------------------------------------------------

    def _cloud_available(self, claim: bool) -> bool:
        """Called with the lock held; ``claim`` starts the background probe of a half-open breaker."""
        if self.breaker is None or self._disabled is not None:
            return False
        assert self.policy is not None
        if self._cloud_inflight >= self.policy.max_cloud_inflight:
            return False
        if self.breaker.allow():
            return True
        if claim and not self._closed and self.breaker.claim_probe():
            self._probe = threading.Thread(target=self._run_probe, name="edgesdk-offload-probe", daemon=True)
            self._probe.start()
        return False

    def _run_probe(self) -> None:
        """The half-open probe: the cloud model's metadata check (if due) and its readiness call; no user request."""
        assert self._client is not None and self.breaker is not None
        try:
            self._ensure_configured()
            ready = self._client.ready()
        except Exception as exc:  # any failure keeps the breaker open; the reason is logged once per probe
            ready, reason = False, str(exc)
        else:
            reason = "the model is not ready"
        if ready:
            log.info("offload: %s answers again; circuit breaker closed", self._client.model_label)
            self.breaker.success()
        else:
            self.breaker.failure()
            log.info("offload: probe of %s failed (%s); all work local for %g s more", self._client.model_label, reason,
                     self.breaker_reset_s)

    def _is_heavy(self, feeds: dict[str, np.ndarray], heavy: bool | None) -> bool:
        if heavy is not None:
            return heavy
        limit = self.policy.heavy_input_bytes if self.policy else None
        return limit is not None and input_bytes(feeds) >= limit

    def route(self, feeds: dict[str, np.ndarray], heavy: bool | None = None) -> str:
        """Where a request would go now: ``local``, ``cloud`` or ``refused`` (claims nothing; for tests and tools)."""
        with self._lock:
            return self._route(feeds, heavy, claim=False)[0]

    def _route(self, feeds: dict[str, np.ndarray], heavy: bool | None, claim: bool) -> tuple[str, Prediction | None]:
        """Where a request goes, with the local prediction it was judged on (None when the local side was not asked)."""
        if self._is_heavy(feeds, heavy) and self._cloud_available(claim):
            return "cloud", None
        room = len(self._queue) + self._running < self.max_local_queue
        slo_s = self.policy.latency_slo_ms / 1e3 if self.policy else float("inf")
        prediction = self.predictor.predict(len(self._queue))
        if room and prediction.tail_s <= slo_s:
            return "local", prediction
        # Local would break the SLO: the cloud, unless its recent round trips are slower than waiting here.
        cloud_s = self.cloud_latency.service_s or 0.0
        if (not room or cloud_s < prediction.tail_s) and self._cloud_available(claim):
            return "cloud", None
        return ("local" if room else "refused"), prediction

    def submit(self, inputs: Any, heavy: bool | None = None) -> Future[Any]:
        """Validate ``inputs`` against the local model and route them; a Future of what ``predict`` returns.

        Raises at once: InputError for bad inputs, OverloadedError when the local queue and the
        cloud are both full, BackendError after :meth:`close`.
        """
        model = self._model()
        feeds = validate_inputs(model.inputs, inputs, model.check_finite)
        job = _Job(feeds, model.outputs)
        with self._lock:
            if self._closed:
                raise BackendError("this runtime is closed; create a new one to run predictions")
            where, job.prediction = self._route(feeds, heavy, claim=True)
            if where == "refused":
                self.refused += 1
                cloud = (f", {self._cloud_inflight}/{self.policy.max_cloud_inflight} cloud requests open, breaker "
                         f"{self._breaker_state()}") if self.policy else " and no offload policy"
                raise OverloadedError(f"request refused: the local queue is full ({len(self._queue) + self._running}/"
                                      f"{self.max_local_queue}){cloud}; slow the request rate, drop this input or "
                                      "raise max_local_queue / max_cloud_inflight")
            if where == "local":
                self._enqueue(job)
                return job.future
            self._cloud_inflight += 1
            assert self._executor is not None
            # Under the lock: close() marks the dispatcher closed under it before shutting the executor down.
            self._executor.submit(self._run_cloud, job)
        return job.future

    def _enqueue(self, job: _Job) -> None:
        """Queue ``job`` in submission order (a cloud fallback may be older than some waiting jobs); lock held."""
        later = next((i for i, queued in enumerate(self._queue) if queued.submitted_ns > job.submitted_ns), None)
        if later is None:
            self._queue.append(job)
        else:
            self._queue.insert(later, job)
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="edgesdk-local", daemon=True)
            self._worker.start()
        self._lock.notify_all()

    # --- execution -----------------------------------------------------------------------------------------------

    @staticmethod
    def _shape(job: _Job, outputs: dict[str, np.ndarray]) -> Any:
        """The cloud's outputs in the form ``predict`` returns (one array for single-output models)."""
        if len(job.outputs) == 1:
            return outputs[job.outputs[0].name]
        return outputs

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                job = self._queue.popleft()
                self._running = True
            try:
                self._run_local(job)
            finally:
                with self._lock:
                    self._running = False
                    self._lock.notify_all()

    def _run_local(self, job: _Job) -> None:
        if not job.started:
            if not job.future.set_running_or_notify_cancel():
                return
            job.started = True
        self.predictor.begin()
        ok = False
        try:
            result = self._model().predict(job.feeds)
            ok = True
        except BaseException as exc:  # the future carries every failure to the caller
            self._paths["local"].record_error()
            job.future.set_exception(exc)
            return
        finally:
            self.predictor.end(record=ok)
        took_ns = time.perf_counter_ns() - job.submitted_ns
        self._paths["local"].record(took_ns)
        if job.prediction is not None:
            self.predictor.settle(job.prediction, took_ns / 1e9)
        job.future.set_result(result)

    def _run_cloud(self, job: _Job) -> None:
        assert self._client is not None and self.breaker is not None
        if not job.future.set_running_or_notify_cancel():
            with self._lock:
                self._cloud_inflight -= 1
            return
        job.started = True
        try:
            self._ensure_configured()
            sent = time.perf_counter()
            outputs = self._client.infer(job.feeds)
            self.cloud_latency.observe(time.perf_counter() - sent)
        except Exception as exc:
            self._cloud_failed(job, exc)
            return
        self.breaker.success()
        with self._lock:
            self._cloud_inflight -= 1
        self._paths["cloud"].record(time.perf_counter_ns() - job.submitted_ns)
        job.future.set_result(self._shape(job, outputs))

    def _cloud_failed(self, job: _Job, exc: Exception) -> None:
        assert self.breaker is not None
        self._paths["cloud"].record_error()
        if self.breaker.failure():  # one warning when a working cloud starts failing
            log.warning("offload: circuit breaker open after %s; all work local for %g s", exc, self.breaker_reset_s)
        with self._lock:
            self._cloud_inflight -= 1
            if self._closed:
                job.future.set_exception(BackendError(f"the runtime was closed while a cloud request failed ({exc}); "
                                                      "it could not be run locally any more"))
                return
            held = len(self._queue) + self._running
            if held >= self.max_local_queue:
                self.refused += 1
                job.future.set_exception(OverloadedError(
                    f"request refused: the cloud failed ({exc}) and the local queue is full ({held}/"
                    f"{self.max_local_queue}); slow the request rate, check the offload server, or raise "
                    "max_local_queue"))
                return
            self.fallbacks += 1
            self._enqueue(job)

    # --- state ---------------------------------------------------------------------------------------------------

    def _breaker_state(self) -> str | None:
        if self.breaker is None:
            return None
        return "disabled" if self._disabled is not None else self.breaker.state

    def snapshot(self, overall: StatsSnapshot) -> StatsSnapshot:
        """``overall`` plus where requests ran: per-path figures, refused and fallback counts, breaker state."""
        with self._lock:
            refused, fallbacks = self.refused, self.fallbacks
        return replace(overall, paths={name: stats.snapshot() for name, stats in self._paths.items()},
                       refused=refused, fallbacks=fallbacks, breaker=self._breaker_state(),
                       calibration=self.predictor.calibration())

    def path_counts(self) -> tuple[int, int]:
        """Running totals of requests run locally and sent to the cloud, failed ones included."""
        return self._paths["local"].counters()[0], self._paths["cloud"].counters()[0]

    def close(self) -> None:
        """Stop taking requests, fail the waiting ones, let the running ones finish; safe to call twice."""
        with self._lock:
            self._closed = True
            waiting = list(self._queue)
            self._queue.clear()
            self._lock.notify_all()
            worker = self._worker
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(BackendError("the runtime was closed before this request ran; submit it to "
                                                      "a new runtime"))
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        if self._probe is not None and self._probe is not threading.current_thread():
            self._probe.join()  # within the client's timeout
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for client in [*self._retired_clients, *([self._client] if self._client is not None else [])]:
            client.close()
