"""The mixed-precision search's two rules side by side on real models, on this host (issue 59).

Per model (benchmarks/shared/models.py): the FP32 model at its fixed shape, static INT8
with the project's own calibration and quantizer (``QuantizationConfig.arm64()``, the
calibration method with the lowest selection drop), then

* **own sensitivity** (the rule before issue 59): each block's error with only it quantized,
  blocks floated in that order per MAC (``search.search_mixed``);
* **added error**: each block's (or unit's) recovery in the current model, greedy per MAC share,
  re-measured lazily (:mod:`edgesdk.converters.quantization.added_error`, ``search_path``).

Both score blocks on the first ``--samples`` calibration samples (never evaluation data) and
measure at most 12 candidates on the evaluation samples (30% held out, as in
quantization.py). A candidate's cost here is the share of the model's MACs left in float (no
board, no emulation: the search's choice, not its latency, is what this compares).

    python benchmarks/converter/mixed_search.py [--models ocr_rec detector] [--samples 16]
                                                [--budget 2400]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.shared.common import log  # noqa: E402
from benchmarks.shared.models import DATA, MODELS, fetch  # noqa: E402
from edgesdk.converters.formats import onnx_model  # noqa: E402
from edgesdk.converters.planning.data import split_evaluation  # noqa: E402
from edgesdk.converters.planning.metrics import resolve_metric  # noqa: E402
from edgesdk.converters.quantization import model_runs, search  # noqa: E402
from edgesdk.converters.quantization.added_error import added_error_path  # noqa: E402
from edgesdk.converters.quantization.calibrate import calibrate  # noqa: E402
from edgesdk.converters.quantization.config import QuantizationConfig  # noqa: E402
from edgesdk.converters.quantization.qdq import QdqGraph  # noqa: E402
from edgesdk.converters.quantization.quantize import quantize_static_int8  # noqa: E402

BOUND, CANDIDATES, HOLDOUT = 1.0, 12, 0.3
EVAL = {"detector": 200, "ocr_rec": 128, "orientation": 128}


def static_int8(name: str, work: Path) -> dict[str, Any]:
    """FP32 at its fixed shape, data, and the most accurate static INT8 on the selection samples."""
    spec = MODELS[name]
    fixed = onnx_model.fix_input_shapes(onnx_model.load_onnx(fetch(name)),
                                        {spec.input_name: spec.shape})
    fp32 = onnx_model.save_onnx(onnx_model.simplify(fixed), work / "fp32.onnx")
    data = DATA[name]
    calibration, evaluation = data(128, 1), data(EVAL[name], 2)
    # orientation's data comes with labels: the rules compare with FP32, so they are dropped
    calibration, evaluation = (x[0] if isinstance(x, tuple) else x
                               for x in (calibration, evaluation))
    split = split_evaluation(len(evaluation), HOLDOUT)
    config = QuantizationConfig.arm64()
    ranges = calibrate(fp32, {spec.input_name: calibration}, config.calibration_methods,
                       work / "ranges", percentile=config.percentile,
                       symmetric=bool(config.activation_symmetric))
    metric = resolve_metric(spec.metric, None)
    reference = model_runs.run_model(fp32, {spec.input_name: evaluation})[0]
    best = None
    for method in config.calibration_methods:
        path = quantize_static_int8(fp32, work / f"int8-{method.value}.onnx", ranges.caches[method],
                                    config, method)
        out = model_runs.run_model(path, {spec.input_name: evaluation})[0]
        drop = metric.drop(reference[split.selection], out[split.selection], None)
        if best is None or drop < best[0]:
            held = metric.drop(reference[split.holdout], out[split.holdout], None)
            best = (drop, held, method.value, path)
    assert best is not None
    return {"fp32": fp32, "int8": best[3], "method": best[2], "selection_drop": best[0],
            "holdout_drop": best[1], "calibration": calibration, "evaluation": evaluation,
            "reference": reference, "split": split, "metric": metric, "input": spec.input_name}


def compare(name: str, work: Path, samples: int, budget: float) -> dict[str, Any]:
    """Both rules on one model; every measured candidate with its drops and float MAC share."""
    base = static_int8(name, work)
    graph = QdqGraph(base["int8"], base["fp32"])
    total = sum(b.macs for b in graph.blocks)
    split, metric, ref, key = base["split"], base["metric"], base["reference"], base["input"]
    sample = {key: base["calibration"][:samples]}
    held: dict[str, float] = {}

    def measure(label: str, path: Path, nodes: tuple[str, ...]) -> tuple[float, float]:
        out = model_runs.run_model(path, {key: base["evaluation"]})[0]
        held[label] = metric.drop(ref[split.holdout], out[split.holdout], None)
        names = set(nodes)
        share = sum(b.macs for b in graph.blocks if set(graph.node_names([b])) <= names) / total
        return metric.drop(ref[split.selection], out[split.selection], None), share

    def score(reference: Any, outputs: Any) -> float:
        return metric.drop(reference[0], outputs[0], None)

    static = {"method": base["method"], "selection_drop": round(base["selection_drop"], 3),
              "holdout_drop": round(base["holdout_drop"], 3)}
    rows: dict[str, Any] = {"blocks": len(graph.blocks), "mmacs": round(total / 1e6, 1),
                            "static_int8": static}
    log(f"{name}: {len(graph.blocks)} blocks; own-sensitivity rule")
    started = time.perf_counter()
    sensitivities = search.block_sensitivity(graph, base["fp32"], sample, score=score,
                                             budget_s=budget)
    old = search.search_mixed(graph, sensitivities, work / "old", measure, BOUND, 1.0 + 1e-9,
                              CANDIDATES)
    rows["own_sensitivity"] = _row(old, held, time.perf_counter() - started)
    log(f"{name}: added-error rule")
    started = time.perf_counter()
    path = added_error_path(graph, base["fp32"], sample, score, stop_drop=0.25 * BOUND,
                            budget_s=budget)
    new = search.search_path(graph, path, work / "new", measure, BOUND, 1.0 + 1e-9, CANDIDATES)
    rows["added_error"] = {**_row(new, held, time.perf_counter() - started),
                           "path_seconds": round(path.seconds, 1), "path_runs": path.evaluations,
                           "path": [s.to_dict() for s in path.steps]}
    return rows


def _row(result: search.SearchResult, held: dict[str, float], seconds: float) -> dict[str, Any]:
    front = [{"label": p.label, "float_blocks": len(p.float_blocks),
              "float_macs": round(p.latency_ms, 4), "selection_drop": round(p.accuracy_drop, 3),
              "holdout_drop": round(held[p.label], 3), "why": p.why} for p in result.front]
    within = [f for f in front if f["selection_drop"] <= BOUND]
    best = min(within, key=lambda f: f["float_macs"]) if within else None
    return {"seconds": round(seconds, 1), "candidates": len(front),
            "stopped_because": result.stopped_because, "best": best, "front": front}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ocr_rec", "detector"],
                        choices=sorted(EVAL))
    parser.add_argument("--samples", type=int, default=16,
                        help="calibration samples the rules score blocks on")
    parser.add_argument("--budget", type=float, default=2400.0,
                        help="seconds each rule may spend scoring blocks")
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgesdk-mixed-search"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    results = {}
    for name in args.models:
        (args.work / name).mkdir(parents=True, exist_ok=True)
        results[name] = compare(name, args.work / name, args.samples, args.budget)
    print(json.dumps({"bound": BOUND, "samples": args.samples, "budget_s": args.budget,
                      "models": results}, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
