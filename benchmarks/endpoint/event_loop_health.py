"""Health latency beside heavy requests, for benchmarks/endpoint/event_loop.py.

A poller on a keep-alive connection times every ``GET /v2/health/live`` answered while something
else is in flight, and the same for as long with nothing in flight (the host's own latency,
before and after alternating each round). The heavy requests are sent by another process
(:class:`PostingProcess`, pinned like this one): reading an 11 MB answer or sending a 32 MiB body
from a thread here would hold this process's GIL, and the poller would time the client, not the
server."""

from __future__ import annotations

import http.client
import multiprocessing
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LoopCpu", "health_while", "health_beside", "health_during", "percentiles", "post",
           "PostingProcess"]


def _on_cpu(stat: Path) -> int:
    try:
        return int(stat.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


class LoopCpu:
    """CPU seconds the server's event-loop thread has run, from ``/proc/PID/task/TID/schedstat``
    (nanoseconds on CPU). The loop's thread is the one whose CPU time grows most while 200
    health requests are answered (Python does not give its threads' names to the OS).

    Read before and after each health request, it says how much of that request's latency the
    loop spent running (its own work, or a request holding it) rather than waiting for a CPU
    another process held: a figure of the server's, where the host's load distorts wall time. The
    kernel updates the figure at context switches and scheduler ticks, so one sample may include
    up to a tick of CPU run just before the request: an upper bound."""

    def __init__(self, pid: int, port: int) -> None:
        stats = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
        before = {stat: _on_cpu(stat) for stat in stats}
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(200):
                connection.request("GET", "/v2/health/live")
                connection.getresponse().read()
        finally:
            connection.close()
        self._stat = max(stats, key=lambda stat: _on_cpu(stat) - before[stat])

    def seconds(self) -> float:
        """The thread's CPU seconds so far."""
        return int(self._stat.read_text().split()[0]) / 1e9


def health_while(port: int, done: threading.Event, loop: LoopCpu | None = None,
                 loop_cpu: list[float] | None = None) -> list[float]:
    """Seconds of every ``GET /v2/health/live`` answered before ``done`` was set (keep-alive);
    with ``loop``, the loop thread's CPU seconds during each answer go to ``loop_cpu``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    seconds: list[float] = []
    try:
        while not done.is_set():
            cpu = loop.seconds() if loop is not None else 0.0
            started = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                raise RuntimeError(f"health answered {response.status}")
            if not done.is_set():
                seconds.append(elapsed)
                if loop is not None and loop_cpu is not None:
                    loop_cpu.append(loop.seconds() - cpu)
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


def _idle(port: int, seconds: float, loop: LoopCpu | None, loop_cpu: list[float]) -> list[float]:
    """Health seconds for ``seconds`` with nothing else in flight: the host's own latency, for
    context."""
    done = threading.Event()
    timer = threading.Timer(seconds, done.set)
    timer.start()
    try:
        return health_while(port, done, loop, loop_cpu)
    finally:
        timer.cancel()


def _in_flight(port: int, heavy: Any, loop: LoopCpu | None, health: list[float],
               cpu: list[float]) -> float:
    """Poll health while one call of ``heavy()`` is in flight; the call's seconds."""
    done, took = threading.Event(), []

    def run() -> None:
        try:
            started = time.perf_counter()
            heavy()
            took.append(time.perf_counter() - started)
        finally:
            done.set()

    runner = threading.Thread(target=run)
    runner.start()
    health += health_while(port, done, loop, cpu)
    runner.join()
    if not took:
        raise RuntimeError("the heavy request failed (see above)")
    return took[0]


def health_beside(port: int, heavies: dict[str, Any], rounds: int,
                  loop: LoopCpu | None = None) -> dict[str, Any]:
    """Health while each call of each of ``heavies`` is in flight (all of them each round, their
    order rotating), and for as long with nothing in flight (before or after, alternating), in ms
    (:func:`percentiles`); with ``loop``, the loop thread's CPU during each answer too. Per name:
    ``health_ms``, ``loop_cpu_per_health_ms``, the calls' own seconds ``heavy_s``; ``idle``: the
    same with nothing in flight."""
    names = list(heavies)
    raw = {name: ([], [], []) for name in [*names, "idle"]}  # health, cpu, seconds
    for number in range(rounds):
        for name in names[number % len(names):] + names[:number % len(names)]:
            health, cpu, took = raw[name]
            if number % 2:
                _idle_for(port, took[-1] if took else 0.2, loop, raw["idle"])
            took.append(_in_flight(port, heavies[name], loop, health, cpu))
            if not number % 2:
                _idle_for(port, took[-1], loop, raw["idle"])
    out: dict[str, Any] = {}
    for name, (health, cpu, took) in raw.items():
        out[name] = {"health_ms": percentiles(health), "heavy_s": took}
        if loop is not None:
            out[name]["loop_cpu_per_health_ms"] = percentiles(cpu)
    return out


def _idle_for(port: int, seconds: float, loop: LoopCpu | None, idle: Any) -> None:
    idle[0].extend(_idle(port, seconds, loop, idle[1]))


def health_during(
    port: int, heavy: Any, rounds: int, loop: LoopCpu | None = None
) -> dict[str, Any]:
    """:func:`health_beside` for one kind of heavy call: ``health_ms``, ``health_idle_ms``, and
    with ``loop`` ``loop_cpu_per_health_ms`` and ``loop_cpu_per_health_idle_ms``; ``heavy_s``."""
    measured = health_beside(port, {"heavy": heavy}, rounds, loop)
    out = dict(measured["heavy"])
    out["health_idle_ms"] = measured["idle"]["health_ms"]
    if loop is not None:
        out["loop_cpu_per_health_idle_ms"] = measured["idle"]["loop_cpu_per_health_ms"]
    return out


def post(port: int, path: str, body: bytes) -> bytes:
    """One POST on a new connection; the answer's bytes (RuntimeError for a status other than
    200)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"{path} answered {response.status}: {answer[:300]!r}")
    return answer


def _serve_posts(conn: Any) -> None:
    """The posting process: for each (port, path, body file) sent, POST the file's bytes (read once)
    and send back (seconds, answer bytes, error or None)."""
    bodies: dict[str, bytes] = {}
    while True:
        try:
            port, path, body_file = conn.recv()
        except EOFError:
            return
        if body_file not in bodies:
            bodies[body_file] = Path(body_file).read_bytes()
        started = time.perf_counter()
        try:
            size = len(post(port, path, bodies[body_file]))
            conn.send((time.perf_counter() - started, size, None))
        except Exception as exc:  # reported to the parent, which raises it
            conn.send((0.0, 0, repr(exc)))


class PostingProcess:
    """A process that sends heavy POSTs on request (spawned: it inherits this one's CPU
    affinity)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_posts, args=(child,), daemon=True)
        self._process.start()
        child.close()

    def post(self, port: int, path: str, body_file: Path) -> float:
        """POST ``body_file``'s bytes to ``path``; the seconds it took (RuntimeError if it
        failed)."""
        self._conn.send((port, path, str(body_file)))
        seconds, _, error = self._conn.recv()
        if error is not None:
            raise RuntimeError(f"the POST to {path} failed: {error}")
        return float(seconds)

    def close(self) -> None:
        """End the process (it exits when its pipe closes)."""
        self._conn.close()
        self._process.join(timeout=10)
