"""NNCF's accuracy-control row alone, put into a model's results from an earlier ``--partial`` run.

NNCF's accuracy control re-ranks its quantizer groups after every revert; on the OCR recognizer
one ranking takes minutes, so the row can miss its time bound when it shares the host with our
own conversion. This runs it alone, with the data, split and FP32 latency of that earlier run:

    python benchmarks/converter/quantization.py --models ocr_rec --nncf-into DIR

The data are the same (seeded), the split is rebuilt from the saved settings and checked against
the saved sizes, and the FP32 A76 latency is the saved one, so the row's ratio is on the footing
of the variants beside it. The FP32 reference outputs (host and board) come from the fixed-shape
FP32 model NNCF starts from; the row says so in ``reference``.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.converter.quantization_peers import board_reference, nncf_row, peer_row
from benchmarks.shared.common import log
from benchmarks.shared.models import DATA, MODELS, fetch
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.formats.onnx_model import fix_input_shapes, load_onnx, save_onnx
from edgesdk.converters.planning.data import split_evaluation
from edgesdk.converters.planning.metrics import resolve_metric
from edgesdk.converters.quantization.model_runs import run_model

__all__ = ["nncf_into"]


def nncf_into(folder: Path, name: str, work: Path, n_cal: int, n_eval: int, emulator: Emulator,
              board_samples: int) -> dict:
    """Run NNCF's row for ``name`` and write it into ``folder/name.json``; returns the row."""
    path = folder / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no earlier results to add NNCF's row to; run --models {name} "
                         f"--partial {folder} first")
    saved = json.loads(path.read_text())
    spec = MODELS[name]
    held = saved["holdout"]
    split = split_evaluation(n_eval, held["holdout_fraction"], held["holdout_seed"],
                             held["holdout_min"])
    if (len(split.selection), len(split.holdout)) != (held["selection_samples"],
                                                      held["holdout_samples"]):
        raise SystemExit(f"{path}: its split ({held}) is not the one {n_eval} samples give now")
    log(f"{name}: data ({n_cal} calibration, {n_eval} evaluation samples), NNCF's row alone")
    calibration, evaluation = DATA[name](n_cal, 1), DATA[name](n_eval, 2)
    feeds_cal, feeds_eval = {spec.input_name: calibration}, {spec.input_name: evaluation}
    fixed = save_onnx(fix_input_shapes(load_onnx(fetch(name)), {spec.input_name: spec.shape}),
                      work / f"{name}-fixed.onnx")
    reference = run_model(fixed, feeds_eval)[0]
    board = board_reference(emulator, fixed, evaluation, split, spec.input_name, board_samples)
    metric = resolve_metric(spec.metric, None)
    fp32_ms = saved["variants"]["onnx-fp32"]["a76_ms"]
    sample = {spec.input_name: evaluation[:1]}

    def score(model: Path) -> dict:
        outputs = run_model(model, feeds_eval)[0]
        return peer_row(model, fp32_ms, emulator, sample, outputs, reference, split, metric,
                        board)

    # Alone, NNCF gets twice the bound it has inside the full run, where it shares the host.
    row = nncf_row(name, fixed, work, feeds_cal, evaluation, split, score, timeout_s=7200)
    row["reference"] = "fixed-shape FP32 (NNCF's input), run alone (--nncf-into)"
    saved["peers"]["nncf_accuracy_control"] = row
    path.write_text(json.dumps(saved, indent=1))
    return row
