"""Measuring a model variant in a separate process with edgesdk's Runtime.

The child process is :mod:`edgesdk.runtime.measure_worker`, the same one the device agent runs
for the OTA ``measure`` command, so host and board figures are made the same way. A
fresh process per variant keeps the figures clean: its peak RSS is that variant's alone,
and a crashing kernel cannot take the converter down. It reports size, load time,
resident memory before and after (the model's share is the difference), latency on one
sample with the thread count the profile's mode would use (capped at this host's usable
cores), and its outputs on the evaluation data for the accuracy comparison, which the
parent does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesdk.converters.quiet import held_output
from edgesdk.errors import BackendError, ConversionError
from edgesdk.runtime.measure_worker import measure_model
from edgesdk.runtime.profiles import DeviceProfile
from edgesdk.runtime.tensors import adapt_layout

__all__ = ["Measurement", "measure_variant", "adapt_layout", "latency_ratio"]


@dataclass(frozen=True)
class Measurement:
    """What the worker measured for one variant on this host."""

    size_bytes: int
    sha256: str
    load_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    rss_before_mb: float
    peak_rss_mb: float
    threads: int
    backend: str
    accelerator: str
    outputs: np.ndarray
    #: "this host", or the device id when a board of the fleet measured it (``convert(measure_on=...)``).
    measured_on: str = "this host"
    #: Energy per inference above idle (mJ) the board's power sensor measured, and how; None when none did.
    energy_mj: float | None = None
    energy_basis: str = ""

    @property
    def model_memory_mb(self) -> float:
        """Peak resident memory attributable to the loaded, running model."""
        return max(0.0, self.peak_rss_mb - self.rss_before_mb)


def measure_variant(
    model: Path,
    profile: DeviceProfile,
    mode: str,
    threads: int,
    evaluation: Mapping[str, np.ndarray],
    runs: int = 50,
    timeout_s: float = 600,
) -> Measurement:
    """Run the worker on ``model`` and return its figures and evaluation outputs (first output)."""
    with tempfile.TemporaryDirectory(prefix="edgesdk-measure-") as tmp:
        eval_path = Path(tmp) / "eval.npz"
        np.savez(eval_path, **evaluation)  # type: ignore[arg-type]
        try:
            figures, outputs = measure_model(model, eval_path, profile, mode, runs, threads=threads,
                                             timeout_s=timeout_s)
        except BackendError as exc:
            raise ConversionError(str(exc)) from exc
    return Measurement(
        size_bytes=figures.size_bytes, sha256=figures.sha256, load_ms=figures.load_ms,
        latency_p50_ms=figures.latency_p50_ms, latency_p95_ms=figures.latency_p95_ms,
        rss_before_mb=figures.rss_before_mb, peak_rss_mb=figures.peak_rss_mb, threads=figures.threads,
        backend=figures.backend, accelerator=figures.accelerator,
        outputs=next(iter(outputs.values())).astype(np.float32))


def latency_ratio(model: Path, baseline: Path, profile: DeviceProfile, mode: str, threads: int,
                  sample: Mapping[str, np.ndarray], rounds: int = 9, budget_s: float = 8.0) -> float:
    """Median per-round latency of ``model`` / ``baseline``, timed side by side in this process.

    Variants are first measured one after another, each in its own process, so a busy
    moment of the machine can make any of them look faster than it is. Rounds alternate
    which model runs first (A B, B A, ...) so drift hits both alike.
    """
    import statistics
    import time

    from edgesdk.runtime.runtime import Runtime

    with held_output("timing side by side"), Runtime(model, profile=profile, mode=mode, threads=threads) as a, \
            Runtime(baseline, profile=profile, mode=mode, threads=threads) as b:
        feeds = adapt_layout({k: v[:1] for k, v in sample.items()}, a.inputs)
        base_feeds = adapt_layout({k: v[:1] for k, v in sample.items()}, b.inputs)
        calls = {"a": lambda: a.predict(feeds), "b": lambda: b.predict(base_feeds)}
        for call in calls.values():
            for _ in range(5):
                call()
        started = time.perf_counter()
        calls["b"]()
        per_call = max(time.perf_counter() - started, 1e-5)
        repeat = max(3, min(200, int(budget_s / rounds / 2 / per_call)))
        ratios = []
        for r in range(rounds):
            seconds = {}
            for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
                t0 = time.perf_counter()
                for _ in range(repeat):
                    calls[name]()
                seconds[name] = time.perf_counter() - t0
            ratios.append(seconds["a"] / seconds["b"])
    return float(statistics.median(ratios))
