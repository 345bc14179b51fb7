"""Streaming calibration, QDQ graph edits and the mixed-precision search, on real ONNX Runtime."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert
from edgesdk.converters.quantization import search
from edgesdk.converters.quantization.added_error import added_error_path
from edgesdk.converters.quantization.calibrate import calibrate
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.model_runs import run_model
from edgesdk.converters.quantization.qdq import OUTPUTS_BLOCK, QdqGraph, units
from edgesdk.converters.quantization.quantize import quantize_static_int8
from edgesdk.converters.quantization.search import block_sensitivity, search_mixed
from edgesdk.testing import MLPWeights, random_mlp, write_mlp_onnx


@pytest.fixture(scope="module")
def outlier_mlp(tmp_path_factory) -> Path:
    """16 -> 32 -> 32 -> 10 where one hidden unit of layer 1 is 1000x larger than the rest.

    Per-tensor INT8 of that hidden activation leaves the other 31 units almost no
    resolution: the error is made where layer 2 *reads* it. Layer 2 ignores the huge unit
    (a ~0 weight row), so nothing downstream carries the outlier.
    """
    layers = list(random_mlp([16, 32, 32, 10], seed=3).layers)
    w1, b1 = layers[0]
    w1 = w1.copy()
    w1[:, 0] *= 1000
    w2, b2 = layers[1]
    w2 = w2.copy()
    w2[0, :] = 1e-6
    layers[0], layers[1] = (w1, b1), (w2, b2)
    return write_mlp_onnx(MLPWeights(tuple(layers)), tmp_path_factory.mktemp("outlier") / "outlier.onnx")


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((96, 16)).astype(np.float32)}


def _ort_ranges(model: Path, data: np.ndarray, method: CalibrationMethod, tmp: Path) -> dict[str, tuple[float, float]]:
    """ONNX Runtime's own calibrator over the same data, for comparison."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader, create_calibrator
    from onnxruntime.quantization.calibrate import CalibrationMethod as OrtMethod

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(data[i:i + 8] for i in range(0, len(data), 8))

        def get_next(self):  # type: ignore[no-untyped-def]
            batch = next(self.it, None)
            return None if batch is None else {"input": batch}

    ort_method = {CalibrationMethod.MINMAX: OrtMethod.MinMax, CalibrationMethod.ENTROPY: OrtMethod.Entropy,
                  CalibrationMethod.PERCENTILE: OrtMethod.Percentile}[method]
    calibrator = create_calibrator(model, augmented_model_path=str(tmp / f"aug-{method.value}.onnx"),
                                   calibrate_method=ort_method, extra_options={"percentile": 99.999})
    with contextlib.redirect_stdout(io.StringIO()):
        calibrator.collect_data(Reader())
        data_out = calibrator.compute_data()
    return {k: (float(np.ravel(v.range_value[0])[0]), float(np.ravel(v.range_value[1])[0])) for k, v in data_out.items()}


def test_one_streaming_pass_gives_the_ranges_of_onnx_runtimes_calibrators(outlier_mlp, samples, tmp_path):
    from onnxruntime.quantization.calibrate import load_tensors_data

    result = calibrate(outlier_mlp, samples, list(CalibrationMethod), tmp_path / "ranges")
    assert result.samples == 96 and set(result.caches) == set(CalibrationMethod)
    minmax = {k: tuple(float(np.ravel(x)[0]) for x in v.range_value)
              for k, v in load_tensors_data(result.caches[CalibrationMethod.MINMAX]).items()}
    for method in (CalibrationMethod.MINMAX, CalibrationMethod.PERCENTILE):
        ours = {k: tuple(float(np.ravel(x)[0]) for x in v.range_value)
                for k, v in load_tensors_data(result.caches[method]).items()}
        theirs = _ort_ranges(outlier_mlp, samples["input"], method, tmp_path)
        assert set(theirs) <= set(ours)
        for name, (lo, hi) in theirs.items():
            if method is CalibrationMethod.MINMAX:
                assert ours[name] == pytest.approx((lo, hi), rel=1e-6, abs=1e-6), name
            else:  # ORT's percentile maths on a histogram merged batch by batch: close to one made at once
                width = max(abs(lo), abs(hi)) or 1.0
                assert ours[name][0] == pytest.approx(lo, abs=0.05 * width), (method, name)
                assert ours[name][1] == pytest.approx(hi, abs=0.05 * width), (method, name)
    # Entropy's KL search moves with the binning, so it is not compared bin for bin; it stays inside the data.
    entropy = load_tensors_data(result.caches[CalibrationMethod.ENTROPY])
    for name, data in entropy.items():
        lo, hi = (float(np.ravel(x)[0]) for x in data.range_value)
        assert minmax[name][0] - 1e-6 <= lo <= hi <= minmax[name][1] + 1e-6, name


def test_calibration_reads_a_memory_mapped_file_batch_by_batch(outlier_mlp, samples, tmp_path):
    np.save(tmp_path / "cal.npy", samples["input"])
    mapped = np.load(tmp_path / "cal.npy", mmap_mode="r")
    in_memory = calibrate(outlier_mlp, samples, [CalibrationMethod.MINMAX], tmp_path / "a")
    streamed = calibrate(outlier_mlp, {"input": mapped}, [CalibrationMethod.MINMAX], tmp_path / "b")
    assert in_memory.caches[CalibrationMethod.MINMAX].read_text() == streamed.caches[CalibrationMethod.MINMAX].read_text()


@pytest.fixture(scope="module")
def qdq(outlier_mlp, samples, tmp_path_factory) -> tuple[QdqGraph, Path]:
    folder = tmp_path_factory.mktemp("qdq")
    ranges = calibrate(outlier_mlp, samples, [CalibrationMethod.MINMAX], folder)
    logging.disable(logging.WARNING)
    try:
        path = quantize_static_int8(outlier_mlp, folder / "int8.onnx", ranges.caches[CalibrationMethod.MINMAX],
                                    QuantizationConfig(), CalibrationMethod.MINMAX)
    finally:
        logging.disable(logging.NOTSET)
    return QdqGraph(path, outlier_mlp), path


def test_every_block_in_float_is_the_fp32_model_and_none_is_the_int8_model(qdq, outlier_mlp, samples):
    graph, int8_path = qdq
    assert len(graph.blocks) >= 3 and graph.blocks[-1].name == OUTPUTS_BLOCK
    fp32 = run_model(outlier_mlp, samples)[0]
    int8 = run_model(int8_path, samples)[0]
    assert not np.allclose(fp32, int8, atol=1e-3), "the INT8 model should differ from FP32 for this test to mean much"
    all_float = graph.with_float(graph.blocks)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in all_float.graph.node)
    np.testing.assert_allclose(run_model(all_float, samples)[0], fp32, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(run_model(graph.with_float([]), samples)[0], int8)
    onnx.checker.check_model(all_float, full_check=True)


def test_sensitivity_blames_the_blocks_that_read_the_outlier_not_the_layer_after_them(qdq, outlier_mlp, samples):
    graph, _ = qdq
    ranked = sorted(block_sensitivity(graph, outlier_mlp, {"input": samples["input"][:16]}), key=lambda s: -s.noise)
    nodes = graph.model.graph.node

    def weights(block) -> set[str]:
        return {t.split("_")[0] for i in block.nodes for t in nodes[i].input if t.startswith("w")}

    # Layer 0's block (MatMul w0, its bias Add, its Relu) reads the outlier tensors it makes; layer 1's
    # MatMul (w1) reads the outlier activation. Layer 2 (w2) sees no outlier: its own error is small.
    assert {frozenset(weights(s.block)) for s in ranked[:2]} == {frozenset({"w0"}), frozenset({"w1"})}, ranked[:3]
    last = next(s for s in ranked if weights(s.block) == {"w2"})
    assert last.noise < ranked[1].noise / 10

    # With the user's metric as the score, each block's own drop ranks them the same way.
    def worst_error(reference, outputs) -> float:
        return float(np.max(np.abs(reference[0] - outputs[0])))

    by_drop = sorted(block_sensitivity(graph, outlier_mlp, {"input": samples["input"][:16]}, score=worst_error),
                     key=lambda s: -s.drop)
    assert {frozenset(weights(s.block)) for s in by_drop[:2]} == {frozenset({"w0"}), frozenset({"w1"})}
    assert next(s for s in by_drop if weights(s.block) == {"w2"}).drop < by_drop[1].drop / 10


def test_mixed_precision_search_runs_on_a_fixed_batch_model_and_reports_its_front(outlier_mlp, samples,
                                                                                        tmp_path):
    # Batch fixed to 1 (the crash of the issue: sensitivity ran all samples as one batch); a bound
    # static INT8 cannot meet makes the converter search.
    report = convert(ConversionRequest(Source(outlier_mlp, input_shapes={"input": [1, 16]}), Target("raspberry-pi-5"),
                                       Data(samples, samples, metric="cosine"), Output(tmp_path / "out"),
                                       Bounds(max_accuracy_drop=1e-4),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    mixed = [c for c in report.plan.candidates if c.precision == "mixed"]
    assert mixed, "no mixed-precision candidate was measured"
    assert report.search is not None and [p.label for p in report.search.front] == [c.name for c in mixed]
    assert report.search.stopped_because
    static = next(c for c in report.plan.candidates if c.name == "onnx-int8-static-minmax")
    first = mixed[0]
    assert first.config is not None and first.config["float_nodes"], "nothing was kept in float"
    assert "kept in float" in first.notes[0]
    assert static.accuracy_drop > 1e-4
    as_json = report.to_dict()["search"]
    assert as_json["front"][0]["label"] == first.name and as_json["rule"] == "added error"
    assert as_json["added_error"]["steps"][0]["recovered_drop"] > 0 and as_json["front"][0]["why"]


def test_search_floats_the_harmful_blocks_fewest_first_until_the_bound_holds(qdq, outlier_mlp, samples, tmp_path):
    graph, _ = qdq
    evaluation = {"input": samples["input"][48:]}
    reference = run_model(outlier_mlp, evaluation)[0]
    sensitivities = block_sensitivity(graph, outlier_mlp, {"input": samples["input"][:16]})

    def measure(label: str, path: Path, float_nodes: tuple[str, ...]) -> tuple[float, float]:
        # Real accuracy of the real edited model; latency is held constant (timing is not what this tests).
        out = run_model(path, evaluation)[0]
        return float(np.max(np.abs(out - reference))), 1.0

    result = search_mixed(graph, sensitivities, tmp_path, measure, bound=0.02, fp32_latency_ms=2.0)
    passing = [p for p in result.front if p.accuracy_drop <= 0.02]
    assert passing, result
    best = min(passing, key=lambda p: len(p.float_blocks))
    names = {s.block.name: s for s in sensitivities}
    # Both blocks that read the outlier are in float; nothing was floated that made no error.
    assert sum(names[b].noise > 0.1 for b in best.float_blocks) == 2
    assert all(p.accuracy_drop > 0.02 for p in result.front if len(p.float_blocks) < len(best.float_blocks))
    assert "meet the bound" in result.stopped_because


def _matmul_model(nodes: list, weights: dict[str, np.ndarray], width: tuple[int, int],
                  path: Path) -> Path:
    """An ONNX model of ``nodes`` from input x to output y (batch dimension free)."""
    helper, f32 = onnx.helper, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info("x", f32, ["n", width[0]])],
        [helper.make_tensor_value_info("y", f32, ["n", width[1]])],
        [onnx.numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _int8(source: Path, data: dict[str, np.ndarray], folder: Path) -> QdqGraph:
    ranges = calibrate(source, data, [CalibrationMethod.MINMAX], folder)
    logging.disable(logging.WARNING)
    try:
        path = quantize_static_int8(source, folder / "int8.onnx",
                                    ranges.caches[CalibrationMethod.MINMAX], QuantizationConfig(),
                                    CalibrationMethod.MINMAX)
    finally:
        logging.disable(logging.NOTSET)
    return QdqGraph(path, source)


@pytest.fixture(scope="module")
def cancelling(tmp_path_factory) -> tuple[QdqGraph, Path, dict[str, np.ndarray]]:
    """y = A(x) - B(x) + C(x): A and B are one layer twice (the minus is F's weights [I; -I; I]).

    Fully quantized, A and B round alike and cancel exactly; either one alone quantized (its
    *own* error) spoils y badly. C reads an input with an outlier column it ignores, so its
    rounding is the error that really hurts. F carries the rest.
    """
    rng = np.random.default_rng(0)
    wa = rng.standard_normal((16, 16)).astype(np.float32)
    wc = rng.standard_normal((16, 16)).astype(np.float32)
    wc[0, :] = 0
    eye = np.eye(16, dtype=np.float32)
    weights = {"wa": wa, "wb": wa.copy(), "wc": wc, "wf": np.concatenate([eye, -eye, eye])}
    nodes = [onnx.helper.make_node("MatMul", ["x", w], [w[1]], name=w[1].upper())
             for w in ("wa", "wb", "wc")]
    nodes += [onnx.helper.make_node("Concat", ["a", "b", "c"], ["abc"], axis=1, name="cat"),
              onnx.helper.make_node("MatMul", ["abc", "wf"], ["y"], name="F")]
    folder = tmp_path_factory.mktemp("cancelling")
    source = _matmul_model(nodes, weights, (16, 16), folder / "cancelling.onnx")
    x = rng.standard_normal((128, 16)).astype(np.float32)
    x[:, 0] *= 100
    return _int8(source, {"x": x[:64]}, folder), source, {"x": x}


def _relative_error(reference, outputs) -> float:
    """Mean absolute error in % of the mean absolute FP32 output (a metric needing no labels)."""
    return float(np.mean(np.abs(reference[0] - outputs[0])) / np.mean(np.abs(reference[0])) * 100)


def _fewest_within(result, bound: float):  # type: ignore[no-untyped-def]
    within = [p for p in result.front if p.accuracy_drop <= bound]
    return min(within, key=lambda p: len(p.float_blocks))


def test_added_error_floats_what_hurts_in_context_not_a_pair_that_cancels(cancelling, tmp_path):
    graph, source, data = cancelling
    calibration, evaluation = {"x": data["x"][:64]}, {"x": data["x"][64:]}
    reference = run_model(source, evaluation)

    def measure(label: str, path: Path, float_nodes: tuple[str, ...]) -> tuple[float, float]:
        # The real edited model's accuracy; latency held constant (timing is not what this tests).
        return _relative_error(reference, run_model(path, evaluation)), 1.0

    sensitivities = block_sensitivity(graph, source, calibration, score=_relative_error)
    own = {s.block.name: s for s in sensitivities}
    assert min(own["A"].drop, own["B"].drop) > own["C"].drop, "A and B alone must look worst here"
    old = search_mixed(graph, sensitivities, tmp_path / "old", measure, 2.0, fp32_latency_ms=2.0)
    path = added_error_path(graph, source, calibration, _relative_error, stop_drop=0.5)
    new = search.search_path(graph, path, tmp_path / "new", measure, bound=2.0, fp32_latency_ms=2.0)

    # In the fully quantized model, floating A or B breaks the cancellation: negative added error.
    first = {name: drop for name, drop, _ in path.first_round}
    assert first["A"] < 0 and first["B"] < 0 and first["C"] > 0
    assert [s.option for s in path.steps][:2] == ["C", "F"], path.steps
    assert path.steps[0].recovered_drop == pytest.approx(first["C"])
    best_new = _fewest_within(new, 2.0)
    assert set(best_new.float_blocks) == {"C", "F"} and "C: recovered" in new.front[0].why
    # The own-error rule floats A and B first and needs more blocks in float than C and F.
    best_old = _fewest_within(old, 2.0)
    assert {"A", "B"} <= set(best_old.float_blocks) and len(best_old.float_blocks) > 2
    assert new.to_dict()["added_error"]["steps"][0]["option"] == "C" and new.rule == "added error"


def test_added_error_search_measures_at_most_its_candidate_budget(cancelling, tmp_path):
    graph, source, data = cancelling
    never = -1.0  # a calibration drop never reached: the path has every step
    path = added_error_path(graph, source, {"x": data["x"][:64]}, _relative_error, stop_drop=never)
    assert len(path.steps) >= 2
    measured: list[str] = []

    def never_within(label: str, file: Path, float_nodes: tuple[str, ...]) -> tuple[float, float]:
        measured.append(label)
        return 1000.0, 1.0

    # A loose bound: step 1 is predicted within it, measured outside it; the budget ends the search.
    result = search.search_path(graph, path, tmp_path, never_within, 100.0, fp32_latency_ms=2.0,
                         max_candidates=1)
    assert measured == ["onnx-mixed-1"] and "budget (1) spent" in result.stopped_because


def test_two_blocks_that_recover_nothing_alone_go_to_float_as_a_pair(qdq, outlier_mlp, samples):
    # Layer 0 makes the outlier and layer 1 reads it: floating either alone leaves the coarse
    # rounding between them, so each alone recovers exactly nothing in the INT8 model.
    graph, _ = qdq
    calibration = {"input": samples["input"][:16]}
    path = added_error_path(graph, outlier_mlp, calibration, _relative_error, stop_drop=0.5)
    first, second = graph.blocks[0].name, graph.blocks[1].name
    alone = {name: drop for name, drop, _ in path.first_round}
    assert alone[first] == 0 and alone[second] == 0
    assert path.steps[0].blocks == (first, second) and path.steps[0].recovered_drop > 50
    assert path.steps[-1].drop <= 0.5 and "calibration drop" in path.stopped_because


def test_a_residual_unit_is_one_option_and_a_spent_budget_measures_nothing(tmp_path):
    # x -> A -> Relu -> B -> + x -> C: A and B (with the Add) lie between two cuts, C after them.
    rng = np.random.default_rng(1)
    weights = {w: rng.standard_normal((8, 8)).astype(np.float32) for w in ("wa", "wb", "wc")}
    make = onnx.helper.make_node
    nodes = [make("MatMul", ["x", "wa"], ["a"], name="A"), make("Relu", ["a"], ["r"], name="relu"),
             make("MatMul", ["r", "wb"], ["b"], name="B"),
             make("Add", ["b", "x"], ["s"], name="skip"),
             make("MatMul", ["s", "wc"], ["y"], name="C")]
    source = _matmul_model(nodes, weights, (8, 8), tmp_path / "residual.onnx")
    data = {"x": rng.standard_normal((32, 8)).astype(np.float32)}
    graph = _int8(source, data, tmp_path)
    assert [[b.name for b in unit] for unit in units(graph)] == [["A", "B"]]
    path = added_error_path(graph, source, data, _relative_error, stop_drop=0.0)
    assert "unit A .. B (2 blocks)" in {name for name, _, _ in path.first_round}
    spent = added_error_path(graph, source, data, _relative_error, stop_drop=0.0, budget_s=0.0)
    assert spent.steps == () and "spent before any option" in spent.stopped_because


def test_a_path_cut_short_is_continued_by_what_blocks_recovered_alone(cancelling, tmp_path):
    graph, source, data = cancelling
    calibration, evaluation = {"x": data["x"][:64]}, {"x": data["x"][64:]}
    reference = run_model(source, evaluation)
    short = added_error_path(graph, source, calibration, _relative_error, stop_drop=40.0)
    assert [s.option for s in short.steps] == ["C"] and short.steps[-1].drop > 2.0

    def measure(label: str, path: Path, float_nodes: tuple[str, ...]) -> tuple[float, float]:
        return _relative_error(reference, run_model(path, evaluation)), 1.0

    result = search.search_path(graph, short, tmp_path, measure, bound=2.0, fp32_latency_ms=2.0)
    # F recovered the most alone after C (A and B made it worse): it comes next, and the bound holds.
    assert set(_fewest_within(result, 2.0).float_blocks) == {"C", "F"}
    assert "then 1 more block(s)" in result.front[-1].why
