"""Running an ONNX model on samples in batches, and how far its outputs are from a reference's.

Shared by the mixed-precision search (:mod:`.search`), the added-error path (:mod:`.added_error`)
and the methods that measure a model on calibration samples; a module of its own so that neither
of those imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesdk.converters.quantization.calibrate import batches

__all__ = ["run_model", "relative_noise"]


def run_model(model: Any, samples: Mapping[str, np.ndarray], threads: int = 0) -> list[np.ndarray]:
    """All outputs of an ONNX model (a ModelProto or a path) on ``samples``, in batches it accepts."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0].shape[0]
    fixed = first if isinstance(first, int) and first > 0 else None
    n = len(next(iter(samples.values())))
    parts: list[list[np.ndarray]] = []
    for chunk in batches(samples, fixed or min(n, 16), n - (n % fixed if fixed else 0)):
        parts.append(session.run(None, chunk))
    return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]


def relative_noise(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
    """Noise power / signal power, per channel (axis 1) and then averaged, summed over outputs.

    Per channel because outputs mix scales: a detector's box coordinates (0-320) would
    drown its class scores (0-1) in one overall ratio, yet flipped scores are what lose
    detections.
    """
    total = 0.0
    for ref, out in zip(reference, outputs):
        ref64, err = ref.astype(np.float64), ref.astype(np.float64) - out
        axes = tuple(i for i in range(ref.ndim) if i != 1) if ref.ndim >= 2 else None
        signal = np.mean(ref64**2, axis=axes)
        noise = np.mean(err**2, axis=axes)
        total += float(np.mean(noise / np.where(signal > 0, signal, 1.0)))
    return total
