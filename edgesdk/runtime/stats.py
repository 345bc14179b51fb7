"""Request counters and sliding-window latency percentiles for a runtime."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgesdk.runtime.latency_histogram import N_BUCKETS

__all__ = ["LatencyStats", "StatsSnapshot"]


@dataclass(frozen=True)
class StatsSnapshot:
    """Counts since start and latency percentiles (milliseconds) over the last ``window`` calls.

    The overall fields count inferences run on this device's model (``predict`` and the local
    runs of ``predict_async``), with the model's own run time, as they always have; ``paths``
    tells where ``predict_async`` requests ran.
    """

    #: Calls since start, failed ones included.
    count: int
    #: Failed calls since start.
    errors: int
    #: Successful calls the percentiles cover (at most the recorder's window); 0 makes the figures None.
    window: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    #: Where ``predict_async`` requests ran: ``local`` and ``cloud``, each with its count, errors and end-to-end
    #: latency (submission to result, queueing included); empty when predict_async was never used.
    paths: dict[str, StatsSnapshot] = field(default_factory=dict)
    #: predict_async requests refused with OverloadedError (local queue and cloud both full).
    refused: int = 0
    #: Cloud requests that failed or timed out and were then run locally.
    fallbacks: int = 0
    #: The offload circuit breaker: ``closed``, ``open``, ``half_open``, ``disabled`` (a configuration error);
    #: None without an offload policy.
    breaker: str | None = None
    #: How the offload latency predictor's predictions held over recent local requests (milliseconds: predicted and
    #: actual p50 and p99, the share over their predicted tail; see LatencyPredictor.calibration); None before any.
    calibration: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, ready for JSON (``paths`` as nested dicts)."""
        paths = {name: {k: v for k, v in path.__dict__.items() if k in _PATH_FIELDS} for name, path in self.paths.items()}
        return {**self.__dict__, "paths": paths}


_PATH_FIELDS = ("count", "errors", "window", "p50_ms", "p95_ms", "p99_ms", "mean_ms")


class LatencyStats:
    """Thread-safe recorder; ``record`` is O(1), percentiles are computed on ``snapshot``.

    Besides the window of the last ``window`` latencies it keeps a cumulative log-bucket
    histogram of every successful call's latency (:mod:`edgesdk.runtime.latency_histogram`),
    read with the counts by :meth:`counters`: the difference of two readings is what the
    runtime served in between, which is how an app's traffic reaches the device agent.
    """

    def __init__(self, window: int = 1000) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._lock = threading.Lock()
        self._latencies_ns: deque[int] = deque(maxlen=window)
        self._count = 0
        self._errors = 0
        self._buckets = [0] * N_BUCKETS

    def record(self, latency_ns: int) -> None:
        """Count a successful call that took ``latency_ns`` nanoseconds."""
        # latency_histogram.bucket_of, inlined: this runs on every prediction.
        if latency_ns < 8:
            index = latency_ns if latency_ns > 0 else 0
        else:
            b = latency_ns.bit_length()
            index = (b - 3) * 8 + ((latency_ns >> (b - 4)) & 7)
            if index >= N_BUCKETS:
                index = N_BUCKETS - 1
        with self._lock:
            self._count += 1
            self._latencies_ns.append(latency_ns)
            self._buckets[index] += 1

    def record_error(self) -> None:
        """Count a failed call; it adds no latency sample."""
        with self._lock:
            self._count += 1
            self._errors += 1

    def counters(self) -> tuple[int, int, list[int]]:
        """Calls and failed calls so far and a copy of the latency histogram (a count per bucket),
        read at once."""
        with self._lock:
            return self._count, self._errors, self._buckets.copy()

    def snapshot(self) -> StatsSnapshot:
        """The counts so far and percentiles over the last ``window`` successful calls (O(window))."""
        with self._lock:
            samples = np.fromiter(self._latencies_ns, dtype=np.float64, count=len(self._latencies_ns))
            count, errors = self._count, self._errors
        if samples.size == 0:
            return StatsSnapshot(count, errors, 0, None, None, None, None)
        p50, p95, p99 = np.percentile(samples, [50, 95, 99]) / 1e6
        return StatsSnapshot(count, errors, int(samples.size), float(p50), float(p95), float(p99), float(samples.mean() / 1e6))
