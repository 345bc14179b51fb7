"""The dispatcher behind ``predict_async``: one bounded local queue, the cloud, and the rule
between them.

Every request under an offload policy has a deadline: ``latency_slo_ms`` after its submission
(:mod:`edgesdk.offload.deadline`). Routing of each request, decided at once when it is submitted:

1. heavy (``heavy=True``, or inputs of at least ``heavy_input_bytes``) -> the cloud, if it may
   take it (below);
2. local, if the predicted local latency (:class:`~edgesdk.offload.predictor.LatencyPredictor`:
   its calibrated tail) is within ``latency_slo_ms`` and the local queue has room;
3. the cloud, if it may take it: offload configured, fewer than ``max_cloud_inflight`` requests
   open, the breaker closed, and the cloud *predicted to meet the objective* (its latency is
   tracked like the device's: :mod:`edgesdk.offload.cloud_latency`, measured by user requests
   and by a small probe inference; :mod:`edgesdk.offload.cloud_side` says when it is measured and
   what an unmeasured cloud gets: at most one request at a time);
4. refused, if the cloud answers but is predicted to miss the objective and the device is
   busy: neither side would meet it, and a cloud that answers gets no work it cannot do in
   time. An idle device still takes the request: nothing waits behind it, it is the soonest
   answer there is, and its run measures the device again (refusing on a prediction alone would
   keep a pessimistic one forever, with nothing run to correct it);
5. local, if the queue has room, when the cloud cannot take work (down, full, disabled): the
   device is then what it would be without offload, never worse;
6. otherwise :class:`~edgesdk.errors.OverloadedError`. Refusals (4 and 6) come at once and
   say why: the local prediction and queue, the cloud's prediction (or why it may not take
   work) and the objective. Nothing is queued.

**The deadline travels.** A cloud request sends what is left of its deadline to the server (the
V2 ``timeout`` parameter, microseconds) and waits no longer than that for the answer. One whose
deadline passed before it could be sent is dropped with
:class:`~edgesdk.offload.deadline.DeadlineExceededError` unsent.

**Fallback.** A cloud request that fails or times out is run locally only if it can still make
its objective there, in the order of its submission among the waiting requests; otherwise it is
dropped with :class:`~edgesdk.offload.deadline.DeadlineExceededError` instead of running late
ahead of work that still can (:mod:`edgesdk.offload.cloud_requests` says how it is judged). At
the bound its future fails with :class:`~edgesdk.errors.OverloadedError`, as a new request
would be refused: the bound is what keeps local latency bounded, and a cloud that dies under
load would otherwise add up to ``max_cloud_inflight`` requests to a full queue (measured by
benchmarks/endpoint/offload.py: the local p99 rose 27% over local-only at 2x load). Nothing is
lost: every future ends with a result or an error.

**Cold start.** Before the first local run ends the local predictor has nothing to go on; the
dispatcher seeds it with the latency the model's bundle measured for this board
(``expected_latency_s`` of the local model, when it has one: :class:`edgesdk.Runtime` reads it
from the bundle's manifest), so a burst at start does not fill the local queue blind.

One worker thread runs local requests one at a time (the model itself uses the runtime's
threads and cores); cloud requests run on up to ``max_cloud_inflight`` threads, one
keep-alive connection each. :meth:`Dispatcher.close` fails the requests still waiting with a
clear :class:`~edgesdk.errors.BackendError`, lets the running ones finish (cloud ones within
their deadline) and returns: it never hangs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from edgesdk.errors import BackendError, OverloadedError
from edgesdk.offload.breaker import CircuitBreaker
from edgesdk.offload.client import V2Client, input_bytes
from edgesdk.offload.cloud_latency import CloudLatency
from edgesdk.offload.cloud_requests import CloudRequests, ms
from edgesdk.offload.cloud_side import FITS, SLOW, CloudSide
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
        """Refuse NaN and Inf in floating inputs (as the model's own ``predict`` does), also before
        offloading."""


@dataclass
class _Job:
    feeds: dict[str, np.ndarray]
    outputs: tuple[TensorSpec, ...]
    future: Future[Any] = field(default_factory=Future)
    submitted_ns: int = field(default_factory=time.perf_counter_ns)
    started: bool = False
    #: What the local prediction was when the job was admitted locally (None: routed to the cloud).
    prediction: Prediction | None = None

    def elapsed_s(self) -> float:
        """Seconds since submission."""
        return (time.perf_counter_ns() - self.submitted_ns) / 1e9


class Dispatcher(CloudRequests, CloudSide):
    """Routes ``predict_async`` requests between a local model and, with a policy, a KServe V2
    endpoint.

    ``model`` is read at every request (so a ManagedRuntime may swap what it returns). With a
    ``policy`` the cloud model is checked against ``model``'s inputs at construction and its
    latency measured once (one small inference): an unknown model or different inputs raise
    OffloadError; an unreachable server only logs one warning and opens the breaker, and the
    check is retried by the half-open probe. ``clock`` drives the predictor, the cloud's
    latency and the breaker (tests pass a fake one); deadlines are real time.
    """

    def __init__(
        self,
        model: Callable[[], LocalModel],
        policy: OffloadPolicy | None = None,
        max_local_queue: int = DEFAULT_LOCAL_QUEUE,
        clock: Callable[[], float] = time.monotonic,
        configure: bool = True,
        stats_window: int = 1000,
    ) -> None:
        if (
            not isinstance(max_local_queue, int)
            or isinstance(max_local_queue, bool)
            or max_local_queue < 1
        ):
            raise BackendError(f"max_local_queue must be an integer >= 1, got {max_local_queue!r}")
        self._model = model
        self.policy = policy
        self._clock = clock
        self.max_local_queue = policy.max_local_queue if policy is not None else max_local_queue
        self.predictor = LatencyPredictor(policy.predictor_alpha if policy else 0.2, clock)
        self._seed_local()
        #: The cloud's round trips and requests in flight: its predicted latency
        #: (edgesdk.offload.cloud_latency).
        self.cloud_latency = CloudLatency(clock)
        self.breaker: CircuitBreaker | None = None
        self._client: V2Client | None = None
        self._retired_clients: list[V2Client] = []
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Condition()
        self._configure_lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._running = False
        self._cloud_inflight = 0
        self._closed = False
        self._worker: threading.Thread | None = None
        self._disabled: str | None = None
        self._paths = {"local": LatencyStats(stats_window), "cloud": LatencyStats(stats_window)}
        self.refused = 0
        self.fallbacks = 0
        #: Requests dropped because they could no longer meet their objective (also in ``refused``).
        self.dropped = 0
        self._init_cloud()
        if policy is not None:
            self.breaker = CircuitBreaker(policy.breaker_failures, policy.breaker_reset_s, clock)
            self._client = V2Client(policy)
            self._executor = ThreadPoolExecutor(
                policy.max_cloud_inflight, thread_name_prefix="edgesdk-offload"
            )
            if configure:
                self._configure_at_start()

    def _seed_local(self) -> None:
        """Seed the local predictor with the bundle's measured latency for this board, when the
        model has one."""
        try:
            seed = getattr(self._model(), "expected_latency_s", None)
        except BackendError:
            return  # no model yet (a ManagedRuntime before its first install)
        if isinstance(seed, (int, float)) and not isinstance(seed, bool) \
                and math.isfinite(seed) and seed > 0:
            self.predictor.seed(float(seed))

    # --- submission -------------------------------------------------------------------------------

    def _is_heavy(self, feeds: dict[str, np.ndarray], heavy: bool | None) -> bool:
        if heavy is not None:
            return heavy
        limit = self.policy.heavy_input_bytes if self.policy else None
        return limit is not None and input_bytes(feeds) >= limit

    def route(self, feeds: dict[str, np.ndarray], heavy: bool | None = None) -> str:
        """Where a request would go now: ``local``, ``cloud`` or ``refused`` (claims nothing; for
        tests and tools)."""
        with self._lock:
            return self._route(feeds, heavy, claim=False)[0]

    def _route(
        self, feeds: dict[str, np.ndarray], heavy: bool | None, claim: bool
    ) -> tuple[str, Prediction | None, str]:
        """Where a request goes, the local prediction it was judged on (None when the local side
        was not asked),
        and why the cloud may or may not take it."""
        slo_s = self._slo_s
        verdict = None
        if self._is_heavy(feeds, heavy):
            verdict, why = self._cloud_fits(slo_s, claim)
            if verdict == FITS:
                return "cloud", None, why
        room = len(self._queue) + self._running < self.max_local_queue
        prediction = self.predictor.predict(len(self._queue))
        if room and prediction.tail_s <= slo_s:
            return "local", prediction, ""
        # Local would break the objective: the cloud, if it is predicted to meet it.
        if verdict is None:
            verdict, why = self._cloud_fits(slo_s, claim)
            if verdict == FITS:
                return "cloud", None, why
        idle = not self._queue and not self._running
        if verdict == SLOW and not idle:  # a cloud that answers, too slowly: neither side makes it
            return "refused", prediction, why
        return ("local" if room else "refused"), prediction, why

    def _refusal(self, prediction: Prediction | None, why: str) -> OverloadedError:
        held = len(self._queue) + self._running
        if self.policy is None:
            return OverloadedError(
                f"request refused: the local queue is full ({held}/{self.max_local_queue}) and no "
                "offload policy; slow the request rate, drop this input or raise max_local_queue"
            )
        local = ms(prediction.tail_s) if prediction is not None else "unknown"
        full = ", full" if held >= self.max_local_queue else ""
        return OverloadedError(
            f"request refused: local predicted {local} with {len(self._queue)} queued "
            f"({held}/{self.max_local_queue} in the local queue{full}), {why}, objective "
            f"{self.policy.latency_slo_ms:g} ms; slow the request rate, "
            "drop this input, or raise max_local_queue / max_cloud_inflight"
        )

    def submit(self, inputs: Any, heavy: bool | None = None) -> Future[Any]:
        """Validate ``inputs`` against the local model and route them; a Future of what ``predict``
        returns.

        Raises at once: InputError for bad inputs, OverloadedError when neither the local queue nor
        the cloud can take the request (with the reason), BackendError after :meth:`close`. The
        Future
        may fail with DeadlineExceededError (a cloud request that can no longer make its objective).
        """
        model = self._model()
        feeds = validate_inputs(model.inputs, inputs, model.check_finite)
        job = _Job(feeds, model.outputs)
        with self._lock:
            if self._closed:
                raise BackendError("this runtime is closed; create a new one to run predictions")
            where, job.prediction, why = self._route(feeds, heavy, claim=True)
            if where == "refused":
                self.refused += 1
                raise self._refusal(job.prediction, why)
            if self.policy is not None:
                self._keep_probe_input(feeds)
            if where == "local":
                self._enqueue(job)
                return job.future
            job.prediction = None
            self._cloud_inflight += 1
            assert self._executor is not None
            # Under the lock: close() marks the dispatcher closed under it before shutting the
            # executor down.
            self._executor.submit(self._run_cloud, job)
        return job.future

    def _enqueue(self, job: _Job) -> None:
        """Queue ``job`` in submission order (a cloud fallback may be older than some waiting jobs);
        lock held."""
        later = self._place(job)
        if later is None:
            self._queue.append(job)
        else:
            self._queue.insert(later, job)
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="edgesdk-local", daemon=True)
            self._worker.start()
        self._lock.notify_all()

    def _place(self, job: _Job) -> int | None:
        """Where ``job`` goes in the queue by submission order (None: at the back); lock held."""
        return next(
            (i for i, queued in enumerate(self._queue) if queued.submitted_ns > job.submitted_ns),
            None,
        )

    # --- execution --------------------------------------------------------------------------------

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

    # --- state ------------------------------------------------------------------------------------

    def _breaker_state(self) -> str | None:
        if self.breaker is None:
            return None
        return "disabled" if self._disabled is not None else self.breaker.state

    def snapshot(self, overall: StatsSnapshot) -> StatsSnapshot:
        """``overall`` plus where requests ran: per-path figures, refused and fallback counts,
        breaker state."""
        with self._lock:
            refused, fallbacks = self.refused, self.fallbacks
        return replace(
            overall,
            paths={name: stats.snapshot() for name, stats in self._paths.items()},
            refused=refused,
            fallbacks=fallbacks,
            breaker=self._breaker_state(),
            calibration=self.predictor.calibration(),
        )

    def path_counts(self) -> tuple[int, int]:
        """Running totals of requests run locally and sent to the cloud, failed ones included."""
        return self._paths["local"].counters()[0], self._paths["cloud"].counters()[0]

    def close(self) -> None:
        """Stop taking requests, fail the waiting ones, let the running ones finish; safe to call
        twice."""
        with self._lock:
            self._closed = True
            waiting = list(self._queue)
            self._queue.clear()
            self._lock.notify_all()
            worker = self._worker
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(
                    BackendError(
                        "the runtime was closed before this request ran; submit it to a new runtime"
                    )
                )
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        self._join_probe()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for client in [
            *self._retired_clients,
            *([self._client] if self._client is not None else []),
        ]:
            client.close()
