"""Measuring a model variant in a separate process with edgesdk's Runtime.

A fresh process per variant keeps the figures clean: its peak RSS is that variant's
alone, and a crashing kernel cannot take the converter down. The worker reports size,
load time, resident memory before and after (the model's share is the difference),
latency on one sample with the thread count the profile's mode would use (capped at
this host's usable cores), and writes its outputs on the evaluation data for the
accuracy comparison, which the parent does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import ConversionError
from edgesdk.profiles import DeviceProfile, profile_to_dict

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


def adapt_layout(arrays: Mapping[str, np.ndarray], specs: Any) -> dict[str, np.ndarray]:
    """Transpose NCHW data to NHWC where a TFLite input (converted by onnx2tf) wants NHWC."""
    adapted = {}
    for spec in specs:
        array = arrays[spec.name]
        wanted = spec.shape
        if array.ndim == 4 and len(wanted) == 4 and not spec.accepts_shape(array.shape):
            nhwc = array.transpose(0, 2, 3, 1)
            if spec.accepts_shape((wanted[0] or nhwc.shape[0], *nhwc.shape[1:])):
                array = np.ascontiguousarray(nhwc)
        adapted[spec.name] = array
    return adapted


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
        eval_path, out_path = Path(tmp) / "eval.npz", Path(tmp) / "out.npy"
        np.savez(eval_path, **evaluation)  # type: ignore[arg-type]
        request = {"model": str(model), "profile": profile_to_dict(profile), "mode": mode, "threads": threads,
                   "evaluation": str(eval_path), "outputs": str(out_path), "runs": runs}
        try:
            done = subprocess.run([sys.executable, "-m", "edgesdk.converters._measure_worker"],
                                  input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"measuring {model.name} took over {timeout_s:.0f} s; the variant is unusable here") \
                from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ConversionError(f"measuring {model.name} failed (exit {done.returncode}): {' | '.join(tail)}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        outputs = np.load(out_path, allow_pickle=False)
    return Measurement(outputs=outputs, **figures)
