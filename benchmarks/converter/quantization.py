"""edgesdk convert on real pretrained models, judged on the board's emulated core and on held-out data.

Models and data come from benchmarks/shared/models.py (pinned wheels, SHA-256 checked; real
photographs and rendered text): the PP-LCNet orientation classifier, the YOLOv8n detector, the
PP-OCRv4 recognizer and the PP-OCRv4 text detector (DBNet, 320x320). Per model:

* ``convert()`` for a Raspberry Pi 5 (emulated Cortex-A76) with a 1-point bound on the
  model's task metric and 30% of the evaluation samples held out of every choice; each
  variant's board latency is its instruction count on the emulated core
  (:mod:`edgesdk.converters.board.emulate`), its drop is reported on the selection and the
  held-out samples (from the board's outputs where the candidate says its ``accuracy_basis``
  is the board; the goals count a model only then), with ONNX Runtime's int8 fusions on aarch64;
  the TFLite variants
  (onnx2tf; full int8 runs on LiteRT's XNNPACK QS8 kernels) are built, counted and chosen
  from with the ONNX ones (not in ``--quick``: onnx2tf's tool environment is 2.6 GB);
* every variant also counted on an emulated Cortex-A72 (Raspberry Pi 4), reported;
* ONNX Runtime's ``quantize_static`` defaults calibrated on the same samples as ours, and
  NNCF's ``quantize_with_accuracy_control`` with the same data and bound (its own venv,
  ``nncf_peer.py``), both counted on the A76 and scored from the emulated board's outputs
  against FP32's there, on the rows ``convert()`` judges ours on (at most
  ``--peer-board-samples``, 64; ``quantization_peers.py``), selection and held-out alike;
  ours must be at least as fast as NNCF's within the bound (when
  NNCF misses the bound, ours need only be within it);
* the proxy check (``quantization_proxy.py``): every ONNX variant counted on an emulated x86 (Haswell)
  against its real latency on this CPU, interleaved.

Then the cost of an estimate (the 10.9 MB OCR model counted uncached and cached), a CNN
trained on scikit-learn's digits (accuracy against real labels), and (full run) peak RSS of
``edgesdk convert`` with 32 and 512 calibration samples.

    python benchmarks/converter/quantization.py [--quick]

One model per process (the lead's full run), the extras alone, then the goals over all of them:

    python benchmarks/converter/quantization.py --models ocr_det --no-extras --partial DIR
    python benchmarks/converter/quantization.py --models none --partial DIR
    python benchmarks/converter/quantization.py --combine DIR

NNCF's row alone, into an earlier model's results (``nncf_rerun.py``):
``--models ocr_rec --nncf-into DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.converter.nncf_rerun import nncf_into  # noqa: E402
from benchmarks.converter.quantization_peers import (  # noqa: E402
    MAX_SAMPLES,
    PROFILE,
    board_reference,
    nncf_row,
    ort_defaults,
    peer_row,
)
from benchmarks.converter.quantization_proxy import fit_errors, proxy_pairs  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from benchmarks.shared.models import DATA, MODELS, fetch  # noqa: E402
from edgesdk import load_profile  # noqa: E402
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert  # noqa: E402
from edgesdk.converters.board.board_latency import board_cost  # noqa: E402
from edgesdk.converters.board.emulate import Emulator  # noqa: E402
from edgesdk.converters.formats.onnx_model import fix_input_shapes, load_onnx, save_onnx  # noqa: E402
from edgesdk.converters.planning.metrics import resolve_metric  # noqa: E402
from edgesdk.converters.planning.planner import Candidate  # noqa: E402
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig  # noqa: E402
from edgesdk.converters.quantization.model_runs import run_model  # noqa: E402
from edgesdk.converters.report import ConversionReport  # noqa: E402
from edgesdk.errors import EdgeSDKError  # noqa: E402

REPORTED = "raspberry-pi-4"  # PROFILE: the Pi 5
BOUND = 1.0
HOLDOUT = 0.3
#: The benchmark's models (benchmarks/shared/models.py) and their evaluation sample counts.
EVAL = {"orientation": 128, "detector": 200, "ocr_rec": 128, "ocr_det": 128}
#: Evaluation samples whose board outputs score the peers: as many as convert() judges ours on.
PEER_BOARD_SAMPLES = MAX_SAMPLES
#: TFLite variants too (onnx2tf, its own tool environment): full int8 runs on LiteRT's XNNPACK QS8 kernels on
#: the board, counted on the emulated A76 like the ONNX ones and chosen on the same terms (issue 38).
FORMATS = ("onnx", "tflite")


def _is_board(basis: object) -> bool:
    """Whether an accuracy basis names the board's outputs (``board``, ``emulated...``)."""
    return isinstance(basis, str) and basis.lower().startswith(("board", "emulated"))


def _ours(c: Candidate) -> dict:
    """A candidate's drops and their basis.

    The board fields (issue 59) are read with defaults, so this runs before and after they exist.
    """
    board_held, basis = getattr(c, "board_holdout_drop", None), getattr(c, "accuracy_basis", None)
    held = board_held if board_held is not None else c.holdout_drop
    difference = getattr(c, "host_board_difference", None)
    return {"selection_drop": round(c.accuracy_drop, 4),
            "holdout_drop": None if held is None else round(held, 4),
            "accuracy_basis": basis if basis is not None else "this host",
            "host_holdout_drop": None if c.holdout_drop is None else round(c.holdout_drop, 4),
            "board_drop": getattr(c, "board_drop", None), "board_holdout_drop": board_held,
            "host_board_difference": difference if difference is None
            or isinstance(difference, (int, float, str)) else str(difference)}


def _convert(name: str, work: Path, calibration: np.ndarray, evaluation: np.ndarray,
             quick: bool) -> tuple[ConversionReport, QuantizationConfig, float]:
    """Our convert() for the Pi 5 (emulated), 1-point bound, 30% held out.

    Returns the report, the quantization config and the wall seconds.
    """
    spec = MODELS[name]
    config = QuantizationConfig.for_profile(load_profile(PROFILE))
    if quick:
        config = QuantizationConfig(**{**config.__dict__,
                                       "calibration_methods": (CalibrationMethod.MINMAX,),
                                       "max_search_candidates": 0})
    log(f"{name}: convert() for {PROFILE} (emulated), bound {BOUND} point(s), "
        f"{HOLDOUT:.0%} held out")
    started = time.perf_counter()
    request = ConversionRequest(
        Source(fetch(name), input_shapes={spec.input_name: spec.shape}),
        Target(PROFILE, emulate=True),
        Data({spec.input_name: calibration}, {spec.input_name: evaluation}, metric=spec.metric,
             holdout=HOLDOUT),
        Output(work / f"{name}-out", name=name), Bounds(max_accuracy_drop=BOUND),
        formats=("onnx",) if quick else FORMATS, quantization=config)
    report = convert(request, progress=lambda stage, done, total: log(f"  {stage}")
                     if done == 0 else None)
    return report, config, time.perf_counter() - started


def _variant_rows(report: ConversionReport, emulator: Emulator, sample: dict, quick: bool) -> dict:
    """Every variant: A76 (and A72) latency and ratio to FP32, drops with their basis, size,
    host latency."""
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32")
    fp32_ms, pi4 = fp32.estimate.latency_ms, load_profile(REPORTED)
    variants = {}
    for c in report.plan.candidates:
        a72 = None
        if (not quick or c.chosen or c is fp32) and c.estimate.counts:  # no counts: it failed on the A76 already
            try:
                a72 = board_cost(emulator, c.path, sample, pi4, "latency")
            except EdgeSDKError as exc:  # a variant the A72's runtime refuses has no A72 figure, the rest go on
                log(f"  {c.name}: no A72 figure: {exc}")
        count = c.estimate.counts[0] if c.estimate.counts else None
        variants[c.name] = {
            "a76_ms": round(c.estimate.latency_ms, 4),
            "a76_ratio_vs_fp32": round(c.estimate.latency_ms / fp32_ms, 4),
            "a76_instructions": None if count is None else round(count.instructions), "basis": c.estimate.basis,
            "a72_ratio_vs_fp32": None, "a72_ms": None if a72 is None else round(a72.latency_ms, 4),
            **_ours(c),
            "size_ratio": round(c.measurement.size_bytes / fp32.measurement.size_bytes, 4),
            "host_ms": round(c.measurement.latency_p50_ms, 4),
            "fusion_a76": None if count is None or count.fusion is None else {
                k: v for k, v in count.fusion.to_dict().items() if k != "op_types"},
            "rejected": list(c.rejected), "chosen": c.chosen}
    for row in variants.values():
        if row["a72_ms"] is not None and variants["onnx-fp32"]["a72_ms"]:
            row["a72_ratio_vs_fp32"] = round(row["a72_ms"] / variants["onnx-fp32"]["a72_ms"], 4)
    return variants


def bench_model(name: str, work: Path, n_cal: int, n_eval: int, quick: bool, emulator: Emulator,
                nncf: bool = True, board_samples: int = PEER_BOARD_SAMPLES) -> dict:
    """One model: our convert() and its variants, the peers on the same footing, the proxy check."""
    spec = MODELS[name]
    log(f"{name}: data ({n_cal} calibration, {n_eval} evaluation samples)")
    calibration, evaluation = DATA[name](n_cal, 1), DATA[name](n_eval, 2)
    feeds_cal, feeds_eval = {spec.input_name: calibration}, {spec.input_name: evaluation}
    report, config, convert_s = _convert(name, work, calibration, evaluation, quick)
    split = report.holdout
    candidates = {c.name: c for c in report.plan.candidates}
    fp32, chosen = candidates["onnx-fp32"], report.plan.chosen
    fp32_ms = fp32.estimate.latency_ms
    sample = {spec.input_name: evaluation[:1]}
    variants = _variant_rows(report, emulator, sample, quick)
    within = [c for c in report.plan.candidates if variants[c.name]["selection_drop"] <= BOUND
              and (variants[c.name]["holdout_drop"] or 0.0) <= BOUND]
    fastest = min(within, key=lambda c: c.estimate.latency_ms)

    metric = resolve_metric(spec.metric, None)
    reference = fp32.measurement.outputs
    board = board_reference(emulator, Path(fp32.path), evaluation, split, spec.input_name,
                             board_samples)

    def score(path: Path) -> dict:
        outputs = run_model(path, feeds_eval)[0]
        return peer_row(path, fp32_ms, emulator, sample, outputs, reference, split, metric, board)

    log(f"{name}: ORT quantize_static defaults, calibrated on the same {n_cal} samples")
    fixed = save_onnx(fix_input_shapes(load_onnx(fetch(name)), {spec.input_name: spec.shape}),
                      work / f"{name}-fixed.onnx")
    default_path = ort_defaults(fixed, work / f"{name}-ort-defaults.onnx", calibration, spec.input_name)
    peers = {"ort_defaults": score(default_path)}
    if not quick and nncf:
        peers["nncf_accuracy_control"] = nncf_row(name, fixed, work, feeds_cal, evaluation, split,
                                                   score)

    log(f"{name}: proxy check on this host (emulated Haswell counts vs real latency)")
    onnx_variants = {n: c.path for n, c in candidates.items() if c.format == "onnx" and (not quick or n in (
        fp32.name, chosen.name))}
    if not quick:
        onnx_variants["ort-defaults"] = default_path
    proxy = proxy_pairs(name, onnx_variants, sample, emulator, rounds=3 if quick else 5)
    ours = variants[chosen.name]
    return {
        "model": {"package": spec.package, "version": spec.version, "file": spec.member, "sha256": spec.sha256,
                  "input": {spec.input_name: list(spec.shape)}},
        "metric": report.metric, "metric_unit": report.metric_unit, "preset": config.preset,
        "board_estimates": report.board_estimates, "holdout": None if split is None else split.to_dict(),
        "peer_board_samples": 0 if board is None else len(board["fp32"]),
        "chosen": chosen.name, "chosen_reason": report.plan.reason,
        "chosen_selection_drop": ours["selection_drop"],
        "chosen_holdout_drop": ours["holdout_drop"], "chosen_accuracy_basis": ours["accuracy_basis"],
        "chosen_host_holdout_drop": ours["host_holdout_drop"],
        "chosen_a76_ratio": round(chosen.estimate.latency_ms / fp32_ms, 4),
        "chosen_a72_ratio": ours["a72_ratio_vs_fp32"],
        "fastest_within_bound": fastest.name, "fastest_within_bound_a76_ratio": round(
            fastest.estimate.latency_ms / fp32_ms, 4),
        "convert_wall_s": round(convert_s, 1), "search": report.to_dict()["search"],
        "variants": variants, "peers": peers, "proxy": proxy,
    }


def estimate_cost(name: str, work: Path) -> dict:
    """Counting one variant (the 10.9 MB OCR model, in the full run) on the A76: uncached, then cached."""
    spec = MODELS[name]
    fixed = save_onnx(fix_input_shapes(load_onnx(fetch(name)), {spec.input_name: spec.shape}),
                      work / f"cost-{name}.onnx")
    fresh = Emulator(counts_dir=work / "cost-counts")
    sample = {spec.input_name: DATA[name](1, 5)}
    started = time.perf_counter()
    first = fresh.count(fixed, sample, "cortex-a76")
    uncached = time.perf_counter() - started
    started = time.perf_counter()
    again = fresh.count(fixed, sample, "cortex-a76")
    cached = time.perf_counter() - started
    return {"model_mb": round(fixed.stat().st_size / 2**20, 2), "uncached_s": round(uncached, 2),
            "cached_s": round(cached, 3), "instructions": round(first.instructions), "cached_hit": again.cached,
            "windows_spread": first.spread}


def run_digits(work: Path, config: QuantizationConfig, epochs: int) -> dict:
    """A CNN trained on scikit-learn's digits: accuracy against real labels, not agreement."""
    import torch

    from edgesdk.converters.formats.onnx_model import export_torch
    from edgesdk.testing import digits_cnn, load_digits_data

    data = load_digits_data()
    log("digits_cnn: training")
    path = export_torch(digits_cnn(data, epochs=epochs), [torch.zeros(1, 1, 8, 8)], work / "digits_cnn.onnx",
                        output_names=["logits"], dynamic_batch=True)
    report = convert(ConversionRequest(
        Source(path), Target(load_profile(PROFILE)),
        Data({"input": data.x_train.reshape(-1, 1, 8, 8)[:512]}, {"input": data.x_test.reshape(-1, 1, 8, 8)},
             labels=data.y_test),
        Output(work / "digits-out"), quantization=config))
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32")
    return {"metric": report.metric, "chosen": report.plan.chosen.name,
            "fp32_accuracy": float(np.mean(fp32.measurement.outputs.argmax(1) == data.y_test) * 100),
            "variants": {c.name: {"accuracy_drop": round(c.accuracy_drop, 4), "rejected": list(c.rejected)}
                         for c in report.plan.candidates},
            "best_static_int8_drop": min(c.accuracy_drop for c in report.plan.candidates
                                         if c.precision == "int8_static")}


def convert_cli_rss(name: str, work: Path, n_cal: int, n_eval: int) -> dict:
    """Peak RSS (VmHWM of the edgesdk convert process itself) and wall time with n_cal samples in a .npy file."""
    spec = MODELS[name]
    source = fetch(name)
    folder = work / f"rss-{n_cal}"
    folder.mkdir()
    np.save(folder / "cal.npy", DATA[name](n_cal, 3))
    np.save(folder / "eval.npy", DATA[name](n_eval, 4))
    hwm = folder / "hwm"
    code = ("import atexit, sys; from edgesdk.runtime.memory import peak_rss_mb; "
            f"atexit.register(lambda: open({str(hwm)!r}, 'w').write(str(peak_rss_mb()))); "
            "from edgesdk.cli import main; sys.argv = ['edgesdk'] + sys.argv[1:]; main()")
    args = [sys.executable, "-c", code, "convert", str(source), "--profile", PROFILE, "--calibration",
            str(folder / "cal.npy"), "--eval", str(folder / "eval.npy"), "--out", str(folder / "out"), "--input-shape",
            f"{spec.input_name}={','.join(map(str, spec.shape))}", "--metric", "cosine", "--max-accuracy-drop",
            "0.001", "--no-emulate", "--json"]  # memory and wall time of the conversion itself
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"edgesdk convert failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"calibration_samples": n_cal, "peak_rss_mb": round(float(hwm.read_text()), 1), "wall_s": round(wall, 1),
            "calibrated_samples": report["calibration"]["samples"], "chosen": report["chosen"],
            "calibration_file_mb": round((folder / "cal.npy").stat().st_size / 2**20, 1)}


def _nncf_goals(name: str, r: dict, held_ok: bool) -> list[dict]:
    """Ours against NNCF's accuracy control on one model: speed within the bound, wall time."""
    nncf = r["peers"].get("nncf_accuracy_control")
    if nncf is None:
        return []
    if "error" in nncf:
        return [goal(f"{name}: NNCF accuracy control ran (see results)", "ran", 0.0, False)]
    nncf_ok = nncf["holdout_drop"] <= BOUND
    ratio = r["chosen_a76_ratio"] / nncf["a76_ratio_vs_fp32"]
    return [
        goal(f"{name}: ours / NNCF accuracy-control emulated A76 latency, ours within {BOUND} "
             f"point held-out ({r['chosen_accuracy_basis']}); NNCF "
             f"{'within' if nncf_ok else 'missed'} the bound ({nncf['accuracy_basis']}, "
             f"{nncf['holdout_drop']}): when NNCF misses it, ours need only be within it",
             "<= 1.0 (or NNCF outside the bound)", ratio, held_ok and (ratio <= 1.0 or not nncf_ok)),
        goal(f"{name}: our convert wall time / NNCF's", "<= 2.0",
             r["convert_wall_s"] / nncf["wall_s"], r["convert_wall_s"] <= 2 * nncf["wall_s"])]


def model_goals(names: list[str], results: dict, quick: bool) -> list[dict]:
    """The per-model goals and the ones over all models (proxy, fast-and-accurate count); adds to ``results``."""
    goals = []
    rows = [row for name in names for row in results[name]["proxy"]]
    proxy = results["proxy"] = {"summary": fit_errors(rows), "pairs": rows}
    share = proxy["summary"]["plain_within_20pct"]
    goals.append(goal("proxy on this host: (model, variant) pairs whose instruction-count ratio to FP32 is within "
                      "+-20% of the measured ratio (plain count, the converter's form)", ">= 0.8", share or 0.0,
                      (share or 0.0) >= 0.8))
    fast = []
    for name in names:
        r = results[name]
        held, on_board = r["chosen_holdout_drop"], _is_board(r.get("chosen_accuracy_basis"))
        held_ok = held is None or held <= BOUND
        goals.append(goal(f"{name}: chosen variant's held-out drop ({r['metric_unit']}; basis: "
                          f"{r.get('chosen_accuracy_basis', 'this host')})", f"<= {BOUND}",
                          held if held is not None else 0.0, held_ok))
        goals.append(goal(f"{name}: chosen variant's accuracy computed from the board's outputs "
                          f"(basis {r.get('chosen_accuracy_basis')!r})", "board",
                          1.0 if on_board else 0.0, on_board))
        goals.append(goal(f"{name}: chosen variant's emulated A76 latency / FP32's", "<= 1.0",
                          r["chosen_a76_ratio"], r["chosen_a76_ratio"] <= 1.0))
        if r["chosen_a76_ratio"] <= 0.75 and held_ok and held is not None and on_board:
            fast.append(name)
        goals += _nncf_goals(name, r, held_ok)
    results["fast_and_accurate_models"] = fast
    need = 1 if quick else min(3, len(names))
    goals.append(goal(f"emulated Cortex-A76 (Pi 5): models whose chosen variant is <= 0.75x FP32 "
                      f"within {BOUND} point held-out, accuracy from the board's outputs (names in "
                      "results)",
                      f">= {need} of {len(names)}", len(fast), len(fast) >= need))
    return goals


def run_extras(work: Path, quick: bool) -> tuple[dict, list[dict]]:
    """The goals beside the models: one estimate's cost, the digits CNN, peak RSS (full run)."""
    extra_goals, extra_results = [], {}
    cost_model = "orientation" if quick else "ocr_rec"
    log(f"cost of an estimate: {cost_model} on emulated cortex-a76")
    cost = extra_results["estimate_cost"] = {"model": cost_model, **estimate_cost(cost_model, work)}
    extra_goals.append(goal(f"emulated count of one {cost['model_mb']} MB variant, uncached (s)",
                            "<= 120", cost["uncached_s"], cost["uncached_s"] <= 120))
    extra_goals.append(goal("the same count again, cached (s)", "<= 1", cost["cached_s"],
                            cost["cached_s"] <= 1 and cost["cached_hit"]))
    if quick:
        return extra_results, extra_goals
    config = QuantizationConfig.for_profile(load_profile(PROFILE))
    digits = extra_results["digits_cnn"] = run_digits(work, config, 30)
    drop = digits["best_static_int8_drop"]
    extra_goals.append(goal("digits CNN: best static INT8 top-1 accuracy drop vs labels (points)",
                            "<= 0.5", drop, drop <= 0.5))
    log("ocr_rec: edgesdk convert with 32 and 512 calibration samples")
    small = convert_cli_rss("ocr_rec", work, 32, 32)
    large = convert_cli_rss("ocr_rec", work, 512, 32)
    extra_results["memory"] = {"model": "ocr_rec (10.9 MB)", "32": small, "512": large}
    growth = large["peak_rss_mb"] / small["peak_rss_mb"]
    extra_goals.append(goal("ocr_rec: convert peak RSS 512 / 32 calibration samples", "<= 1.2",
                            growth, growth <= 1.2))
    extra_goals.append(goal("ocr_rec: convert peak RSS at 512 samples (MB)", "<= 2048",
                            large["peak_rss_mb"], large["peak_rss_mb"] <= 2048))
    return extra_results, extra_goals


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model, few samples, no peers or RSS runs (CI smoke)")
    parser.add_argument("--models", default=",".join(EVAL),
                        help="comma-separated subset of " + ", ".join(EVAL)
                        + "; 'none' for the extras alone")
    parser.add_argument("--partial", type=Path, default=None,
                        help="also write each model's results to DIR/NAME.json as soon as it is done (long runs)")
    parser.add_argument("--skip-nncf", action="store_true", help="no NNCF row (it takes about 30 min on ocr_rec)")
    parser.add_argument("--no-extras", action="store_true",
                        help="models only: no estimate-cost, digits or RSS runs (one process per "
                             "model)")
    parser.add_argument("--peer-board-samples", type=int, default=PEER_BOARD_SAMPLES,
                        help="evaluation samples on which the peers are scored from the emulated "
                             "board's outputs, the rows convert() judges ours on (0: from this "
                             "host's outputs)")
    parser.add_argument("--combine", type=Path, default=None,
                        help="run nothing: read DIR/NAME.json (and DIR/extras.json) written by --partial runs, which "
                             "may have run in separate processes, and print the goals over all of them")
    parser.add_argument("--nncf-into", type=Path, default=None,
                        help="run only NNCF's row for --models and write it into DIR/NAME.json of "
                             "an earlier --partial run (nncf_rerun.py); then --combine DIR")
    args = parser.parse_args()
    args.names = ["orientation"] if args.quick else [n.strip() for n in args.models.split(",")
                                                     if n.strip() and n.strip() != "none"]
    unknown = [n for n in args.names if n not in EVAL]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: use some of {', '.join(EVAL)}")
    return args


def combine(folder: Path, names: list[str], params: dict, quick: bool) -> None:
    """The goals over the DIR/NAME.json (and DIR/extras.json) that --partial runs wrote."""
    missing = [name for name in names if not (folder / f"{name}.json").is_file()]
    if missing:
        raise SystemExit(f"{folder}: no results for {', '.join(missing)}; run those models with "
                         f"--partial {folder}, or pass --models with the ones that ran")
    results = {name: json.loads((folder / f"{name}.json").read_text()) for name in names}
    goals = model_goals(names, results, quick)
    extras = folder / "extras.json"
    if extras.exists():
        saved = json.loads(extras.read_text())
        results.update(saved["results"])
        goals += saved["goals"]
    emit("quantization", {**params, "combined_from": str(folder)}, results, goals)


def main() -> None:
    args = _arguments()
    names = args.names
    params = {"profile": PROFILE, "reported_profile": REPORTED, "mode": "latency", "quick": args.quick,
              "bound_points": BOUND, "holdout": HOLDOUT, "models": names,
              "peer_board_samples": args.peer_board_samples}
    if args.combine is not None:
        combine(args.combine, names, params, args.quick)
        return
    emulator = Emulator()
    if args.nncf_into is not None:
        with tempfile.TemporaryDirectory() as tmp:
            rows = {name: {"nncf_accuracy_control": nncf_into(
                args.nncf_into, name, Path(tmp), 128, EVAL[name], emulator,
                params["peer_board_samples"])} for name in names}
        emit("quantization", {**params, "nncf_into": str(args.nncf_into)}, rows, [])
        return
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            n_cal, n_eval = (16, 48) if args.quick else (128, EVAL[name])
            results[name] = bench_model(name, work, n_cal, n_eval, args.quick, emulator,
                                        nncf=not args.skip_nncf,
                                        board_samples=params["peer_board_samples"])
            if args.partial is not None:
                args.partial.mkdir(parents=True, exist_ok=True)
                (args.partial / f"{name}.json").write_text(json.dumps(results[name], indent=1))
        goals = model_goals(names, results, args.quick) if names else []
        if not args.no_extras:
            extra_results, extra_goals = run_extras(work, args.quick)
            if args.partial is not None:
                args.partial.mkdir(parents=True, exist_ok=True)
                saved = {"results": extra_results, "goals": extra_goals}
                (args.partial / "extras.json").write_text(json.dumps(saved, indent=1))
            results.update(extra_results)
            goals += extra_goals
    emit("quantization", params, results, goals)


if __name__ == "__main__":
    main()
