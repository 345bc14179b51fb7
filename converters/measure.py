"""Measuring a model variant in a separate process with edgesdk's Runtime.

The child process is :mod:`edgesdk.measure_worker`, the same one the device agent runs
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

from edgesdk.errors import BackendError, ConversionError
from edgesdk.measure_worker import adapt_layout, measure_model
from edgesdk.profiles import DeviceProfile

__all__ = ["Measurement", "measure_variant", "adapt_layout"]


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
