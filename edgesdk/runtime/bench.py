"""Timing predictions with :class:`edgesdk.Runtime`: the one timed-predict loop and ``edgesdk bench``.

:func:`time_predictions` is the only place latencies are measured: ``edgesdk bench``
(:func:`benchmark`), the converter's measuring child (:mod:`edgesdk.runtime.measure_worker`) and
a bundle's health check (:func:`edgesdk.agent.managed.health_check`) all use it, so they
all follow one warm-up rule: ``warmup`` untimed predictions (default :data:`WARMUP`) on
the same inputs, then ``runs`` timed ones. The first predictions after a load pay for
lazy allocation, kernel selection and cold caches; timing them would mix those into the
percentiles.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.runtime.memory import peak_rss_mb
from edgesdk.runtime.profiles import DeviceProfile
from edgesdk.runtime.runtime import Runtime, RuntimeInfo
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["WARMUP", "Timings", "time_predictions", "BenchResult", "benchmark", "random_inputs"]

#: Untimed predictions before timing starts, everywhere latencies are measured.
WARMUP = 5


@dataclass(frozen=True, eq=False)
class Timings:
    """The latencies of ``runs`` timed predictions (ms, in run order) and the wall time they took."""

    latencies_ms: np.ndarray
    #: Seconds from the first timed prediction to the end of the last (including ``on_progress`` calls).
    wall_s: float

    def percentiles(self, *q: float) -> tuple[float, ...]:
        """The latency percentiles ``q`` (0-100), in ms."""
        return tuple(float(v) for v in np.percentile(self.latencies_ms, q))

    @property
    def median_ms(self) -> float:
        """The median latency, ms."""
        return float(np.median(self.latencies_ms))


def time_predictions(runtime: Runtime, feeds: Any, runs: int, warmup: int = WARMUP,
                     on_progress: Callable[[int], None] | None = None) -> Timings:
    """Run ``warmup`` untimed then ``runs`` timed ``runtime.predict(feeds)`` calls (see the module doc).

    ``on_progress(1)`` is called after each timed prediction. ``runs`` must be >= 1 and
    ``warmup`` >= 0 (ValueError otherwise).
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    for _ in range(warmup):
        runtime.predict(feeds)
    latencies = np.empty(runs)
    started = time.perf_counter()
    for i in range(runs):
        t0 = time.perf_counter_ns()
        runtime.predict(feeds)
        latencies[i] = (time.perf_counter_ns() - t0) / 1e6
        if on_progress:
            on_progress(1)
    return Timings(latencies, time.perf_counter() - started)


@dataclass(frozen=True)
class BenchResult:
    """Latency percentiles (ms), throughput and peak memory of one benchmark run."""

    info: RuntimeInfo
    runs: int
    warmup: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput_per_s: float
    #: Peak resident set size of this process (model + runtime + Python), MiB.
    peak_rss_mb: float
    #: With ``energy=True``: :class:`edgesdk.runtime.energy.EnergyResult` as a dict, or ``{"sensor": None, "note": ...}``
    #: on a board with no power sensor.
    energy: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the figures and the runtime's info (``edgesdk bench --json``)."""
        return {**{k: v for k, v in self.__dict__.items() if k != "info"}, "info": self.info.as_dict()}


def random_inputs(specs: tuple[TensorSpec, ...], seed: int = 0, dynamic_dim: int = 1) -> dict[str, np.ndarray]:
    """Deterministic inputs matching ``specs``; dynamic dims take ``dynamic_dim``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = tuple(dynamic_dim if d is None else d for d in spec.shape)
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype.kind in "iu":
            info = np.iinfo(spec.dtype)
            feeds[spec.name] = rng.integers(max(info.min, -128), min(info.max, 127), shape, endpoint=True).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(spec.dtype)
    return feeds


def benchmark(
    model: str | os.PathLike[str],
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    mode: str | None = None,
    backend: str = "auto",
    accelerator: str = "auto",
    threads: int | None = None,
    runs: int = 100,
    warmup: int = WARMUP,
    on_progress: Callable[[int], None] | None = None,
    energy: bool = False,
    idle_s: float = 20.0,
    rate_hz: float | None = None,
    sysfs_root: str | os.PathLike[str] = "/sys",
) -> BenchResult:
    """Load ``model`` with Runtime and time ``runs`` predictions on random inputs (:func:`time_predictions`).

    ``model`` is what :class:`Runtime` takes: a ``.tflite``/``.onnx`` file or a bundle directory
    (whose power mode is the default ``mode``). With ``energy``, the board's power sensor
    (:func:`edgesdk.runtime.energy.find_sensor`, below ``sysfs_root``) is then sampled through an idle
    baseline of ``idle_s`` seconds with the model loaded and ``runs`` more predictions, back to
    back or at ``rate_hz`` (:func:`edgesdk.runtime.energy.measure_energy`), apart from the timed ones so
    that sampling never touches the latencies. A board with no sensor says so in ``energy``.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    with Runtime(model, profile=profile, mode=mode, backend=backend, accelerator=accelerator, threads=threads) as rt:
        feeds = random_inputs(rt.inputs)
        timings = time_predictions(rt, feeds, runs, warmup, on_progress)
        latencies = timings.latencies_ms
        p50, p95, p99 = timings.percentiles(50, 95, 99)
        measured = _energy(rt, feeds, runs, idle_s, rate_hz, sysfs_root) if energy else None
        return BenchResult(
            info=rt.info, runs=runs, warmup=warmup, p50_ms=p50, p95_ms=p95, p99_ms=p99,
            mean_ms=float(latencies.mean()), min_ms=float(latencies.min()), max_ms=float(latencies.max()),
            throughput_per_s=runs / timings.wall_s, peak_rss_mb=peak_rss_mb(), energy=measured,
        )


def _energy(rt: Runtime, feeds: Any, runs: int, idle_s: float, rate_hz: float | None,
            sysfs_root: str | os.PathLike[str]) -> dict[str, Any]:
    """The board's energy per inference for ``feeds``, or why it cannot be measured here."""
    from edgesdk.runtime.energy import find_sensor, measure_energy

    sensor = find_sensor(rt.profile, sysfs_root)
    if sensor is None:
        return {"sensor": None, "note": f"no power sensor found on {rt.profile.name} (below {sysfs_root}); the "
                                        "converter keeps its power model for this board"}
    return measure_energy(sensor, lambda: rt.predict(feeds), runs, idle_s, rate_hz).as_dict()
