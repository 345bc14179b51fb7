"""Runs NNCF's ``quantize_with_accuracy_control`` on one ONNX model; runs INSIDE the NNCF virtualenv.

Started by :mod:`benchmarks.converter.nncf_peer` (``<nncf venv>/bin/python nncf_worker.py request.json``); it imports
only numpy, onnx, onnxruntime and nncf, never edgesdk. The request is a JSON object:

- ``model``: the FP32 ``.onnx``; ``out``: where the quantized ``.onnx`` goes; ``result``: where
  the JSON result goes (both written atomically, the model before the result).
- ``calibration``, ``validation``: ``.npz`` files of model inputs by input name, axis 0 the
  sample. Each sample becomes one NNCF data item of batch 1 (``x[i:i + 1]``), so the model may
  have a fixed batch of 1, and NNCF can rank quantizers by per-sample metric values.
- ``targets``: ``null`` (the FP32 model's own outputs on the validation inputs, computed here),
  or a ``.npy`` (one array) or ``.npz`` (several, in the order of the ``targets_keys`` list, or
  ``targets_dict: true`` for a dict), axis 0 the sample.
- ``metric``: a name from :data:`METRICS`, or any label when ``metric_file`` names a Python file
  that defines ``validate(session_outputs_list, targets) -> float`` (higher is better, as NNCF
  assumes). ``session_outputs_list`` holds, per sample, the list of the session's output arrays
  (batch 1); ``targets`` is the caller's targets for the same samples in the same order (an
  array, list or dict indexed along axis 0; with ``targets: null``, a list of the FP32 outputs
  in the same per-sample form). ``validate`` may also return ``(value, per_sample_values)``.
- ``max_drop``: absolute, in the metric's own units (0.01 = 1 point of a fraction).
- ``nncf_options`` (optional): ``subset_size`` (default: every calibration sample), ``preset``
  (``performance`` / ``mixed``), ``target_device`` (``ANY``, ``CPU``, ...), ``model_type``
  (``transformer``), ``fast_bias_correction``, and the accuracy restorer's ``max_num_iterations``,
  ``tune_hyperparams``, ``ranking_subset_size``, ``num_ranking_workers``.

Built-in metrics: ``top1_agreement``, the fraction of samples whose argmax over axis 1 of
output 0 equals the target's: an integer target is the label itself, a float target is a
reference output whose argmax is taken (outputs with more axes count the fraction of matching
positions per sample).

The result has the timings (``wall_s`` from the worker's start, ``import_s``, ``quantize_s`` for
the NNCF call alone, ``final_eval_s``), the versions, the metric of the FP32 model, of the fully
quantized one and of the model NNCF returns (measured again here, on every validation sample),
its drop, whether NNCF's restorer had to run, the QuantizeLinear/DequantizeLinear counts, peak
RSS and NNCF's own INFO log lines. Telemetry is off: ``openvino_telemetry`` is never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import resource
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()

import numpy as np  # noqa: E402

__all__ = ["METRICS", "top1_agreement", "slice_targets", "load_metric", "run"]


class PerSample(list):
    """Targets as one entry per sample (the FP32 outputs computed here), not one array per output."""


def _argmax_axis1(array: np.ndarray) -> np.ndarray:
    if array.ndim < 2:
        raise ValueError(f"top1_agreement needs an output with a class axis 1, got shape {array.shape}")
    return np.asarray(array).argmax(axis=1)


def _per_sample_top1(outputs: Sequence[Sequence[np.ndarray]], targets: Any) -> list[float]:
    """1.0/0.0 per sample (the fraction of matching positions for outputs with more than two axes)."""
    if not isinstance(targets, PerSample):
        if isinstance(targets, dict):
            targets = next(iter(targets.values()))
        elif isinstance(targets, (list, tuple)):
            targets = targets[0]
        targets = np.asarray(targets)
    values = []
    for i, sample in enumerate(outputs):
        predicted = _argmax_axis1(np.asarray(sample[0]))[0]
        if isinstance(targets, PerSample):  # the FP32 outputs computed here: output 0 of that sample, batch 1
            target = _argmax_axis1(np.asarray(targets[i][0]))[0]
        elif np.issubdtype(targets.dtype, np.floating):  # a reference output: its class axis is 0 without the batch
            target = targets[i].argmax(axis=0)
        else:
            target = targets[i]  # the label
        values.append(float(np.mean(predicted == target)))
    return values


def top1_agreement(outputs: Sequence[Sequence[np.ndarray]], targets: Any) -> tuple[float, list[float]]:
    """Fraction of samples whose argmax over axis 1 of output 0 matches the label or the reference's argmax."""
    values = _per_sample_top1(outputs, targets)
    return (float(np.mean(values)) if values else 0.0), values


#: name -> fn(session_outputs_list, targets) -> (value, per-sample values or None)
METRICS: dict[str, Callable[[Sequence[Sequence[np.ndarray]], Any], tuple[float, list[float] | None]]] = {
    "top1_agreement": top1_agreement,
}


def slice_targets(targets: Any, indices: Sequence[int]) -> Any:
    """The targets of these samples, in this order: an array, each array of a list/tuple/dict, or a PerSample."""
    if isinstance(targets, PerSample):
        return PerSample(targets[i] for i in indices)
    if isinstance(targets, dict):
        return {k: slice_targets(v, indices) for k, v in targets.items()}
    if isinstance(targets, (list, tuple)):
        return type(targets)(slice_targets(v, indices) for v in targets)
    return np.asarray(targets)[np.asarray(indices, dtype=np.int64)]


def load_metric(metric: str, metric_file: str | None) -> Callable[[Sequence[Sequence[np.ndarray]], Any],
                                                                   tuple[float, list[float] | None]]:
    """The built-in metric ``metric``, or ``validate`` from ``metric_file`` wrapped to return (value, per-sample)."""
    if metric_file is None:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}: built in are {sorted(METRICS)}; pass metric_file for others")
        return METRICS[metric]
    spec = importlib.util.spec_from_file_location(f"_nncf_metric_{Path(metric_file).stem}", metric_file)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import the metric file {metric_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    validate = getattr(module, "validate", None)
    if not callable(validate):
        raise ValueError(f"{metric_file} defines no validate(session_outputs_list, targets) -> float")

    def wrapped(outputs: Sequence[Sequence[np.ndarray]], targets: Any) -> tuple[float, list[float] | None]:
        value = validate(list(outputs), targets)
        if isinstance(value, tuple):
            value, per_sample = value
            return float(value), None if per_sample is None else [float(v) for v in per_sample]
        # Per-sample values from the outputs already computed, as NNCF would ask for them one item at a time.
        per_sample = [float(validate([outputs[i]], slice_targets(targets, [i]))) for i in range(len(outputs))]
        return float(value), per_sample

    return wrapped


def _load_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _load_targets(request: dict) -> Any:
    path = request.get("targets")
    if path is None:
        return None
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    arrays = _load_npz(path)
    if request.get("targets_dict"):
        return arrays
    return [arrays[k] for k in request["targets_keys"]]


def _split(feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    lengths = {len(v) for v in feeds.values()}
    if len(lengths) != 1:
        raise ValueError(f"inputs have different sample counts: { {k: len(v) for k, v in feeds.items()} }")
    (n,) = lengths
    return [{k: v[i:i + 1] for k, v in feeds.items()} for i in range(n)]


class Sessions:
    """onnxruntime sessions for the models NNCF hands the validation function, by content; thread safe."""

    def __init__(self, keep: int = 3) -> None:
        import onnxruntime as ort

        self._ort = ort
        self._keep = keep
        self._cache: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.created = 0

    def get(self, model: Any) -> Any:
        data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
        key = hashlib.sha1(data.encode() if isinstance(data, str) else data).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        session = self._ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        with self._lock:
            self.created += 1
            self._cache[key] = session
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return session


def _quantizer_counts(model: Any) -> dict[str, int]:
    counts = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _nncf_arguments(nncf: Any, options: dict, n_calibration: int) -> tuple[dict, dict]:
    """quantize_with_accuracy_control keyword arguments and AdvancedAccuracyRestorerParameters fields."""
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    options = dict(options)
    kwargs: dict[str, Any] = {"subset_size": int(options.pop("subset_size", n_calibration))}
    if "preset" in options:
        kwargs["preset"] = nncf.QuantizationPreset(options.pop("preset"))
    if "target_device" in options:
        kwargs["target_device"] = nncf.TargetDevice[options.pop("target_device").upper()]
    if "model_type" in options:
        kwargs["model_type"] = nncf.ModelType(options.pop("model_type"))
    if "fast_bias_correction" in options:
        kwargs["fast_bias_correction"] = bool(options.pop("fast_bias_correction"))
    restorer = {k: options.pop(k) for k in ("max_num_iterations", "tune_hyperparams", "ranking_subset_size",
                                            "num_ranking_workers") if k in options}
    if options:
        raise ValueError(f"unknown nncf_options {sorted(options)}")
    if restorer:
        kwargs["advanced_accuracy_restorer_parameters"] = AdvancedAccuracyRestorerParameters(**restorer)
    return kwargs, restorer


def run(request: dict) -> dict:
    """Quantize ``request['model']`` with accuracy control; write the model and return the result dict."""
    sys.modules["openvino_telemetry"] = None  # NNCF then sends no telemetry: it needs this module
    os.environ.setdefault("NNCF_CI", "1")
    import nncf
    import onnx
    import onnxruntime as ort
    from nncf.common.logging import nncf_logger

    import_s = time.perf_counter() - STARTED
    captured = _LogLines()
    nncf_logger.addHandler(captured)

    model = onnx.load(request["model"])
    calibration = _split(_load_npz(request["calibration"]))
    validation = _split(_load_npz(request["validation"]))
    targets = _load_targets(request)
    metric = load_metric(request["metric"], request.get("metric_file"))
    max_drop = float(request["max_drop"])
    sessions = Sessions()

    def outputs_of(model_or_bytes: Any, feeds: Iterable[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        session = sessions.get(model_or_bytes)
        return [session.run(None, f) for f in feeds]

    if targets is None:
        targets = PerSample(outputs_of(model, validation))
    calls: list[dict[str, Any]] = []

    def validation_fn(model_proto: Any, items: Iterable[tuple[int, dict[str, np.ndarray]]]) -> tuple[float, Any]:
        started = time.perf_counter()
        items = list(items)
        indices = [i for i, _ in items]
        outputs = outputs_of(model_proto, (feeds for _, feeds in items))
        value, per_sample = metric(outputs, slice_targets(targets, indices))
        calls.append({"samples": len(items), "value": float(value), "seconds": time.perf_counter() - started})
        return float(value), per_sample

    def transform(item: tuple[int, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return item[1]

    calibration_dataset = nncf.Dataset(calibration)
    validation_dataset = nncf.Dataset(list(enumerate(validation)), transform)
    kwargs, restorer = _nncf_arguments(nncf, request.get("nncf_options") or {}, len(calibration))
    started = time.perf_counter()
    quantized = nncf.quantize_with_accuracy_control(model, calibration_dataset, validation_dataset, validation_fn,
                                                    max_drop=max_drop, drop_type=nncf.DropType.ABSOLUTE, **kwargs)
    quantize_s = time.perf_counter() - started
    full = [c for c in calls if c["samples"] == len(validation)]

    started = time.perf_counter()
    final_bytes = quantized.SerializeToString()
    final_value, _ = metric(outputs_of(final_bytes, validation), targets)
    final_eval_s = time.perf_counter() - started
    out = Path(request["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    partial.write_bytes(final_bytes)
    os.replace(partial, out)

    def logged(prefix: str, fallback: float | None) -> float | None:  # NNCF's own figure, else our count of calls
        found = [line[len(prefix):].strip() for line in captured.lines if line.startswith(prefix)]
        return float(found[0]) if found else fallback

    initial_value = logged("Metric of initial model:", full[0]["value"] if full else None)
    quantized_value = logged("Metric of quantized model:", full[1]["value"] if len(full) > 1 else None)
    reverted = next((line for line in captured.lines if " were reverted back to the floating-point" in line), None)
    total = next((line.rsplit(":", 1)[1].strip() for line in captured.lines
                  if line.startswith("Total number of quantized operations in the model:")), None)
    completed = next((line.split(":", 1)[1].strip() for line in captured.lines
                      if line.startswith("Algorithm completed:")), None)
    counts = _quantizer_counts(quantized)
    return {
        "nncf_version": nncf.__version__, "onnx_version": onnx.__version__, "onnxruntime_version": ort.__version__,
        "numpy_version": np.__version__, "python": platform.python_version(),
        "metric": request["metric"], "metric_file": request.get("metric_file"), "max_drop": max_drop,
        "drop_type": "absolute", "calibration_samples": len(calibration), "validation_samples": len(validation),
        "targets": "fp32_outputs" if request.get("targets") is None else "given",
        "nncf_arguments": {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                           for k, v in kwargs.items() if k != "advanced_accuracy_restorer_parameters"},
        "restorer_parameters": restorer,
        "initial_metric": initial_value, "quantized_metric": quantized_value,
        "quantized_drop": None if initial_value is None or quantized_value is None else initial_value - quantized_value,
        "restorer_ran": initial_value is not None and quantized_value is not None
        and initial_value - quantized_value > max_drop,
        "final_metric": final_value,
        "final_drop": None if initial_value is None else initial_value - final_value,
        "within_bound": None if initial_value is None else initial_value - final_value <= max_drop,
        "quantized_operations": None if total is None else int(total),
        "reverted_operations": [] if reverted is None else [n.strip() for n in reverted.splitlines()[1:] if n.strip()],
        "completed": completed,
        "quantize_linear": counts["QuantizeLinear"], "dequantize_linear": counts["DequantizeLinear"],
        "output_bytes": out.stat().st_size,
        "validation_calls": len(calls), "validation_s": round(sum(c["seconds"] for c in calls), 3),
        "sessions_created": sessions.created,
        "import_s": round(import_s, 3), "quantize_s": round(quantize_s, 3), "final_eval_s": round(final_eval_s, 3),
        "wall_s": round(time.perf_counter() - STARTED, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "nncf_log": captured.lines[-200:],
    }


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: nncf_worker.py REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    result = run(request)
    path = Path(request["result"])
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(result, indent=1))
    os.replace(partial, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
