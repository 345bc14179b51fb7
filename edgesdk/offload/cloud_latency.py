"""The cloud's latency as a prediction: will a request sent to the endpoint now be answered in time?

**What is measured.** The round trip of every cloud inference, sent to answered, on the
dispatcher's clock: user requests and the out-of-band probe's small inference alike (the probe
is what measures a cloud no user request is sent to). A request that timed out says only that
the round trip was longer than its timeout: it is kept as *censored*, counted as infinitely slow
(it missed whatever objective it had), never as the time it happened to give up at.

**The prediction.** The tail the objective is about: the p99 of the round trips of the last
``CLOUD_HORIZON_S`` seconds (the newest one always kept), taken as the next-higher sample (no
interpolation, so a censored sample is never averaged into a finite figure; with few samples
the p99 is their maximum). The cloud is served by many requests at once, so the requests in
flight are not a queue to add up (as the local worker's are); what they say is a lower bound:
a request in flight for ``e`` seconds shows the round trip now is at least ``e``. So::

    tail = max(p99(recent round trips), oldest request in flight's elapsed time)

A cloud that slows down shows it through its requests in flight before any of them ends, and
one that recovers is believed once its slow samples leave the horizon (the probe re-measures a
cloud judged too slow every ``breaker_reset_s``; see :mod:`edgesdk.offload.dispatcher`).

**Unknown.** With no sample in the horizon and nothing in flight the prediction is None: the
dispatcher measures before it trusts (see its module doc).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

import numpy as np

__all__ = ["CloudLatency", "CloudPrediction", "CLOUD_HORIZON_S"]

#: Seconds a round trip counts for the prediction (the newest is kept however old).
CLOUD_HORIZON_S = 30.0
#: Round trips kept at most within the horizon.
CLOUD_SAMPLES = 500
#: The percentile of the round trips the objective is compared with (the SLO is a p99 objective).
CLOUD_PERCENTILE = 99.0


@dataclass(frozen=True)
class CloudPrediction:
    """The cloud's predicted round trip (seconds) and what it rests on."""

    #: The predicted tail; None when nothing is known (no sample in the horizon, nothing in flight).
    tail_s: float | None
    #: Round trips in the horizon (censored ones included).
    samples: int
    #: Requests in flight now, and how long the oldest of them has been out (0 with none).
    inflight: int
    oldest_inflight_s: float

    def describe(self) -> str:
        """``cloud predicted 12.3 ms (p99 of 40 round trips, 2 in flight)``, or why it is not known.
        """
        if self.tail_s is None:
            return "cloud latency not measured yet"
        shown = "over its timeout" if math.isinf(self.tail_s) else f"{self.tail_s * 1e3:.1f} ms"
        return (f"cloud predicted {shown} (p99 of {self.samples} round trips, "
                f"{self.inflight} in flight)")


class CloudLatency:
    """Round trips to the cloud and the requests in flight; :meth:`predict` says the tail a new
    request would see."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, horizon_s: float = CLOUD_HORIZON_S
    ) -> None:
        self._clock, self._horizon_s = clock, horizon_s
        self._lock = threading.Lock()
        # (when, seconds; inf: censored)
        self._samples: deque[tuple[float, float]] = deque(maxlen=CLOUD_SAMPLES)
        self._tail: float | None = None  # p99 of the samples, recomputed when they change
        self._inflight: dict[int, float] = {}
        self._tokens = count()
        self._measured_at: float | None = None

    def begin(self) -> int:
        """A cloud request is sent now; returns the token to :meth:`end` it with."""
        with self._lock:
            token = next(self._tokens)
            self._inflight[token] = self._clock()
            return token

    def end(self, token: int, answered: bool) -> float:
        """The request ``token`` ended: ``answered`` keeps its round trip; a request that failed at
        once (refused,
        reset) says nothing about the latency and is only no longer in flight. Returns its round
        trip."""
        with self._lock:
            started = self._inflight.pop(token, None)
            took = max(self._clock() - started, 0.0) if started is not None else 0.0
            if answered:
                self._add(took)
            return took

    def end_censored(self, token: int) -> float:
        """The request ``token`` timed out: its round trip is longer than anyone waited (kept as
        infinite)."""
        with self._lock:
            started = self._inflight.pop(token, None)
            self._add(math.inf)
            return max(self._clock() - started, 0.0) if started is not None else 0.0

    def observe(self, round_trip_s: float) -> None:
        """Add one round trip measured elsewhere (math.inf: one that timed out)."""
        with self._lock:
            self._add(round_trip_s)

    def _add(self, took: float) -> None:
        now = self._clock()
        self._samples.append((now, took))
        self._measured_at = now
        self._tail = None

    @property
    def measured_at(self) -> float | None:
        """When the newest round trip ended (the dispatcher's clock), or None before any."""
        with self._lock:
            return self._measured_at

    def _recent(self, now: float) -> None:
        while len(self._samples) > 1 and now - self._samples[0][0] > self._horizon_s:
            self._samples.popleft()
            self._tail = None

    def predict(self) -> CloudPrediction:
        """The tail a request sent now would see (see the module doc)."""
        with self._lock:
            now = self._clock()
            self._recent(now)
            if self._tail is None and self._samples:
                values = np.fromiter((took for _, took in self._samples), float)
                self._tail = float(np.percentile(values, CLOUD_PERCENTILE, method="higher"))
            oldest = max((now - since for since in self._inflight.values()), default=0.0)
            tail = self._tail
            if tail is None and not self._inflight:
                return CloudPrediction(None, 0, 0, 0.0)
            return CloudPrediction(
                max(tail or 0.0, oldest), len(self._samples), len(self._inflight), oldest
            )
