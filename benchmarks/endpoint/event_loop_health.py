"""Health latency beside heavy requests, for benchmarks/endpoint/event_loop.py.

A poller on a keep-alive connection times every ``GET /v2/health/live`` answered while something
else is in flight, and the same for as long with nothing in flight (the host's own latency,
before and after alternating each round)."""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from typing import Any

import numpy as np

__all__ = ["health_while", "health_during", "percentiles"]


def health_while(port: int, done: threading.Event) -> list[float]:
    """Seconds of every ``GET /v2/health/live`` answered before ``done`` was set (keep-alive)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    seconds: list[float] = []
    try:
        while not done.is_set():
            started = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"health answered {response.status}")
            if not done.is_set():
                seconds.append(time.perf_counter() - started)
    finally:
        connection.close()
    return seconds


def percentiles(seconds: list[float]) -> dict[str, float | int]:
    """Answers, p50, p99 and max in ms (only the count when there were none: no evidence)."""
    if not seconds:
        return {"answers": 0}
    return {
        "answers": len(seconds),
        "p50": statistics.median(seconds) * 1e3,
        "p99": float(np.percentile(seconds, 99)) * 1e3,
        "max": max(seconds) * 1e3,
    }


def _idle(port: int, seconds: float) -> list[float]:
    """Health seconds for ``seconds`` with nothing else in flight: the host's own latency, for
    context."""
    done = threading.Event()
    timer = threading.Timer(seconds, done.set)
    timer.start()
    try:
        return health_while(port, done)
    finally:
        timer.cancel()


def health_during(
    port: int, heavy: Any, rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Health seconds while each of ``rounds`` calls of ``heavy()`` is in flight, health seconds
    for as long
    with nothing in flight (before or after, alternating each round), and the calls' own seconds."""
    health: list[float] = []
    idle: list[float] = []
    heavy_s: list[float] = []
    for number in range(rounds):
        if number % 2:
            idle += _idle(port, heavy_s[-1] if heavy_s else 0.2)
        done = threading.Event()

        def run(done: threading.Event = done) -> None:
            try:
                started = time.perf_counter()
                heavy()
                heavy_s.append(time.perf_counter() - started)
            finally:
                done.set()

        runner = threading.Thread(target=run)
        runner.start()
        health += health_while(port, done)
        runner.join()
        if not number % 2:
            idle += _idle(port, heavy_s[-1] if heavy_s else 0.2)
    return health, idle, heavy_s
