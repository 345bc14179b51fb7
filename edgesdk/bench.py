"""Benchmark a model with :class:`edgesdk.Runtime` on this device (used by ``edgesdk bench``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.memory import peak_rss_mb
from edgesdk.profiles import DeviceProfile
from edgesdk.runtime import Runtime, RuntimeInfo
from edgesdk.tensors import TensorSpec

__all__ = ["BenchResult", "benchmark", "random_inputs"]


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

    def as_dict(self) -> dict[str, Any]:
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
    warmup: int = 10,
    on_progress: Callable[[int], None] | None = None,
) -> BenchResult:
    """Load ``model`` with Runtime, run ``warmup`` then ``runs`` timed predictions on random inputs.

    ``model`` is what :class:`Runtime` takes: a ``.tflite``/``.onnx`` file or a bundle directory
    (whose power mode is the default ``mode``).
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    with Runtime(model, profile=profile, mode=mode, backend=backend, accelerator=accelerator, threads=threads) as rt:
        feeds = random_inputs(rt.inputs)
        for _ in range(warmup):
            rt.predict(feeds)
        latencies = np.empty(runs)
        started = time.perf_counter()
        for i in range(runs):
            t0 = time.perf_counter_ns()
            rt.predict(feeds)
            latencies[i] = (time.perf_counter_ns() - t0) / 1e6
            if on_progress:
                on_progress(1)
        wall = time.perf_counter() - started
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        return BenchResult(
            info=rt.info, runs=runs, warmup=warmup, p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99),
            mean_ms=float(latencies.mean()), min_ms=float(latencies.min()), max_ms=float(latencies.max()),
            throughput_per_s=runs / wall, peak_rss_mb=peak_rss_mb(),
        )
