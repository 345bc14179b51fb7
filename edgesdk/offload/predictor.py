"""The local latency predictor: how long would a request wait and run if it were queued here now?

**The estimate.** Moving averages (EWMA) of recent local service times, kept apart by how a run
started:

- **back to back**, right after the previous run ended (the worker was busy: caches warm, the
  CPU at the clock its governor gives a busy core), which is how queued requests will run;
- **after idle** (the first run, or one that found the worker waiting), which on real boards is
  slower: an ondemand governor has lowered the clock and caches have cooled. Measured on this
  project's benchmark host, an isolated request of the offload model took 64 ms against 49 ms
  back to back; counting every queued request at the idle figure predicted queues 30% too long.

A request's expected latency is what is left of the running request, plus one service time for
each request ahead of it and for itself::

    expected = remaining + service x (waiting + 1)

``remaining`` counts the running request's elapsed time as what it says about the rest: the
mean of ``s - elapsed`` over the recent service times ``s`` longer than ``elapsed`` (a run that
has gone on for a while is, if anything, a long one), not ``max(mean - elapsed, 0)``, which says
"done any moment" for every run past the mean.

**The margin, calibrated.** The routing decision compares the SLO with a tail, not the mean.
Each local request's actual latency (submission to result) is compared with the expected latency
it was admitted on; the residual, scaled by ``sqrt(runs)`` (the service times the estimate sums),
is kept for the last ``RESIDUALS`` requests. The prediction's tail is::

    predicted = expected + p99(residual / sqrt(runs)) x sqrt(runs)

so whatever the estimate misses (service times that vary together, a slower first run, the
hand-off between threads) is measured and added, at the percentile the SLO is about. Until
``MIN_RESIDUALS`` requests have been seen the margin is ``2 x deviation x sqrt(runs)``, with the
deviation the moving average of back-to-back runs' distance from their average (TCP's round-trip
variance estimate, RFC 6298). :meth:`LatencyPredictor.calibration` says how well it holds:
predicted against actual p50 and p99, and the share of requests over their own predicted tail.
The clock is injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LatencyPredictor", "Prediction"]

#: A run that starts within this long of the previous one's end ran back to back.
BACK_TO_BACK_S = 0.001
#: Deviations in the margin before the residuals are enough to calibrate it.
MARGIN_DEVIATIONS = 2.0
#: The percentile of the residuals added to a prediction (the SLO is a p99 objective).
TAIL_PERCENTILE = 99.0
#: Residuals (and service times) remembered: about the last few seconds at the loads offload is for.
RESIDUALS = 500
#: Residuals before their percentile replaces the deviation margin (a p99 of fewer is its maximum).
MIN_RESIDUALS = 50


def _average(mean: float | None, sample: float, alpha: float) -> float:
    return sample if mean is None else alpha * sample + (1 - alpha) * mean


@dataclass(frozen=True)
class Prediction:
    """One request's predicted latency (seconds): the expected value and the calibrated margin above it."""

    #: remaining + service x (waiting + 1).
    expected_s: float
    #: The margin that makes ``expected_s`` the tail the SLO is compared with.
    margin_s: float
    #: Service times the expectation sums; 0 when nothing was known yet (such a prediction teaches nothing).
    runs: int

    @property
    def tail_s(self) -> float:
        """What routing compares with the SLO: the expected latency plus the margin (never below 0)."""
        return max(self.expected_s + self.margin_s, 0.0)


class LatencyPredictor:
    """Tracks the local worker's service times and predicts a new request's latency (seconds).

    With no sample yet the prediction is 0: the first requests run locally and teach it.
    """

    def __init__(self, alpha: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha, self._clock = alpha, clock
        self._lock = threading.Lock()
        self._busy_s: float | None = None  # back-to-back runs
        self._idle_s: float | None = None  # runs that started after idle
        self._deviation_s = 0.0
        self._recent_busy: deque[float] = deque(maxlen=RESIDUALS)
        self._recent_idle: deque[float] = deque(maxlen=RESIDUALS)
        self._running_since: float | None = None
        self._running_busy = False
        self._ended_at: float | None = None
        self._residuals: deque[float] = deque(maxlen=RESIDUALS)  # (actual - expected) / sqrt(runs)
        self._tail_z: float | None = None  # p99 of the residuals, recomputed when they change
        self._settled: deque[tuple[float, int, float, float]] = deque(maxlen=RESIDUALS)  # expected, runs, tail, actual

    @property
    def service_s(self) -> float | None:
        """The moving average of back-to-back service times (of runs after idle until there is one), or None."""
        with self._lock:
            return self._busy_s if self._busy_s is not None else self._idle_s

    @property
    def idle_service_s(self) -> float | None:
        """The moving average of service times of runs that started after idle, or None."""
        with self._lock:
            return self._idle_s

    def begin(self) -> None:
        """A local request starts running now."""
        with self._lock:
            now = self._clock()
            self._running_since = now
            self._running_busy = self._ended_at is not None and now - self._ended_at <= BACK_TO_BACK_S

    def end(self, record: bool = True) -> None:
        """The running request finished; ``record`` False (a failed run) leaves the averages as they were."""
        with self._lock:
            started, self._running_since = self._running_since, None
            self._ended_at = self._clock()
            if started is None or not record:
                return
            took = max(self._ended_at - started, 0.0)
            if self._running_busy:
                self._add_busy(took)
            else:
                self._idle_s = _average(self._idle_s, took, self._alpha)
                self._recent_idle.append(took)

    def observe(self, service_s: float) -> None:
        """Add one service time measured elsewhere (e.g. a warm-up run, or a cloud round trip)."""
        with self._lock:
            self._add_busy(service_s)

    def _add_busy(self, took: float) -> None:
        if self._busy_s is not None:
            self._deviation_s = _average(self._deviation_s, abs(took - self._busy_s), self._alpha)
        self._busy_s = _average(self._busy_s, took, self._alpha)
        self._recent_busy.append(took)

    def _remaining(self, elapsed: float, mean: float, recent: deque[float]) -> float:
        """Expected time left of a run that has gone on for ``elapsed`` (see the module doc)."""
        left = [s - elapsed for s in recent if s > elapsed]
        if left:
            return sum(left) / len(left)
        if recent:  # longer than every recent run: expect it to end within about one deviation
            return self._deviation_s
        return max(mean - elapsed, 0.0)

    def predict(self, waiting: int) -> Prediction:
        """The prediction for a request queued behind ``waiting`` others (the running one not counted in it)."""
        with self._lock:
            each = self._busy_s if self._busy_s is not None else self._idle_s
            if each is None:
                return Prediction(0.0, 0.0, 0)
            first = self._idle_s if self._idle_s is not None else each  # a run that finds the worker idle
            runs = waiting + 1
            if self._running_since is not None:
                busy = self._running_busy and self._busy_s is not None
                elapsed = self._clock() - self._running_since
                expected = self._remaining(elapsed, each if busy else first,
                                           self._recent_busy if busy else self._recent_idle or self._recent_busy)
                expected += each * runs
                runs += 1
            else:
                expected = first + each * waiting
            return Prediction(expected, self._margin(runs), runs)

    def predict_s(self, waiting: int) -> float:
        """The tail latency (seconds) of a request queued behind ``waiting`` others: what routing compares."""
        return self.predict(waiting).tail_s

    def _margin(self, runs: int) -> float:
        if self._tail_z is None and len(self._residuals) >= MIN_RESIDUALS:
            self._tail_z = float(np.percentile(np.fromiter(self._residuals, float), TAIL_PERCENTILE))
        if self._tail_z is None:
            return MARGIN_DEVIATIONS * self._deviation_s * math.sqrt(runs)
        return self._tail_z * math.sqrt(runs)

    def settle(self, prediction: Prediction, actual_s: float) -> None:
        """A request admitted on ``prediction`` took ``actual_s`` from submission to result: keep the residual."""
        if prediction.runs == 0:
            return
        with self._lock:
            self._residuals.append((actual_s - prediction.expected_s) / math.sqrt(prediction.runs))
            self._tail_z = None
            self._settled.append((prediction.expected_s, prediction.runs, prediction.tail_s, actual_s))

    def calibration(self, last: int | None = None) -> dict[str, Any] | None:
        """How well the predictions held over the last settled requests (``last`` of them: all kept when None), in
        milliseconds; None before any.

        ``predicted_p50_ms``/``predicted_p99_ms`` are percentiles of the latency the predictor
        expects for those requests (each request's expected latency plus every recent residual at
        its width); ``actual_*`` of what they took. ``over_predicted_tail`` is the share of requests
        that took longer than the tail they were admitted on (1% when the p99 margin holds).
        ``margin`` says whether the residuals (``calibrated``) or the deviation (``deviation``) set it.
        """
        with self._lock:
            settled, residuals = list(self._settled), np.fromiter(self._residuals, float)
            margin = "calibrated" if len(self._residuals) >= MIN_RESIDUALS else "deviation"
        if last is not None:
            keep = max(last, 0)
            settled, residuals = settled[max(len(settled) - keep, 0):] if keep else [], residuals[max(len(residuals) - keep, 0):]
        if not settled:
            return None
        expected, runs, tail, actual = (np.array(column, float) for column in zip(*settled))
        spread = expected[:, None] + residuals[None, :] * np.sqrt(runs)[:, None]
        return {"requests": len(settled), "margin": margin,
                "predicted_p50_ms": float(np.percentile(spread, 50) * 1e3),
                "predicted_p99_ms": float(np.percentile(spread, 99) * 1e3),
                "actual_p50_ms": float(np.percentile(actual, 50) * 1e3),
                "actual_p99_ms": float(np.percentile(actual, 99) * 1e3),
                "over_predicted_tail": float(np.mean(actual > tail))}
