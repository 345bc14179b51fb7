"""The local latency predictor: how long would a request wait and run if it were queued here now?

Moving averages (EWMA) of recent local service times, kept apart by how a run started:

- **back to back**, right after the previous run ended (the worker was busy: caches warm, the
  CPU at the clock its governor gives a busy core), which is how queued requests will run;
- **after idle** (the first run, or one that found the worker waiting), which on real boards is
  slower: an ondemand governor has lowered the clock and caches have cooled. Measured on this
  project's benchmark host, an isolated request of the offload model took 64 ms against 49 ms
  back to back; counting every queued request at the idle figure predicted queues 30% too long
  and sent work to the cloud that the device would have finished within its objective.

A request's predicted latency is what is left of the running one, plus one service time for
each request ahead of it and for itself, plus a margin for their variation::

    predicted = remaining + service x (waiting + 1) + 2 x deviation x sqrt(runs)

where ``deviation`` is the moving average of back-to-back runs' distance from their average
(TCP's round-trip variance estimate, RFC 6298) and ``runs`` the runs counted. The margin keeps
the objective at the tail: a mean-only prediction admits requests that the slower runs push
past it. The clock is injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["LatencyPredictor"]

#: A run that starts within this long of the previous one's end ran back to back.
BACK_TO_BACK_S = 0.001
#: Deviations added to a prediction (about the 97th percentile of a normal spread).
MARGIN_DEVIATIONS = 2.0


def _average(mean: float | None, sample: float, alpha: float) -> float:
    return sample if mean is None else alpha * sample + (1 - alpha) * mean


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
        self._running_since: float | None = None
        self._running_busy = False
        self._ended_at: float | None = None

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

    def observe(self, service_s: float) -> None:
        """Add one service time measured elsewhere (e.g. a warm-up run, or a cloud round trip)."""
        with self._lock:
            self._add_busy(service_s)

    def _add_busy(self, took: float) -> None:
        if self._busy_s is not None:
            self._deviation_s = _average(self._deviation_s, abs(took - self._busy_s), self._alpha)
        self._busy_s = _average(self._busy_s, took, self._alpha)

    def predict_s(self, waiting: int) -> float:
        """Predicted latency of a request queued behind ``waiting`` others (the running one not counted in it)."""
        with self._lock:
            each = self._busy_s if self._busy_s is not None else self._idle_s
            if each is None:
                return 0.0
            first = self._idle_s if self._idle_s is not None else each  # a run that finds the worker idle
            runs = waiting + 1
            if self._running_since is not None:
                running = self._busy_s if self._running_busy and self._busy_s is not None else first
                remaining = max(running - (self._clock() - self._running_since), 0.0)
                predicted = remaining + each * runs
                runs += 1
            else:
                predicted = first + each * waiting
            return predicted + MARGIN_DEVIATIONS * self._deviation_s * math.sqrt(runs)
