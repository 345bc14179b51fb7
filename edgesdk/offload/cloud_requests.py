"""A cloud request's life: sent with its deadline, answered, or failed; then dropped or re-queued.

A cloud request carries what is left of its deadline (``latency_slo_ms`` after submission) to
the server and waits no longer (:meth:`edgesdk.offload.client.V2Client.infer`). One whose
deadline passed while it waited for a connection thread is dropped unsent. One that fails or
times out is run locally only if it can still make its objective there: its time left at least
the *expected* local latency at the place it would take in submission order (the mean, not the
tail: a request with a fair chance is served). Otherwise it is dropped with
:class:`~edgesdk.offload.deadline.DeadlineExceededError` naming the objective and how late it
would be: re-queued, it would run late *and* push back work that can still make its objective.
Every cloud round trip, answered or timed out, goes into the cloud's latency
(:mod:`edgesdk.offload.cloud_latency`); a failure counts for the circuit breaker, a success
only resets its count (:mod:`edgesdk.offload.breaker`: only the probe closes it).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendError, OverloadedError
from edgesdk.offload.breaker import CircuitBreaker
from edgesdk.offload.client import V2Client
from edgesdk.offload.cloud_latency import CloudLatency
from edgesdk.offload.cloud_side import timed_out
from edgesdk.offload.deadline import DeadlineExceededError
from edgesdk.offload.policy import OffloadPolicy
from edgesdk.offload.predictor import LatencyPredictor
from edgesdk.runtime.stats import LatencyStats

if TYPE_CHECKING:
    from edgesdk.offload.dispatcher import _Job

__all__ = ["CloudRequests", "ms"]

log = logging.getLogger("edgesdk.offload.dispatcher")


def ms(seconds: float) -> str:
    """Seconds as ``12.3 ms`` (or why there is no figure), for messages."""
    return f"{seconds * 1e3:.1f} ms" if math.isfinite(seconds) else "unknown (no run measured yet)"


class CloudRequests:
    """Mixin of :class:`~edgesdk.offload.dispatcher.Dispatcher`: running cloud requests and what
    happens when they fail. The dispatcher sets the attributes below."""

    policy: OffloadPolicy | None
    predictor: LatencyPredictor
    cloud_latency: CloudLatency
    breaker: CircuitBreaker | None
    _client: V2Client | None
    _lock: threading.Condition
    _queue: Any
    _running: bool
    _closed: bool
    _cloud_inflight: int
    _paths: dict[str, LatencyStats]
    max_local_queue: int
    refused: int
    fallbacks: int
    dropped: int

    @property
    def _slo_s(self) -> float:
        return self.policy.latency_slo_ms / 1e3 if self.policy else float("inf")

    if TYPE_CHECKING:  # provided by the cloud side and the dispatcher (not here: no shadowing)
        breaker_reset_s: float

        def _ensure_configured(self) -> None: ...

        def _enqueue(self, job: _Job) -> None: ...

        def _place(self, job: _Job) -> int | None: ...

    @staticmethod
    def _shape(job: _Job, outputs: dict[str, np.ndarray]) -> Any:
        """The cloud's outputs in the form ``predict`` returns (one array for single-output models).
        """
        if len(job.outputs) == 1:
            return outputs[job.outputs[0].name]
        return outputs

    def _run_cloud(self, job: _Job) -> None:
        assert self._client is not None and self.breaker is not None
        if not job.future.set_running_or_notify_cancel():
            with self._lock:
                self._cloud_inflight -= 1
            return
        job.started = True
        left = self._slo_s - job.elapsed_s()
        if left <= 0:  # waited for a thread past its deadline: nobody needs the answer any more
            with self._lock:
                self._cloud_inflight -= 1
                self._drop(
                    job, "it waited for a cloud connection past its objective and was not sent", 0.0
                )
            return
        latency = self.cloud_latency
        token = latency.begin()
        try:
            self._ensure_configured()
            outputs = self._client.infer(job.feeds, deadline=time.monotonic() + left)
        except Exception as exc:
            if timed_out(exc):
                latency.end_censored(token)
            else:
                latency.end(token, answered=False)
            self._cloud_failed(job, exc)
            return
        latency.end(token, answered=True)
        self.breaker.success()
        with self._lock:
            self._cloud_inflight -= 1
        self._paths["cloud"].record(time.perf_counter_ns() - job.submitted_ns)
        job.future.set_result(self._shape(job, outputs))

    def _cloud_failed(self, job: _Job, exc: Exception) -> None:
        assert self.breaker is not None
        self._paths["cloud"].record_error()
        if self.breaker.failure():  # one warning when a working cloud starts failing
            log.warning(
                "offload: circuit breaker open after %s; all work local for %g s",
                exc,
                self.breaker_reset_s,
            )
        with self._lock:
            self._cloud_inflight -= 1
            if self._closed:
                job.future.set_exception(
                    BackendError(
                        f"the runtime was closed while a cloud request failed ({exc}); "
                        "it could not be run locally any more"
                    )
                )
                return
            held = len(self._queue) + self._running
            if held >= self.max_local_queue:
                self.refused += 1
                job.future.set_exception(
                    OverloadedError(
                        f"request refused: the cloud failed ({exc}) and the local queue is full "
                        f"({held}/{self.max_local_queue}); slow the request rate, check the "
                        "offload server, or raise "
                        "max_local_queue"
                    )
                )
                return
            place = self._place(job)
            expected = self.predictor.predict(
                len(self._queue) if place is None else place
            ).expected_s
            # Nothing known of the device yet (no run, no seed: an infinite expectation) is no
            # evidence it would be late: the request runs here, as it would without offload.
            if math.isfinite(expected) and job.elapsed_s() + expected > self._slo_s:
                what = "timed out" if timed_out(exc) else "failed"
                self._drop(
                    job,
                    f"the cloud {what} ({exc}) and running it here is predicted to take "
                    f"{ms(expected)} more",
                    expected,
                )
                return
            self.fallbacks += 1
            self._enqueue(job)

    def _drop(self, job: _Job, why: str, more_s: float) -> None:
        """Fail ``job`` with DeadlineExceededError: it cannot make its objective any more; lock
        held."""
        assert self.policy is not None
        self.refused += 1
        self.dropped += 1
        objective = self.policy.latency_slo_ms
        elapsed_ms = job.elapsed_s() * 1e3
        late = elapsed_ms + more_s * 1e3 - objective
        how_late = f"{late:.1f} ms late" if math.isfinite(late) else "how late is unknown"
        job.future.set_exception(
            DeadlineExceededError(
                f"request dropped {elapsed_ms:.1f} ms after submission: it cannot meet its "
                f"{objective:g} ms objective any more ({how_late}): {why}; it was not re-queued "
                "ahead of work that can still make its objective. Slow the request rate, or raise "
                "latency_slo_ms if late answers are of use",
                objective,
                late,
            )
        )
