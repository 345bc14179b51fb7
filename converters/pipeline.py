"""``convert()``: from a model and a board to a measured, chosen, bundled variant.

Steps: load (ONNX, PyTorch export, or a TFLite file passed through) → check and fix
shapes → split the evaluation samples → shrink → build variants (FP32, FP16, INT8 dynamic;
one streaming calibration pass, then INT8 static per calibration method; when static INT8
misses the accuracy bound, the mixed-precision search of :mod:`edgesdk.converters.quantization.search`; TFLite variants
via onnx2tf when asked) → measure each in its own process → plan → write the bundle.

**Selection and held-out samples.** The evaluation samples are split once
(:func:`~edgesdk.converters.planning.data.split_evaluation`). Every choice is made on the
*selection* drop: the calibration method, the mixed-precision search, the planner. Each
variant runs once on all evaluation samples; its outputs are sliced by sample index into
the selection drop (``Candidate.accuracy_drop``) and the *held-out* drop
(``Candidate.holdout_drop``), which only checks the chosen variant (:mod:`edgesdk.converters.planning.planner`,
"Held-out check"). When the calibration data is the evaluation data itself (the CLI
without ``--calibration``), only the selection samples calibrate. A model whose first
output is not one row per sample cannot be split by sample: it gets no held-out check,
and the report says so. Emulated, the variants that could be chosen are judged on the board's
outputs instead (:mod:`edgesdk.converters.board.board_accuracy`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.arguments import check_out_dir
from edgesdk.converters.board.accelerator_plan import accelerator_candidates
from edgesdk.converters.board.board_accuracy import BoardEvaluation, BoardJudge
from edgesdk.converters.board.conversion_costs import ConversionCosts
from edgesdk.converters.board.measure import Measurement, adapt_layout, latency_ratio, measure_variant
from edgesdk.converters.board.power import PowerBudget
from edgesdk.converters.bundle_writer import write_chosen_bundle
from edgesdk.converters.formats.onnx_model import export_torch, fix_input_shapes, load_onnx, save_onnx, simplify
from edgesdk.converters.planning.data import EvaluationSplit, split_evaluation
from edgesdk.converters.planning.metrics import Metric, resolve_metric
from edgesdk.converters.planning.planner import CLEAR_GAIN, Candidate, PlanResult, choose, estimate_on_board
from edgesdk.converters.quantization.calibrate import batches, calibrate
from edgesdk.converters.quantization.config import QuantizationConfig
from edgesdk.converters.quantization.quantize import quantize_dynamic_int8, quantize_static_int8, to_fp16
from edgesdk.converters.quantization.search import SearchResult
from edgesdk.converters.quiet import held_output, warnings_once
from edgesdk.converters.report import ConversionReport
from edgesdk.converters.request import ConversionRequest, Source
from edgesdk.converters.staging import moved_paths, staged_output
from edgesdk.errors import ConversionError, DataError, EdgeSDKError, UnsupportedOpError
from edgesdk.runtime.backends.tensorrt import GPU_PROVIDERS
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.profiles import DeviceProfile
from edgesdk.runtime.scheduling import plan_cores, usable_cpus
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["ConversionReport", "convert", "Progress", "CLEAR_GAIN"]

log = logging.getLogger(__name__)

#: progress(stage, done, total)
Progress = Callable[[str, int, int], None]


def _specs(path: Path, board: DeviceProfile) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    from edgesdk.runtime.runtime import Runtime

    with held_output("loading the model"), Runtime(path, profile=board, threads=1) as rt:
        return rt.inputs, rt.outputs


def _prepare_source(source: Source, work: Path) -> Path:
    """The simplified FP32 ONNX file every variant is made from."""
    model = source.model
    if source.path is None:
        assert source.example_inputs is not None  # Source refuses a module without them
        model = export_torch(model, source.example_inputs, work / "exported.onnx",
                             dynamic_batch=source.input_shapes is None)
    loaded = load_onnx(model)
    if source.input_shapes:
        loaded = fix_input_shapes(loaded, source.input_shapes)
    return save_onnx(simplify(loaded), work / "fp32.onnx")


def convert(request: ConversionRequest, progress: Progress | None = None) -> ConversionReport:
    """Build, measure and plan every variant; write the chosen one as a bundle in ``out_dir/bundle``.

    ``request`` was checked when it was built (:mod:`.request`); the output directory is
    checked again here, as it may have changed since. ``out_dir`` gets ``variants/`` (every
    file built) and ``bundle/``; they are built in a staging directory beside it and moved in
    only when complete, so a failed or interrupted conversion leaves ``out_dir`` as it was.
    An ``out_dir`` that already holds them is refused unless ``force``, which replaces them
    once the new ones are complete.

    ``progress(stage, done, total)`` is called when each stage starts and as it advances:
    ``stage`` says in words what runs ("loading and simplifying the model", "building
    onnx-fp16", "calibrating (128/256 samples)", "installing the onnx2tf tool environment
    (...)", "measuring onnx-int8-dynamic", "choosing a variant", "writing the bundle", and
    finally "done"), ``done``/``total`` how far that stage is. Third-party output (the
    quantizer's prints, LiteRT's delegate lines) is held back unless
    :func:`edgesdk.logs.is_verbose`, and shown in the error when a step fails
    (:mod:`.quiet`).
    """
    out = check_out_dir(request.output.out_dir, request.output.force)
    notify = progress if progress is not None else (lambda stage, done, total: None)
    with warnings_once(), staged_output(out) as work:
        if request.source.is_tflite:
            report = _tflite_passthrough(request, work, notify)
        else:
            report = _convert_onnx(request, work, notify)
    report = moved_paths(report, work, out)
    notify("done", 1, 1)
    return report


def _convert_onnx(request: ConversionRequest, out: Path, notify: Progress) -> ConversionReport:
    """Every ONNX (and TFLite) variant built in ``out/variants``, measured and planned; the bundle in ``out/bundle``."""
    target, labels, bound = request.target, request.data.labels, request.bounds.max_accuracy_drop
    board, mode, config = target.board, target.mode, request.config
    variants_dir = out / "variants"
    variants_dir.mkdir()
    path = request.source.path
    source_sha = read_model(path).sha256 if path is not None and path.suffix == ".onnx" else ""
    notify("loading and simplifying the model", 0, 1)
    fp32_path = _prepare_source(request.source, variants_dir)
    source_sha = source_sha or read_model(fp32_path).sha256
    inputs, outputs = _specs(fp32_path, board)
    from edgesdk.converters.planning.data import check_arrays

    data = request.data
    calibration = check_arrays(data.calibration, inputs, "calibration data")
    evaluation = check_arrays(data.evaluation, inputs, "evaluation data")
    count = len(next(iter(evaluation.values())))
    if labels is not None and len(labels) != count:
        raise DataError(f"{len(labels)} labels for {count} evaluation samples")
    scorer = resolve_metric(data.metric, labels)
    split = split_evaluation(count, data.holdout, data.holdout_seed, data.holdout_min, labels)

    board_threads = plan_cores(board, mode, available=frozenset(range(1024))).threads
    threads = max(1, min(board_threads, len(usable_cpus())))
    figures = dict(target.board_figures or {})
    measured: dict[str, tuple[Path, str, str, Measurement, Mapping[str, Any] | None, tuple[str, ...]]] = {}
    # A fleet device measuring every variant needs no emulated stand-in for it.
    budget = request.bounds.budget
    costs = ConversionCosts(False if target.measure_on is not None else target.emulate, board, mode,
                            {k: v[:1] for k, v in evaluation.items()}, every_cluster=budget.constrains)

    def measure(label: str, path: Path, fmt: str, precision: str, cfg: Mapping[str, Any] | None,
                notes: tuple[str, ...] = ()) -> Measurement:
        if costs.active and read_model(path).sha256 not in figures:
            # counted while this host measures it and the next steps run; waited for to choose
            notify(f"counting {label} on the board's emulated cores", len(measured), len(measured) + 1)
            costs.submit(label, path)
        notify(f"measuring {label}", len(measured), len(measured) + 1)
        m = measure_variant(path, board, mode, threads, evaluation)
        if target.measure_on is not None:
            notify(f"measuring {label} on the board", len(measured), len(measured) + 1)
            m = _on_board(m, target.measure_on(path, evaluation), outputs)
            figures[m.sha256] = m.latency_p50_ms
        measured[label] = (path, fmt, precision, m, cfg, notes)
        return m

    def board_ms(label: str) -> float:
        """What the search compares: the emulated board latency, or this host's."""
        cost = costs.cost(label)  # waits for this count only
        return cost.latency_ms if cost is not None else measured[label][3].latency_p50_ms

    reference = measure("onnx-fp32", fp32_path, "onnx", "fp32", None).outputs
    if split.is_split and len(reference) != count:
        split = replace(split, selection=np.arange(count), holdout=np.arange(0), note=(
            f"no held-out check: the model's first output has {len(reference)} rows for {count} evaluation samples "
            "(not one per sample), so its outputs cannot be split by sample"))
    if split.note:
        (log.warning if split.fraction else log.info)("%s", split.note)
    if split.is_split and _same_arrays(data.calibration, data.evaluation):
        calibration = {k: v[split.selection] for k, v in calibration.items()}
    drops = _Drops(scorer, reference, labels, split)
    drop = drops.selection

    cfg_dict = config.to_dict()
    builders: list[tuple[str, str, Callable[[Path], Path]]] = [
        ("onnx-fp16", "fp16", lambda p: to_fp16(fp32_path, p, config)),
        ("onnx-int8-dynamic", "int8_dynamic", lambda p: quantize_dynamic_int8(fp32_path, p, config)),
    ]
    for label, precision, build in builders:
        notify(f"building {label}", 0, 1)
        try:
            path = build(variants_dir / f"{label}.onnx")
        except ConversionError as exc:
            log.warning("%s skipped: %s", label, exc)
            continue
        measure(label, path, "onnx", precision, cfg_dict)

    notify("calibrating", 0, 1)
    ranges = calibrate(fp32_path, calibration, config.calibration_methods, variants_dir / "calibration",
                       percentile=config.percentile, symmetric=bool(config.activation_symmetric),
                       max_samples=config.max_calibration_samples,
                       progress=lambda done, total: notify(f"calibrating ({done}/{total} samples)", done, total))
    static: list[tuple[float, str, Path, Path]] = []  # drop, calibration method, variant, its float source
    for method in config.calibration_methods:
        label = f"onnx-int8-static-{method.value}"
        notify(f"building {label}", 0, 1)
        path = quantize_static_int8(fp32_path, variants_dir / f"{label}.onnx", ranges.caches[method], config, method)
        m = measure(label, path, "onnx", "int8_static", {**cfg_dict, "calibration_method": method.value})
        static.append((drop(m), method.value, path, fp32_path))
    best_drop, best_method, best_path, best_source = min(static)
    if best_drop > bound:  # the recipes (equalization, bias correction, trap fixes, ...) with the best calibration
        static += _recipe_variants(fp32_path, calibration, config, best_method, ranges.caches, variants_dir,
                                   measure, drop, cfg_dict, notify)
        best_drop, best_method, best_path, best_source = min(static)
    search = None
    if best_drop > bound and config.max_search_candidates > 0:
        unlabelled = None if labels is not None else scorer
        search = _mixed(best_source, best_path, best_method, variants_dir, calibration, board, mode, threads, config, cfg_dict,
                        bound, board_ms("onnx-fp32"), measure, drop, notify, unlabelled,
                        board_ms if costs.active else None)

    tflite_error, parity = None, None
    if "tflite" in request.formats:
        tflite_error, parity = _tflite_variants(fp32_path, variants_dir, calibration, evaluation, measure, notify)

    costs.wait_all(notify)  # every count in before any choice
    notify("choosing a variant", 0, 1)
    host = target.host_profile()
    candidates = []
    for label, (path, fmt, precision, m, cfg, notes) in measured.items():
        energy, energy_basis = m.energy_mj, m.energy_basis
        if energy is None and m.sha256 in (target.board_energy or {}):
            energy, energy_basis = (target.board_energy or {})[m.sha256], "measured on board (--board-figures)"
        on_cpu = m.accelerator not in GPU_PROVIDERS  # a board figure taken on its GPU is that engine's, not the CPU's
        estimate = estimate_on_board(m.latency_p50_ms, host, threads, board, mode,
                                     figures.get(m.sha256) if on_cpu else None, costs.costs.get(label),
                                     energy if on_cpu else None, energy_basis)
        if (fmt == "onnx" and precision == "int8_static" and label != f"onnx-int8-static-{best_method}"
                and "recipe" not in (cfg or {})):
            notes = (*notes, f"calibration {best_method} was more accurate")
        refused = costs.failures.get(label)
        candidates.append(Candidate(label, fmt, path, precision, m, drop(m), estimate, cfg, notes=notes,
                                    holdout_drop=drops.holdout(m),
                                    rejected=(f"fails on {board.name}'s own runtime: {refused}",) if refused else ()))
    candidates += accelerator_candidates(candidates, board, mode, {k: v[:1] for k, v in evaluation.items()})
    on_board = BoardJudge(costs, BoardEvaluation(scorer, evaluation, labels, split, bound), notify)
    candidates = on_board.start(candidates)
    plan = _confirmed(candidates, board, mode, bound, budget, threads, evaluation, notify, on_board)
    bundle = write_chosen_bundle(plan, out, evaluation, source_sha, scorer, request, notify, split, drops.reference_score())
    return ConversionReport(board.name, mode, scorer.name, scorer.unit, bound, plan, bundle,
                            tflite_error, parity, ranges, search, split, costs.note,
                            reference_score=drops.reference_score())


def _same_arrays(calibration: Mapping[str, np.ndarray], evaluation: Mapping[str, np.ndarray]) -> bool:
    """True when the calibration data is the evaluation data itself (the same arrays, not equal copies)."""
    return calibration is evaluation or (
        calibration.keys() == evaluation.keys() and all(calibration[k] is evaluation[k] for k in calibration))


class _Drops:
    """A variant's drop vs FP32 on the selection and on the held-out samples, from its outputs on all of them."""

    def __init__(self, scorer: Metric, reference: np.ndarray, labels: np.ndarray | None,
                 split: EvaluationSplit) -> None:
        self.scorer, self.split = scorer, split
        self.reference, self.labels = reference, labels

    def _on(self, rows: np.ndarray, m: Measurement) -> float:
        labels = None if self.labels is None else self.labels[rows]
        return self.scorer.drop(self.reference[rows], m.outputs[rows], labels)

    def selection(self, m: Measurement) -> float:
        """The drop on the samples every choice is made on (all of them when none are held out)."""
        if not self.split.is_split:
            return self.scorer.drop(self.reference, m.outputs, self.labels)
        return self._on(self.split.selection, m)

    def holdout(self, m: Measurement) -> float | None:
        """The drop on the held-out samples; None when none are held out."""
        return self._on(self.split.holdout, m) if self.split.is_split else None

    def reference_score(self) -> float | None:
        """FP32's own score on the evaluation samples against their labels (the baseline the drops are taken
        from); None without labels, where the metric compares with FP32 itself."""
        if self.labels is None:
            return None
        return float(self.scorer.score(self.reference, self.reference, self.labels))


def _confirmed(candidates: list[Candidate], board: DeviceProfile, mode: str, bound: float, budget: PowerBudget,
               threads: int, evaluation: Mapping[str, np.ndarray], notify: Progress, on_board: BoardJudge) -> PlanResult:
    """Plan until the chosen variant has been judged on the board and, where its speed is scaled from this host's,
    timed side by side with FP32.

    A chosen variant not yet run on the board runs there (:class:`BoardJudge`), and the plan is made again with its
    board drops. A chosen variant whose board latency is scaled from this host's is timed side by side with FP32; one
    not clearly faster is rejected and the plan made again. Only while FP32 fits (otherwise size, not speed, is why a
    variant is chosen); a board's own figures and emulated counts are not second-guessed by this host's clock.
    """
    fp32 = next((c for c in candidates if c.name == "onnx-fp32"), None)
    while True:
        plan = choose(candidates, board, mode, bound, budget=budget)
        chosen = plan.chosen
        index = next(i for i, c in enumerate(candidates) if c.name == chosen.name)
        if on_board.wants(candidates[index]):
            candidates[index] = on_board.judge(candidates[index])
            continue
        fp32_judged = next((c for c in plan.candidates if c.name == "onnx-fp32"), None)
        if (fp32 is None or chosen.name == fp32.name or chosen.format != "onnx" or chosen.measurement.measured_on
                != "this host" or chosen.estimate.basis != "estimated" or fp32_judged is None
                or any("budget" in r for r in fp32_judged.rejected)):
            break
        notify(f"timing {chosen.name} side by side with FP32", 0, 1)
        ratio = latency_ratio(chosen.path, fp32.path, board, mode, threads, evaluation)
        note = f"side by side with FP32 on this host: {ratio:.2f}x its latency"
        if ratio <= CLEAR_GAIN:
            candidates[index] = replace(candidates[index], notes=(*candidates[index].notes, note))
            break
        candidates[index] = replace(candidates[index], notes=(*candidates[index].notes, note),
                                    rejected=(f"not clearly faster than FP32 when timed side by side ({ratio:.2f}x > "
                                              f"{CLEAR_GAIN})",))
        log.info("%s rejected: %s", chosen.name, note)
    return choose(on_board.noted(candidates), board, mode, bound, budget=budget)


def _on_board(host: Measurement, board: Any, outputs: tuple[TensorSpec, ...]) -> Measurement:
    """The board's figures and first output in place of this host's."""
    first = board.outputs.get(outputs[0].name, next(iter(board.outputs.values()), None))
    if first is None:
        raise ConversionError(f"the board {board.device} returned no outputs for {host.sha256[:12]}")
    return replace(host, latency_p50_ms=board.latency_p50_ms, latency_p95_ms=board.latency_p90_ms,
                   rss_before_mb=board.rss_before_mb, peak_rss_mb=board.peak_rss_mb, load_ms=board.load_ms,
                   threads=board.threads, backend=board.backend, accelerator=board.accelerator,
                   outputs=np.asarray(first, dtype=np.float32), measured_on=board.device,
                   # A measure_on of the caller's own may return figures without energy.
                   energy_mj=getattr(board, "energy_mj", None), energy_basis=getattr(board, "energy_basis", ""))


def _mixed(fp32_path: Path, qdq_path: Path, method: str, variants_dir: Path, calibration: Mapping[str, np.ndarray],
           board: DeviceProfile, mode: str, threads: int,
           config: QuantizationConfig, cfg_dict: Mapping[str, Any], bound: float, fp32_latency_ms: float,
           measure: Callable[..., Measurement], drop: Callable[[Measurement], float], notify: Progress,
           scorer: Metric | None, board_ms: Callable[[str], float] | None = None) -> SearchResult:
    """The error each block adds in context, on calibration samples, then the timed search (issue 59).

    :func:`~edgesdk.converters.quantization.added_error.added_error_path` floats blocks one
    greedy step at a time until the calibration drop is a quarter of the bound;
    :func:`~edgesdk.converters.quantization.search.search_path` measures some of those steps.
    ``scorer`` (a metric that compares with FP32, so needs no labels) scores the error each
    block adds; without it, the output noise does.
    ``board_ms(label)``, when given, is a measured candidate's emulated board latency: the search's cost.
    """
    from edgesdk.converters.quantization.added_error import added_error_path
    from edgesdk.converters.quantization.qdq import QdqGraph
    from edgesdk.converters.quantization.search import search_path

    graph = QdqGraph(qdq_path, fp32_path)
    sample = next(batches(calibration, config.sensitivity_samples))
    notify("mixed precision: error each block adds", 0, len(graph.blocks))
    score = None
    if scorer is not None:
        def score(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
            return scorer.drop(reference[0], outputs[0], None)

    path = added_error_path(
        graph, fp32_path, sample, score, stop_drop=0.25 * bound,
        progress=lambda done, total: notify(f"mixed precision: added error ({done}/{total} options)", done, total))

    def measure_candidate(label: str, path: Path, float_nodes: tuple[str, ...]) -> tuple[float, float]:
        notify(f"mixed precision: measuring {label}", 0, 1)
        m = measure(label, path, "onnx", "mixed", {**cfg_dict, "calibration_method": method,
                                                   "float_nodes": list(float_nodes)},
                    (f"{label.rsplit('-', 1)[-1]} block(s) kept in float for the error they add: "
                     f"{_listed(float_nodes)}",))
        if board_ms is not None:  # counted, not timed: no noise to guard against
            return drop(m), board_ms(label)
        if m.latency_p50_ms < fp32_latency_ms or m.measured_on != "this host":
            return drop(m), m.latency_p50_ms
        # The search stops on a candidate no faster than FP32: a busy moment of the machine must not
        # be the reason, so that verdict is checked side by side.
        ratio = latency_ratio(path, fp32_path, board, mode, threads, sample)
        return drop(m), fp32_latency_ms * ratio

    result = search_path(graph, path, variants_dir, measure_candidate, bound, fp32_latency_ms,
                         config.max_search_candidates)
    return replace(result, sensitivity_seconds=path.seconds)


def _recipe_variants(fp32_path: Path, calibration: Mapping[str, np.ndarray], config: QuantizationConfig,
                     method: str, caches: Mapping[Any, Path], variants_dir: Path, measure: Callable[..., Measurement],
                     drop: Callable[[Measurement], float], cfg_dict: Mapping[str, Any],
                     notify: Progress) -> list[tuple[float, str, Path, Path]]:
    """The recipes' static INT8 variants that change something (:mod:`.quantization.recipes`), measured.

    Returns (drop, calibration method, variant, the FP32 model it was quantized from) per variant.
    """
    from edgesdk.converters.quantization.config import CalibrationMethod
    from edgesdk.converters.quantization.recipes import build_recipes

    chosen = CalibrationMethod(method)
    notify(f"building the accuracy-keeping recipes (calibration {method})", 0, 1)
    made = []
    for variant in build_recipes(fp32_path, calibration, config, chosen, variants_dir / "recipes", caches[chosen]):
        m = measure(variant.label, variant.path, "onnx", "int8_static", {**cfg_dict, **variant.config()},
                    variant.notes)
        made.append((drop(m), method, variant.path, variant.fp32_path))
    return made


def _listed(names: Sequence[str], shown: int = 6) -> str:
    """``a, b, c`` or ``a, b, c and 4 more (7 nodes)``."""
    more = f" and {len(names) - shown} more ({len(names)} nodes)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _tflite_variants(fp32_path: Path, variants_dir: Path, calibration: Mapping[str, np.ndarray],
                     evaluation: Mapping[str, np.ndarray], measure: Callable[..., Measurement],
                     notify: Progress) -> tuple[str | None, float | None]:
    from edgesdk.converters.formats.onnx2tf_tool import Onnx2TfTool
    from edgesdk.converters.formats.tflite import convert_to_tflite

    sample = {k: v[:32] for k, v in evaluation.items()}
    try:
        tool = Onnx2TfTool().ensure(announce=lambda message: notify(message, 0, 1))
        notify("converting to TFLite (onnx2tf)", 0, 1)
        result = convert_to_tflite(fp32_path, variants_dir / "tflite", calibration=calibration, eval_inputs=sample,
                                   tool=tool)
    except UnsupportedOpError as exc:
        log.warning("TFLite variants skipped: %s", exc)
        return str(exc), None
    except EdgeSDKError as exc:
        log.warning("TFLite conversion failed: %s", exc)
        return str(exc), None
    for precision, path in result.models.items():
        measure(f"tflite-{precision.replace('_', '-')}", Path(path), "tflite", precision, None,
                (f"onnx2tf; FP32 parity max abs diff {result.parity_max_abs_diff:.2e}",)
                if result.parity_max_abs_diff is not None else ())
    return None, result.parity_max_abs_diff


def _tflite_passthrough(request: ConversionRequest, out: Path, notify: Progress) -> ConversionReport:
    """An existing .tflite is measured and planned as is (its accuracy is the reference)."""
    from edgesdk.converters.planning.data import check_arrays
    from edgesdk.runtime.runtime import Runtime

    target, bound = request.target, request.bounds.max_accuracy_drop
    board, mode, path = target.board, target.mode, request.source.path
    assert path is not None  # is_tflite
    source_sha = read_model(path).sha256
    with held_output("loading the model"), Runtime(path, profile=board, mode=mode) as rt:
        specs = rt.inputs
    evaluation = check_arrays(adapt_layout(request.data.evaluation, specs), specs, "evaluation data")
    scorer = resolve_metric(request.data.metric, request.data.labels)
    threads = max(1, min(plan_cores(board, mode, available=frozenset(range(1024))).threads, len(usable_cpus())))
    notify("measuring tflite", 0, 1)
    m = measure_variant(path, board, mode, threads, evaluation)
    notify("choosing a variant", 0, 1)
    estimate = estimate_on_board(m.latency_p50_ms, target.host_profile(), threads, board, mode,
                                 (target.board_figures or {}).get(m.sha256))
    (out / "variants").mkdir()
    candidate = Candidate("tflite-input", "tflite", path, "as-given", m, 0.0, estimate,
                          notes=("passed through: the given .tflite is the accuracy reference",))
    plan = choose([candidate], board, mode, bound, budget=request.bounds.budget)
    data = request.data
    unsplit = EvaluationSplit(np.arange(len(next(iter(evaluation.values())))), np.arange(0), data.holdout,
                              data.holdout_seed, data.holdout_min,
                              "no held-out check: the given .tflite is passed through as its own accuracy reference")
    bundle = write_chosen_bundle(plan, out, evaluation, source_sha, scorer, request, notify, unsplit)
    return ConversionReport(board.name, mode, scorer.name, scorer.unit, bound, plan, bundle, None, None,
                            holdout=unsplit, board_estimates="board latency scaled from this host's timings (a .tflite "
                            "passed through is measured as given, not emulated)")
