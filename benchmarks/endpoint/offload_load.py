"""The load of benchmarks/endpoint/offload.py: our endpoint as a process on its own CPU, an open-loop
Poisson generator for a device runtime, and closed-loop tritonclient clients (loopback only,
bounded in count and time).

An open-loop run may change in its middle (:class:`Switch`): the arrival rate from then on (a
step in load) and an action taken at that instant (e.g. the device slowed down). The run keeps
when it started and when it switched on ``time.monotonic``, the latency predictor's clock, so a
predictor's calibration can be read over the run's requests or the ones admitted after the
switch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.ota_server.broker import free_port

# the cloud ------------------------------------------------------------------------------------------

def pin_two_cpus(this: str, other: str) -> tuple[int, int]:
    """The first two CPUs this process may use; pins this process to the first (``this`` names
    its role, ``other`` the second's, for the message). Exits with a message on fewer than two."""
    from benchmarks.shared.common import log

    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        log(f"needs 2 usable CPUs ({this} and {other}); this process may use {usable}")
        sys.exit(1)
    os.sched_setaffinity(0, {usable[0]})
    return usable[0], usable[1]

def _edgesdk_command() -> list[str]:
    script = Path(sys.executable).with_name("edgesdk")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from edgesdk.cli import main; main()"]


class Cloud:
    """``edgesdk server inference`` in a subprocess pinned to ``cpu``, on a free loopback port (and with ``grpc``,
    its gRPC service on another)."""

    def __init__(self, repo: Path, config: Path, cpu: int, log_path: Path, grpc: bool = False) -> None:
        self.repo, self.config, self.cpu, self.log_path = repo, config, cpu, log_path
        self.port = free_port()
        self.grpc_address = f"127.0.0.1:{free_port()}" if grpc else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the endpoint."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> Cloud:
        """Start it and wait for ``/v2/health/ready``."""
        cpu = self.cpu
        command = [*_edgesdk_command(), "server", "inference", "--repo", str(self.repo), "--listen",
                   f"127.0.0.1:{self.port}", "--inference-config", str(self.config), "--threads", "1",
                   *(["--grpc", self.grpc_address] if self.grpc_address else [])]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the endpoint exited ({self.process.returncode}): {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the endpoint was not ready in {timeout_s:.0f} s: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the cloud goes away without a goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()


def path_counts(runtime: Any) -> dict[str, int]:
    """Where ``predict_async`` requests ran so far (``runtime.stats().paths``), refusals and cloud->local fallbacks."""
    stats = runtime.stats()
    # A cloud request that failed counts as a cloud error and then runs locally (``fallbacks``).
    counts = {name: int(path.count - path.errors) for name, path in stats.paths.items()}
    counts.update(refused_total=int(stats.refused), fallbacks=int(stats.fallbacks))
    return counts


# the device -----------------------------------------------------------------------------------------
@dataclass
class OpenLoopRun:
    """One open-loop run: per request, its outcome and latency from scheduled arrival to completion."""

    rate: float
    span_s: float
    latencies_s: list[float]
    refused: int
    failed: int
    unfinished: int
    submitted: int
    max_lag_ms: float
    paths: dict[str, int]
    errors: list[str]
    #: ``time.monotonic()`` when the first arrival was due, and when the switch happened (or None).
    started_mono: float = 0.0
    switched_mono: float | None = None
    #: The first refusals' messages (they say why neither side took the request).
    refusals: list[str] | None = None

    def figures(self, slo_s: float) -> dict[str, Any]:
        """The run's numbers for the JSON (ms, counts, per second)."""
        lat = np.array(self.latencies_s) * 1e3
        completed = len(self.latencies_s)

        def pct(q: float) -> float | None:
            return float(np.percentile(lat, q)) if completed else None

        within = int((lat <= slo_s * 1e3).sum()) if completed else 0
        ran = self.paths.get("local", 0) + self.paths.get("cloud", 0)
        return {"rate_rps": round(self.rate, 2), "submitted": self.submitted, "completed": completed,
                "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99), "goodput_rps": within / self.span_s,
                "within_slo": within, "over_slo": completed - within,
                "share_over_slo": (completed - within) / completed if completed else 0.0,
                "ran_local": self.paths.get("local", 0), "offloaded": self.paths.get("cloud", 0),
                "share_offloaded": self.paths.get("cloud", 0) / ran if ran else 0.0,
                "fallbacks": self.paths.get("fallbacks", 0), "refused": self.refused, "failed": self.failed,
                "unfinished": self.unfinished,
                "generator_max_lag_ms": round(self.max_lag_ms, 3), "errors": self.errors[:3],
                "refusals": (self.refusals or [])[:3]}


@dataclass(frozen=True)
class Switch:
    """A change ``at_s`` seconds into a run: arrivals at ``rate`` from then on (None: unchanged),
    and ``action`` called at that instant (None: nothing)."""

    at_s: float
    rate: float | None = None
    action: Callable[[], None] | None = None


def arrival_times(rate: float, count: int, max_s: float, seed: int,
                  switch: Switch | None = None) -> np.ndarray:
    """Poisson arrival times (s): at most ``count``, within ``max_s``; at ``switch.rate`` after
    ``switch.at_s`` (memoryless: the first gap after the switch starts at the switch)."""
    rng = np.random.default_rng(seed)
    if switch is None or switch.rate is None:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
        return arrivals[arrivals <= max_s]
    before = np.cumsum(rng.exponential(1.0 / rate, count))
    before = before[before < switch.at_s]
    after = switch.at_s + np.cumsum(rng.exponential(1.0 / switch.rate, count))
    joined = np.concatenate([before, after])[:count]
    return joined[joined <= max_s]


def open_loop(runtime: Any, inputs: list[np.ndarray], rate: float, count: int, max_s: float, seed: int,
              drain_s: float, switch: Switch | None = None) -> OpenLoopRun:
    """Poisson arrivals at ``rate``/s: ``count`` requests or ``max_s`` seconds of arrivals,
    whichever is first; with ``switch``, the run changes at ``switch.at_s``."""
    from edgesdk import OverloadedError

    arrivals = arrival_times(rate, count, max_s, seed, switch)
    latencies: list[float] = []
    errors: list[str] = []
    refusals: list[str] = []
    counts = {"refused": 0, "failed": 0, "done": 0}
    lock = threading.Lock()
    all_done = threading.Event()
    submitted = [0]
    lag = [0.0]
    marks: dict[str, float] = {}
    finished_generating = threading.Event()
    before = path_counts(runtime)

    def finished(scheduled: float, future: Future[Any]) -> None:
        now = time.perf_counter()
        exc = future.exception()
        with lock:
            if exc is None:
                latencies.append(now - scheduled)
            elif isinstance(exc, OverloadedError):
                counts["refused"] += 1
            else:
                counts["failed"] += 1
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
            counts["done"] += 1
            if finished_generating.is_set() and counts["done"] >= submitted[0]:
                all_done.set()

    def switch_now(start: float) -> None:
        assert switch is not None
        delay = start + switch.at_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if switch.action is not None:
            switch.action()
        marks["switched"] = time.monotonic()

    def generate() -> None:
        start = time.perf_counter() + 0.02
        marks["started"] = time.monotonic() + 0.02
        for i, at in enumerate(arrivals):
            if switch is not None and "switched" not in marks and at >= switch.at_s:
                switch_now(start)
            scheduled = start + float(at)
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                lag[0] = max(lag[0], -delay)
            try:
                future = runtime.predict_async(inputs[i % len(inputs)])
            except OverloadedError as exc:
                with lock:
                    counts["refused"] += 1
                    if len(refusals) < 3:
                        refusals.append(str(exc)[:300])
                continue
            with lock:
                submitted[0] += 1
            future.add_done_callback(lambda f, s=scheduled: finished(s, f))
        with lock:
            finished_generating.set()
            if counts["done"] >= submitted[0]:
                all_done.set()

    generator = threading.Thread(target=generate, name="poisson-generator", daemon=True)
    generator.start()
    generator.join(max_s + drain_s)
    all_done.wait(max(0.0, drain_s))
    after = path_counts(runtime)
    with lock:
        unfinished = submitted[0] - counts["done"]
        # Refused at submission: no future (OverloadedError raised by predict_async); "submitted" counts futures.
        return OpenLoopRun(rate, float(arrivals[-1]) if len(arrivals) else max_s, list(latencies), counts["refused"],
                           counts["failed"], unfinished, submitted[0], lag[0] * 1e3,
                           {k: after.get(k, 0) - before.get(k, 0) for k in after}, list(errors),
                           marks.get("started", 0.0), marks.get("switched"), list(refusals))


# tritonclient ----------------------------------------------------------------------------------------
def triton_infer(url: str, model: str, output: str, input_name: str = "x") -> Callable[[np.ndarray, bool], Any]:
    """A function sending one tensor (``input_name``) to ``model`` with tritonclient (one client per caller)."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"), connection_timeout=30.0, network_timeout=30.0)

    def call(x: np.ndarray, binary: bool) -> Any:
        tensor = triton.InferInput(input_name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput(output, binary_data=binary)])
        return result.as_numpy(output)

    return call


def triton_throughput(url: str, model: str, output: str, x: np.ndarray, clients: int, seconds: float,
                      max_requests: int, input_name: str = "x") -> dict[str, Any]:
    """``clients`` threads, each a closed loop of binary requests, for ``seconds`` or ``max_requests`` in all.

    Each thread makes and warms up its own client (tritonclient's gevent-based HTTP client may not cross threads).
    """
    done = [0] * clients
    failed = [0] * clients
    errors: list[str] = []
    ready = threading.Barrier(clients + 1)
    per_client = max(1, max_requests // clients)
    window: dict[str, float] = {}

    def loop(i: int) -> None:
        call = triton_infer(url, model, output, input_name)
        call(x, True)
        ready.wait()
        while time.perf_counter() < window["stop"] and done[i] < per_client:
            try:
                call(x, True)
                done[i] += 1
            except Exception as exc:  # counted; the figure is completed requests
                failed[i] += 1
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    window["stop"] = time.perf_counter() + 60 + seconds  # until every client is ready
    ready.wait(60)
    started, cpu_started = time.perf_counter(), time.process_time()
    window["stop"] = started + seconds
    for t in threads:
        t.join(seconds + 60)
    elapsed = time.perf_counter() - started
    # The clients' own CPU (this process) per second: near 1.0 on one CPU means the clients, not the server, set the pace.
    client_cpu = (time.process_time() - cpu_started) / elapsed
    return {"requests": sum(done), "failed": sum(failed), "seconds": elapsed, "throughput_rps": sum(done) / elapsed,
            "client_cpu_per_s": round(client_cpu, 3), "errors": sorted(set(errors))[:3]}
