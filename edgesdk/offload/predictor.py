"""The local latency predictor: how long would a request wait and run if it were queued here now?

A moving average (EWMA) of recent local service times, times the requests that would be
ahead of it plus itself, plus what is left of the one running::

    predicted = ewma x (waiting + 1) + max(ewma - running_elapsed, 0)

The clock is injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["LatencyPredictor"]


class LatencyPredictor:
    """Tracks the local worker's service times and predicts a new request's latency (seconds).

    With no sample yet the prediction is 0: the first requests run locally and teach it.
    """

    def __init__(self, alpha: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha, self._clock = alpha, clock
        self._lock = threading.Lock()
        self._ewma_s: float | None = None
        self._running_since: float | None = None

    @property
    def service_s(self) -> float | None:
        """The moving average of local service times, or None before the first one."""
        with self._lock:
            return self._ewma_s

    def begin(self) -> None:
        """A local request starts running now."""
        with self._lock:
            self._running_since = self._clock()

    def end(self, record: bool = True) -> None:
        """The running request finished; ``record`` False (a failed run) leaves the average as it was."""
        with self._lock:
            started, self._running_since = self._running_since, None
            if started is None or not record:
                return
            took = max(self._clock() - started, 0.0)
            self._ewma_s = took if self._ewma_s is None else self._alpha * took + (1 - self._alpha) * self._ewma_s

    def observe(self, service_s: float) -> None:
        """Add one service time measured elsewhere (e.g. a warm-up run)."""
        with self._lock:
            self._ewma_s = service_s if self._ewma_s is None else (self._alpha * service_s
                                                                   + (1 - self._alpha) * self._ewma_s)

    def predict_s(self, waiting: int) -> float:
        """Predicted latency of a request queued behind ``waiting`` others (the running one not counted in it)."""
        with self._lock:
            if self._ewma_s is None:
                return 0.0
            remaining = 0.0
            if self._running_since is not None:
                remaining = max(self._ewma_s - (self._clock() - self._running_since), 0.0)
            return self._ewma_s * (waiting + 1) + remaining
