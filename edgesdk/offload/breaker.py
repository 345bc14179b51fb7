"""The circuit breaker in front of the cloud: failures open it, time half-opens it, only the probe closes it.

::

    closed --(breaker_failures consecutive failures)--> open --(reset_s later)--> half_open
    half_open --(the probe succeeds: probe_success)--> closed
    half_open --(the probe fails: probe_failure)--> open

Only a closed breaker :meth:`~CircuitBreaker.allow` s user requests. The half-open probe is
claimed with :meth:`~CircuitBreaker.claim_probe` by whoever sends it out of band (the dispatcher
sends the cloud model one small inference, as Envoy's and Finagle's outlier detection probe
a host), so no user request waits on a cloud that was down.

**Only the probe moves an open breaker.** User requests are sent only while it is closed, so a
user request that ends while it is open or half-open was sent before it opened: a straggler. Its
late success says the cloud answered *then*, not that it answers now, and must not close the
breaker (it would send a burst of work to a cloud that may still be failing); its late failure
is already counted. So :meth:`success` and :meth:`failure` count only while closed, and
:meth:`probe_success` / :meth:`probe_failure` are what half-open listens to. The clock is
injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker", "CLOSED", "OPEN", "HALF_OPEN"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    """Counts consecutive cloud failures and decides whether the next request may try the cloud."""

    def __init__(self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1 or reset_s <= 0:
            raise ValueError(f"failures must be >= 1 and reset_s > 0, got {failures}, {reset_s}")
        self._threshold, self._reset_s, self._clock = failures, reset_s, clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False
        #: Times the breaker opened (from closed or after a failed probe).
        self.opened = 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open`` (open turns half_open once ``reset_s`` has passed)."""
        with self._lock:
            self._tick()
            return self._state

    def _tick(self) -> None:
        if self._state == OPEN and self._clock() - self._opened_at >= self._reset_s:
            self._state, self._probe_out = HALF_OPEN, False

    def allow(self) -> bool:
        """Whether a user request may go to the cloud now: only while closed."""
        with self._lock:
            self._tick()
            return self._state == CLOSED

    def claim_probe(self) -> bool:
        """True once per half-open period: the caller sends the probe and reports it with success() or failure()."""
        with self._lock:
            self._tick()
            if self._state == HALF_OPEN and not self._probe_out:
                self._probe_out = True
                return True
            return False

    def success(self) -> None:
        """A user request succeeded: while closed, forget earlier failures; open or half-open, nothing (a straggler)."""
        with self._lock:
            if self._state == CLOSED:
                self._failures = 0

    def probe_success(self) -> None:
        """The probe succeeded: close the breaker and forget earlier failures."""
        with self._lock:
            self._state, self._failures, self._probe_out = CLOSED, 0, False

    def probe_failure(self) -> None:
        """The probe failed: open (again) for another ``reset_s``."""
        with self._lock:
            self._open()

    def failure(self) -> bool:
        """A user request failed or timed out; returns True when this failure opened the breaker.

        Counted only while closed: open or half-open, it is a straggler sent before the breaker opened.
        """
        with self._lock:
            self._tick()
            if self._state != CLOSED:
                return False
            self._failures += 1
            if self._failures >= self._threshold:
                self._open()
                return True
            return False

    def trip(self) -> None:
        """Open now, whatever the count (the cloud was unreachable at configuration)."""
        with self._lock:
            self._open()

    def _open(self) -> None:
        self._state, self._opened_at, self._probe_out = OPEN, self._clock(), False
        self._failures = 0
        self.opened += 1
