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

Each term follows the device's speed now, since a slowdown (throttling, a neighbour) hits every
queued run at once and the requests admitted before the estimate catches up are the ones that
overrun:

- ``service`` is the back-to-back average, or the median of the last ``RECENT_RUNS``
  back-to-back runs when that is higher (the last runs show a slowdown several runs before an
  average with weight ``alpha`` does), or the running run's elapsed time scaled to a
  back-to-back run when that is higher still (a run already longer than the average says the
  device is that slow now); a run that finds the worker idle counts at least that;
- ``remaining`` counts the running run's elapsed time as what it says about the rest: the mean
  of ``r x mean - elapsed`` over the recent runs' shapes ``r`` (each run's time over the
  average before it) longer than ``elapsed``, with ``mean`` today's average: absolute samples
  would say, after a slowdown, that a run is nearly done when half of it is left; and not
  ``max(mean - elapsed, 0)``, which says "done any moment" for every run past the mean.

**The margin grows linearly with the runs summed.** Routing compares the SLO with a tail, not
the mean. Each local request's actual latency (submission to result) is compared with the
expected latency it was admitted on; the residual is divided by ``runs`` (the service times the
estimate sums, the running one included) and kept, with ``runs``, for the last ``RESIDUALS``
requests. The tail of a new prediction over ``n`` runs is::

    predicted = expected + n x max(p99(residual / runs), p99 of the same at n's depth)

Why linear, not ``sqrt(runs)``: errors that are independent from run to run grow with the
square root of the runs, but the slowdowns that matter on a device (thermal throttling,
frequency scaling, a noisy neighbour) hit every queued run together, so their error is
proportional to the work queued. Scaling by ``sqrt(runs)`` learns the per-run spread at the
shallow depths most requests see and extrapolates it to a deep queue as if the runs were
independent: in a probe the margin at 9 queued runs was 15 ms against a 45 ms real excess.
Scaling by ``runs`` is exact for a correlated slowdown and errs on the safe side for independent
noise (by ``sqrt(runs)``, and the SLO bounds how deep an admitted queue is). The depth term
conditions on where deep queues come from: a queue grows when the device is slow, so deep
queues are over-represented in slow spells and their residuals can be larger per run than the
pooled ones; where a depth bucket (runs 1, 2-3, 4-7, 8-15, ...) has ``MIN_BUCKET`` residuals
its own p99 counts too, and the larger of the two sets the margin.

**Before the residuals are enough** (``MIN_RESIDUALS``) the margin is
``2 x deviation x runs``, with the deviation the moving average of runs' distance from the
average of their kind (back to back or after idle). As in TCP's round-trip variance (RFC 6298:
``RTTVAR = R / 2`` on the first sample) the deviation starts at half the first sample, not at 0
(which made the first margins about 5x too small).

**Cold start.** :meth:`LatencyPredictor.seed` gives a prior service time (e.g. the bundle's
measured latency) used, with a deviation of half of it, until the first real run ends; the first
real sample then replaces it. Without a seed, before any run has ended, nothing is known: the
one request that finds the worker idle and the queue empty is predicted 0 (``basis`` ``first``:
it runs locally and teaches the predictor), every other one is predicted infinite (``basis``
``unknown``), so at most one request is admitted on no evidence and a burst at start does not
fill the local queue blind. (A request routed in the microseconds between the worker taking the
first job from the queue and starting it would also see an idle worker.)

**Calibration, out of sample.** :meth:`LatencyPredictor.calibration` reports, over the recent
settled requests, the share that took longer than the tail they were admitted on. Each tail was
computed before its request ran, but the first ``MIN_RESIDUALS`` requests taught the margin
(they were admitted on the deviation or the seed): the goal figure,
``over_tail_after_warmup``, counts only requests admitted on a calibrated margin; about 1% when
a p99 margin holds. ``predicted_p99_ms`` against ``actual_p99_ms`` compares distributions built
from the same residuals (in sample: it can look perfect while the margin is short), and is kept
as a report only. The clock is injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.errors import OffloadError

__all__ = ["LatencyPredictor", "Prediction"]

#: A run that starts within this long of the previous one's end ran back to back.
BACK_TO_BACK_S = 0.001
#: Deviations per run in the margin before the residuals are enough to calibrate it.
MARGIN_DEVIATIONS = 2.0
#: The deviation a first sample (or a seed) starts with, as a share of it (RFC 6298: R / 2).
FIRST_DEVIATION = 0.5
#: The percentile of the residuals added to a prediction (the SLO is a p99 objective).
TAIL_PERCENTILE = 99.0
#: Residuals (and service times) remembered: the last few seconds at the loads offload is for.
RESIDUALS = 500
#: Residuals before their percentile replaces the deviation margin (the warm-up).
MIN_RESIDUALS = 50
#: Residuals at one depth bucket before that bucket's own percentile counts.
MIN_BUCKET = 20
#: Back-to-back runs whose median can raise the service time above its moving average.
RECENT_RUNS = 2


def _average(mean: float | None, sample: float, alpha: float) -> float:
    return sample if mean is None else alpha * sample + (1 - alpha) * mean


def _bucket(runs: int) -> int:
    """Depth bucket of a prediction over ``runs`` service times: 1, 2-3, 4-7, 8-15, ..."""
    return max(runs, 1).bit_length()


@dataclass(frozen=True)
class Prediction:
    """One request's predicted latency (seconds): the expected value and the margin above it."""

    #: remaining + service x (waiting + 1); infinite when nothing is known (``basis`` unknown).
    expected_s: float
    #: The margin that makes ``expected_s`` the tail the SLO is compared with.
    margin_s: float
    #: Service times the expectation sums; 0 when nothing was known (such a prediction teaches
    #: nothing and is not settled).
    runs: int
    #: What the margin rests on: ``residuals`` (calibrated), ``deviation`` (warm-up), ``seed``
    #: (the prior, before any run ended), ``first`` (nothing known: the one request admitted to
    #: learn) or ``unknown`` (nothing known and a request already out to learn it).
    basis: str = "residuals"
    #: When it was made, on the predictor's clock (for ``calibration(since=...)``).
    made_s: float = 0.0

    @property
    def tail_s(self) -> float:
        """What routing compares with the SLO: expected latency plus margin (never below 0)."""
        return max(self.expected_s + self.margin_s, 0.0)


@dataclass(frozen=True)
class _Settled:
    made: float
    expected: float
    runs: int
    tail: float
    actual: float
    calibrated: bool  # admitted on the residuals' margin (after the warm-up)


class LatencyPredictor:
    """Tracks the local worker's service times and predicts a new request's latency (seconds).

    Before any run has ended (and without :meth:`seed`) only a lone request is admitted on no
    evidence: see the module doc.
    """

    def __init__(self, alpha: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha, self._clock = alpha, clock
        self._lock = threading.Lock()
        self._seed_s: float | None = None  # the prior, until the first real sample
        self._busy_s: float | None = None  # back-to-back runs
        self._idle_s: float | None = None  # runs that started after idle
        self._deviation_s = 0.0
        self._recent_busy: deque[float] = deque(maxlen=RECENT_RUNS)
        # Each run's time over the average of its kind before it: the shape of the runs, whatever
        # the device's speed now (a slowdown would make absolute samples understate what is left).
        self._shape_busy: deque[float] = deque(maxlen=RESIDUALS)
        self._shape_idle: deque[float] = deque(maxlen=RESIDUALS)
        self._running_since: float | None = None
        self._running_busy = False
        self._ended_at: float | None = None
        # (actual - expected) / runs, with runs
        self._residuals: deque[tuple[float, int]] = deque(maxlen=RESIDUALS)
        self._scales: dict[int, float] | None = None  # p99 per depth bucket, 0 = pooled; cached
        self._settled: deque[_Settled] = deque(maxlen=RESIDUALS)
        self._settled_count = 0

    @property
    def service_s(self) -> float | None:
        """The moving average of back-to-back service times (of runs after idle until there is
        one; the seed until any run ended), or None."""
        with self._lock:
            return self._known()

    @property
    def idle_service_s(self) -> float | None:
        """The moving average of service times of runs that started after idle, or None."""
        with self._lock:
            return self._idle_s

    @property
    def settled_count(self) -> int:
        """Requests settled so far (a running total: a benchmark's window is a difference)."""
        with self._lock:
            return self._settled_count

    def _known(self) -> float | None:
        if self._busy_s is not None:
            return self._busy_s
        return self._idle_s if self._idle_s is not None else self._seed_s

    def seed(self, service_s: float) -> None:
        """A prior service time (seconds; e.g. the bundle's measured latency), used until the first
        real run ends, with a deviation of half of it. Ignored once a real run has been measured:
        measurements on this device win over a prior."""
        number = isinstance(service_s, (int, float)) and not isinstance(service_s, bool)
        if not number or not math.isfinite(service_s) or service_s <= 0:
            raise OffloadError("latency predictor seed must be a positive finite number of "
                               f"seconds, got {service_s!r}; pass the bundle's measured latency "
                               "in seconds (e.g. latency_ms / 1000)")
        with self._lock:
            if self._busy_s is None and self._idle_s is None:
                self._seed_s = float(service_s)
                self._deviation_s = FIRST_DEVIATION * self._seed_s

    def begin(self) -> None:
        """A local request starts running now."""
        with self._lock:
            now = self._clock()
            self._running_since = now
            ended = self._ended_at
            self._running_busy = ended is not None and now - ended <= BACK_TO_BACK_S

    def end(self, record: bool = True) -> None:
        """The running request finished; ``record`` False (a failed run) leaves the averages."""
        with self._lock:
            started, self._running_since = self._running_since, None
            self._ended_at = self._clock()
            if started is None or not record:
                return
            took = max(self._ended_at - started, 0.0)
            if self._running_busy:
                self._add_busy(took)
            else:
                self._first_sample(took)
                if self._idle_s is not None:  # the spread around its own kind's average
                    spread = abs(took - self._idle_s)
                    self._deviation_s = _average(self._deviation_s, spread, self._alpha)
                self._shape_idle.append(took / self._idle_s if self._idle_s else 1.0)
                self._idle_s = _average(self._idle_s, took, self._alpha)

    def observe(self, service_s: float) -> None:
        """Add one service time measured elsewhere (e.g. a warm-up run), as a back-to-back run."""
        with self._lock:
            self._add_busy(service_s)

    def _first_sample(self, took: float) -> None:
        """The first real sample replaces the seed and starts the deviation at half of it."""
        if self._busy_s is None and self._idle_s is None:
            self._seed_s = None
            self._deviation_s = FIRST_DEVIATION * took

    def _add_busy(self, took: float) -> None:
        self._first_sample(took)
        if self._busy_s is not None:
            self._deviation_s = _average(self._deviation_s, abs(took - self._busy_s), self._alpha)
        self._shape_busy.append(took / self._busy_s if self._busy_s else 1.0)
        self._busy_s = _average(self._busy_s, took, self._alpha)
        self._recent_busy.append(took)

    def _each(self) -> float | None:
        """The service time of a queued run: the average, or the recent runs' median if higher."""
        each = self._known()
        if each is not None and self._busy_s is not None and len(self._recent_busy) == RECENT_RUNS:
            each = max(each, statistics.median(self._recent_busy))
        return each

    def _remaining(self, elapsed: float, mean: float, shape: deque[float]) -> float:
        """Expected time left of a run that has gone on for ``elapsed``, if its kind now takes
        ``mean`` on average (see the module doc)."""
        if mean <= 0:
            return 0.0
        gone = elapsed / mean
        left = [ratio - gone for ratio in shape if ratio > gone]
        if left:
            return mean * sum(left) / len(left)
        if shape:  # longer than every recent run: expect it to end within about one deviation
            return self._deviation_s
        return max(mean - elapsed, 0.0)

    def predict(self, waiting: int) -> Prediction:
        """The prediction for a request queued behind ``waiting`` others (the running one not
        counted in it)."""
        with self._lock:
            now = self._clock()
            each = self._each()
            if each is None:  # nothing known: one lone request learns, nothing queues blind
                if self._running_since is None and waiting == 0:
                    return Prediction(0.0, 0.0, 0, "first", now)
                return Prediction(math.inf, 0.0, 0, "unknown", now)
            first = max(self._idle_s or 0.0, each)  # a run that finds the worker idle
            runs = waiting + 1
            if self._running_since is not None:
                busy = self._running_busy and self._busy_s is not None
                elapsed = now - self._running_since
                shape = self._shape_busy if busy else self._shape_idle or self._shape_busy
                own = each if busy else first  # what a run of the running one's kind takes
                expected = self._remaining(elapsed, own, shape)
                # A run already longer than its kind's average says the device is that slow now.
                expected += max(each, each * elapsed / own if own > 0 else 0.0) * runs
                runs += 1
            else:
                expected = first + each * waiting
            margin, basis = self._margin(runs)
            return Prediction(expected, margin, runs, basis, now)

    def predict_s(self, waiting: int) -> float:
        """The tail latency (seconds) of a request queued behind ``waiting`` others."""
        return self.predict(waiting).tail_s

    def _margin(self, runs: int) -> tuple[float, str]:
        if len(self._residuals) < MIN_RESIDUALS:
            basis = "seed" if self._seed_s is not None else "deviation"
            return MARGIN_DEVIATIONS * self._deviation_s * runs, basis
        if self._scales is None:
            self._scales = _scales(self._residuals)
        pooled = self._scales[0]
        return max(pooled, self._scales.get(_bucket(runs), pooled)) * runs, "residuals"

    def settle(self, prediction: Prediction, actual_s: float) -> None:
        """A request admitted on ``prediction`` took ``actual_s`` from submission to result."""
        if prediction.runs == 0:
            return
        with self._lock:
            residual = (actual_s - prediction.expected_s) / prediction.runs
            self._residuals.append((residual, prediction.runs))
            self._scales = None
            self._settled.append(_Settled(prediction.made_s, prediction.expected_s, prediction.runs,
                                          prediction.tail_s, actual_s,
                                          prediction.basis == "residuals"))
            self._settled_count += 1

    def calibration(self, last: int | None = None,
                    since: float | None = None) -> dict[str, Any] | None:
        """How the predictions held over the last settled requests (``last`` of them; all kept
        when None; with ``since``, only those admitted on a prediction made at or after that time
        on the predictor's clock), in milliseconds; None before any.

        ``over_tail_after_warmup`` is the goal figure: the share of requests admitted on a
        calibrated margin (``requests_after_warmup`` of them; None when there are none) that took
        longer than the tail they were admitted on (1% when the p99 margin holds);
        ``over_predicted_tail`` counts the warm-up requests too. ``predicted_p50_ms`` and
        ``predicted_p99_ms`` spread each request's expected latency by every recent residual at
        its runs (in sample, a report only), ``actual_*`` are what they took. ``margin`` says
        whether the residuals (``calibrated``) or the deviation (``deviation``) set it now.
        """
        with self._lock:
            settled, residuals = list(self._settled), list(self._residuals)
            margin = "calibrated" if len(self._residuals) >= MIN_RESIDUALS else "deviation"
        if last is not None:
            keep = max(last, 0)
            settled = settled[len(settled) - keep:] if keep else []
            residuals = residuals[len(residuals) - keep:] if keep else []
        if since is not None:
            settled = [s for s in settled if s.made >= since]
        if not settled:
            return None
        expected = np.array([s.expected for s in settled])
        runs = np.array([s.runs for s in settled], float)
        actual = np.array([s.actual for s in settled])
        over = actual > np.array([s.tail for s in settled])
        after = np.array([s.calibrated for s in settled])
        scaled = np.array([r for r, _ in residuals], float)
        spread = expected[:, None] + scaled[None, :] * runs[:, None]
        return {"requests": len(settled), "margin": margin,
                "predicted_p50_ms": float(np.percentile(spread, 50) * 1e3),
                "predicted_p99_ms": float(np.percentile(spread, 99) * 1e3),
                "actual_p50_ms": float(np.percentile(actual, 50) * 1e3),
                "actual_p99_ms": float(np.percentile(actual, 99) * 1e3),
                "over_predicted_tail": float(np.mean(over)),
                "requests_after_warmup": int(after.sum()),
                "over_after_warmup": int(over[after].sum()),
                "over_tail_after_warmup": float(np.mean(over[after])) if after.any() else None}


def _scales(residuals: deque[tuple[float, int]]) -> dict[int, float]:
    """The p99 of residual / runs: pooled (key 0) and per depth bucket with enough residuals."""
    scaled = np.array([r for r, _ in residuals], float)
    buckets = np.array([_bucket(n) for _, n in residuals])
    out = {0: float(np.percentile(scaled, TAIL_PERCENTILE))}
    for bucket in np.unique(buckets):
        chosen = scaled[buckets == bucket]
        if len(chosen) >= MIN_BUCKET:
            out[int(bucket)] = float(np.percentile(chosen, TAIL_PERCENTILE))
    return out
