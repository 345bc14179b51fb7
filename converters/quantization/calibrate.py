"""Streaming calibration: one pass over the samples, memory flat in their number.

ONNX Runtime's calibrators keep every intermediate output of every sample until the end,
so their memory grows with the calibration set (7 GB for 32 samples of a 10 MB OCR model).
Here the model, with every float activation added as an output, runs batch by batch, and
each batch only updates running statistics before it is dropped:

* MinMax: running min and max per tensor;
* Entropy and Percentile: a fixed-size histogram per tensor, re-binned when the range
  grows, kept in the format of ONNX Runtime's ``HistogramCollector`` so the threshold
  maths (KL divergence, percentile) is ORT's own.

One pass feeds all three, so the expensive part (inference) is paid once whatever the
number of methods. The result is one ``TensorsData`` per method, saved in ORT's
calibration-cache format, which ``quantize_static(calibration_cache_path=...)`` reads
without calibrating again. Batches come from arrays that may be memory-mapped ``.npy``
files; their pages are released after each batch so they do not pile up in RSS either.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.quantization.config import CalibrationMethod
from edgesdk.converters.quiet import held_output
from edgesdk.errors import ConversionError

__all__ = ["CalibrationResult", "calibrate", "batches", "model_batch_size", "ACTIVATION_BUDGET_BYTES"]

#: Largest total size of the activations of one calibration batch (all tensors together).
ACTIVATION_BUDGET_BYTES = 256 * 2**20
#: Values per tensor and batch that go into the Entropy/Percentile histograms (see ``_strided``).
HISTOGRAM_VALUES = 1 << 16
_FLOAT_TYPES = (1, 10)  # onnx.TensorProto.FLOAT, FLOAT16


@dataclass(frozen=True)
class CalibrationResult:
    """Per-method tensor ranges, each saved as an ORT calibration cache file."""

    caches: Mapping[CalibrationMethod, Path]
    samples: int
    tensors: int
    batch_size: int
    seconds: float


def model_batch_size(model: Any) -> int | None:
    """The fixed batch size of the model's first input, or None when the batch dim is dynamic."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
        return int(dims[0].dim_value)
    return None


def _release_pages(array: np.ndarray) -> None:
    """Drop the resident pages of a memory-mapped array (re-read from the file if touched again)."""
    base: Any = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "_mmap", None) or getattr(base, "base", None)
    if isinstance(base, mmap.mmap) and hasattr(base, "madvise"):
        base.madvise(mmap.MADV_DONTNEED)


def batches(samples: Mapping[str, np.ndarray], batch: int, limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Batches of ``batch`` samples, copied out of the source arrays, up to ``limit`` samples.

    The last batch may be smaller: for a model with a fixed batch size, pass a ``limit``
    that is a multiple of it. Memory-mapped sources give back their pages after each batch.
    """
    n = len(next(iter(samples.values())))
    n = min(n, limit) if limit is not None else n
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        chunk = {k: np.array(v[start:stop]) for k, v in samples.items()}
        for v in samples.values():
            _release_pages(v)
        yield chunk


def _augmented(model: Any) -> tuple[bytes, list[str]]:
    """The model with every float activation (not initializers) as an extra output."""
    import onnx

    model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    infos = {v.name: v for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    initializers = {i.name for i in model.graph.initializer}
    existing = {o.name for o in model.graph.output}
    wanted: list[str] = []
    for node in model.graph.node:
        for name in (*node.input, *node.output):
            info = infos.get(name)
            if (name and name not in initializers and name not in wanted and info is not None
                    and info.type.HasField("tensor_type") and info.type.tensor_type.elem_type in _FLOAT_TYPES):
                wanted.append(name)
    for name in wanted:
        if name not in existing:
            model.graph.output.append(infos[name])
    return model.SerializeToString(), wanted


def _collectors(methods: Sequence[CalibrationMethod], percentile: float, symmetric: bool) -> dict[CalibrationMethod, Any]:
    from onnxruntime.quantization.calibrate import HistogramCollector

    # Bin counts are ORT's defaults for EntropyCalibrater and PercentileCalibrater.
    made = {}
    if CalibrationMethod.ENTROPY in methods:
        made[CalibrationMethod.ENTROPY] = HistogramCollector("entropy", symmetric, 128, 128, percentile, "same")
    if CalibrationMethod.PERCENTILE in methods:
        made[CalibrationMethod.PERCENTILE] = HistogramCollector("percentile", symmetric, 2048, 128, percentile, "same")
    return made


def calibrate(
    model_path: Path,
    samples: Mapping[str, np.ndarray],
    methods: Sequence[CalibrationMethod],
    out_dir: Path,
    *,
    percentile: float = 99.999,
    symmetric: bool = False,
    max_samples: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """One streaming pass over ``samples``; write an ORT calibration cache per method into ``out_dir``."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import CalibrationMethod as OrtMethod
    from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data

    started = time.perf_counter()
    model = onnx.load(str(model_path))
    fixed = model_batch_size(model)
    serialized, tensors = _augmented(model)
    del model
    options = ort.SessionOptions()
    # Basic level only: the extra outputs must keep their names (no fusion may swallow them).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    del serialized
    names = [o.name for o in session.get_outputs()]
    n = len(next(iter(samples.values())))
    total = min(n, max_samples) if max_samples else n
    if fixed is not None and total < fixed:
        raise ConversionError(f"calibration: the model takes batches of exactly {fixed}, got {total} sample(s); "
                              f"give at least {fixed}")

    stats = _Stats(set(tensors), _collectors(methods, percentile, symmetric))
    if fixed is not None:
        total -= total % fixed
    # The first batch (one sample, or the fixed batch) also tells how large one sample's activations are.
    # Later runs are folded in groups of up to ACTIVATION_BUDGET_BYTES: the per-tensor statistics cost
    # Python time per call, so one call per group, not per sample (a fixed-batch-1 model runs one sample at a time).
    first = next(batches(samples, fixed or 1, total))
    per_sample = stats.update([_run(session, names, first)]) / (fixed or 1)
    done = fixed or 1
    group = int(max(1, min(32, ACTIVATION_BUDGET_BYTES // max(per_sample, 1))))
    batch = fixed or group
    pending: list[dict[str, np.ndarray]] = []
    if progress:
        progress(done, total)
    for chunk in batches({k: v[done:] for k, v in samples.items()}, batch, total - done):
        pending.append(_run(session, names, chunk))
        done += len(next(iter(chunk.values())))
        if len(pending) * batch >= group or done == total:
            stats.update(pending)
            pending = []
            if progress:
                progress(done, total)
    lows, highs, collectors = stats.lows, stats.highs, stats.collectors
    if not lows:
        raise ConversionError("calibration: no float activations were seen; the model has nothing to quantize")

    out_dir.mkdir(parents=True, exist_ok=True)
    caches: dict[CalibrationMethod, Path] = {}
    for method in methods:
        if method is CalibrationMethod.MINMAX:
            ranges: dict[str, Any] = {}
            for name in lows:
                lo, hi = np.float32(lows[name]), np.float32(highs[name])
                if symmetric:
                    bound = np.float32(max(abs(lo), abs(hi)))
                    lo, hi = -bound, bound
                ranges[name] = (np.array(lo, np.float32), np.array(hi, np.float32))
            data = TensorsData(OrtMethod.MinMax, ranges)
        else:
            with contextlib.redirect_stdout(sys.stderr), held_output(f"ONNX Runtime's {method.value} calibrator"):
                result = collectors[method].compute_collection_result()
            ort_method = OrtMethod.Entropy if method is CalibrationMethod.ENTROPY else OrtMethod.Percentile
            data = TensorsData(ort_method, {k: tuple(np.asarray(x) for x in v) for k, v in result.items()})
        path = out_dir / f"ranges-{method.value}{'-sym' if symmetric else ''}.json"
        save_tensors_data(data, path)
        caches[method] = path
    return CalibrationResult(caches, done, len(lows), batch, time.perf_counter() - started)


def _run(session: Any, names: list[str], chunk: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        return dict(zip(names, session.run(names, dict(chunk))))
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types
        shapes = {k: v.shape for k, v in chunk.items()}
        raise ConversionError(f"calibration: the model failed on a batch of shape {shapes}: "
                              f"{str(exc).splitlines()[0]}; check the data's shape and preprocessing") from exc


class _Stats:
    """Running min/max and histograms per tensor; a batch's arrays are dropped once folded in."""

    def __init__(self, tensors: set[str], collectors: Mapping[CalibrationMethod, Any]) -> None:
        self.tensors, self.collectors = tensors, collectors
        self.lows: dict[str, np.ndarray] = {}
        self.highs: dict[str, np.ndarray] = {}

    def update(self, runs: list[dict[str, np.ndarray]]) -> int:
        """Fold the outputs of some runs in; return the bytes of their activations."""
        # A scalar activation (a ReduceMean with keepdims=0) has no axis to concatenate runs along.
        seen = {k: (runs[0][k] if len(runs) == 1 else np.concatenate([np.atleast_1d(r[k]) for r in runs]))
                for k in runs[0] if k in self.tensors and runs[0][k].size}
        for name, value in seen.items():
            lo, hi = value.min(), value.max()
            if np.isnan(lo) or np.isnan(hi):
                lo, hi = np.nanmin(value), np.nanmax(value)
            self.lows[name] = np.minimum(self.lows[name], lo) if name in self.lows else lo
            self.highs[name] = np.maximum(self.highs[name], hi) if name in self.highs else hi
        if self.collectors:
            sampled = {k: _strided(v) for k, v in seen.items()}
            for collector in self.collectors.values():
                _fold_histograms(collector, sampled, self.lows, self.highs)
        return sum(v.nbytes for v in seen.values())


def _fold_histograms(collector: Any, values: Mapping[str, np.ndarray], lows: Mapping[str, np.ndarray],
                     highs: Mapping[str, np.ndarray]) -> None:
    """Add a batch to an ORT ``HistogramCollector``'s histograms, keeping its bin count fixed.

    The histograms are kept in the collector's own format, so its ``compute_collection_result``
    (ORT's entropy and percentile maths) reads them as if it had collected them. ORT's own
    ``collect`` widens a histogram at its old bin width when a later batch has a wider range;
    fed batch by batch (the first batch is one sample) that grew to 40,000 bins and made the
    quadratic entropy search take minutes. Here a wider range re-bins the old counts (each at
    its bin's centre) into the same number of bins over the new range.
    """
    absolute = collector.method == "percentile" and collector.symmetric
    for name, value in values.items():
        flat = np.abs(value) if absolute else value
        # The exact running range over every value (the histogram only sees a strided subset).
        lo, hi = np.float32(lows[name]), np.float32(highs[name])
        bound = max(abs(lo), abs(hi))
        old = collector.histogram_dict.get(name)
        bound = max(bound, np.float32(1e-8))
        span = (0.0, float(bound)) if absolute else (-float(bound), float(bound))
        hist, edges = np.histogram(flat, bins=collector.num_bins, range=span)
        if old is not None:
            centres = (old[1][:-1] + old[1][1:]) / 2
            hist = hist + np.histogram(centres, bins=collector.num_bins, range=span,
                                       weights=old[0])[0].astype(hist.dtype)
        edges = edges.astype(np.float32)
        collector.histogram_dict[name] = ((hist, edges, lo, hi) if absolute
                                          else (hist, edges, lo, hi, np.float32(bound)))


def _strided(value: np.ndarray) -> np.ndarray:
    """At most HISTOGRAM_VALUES evenly strided values of a tensor, for its histogram.

    Histogramming every value of every activation was 70% of calibration time (25 M values
    per sample for a 48x320 OCR model). A strided subset keeps the distribution's shape; the
    exact min and max are still taken over all values, and percentile ranges are clipped to them.
    """
    flat = value.reshape(-1)
    step = -(-flat.size // HISTOGRAM_VALUES)
    return flat[::step] if step > 1 else flat
