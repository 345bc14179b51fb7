"""The quantization benchmark's peers, scored on the footing of edgesdk's own variants.

ONNX Runtime's ``quantize_static`` with its defaults and NNCF's ``quantize_with_accuracy_control``
(its own venv, :mod:`benchmarks.converter.nncf_peer`): each counted on the emulated A76 of the
benchmark's board and scored on the same selection and held-out samples as ``convert()``'s
variants. The held-out drop is computed from the emulated board's outputs on the first held-out
samples (:func:`board_reference`, :func:`board_outputs`: ``Emulator.first_output``, one emulated
run per sample), against FP32's board outputs on the same samples; without them, from this
host's outputs, and the row's ``accuracy_basis`` says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.converter.nncf_peer import NncfError, nncf_accuracy_control
from benchmarks.shared.common import log
from benchmarks.shared.models import MODELS
from edgesdk import load_profile
from edgesdk.converters.board.board_latency import board_cost
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.planning.data import EvaluationSplit
from edgesdk.converters.planning.metrics import Metric

__all__ = ["NNCF_METRIC", "board_outputs", "board_reference", "nncf_row", "ort_defaults",
           "peer_row"]

PROFILE = "raspberry-pi-5"
#: name -> (NNCF's metric, whether it comes from nncf_metrics.py, NNCF's max drop in its units).
NNCF_METRIC = {"orientation": ("top1_agreement", None, 0.01),
               "detector": ("detection_agreement", "metric", 1.0),
               "ocr_rec": ("text_agreement", "metric", 1.0),
               "ocr_det": ("text_box_agreement", "metric", 1.0)}


def ort_defaults(src: Path, dst: Path, calibration: np.ndarray, input_name: str) -> Path:
    """Plain onnxruntime.quantization.quantize_static with its defaults, one sample per call."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration[i:i + 1] for i in range(len(calibration)))

        def get_next(self):  # type: ignore[no-untyped-def]
            sample = next(self.samples, None)
            return None if sample is None else {input_name: sample}

    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        quantize_static(str(src), str(dst), Reader())
        logging.disable(logging.NOTSET)
    return dst


def board_outputs(emulator: Emulator, path: Path, samples: np.ndarray,
                   input_name: str) -> np.ndarray:
    """The emulated A76's first output on each sample (a run each, as many at once as cores)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> np.ndarray:
        out = emulator.first_output(path, {input_name: samples[i:i + 1]}, "cortex-a76")
        if out is None:
            raise RuntimeError(f"{path.name}: the emulated board gave no output for sample {i}")
        return out

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return np.concatenate(list(pool.map(one, range(len(samples)))))


def peer_row(path: Path, fp32_ms: float, emulator: Emulator, sample: dict, outputs: np.ndarray,
              reference: np.ndarray, split: EvaluationSplit, metric: Metric,
              board: dict | None) -> dict:
    """A peer's model on our footing: A76 estimate, drops on our selection and held-out samples.

    With ``board`` (FP32's board outputs on the first held-out samples, and those samples), the
    held-out drop is computed from the emulated board's outputs on them (basis ``board``); else
    from this host's (basis ``host``).
    """
    cost = board_cost(emulator, path, sample, load_profile(PROFILE), "latency")
    fusion = cost.counts[0].fusion
    host_held = metric.drop(reference[split.holdout], outputs[split.holdout], None)
    selected = metric.drop(reference[split.selection], outputs[split.selection], None)
    row = {"a76_ms": round(cost.latency_ms, 4),
           "a76_ratio_vs_fp32": round(cost.latency_ms / fp32_ms, 4),
           "selection_drop": round(selected, 4), "holdout_drop": round(host_held, 4),
           "host_holdout_drop": round(host_held, 4), "accuracy_basis": "host",
           "fusion": None if fusion is None else {k: v for k, v in fusion.to_dict().items()
                                                  if k != "op_types"}}
    if board is not None:
        log(f"  {path.name}: board outputs on {len(board['samples'])} held-out samples")
        mine = board_outputs(emulator, path, board["samples"], board["input_name"])
        row.update({"holdout_drop": round(metric.drop(board["fp32"], mine, None), 4),
                    "board_samples": len(mine), "accuracy_basis": "board"})
    return row


def board_reference(emulator: Emulator, fp32_path: Path, evaluation: np.ndarray,
                     split: EvaluationSplit | None, input_name: str, n: int) -> dict | None:
    """FP32's emulated-board outputs on the first ``n`` held-out samples (the peers' reference)."""
    if n <= 0 or split is None or not split.is_split:
        return None
    samples = evaluation[split.holdout[:n]]
    log(f"  FP32: board outputs on {len(samples)} held-out samples (emulated A76)")
    return {"samples": samples, "input_name": input_name,
            "fp32": board_outputs(emulator, fp32_path, samples, input_name)}


def nncf_row(name: str, fixed: Path, work: Path, feeds_cal: dict, evaluation: np.ndarray,
              split: EvaluationSplit, score: Callable[[Path], dict]) -> dict:
    """NNCF's accuracy control on our selection samples, scored by ``score(path)`` as the other
    peers are."""
    spec = MODELS[name]
    metric_name, metric_file, max_drop = NNCF_METRIC[name]
    log(f"{name}: NNCF quantize_with_accuracy_control, max drop {max_drop} {metric_name}, "
        "selection samples")
    os.environ["EDGESDK_NNCF_METRIC"] = metric_name  # read by nncf_metrics.py in NNCF's worker
    try:
        peer = nncf_accuracy_control(
            fixed, feeds_cal, {spec.input_name: evaluation[split.selection]}, None, metric_name,
            max_drop, work / f"{name}-nncf.onnx", timeout_s=3600,
            metric_file=Path(__file__).with_name("nncf_metrics.py") if metric_file else None)
    except NncfError as exc:
        return {"error": str(exc)[-500:]}
    row = score(peer.path)
    row.update({"wall_s": round(peer.wall_s, 1), "restorer_ran": peer.restorer_ran,
                "reverted_operations": len(peer.reverted_operations),
                "nncf_version": peer.nncf_version, "nncf_final_drop": peer.final_drop})
    return row
