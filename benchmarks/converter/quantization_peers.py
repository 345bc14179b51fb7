"""The quantization benchmark's peers, scored on the footing of edgesdk's own variants.

ONNX Runtime's ``quantize_static`` with its defaults and NNCF's ``quantize_with_accuracy_control``
(its own venv, :mod:`benchmarks.converter.nncf_peer`): each counted on the emulated A76 of the
benchmark's board and scored on the same selection and held-out samples as ``convert()``'s
variants. Their drops are computed from the emulated board's outputs, against FP32's there, on
the rows the converter's own board accuracy uses (``board_accuracy.board_rows``, at most
``MAX_SAMPLES``; :func:`board_reference`, ``board_outputs``: FP32's are then read from the
converter's cache); with no board samples asked, from this host's outputs. The row's
``accuracy_basis`` says which.
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
from edgesdk.converters.board.board_outputs import MAX_SAMPLES, board_outputs
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.planning.data import EvaluationSplit
from edgesdk.converters.planning.metrics import Metric

__all__ = ["MAX_SAMPLES", "NNCF_METRIC", "board_reference", "nncf_row", "ort_defaults", "peer_row"]

PROFILE, CPU = "raspberry-pi-5", "cortex-a76"
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


def _rows(split: EvaluationSplit, max_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation rows the converter's own board accuracy runs on (its ``board_rows``), so the
    peers' board drops are on ours' samples; the held-out rows alone where that is not there."""
    try:
        from edgesdk.converters.board.board_accuracy import board_rows
    except ImportError:
        return split.selection[:0], split.holdout[:max_samples]
    selection, holdout = board_rows(split, max_samples)
    return np.asarray(selection), np.asarray(holdout)


def board_reference(emulator: Emulator, fp32_path: Path, evaluation: np.ndarray,
                    split: EvaluationSplit | None, input_name: str,
                    max_samples: int) -> dict | None:
    """FP32's emulated-A76 outputs on the board-accuracy rows (the peers' reference), or None."""
    if max_samples <= 0 or split is None or not split.is_split:
        return None
    selection, holdout = _rows(split, max_samples)
    rows = np.concatenate([selection, holdout])
    inputs = {input_name: evaluation[rows]}
    log(f"  FP32: board outputs on {len(selection)} selection + {len(holdout)} held-out samples")
    fp32 = board_outputs(emulator, fp32_path, inputs, CPU, max_samples=len(inputs[input_name]))
    return {"inputs": inputs, "rows": rows, "selection": len(selection), "fp32": fp32.outputs}


def peer_row(path: Path, fp32_ms: float, emulator: Emulator, sample: dict, outputs: np.ndarray,
             reference: np.ndarray, split: EvaluationSplit, metric: Metric,
             board: dict | None) -> dict:
    """A peer's model on our footing: A76 estimate, drops on our selection and held-out samples.

    With ``board`` (:func:`board_reference`), its drops are also computed from the emulated A76's
    outputs against FP32's there, on the rows the converter's board accuracy uses, and the
    held-out one is the row's ``holdout_drop`` (basis ``board ...``); else this host's is.
    """
    cost = board_cost(emulator, path, sample, load_profile(PROFILE), "latency")
    fusion = cost.counts[0].fusion
    host_held = metric.drop(reference[split.holdout], outputs[split.holdout], None)
    selected = metric.drop(reference[split.selection], outputs[split.selection], None)
    row = {"a76_ms": round(cost.latency_ms, 4),
           "a76_ratio_vs_fp32": round(cost.latency_ms / fp32_ms, 4),
           "selection_drop": round(selected, 4), "holdout_drop": round(host_held, 4),
           "host_holdout_drop": round(host_held, 4), "accuracy_basis": "this host",
           "fusion": None if fusion is None else {k: v for k, v in fusion.to_dict().items()
                                                  if k != "op_types"}}
    if board is not None:
        count, n = len(board["fp32"]), board["selection"]
        log(f"  {path.name}: board outputs on {count} samples (emulated A76)")
        mine = board_outputs(emulator, path, board["inputs"], CPU, max_samples=count).outputs
        fp32 = board["fp32"]
        held = round(metric.drop(fp32[n:], mine[n:], None), 4)
        row.update({"holdout_drop": held, "board_holdout_drop": held,
                    "board_drop": round(metric.drop(fp32[:n], mine[:n], None), 4) if n else None,
                    "host_board_difference": round(float(np.abs(mine - outputs[board["rows"]])
                                                         .max()), 4),
                    "accuracy_basis": f"board (emulated {CPU}, {count} samples)"})
    return row


def nncf_row(name: str, fixed: Path, work: Path, feeds_cal: dict, evaluation: np.ndarray,
              split: EvaluationSplit, score: Callable[[Path], dict],
              timeout_s: float = 3600) -> dict:
    """NNCF's accuracy control on our selection samples, scored by ``score(path)`` as the other
    peers are; ``timeout_s`` bounds NNCF's run."""
    spec = MODELS[name]
    metric_name, metric_file, max_drop = NNCF_METRIC[name]
    log(f"{name}: NNCF quantize_with_accuracy_control, max drop {max_drop} {metric_name}, "
        "selection samples")
    os.environ["EDGESDK_NNCF_METRIC"] = metric_name  # read by nncf_metrics.py in NNCF's worker
    try:
        peer = nncf_accuracy_control(
            fixed, feeds_cal, {spec.input_name: evaluation[split.selection]}, None, metric_name,
            max_drop, work / f"{name}-nncf.onnx", timeout_s=timeout_s,
            metric_file=Path(__file__).with_name("nncf_metrics.py") if metric_file else None)
    except NncfError as exc:
        return {"error": str(exc)[-500:]}
    row = score(peer.path)
    row.update({"wall_s": round(peer.wall_s, 1), "restorer_ran": peer.restorer_ran,
                "reverted_operations": len(peer.reverted_operations),
                "nncf_version": peer.nncf_version, "nncf_final_drop": peer.final_drop})
    return row
