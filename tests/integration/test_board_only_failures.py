"""Issue 38, item 7, through ``convert``: FP16 variants that this host's onnxruntime runs and the board's own build
(the aarch64 wheel of the same version, under qemu's Cortex-A76) does not run, or runs to another answer.

Why only there: x86 onnxruntime has no FP16 Gemm/MatMul/Conv kernels, so it casts their inputs to FP32, computes
and casts back; the aarch64 build, on a core with FP16 arithmetic (the A76's ``fphp asimdhp``), runs them with
MLAS's FP16 kernels, which also *accumulate* in FP16. Partial sums past 65504 then become infinite on the board
although the result, as x86 computes it, is small: a Gemm of x = [200, 200, 200, 200] with weights
[-200, -200, 200, 200] is 0 on x86 and -inf on the board (FP32 is 0 on both).

* A detector-like model (score = sigmoid(that Gemm + 3), keep the boxes scoring over 0.5, output the first kept
  box) keeps its box on x86 and none on the board, where the Gather of the first box fails with the error the
  issue's reporter saw on two real detectors: ``indices element out of data bounds, idx=0 must be within the
  inclusive range [0,-1]``.
* A Conv net with such a score beside its features runs on the board but answers sigmoid(+inf) = 1
  where x86 answers sigmoid(-3): judged on the board's own outputs (issue 59), its drop vs FP32
  there rejects it.

Real qemu-user, the real aarch64 userland (``edgesdk emulator setup``; ``scripts/setup.sh`` builds it in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.quantization.config import QuantizationConfig
from edgesdk.errors import EmulatorError

BOARD_ERROR = "idx=0 must be within the inclusive range [0,-1]"


@pytest.fixture(autouse=True)
def _emulated(monkeypatch):
    monkeypatch.delenv("EDGESDK_EMULATE", raising=False)  # tests/conftest.py turns emulation off for other tests
    try:
        Emulator()
    except EmulatorError as exc:
        pytest.skip(f"the board emulator is not set up: {exc}")


def _save(path: Path, nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _cancelling(features: int, weight: float) -> np.ndarray:
    """A [2 * features, 1] Gemm weight: +weight on the first half, -weight on the second (the sum cancels exactly in
    FP32 when both halves are equal; in FP16 the first half's partial sum overflows before the second half comes)."""
    return np.concatenate([np.full(features, weight), np.full(features, -weight)]).reshape(-1, 1).astype(np.float32)


def _detector(path: Path) -> Path:
    """x [1, 4] is a box whose four values are equal (see the data); score = sigmoid(Gemm(x) + 3) with weights
    [-200, -200, 200, 200]; y = the first box scoring over 0.5 (NonZero, Gather, Gather index 0)."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score"]),
        helper.make_node("Reshape", ["score", "flat"], ["scores"]),
        helper.make_node("Greater", ["scores", "threshold"], ["keep"]),
        helper.make_node("NonZero", ["keep"], ["where"]),
        helper.make_node("Reshape", ["where", "flat"], ["kept"]),
        helper.make_node("Gather", ["x", "kept"], ["boxes"], axis=0),
        helper.make_node("Gather", ["boxes", "first"], ["y"], axis=0),
    ]
    return _save(path, nodes, [helper.make_tensor_value_info("x", f, [1, 4])],
                 [helper.make_tensor_value_info("y", f, [1, 4])],
                 {"w": -_cancelling(2, 200.0), "b": np.array([3.0], np.float32),
                  "flat": np.array([-1], np.int64), "threshold": np.array([0.5], np.float32),
                  "first": np.array([0], np.int64)})


def _scored_features(path: Path) -> Path:
    """Conv 16->32 3x3, Relu, global average pool: 32 features; score = sigmoid(Gemm(q twice) - 3) with weights
    +4096 on the first copy of q = round(4 * features), -4096 on the second; y = [features, score]. The score's
    Gemm sums integers times a power of two, so FP32 cancels it exactly on either architecture."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"]),
        helper.make_node("Mul", ["features", "four"], ["scaled"]),
        helper.make_node("Round", ["scaled"], ["q"]),
        helper.make_node("Concat", ["q", "q"], ["twice"], axis=1),
        helper.make_node("Gemm", ["twice", "w", "b"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score"]),
        helper.make_node("Concat", ["features", "score"], ["y"], axis=1),
    ]
    return _save(path, nodes, [helper.make_tensor_value_info("x", f, [1, 16, 12, 12])],
                 [helper.make_tensor_value_info("y", f, [1, 33])],
                 {"cw": (rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32),
                  "cb": (rng.standard_normal(32) * 0.1 + 1).astype(np.float32),
                  "four": np.array(4.0, np.float32), "w": _cancelling(32, 4096.0),
                  "b": np.array([-3.0], np.float32)})


def _request(model: Path, data: dict[str, np.ndarray], out: Path, bound: float) -> ConversionRequest:
    config = QuantizationConfig.arm64()
    config = config.__class__(**{**config.__dict__, "calibration_methods": ("minmax",), "max_search_candidates": 0,
                                 "dynamic_op_types": ()})  # no INT8 dynamic: one variant fewer to emulate
    return ConversionRequest(Source(model), Target("raspberry-pi-5", emulate=True),
                             Data(data, data, metric="cosine", holdout=0), Output(out, name=model.stem),
                             Bounds(max_accuracy_drop=bound), quantization=config)


def test_a_variant_only_the_boards_build_refuses_is_rejected_with_its_error_and_the_others_stay_emulated(tmp_path):
    """FP16 of the detector: x86 keeps the box; the board's FP16 Gemm overflows, keeps none, and its Gather fails."""
    model = _detector(tmp_path / "detector.onnx")
    boxes = np.repeat(np.linspace(180, 250, 8, dtype=np.float32)[:, None], 4, axis=1)  # 180 * 200 * 2 > 65504
    report = convert(_request(model, {"x": boxes}, tmp_path / "out", 0.05))
    rows = {c.name: c for c in report.plan.candidates}
    fp16 = rows["onnx-fp16"]
    assert fp16.accuracy_drop < 1e-6, "this host runs the FP16 variant and keeps every box"
    assert len(fp16.rejected) == 1 and fp16.rejected[0].startswith("fails on raspberry-pi-5's own runtime: ")
    assert re.search(r"onnx-fp16\.onnx fails in the board's runtime on emulated cortex-a76 \(.*onnxruntime [0-9.]+ "
                     r"\(aarch64 wheels.*\): InvalidArgument: .*Gather node", fp16.rejected[0]), fp16.rejected[0]
    assert BOARD_ERROR in fp16.rejected[0]
    assert not fp16.chosen and report.plan.chosen.name != "onnx-fp16"
    others = [c for name, c in rows.items() if name != "onnx-fp16"]
    assert {"onnx-fp32", "onnx-int8-static-minmax"} <= {c.name for c in others}
    assert all(c.estimate.basis == "emulated cortex-a76" for c in others), {c.name: c.estimate.basis for c in others}
    assert "emulated cortex-a76" in report.board_estimates
    assert report.plan.chosen.estimate.basis == "emulated cortex-a76"


def test_a_variant_that_answers_worse_on_the_board_is_rejected_on_its_board_accuracy(tmp_path):
    """FP16 of the scored features: fewer instructions than FP32 on the A76 and within the bound on
    this host; its score on the board is 1 where FP32's there is 0.047, so its drop on the board's
    outputs is over the bound: it is rejected on that drop (its difference from this host's output
    is reported beside it) and FP32 chosen.

    The bound (2e-7, cosine) keeps the INT8 variants out on accuracy, so the choice is between FP16 and FP32 (FP16's
    drop is ~4e-8). INT8's drop depends on the host: 1.1e-6 with AVX512-VNNI, above 1e-5 on a host without VNNI,
    where ONNX Runtime's u8*s8 sums saturate (a bound of 1e-5 let INT8 in on an EPYC with VNNI, and it was chosen)."""
    model = _scored_features(tmp_path / "scored.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16, 12, 12)).astype(np.float32)
    report = convert(_request(model, {"x": x}, tmp_path / "out", 2e-7))
    rows = {c.name: c for c in report.plan.candidates}
    fp16, fp32 = rows["onnx-fp16"], rows["onnx-fp32"]
    assert fp16.accuracy_drop <= 2e-7 and fp16.estimate.latency_ms < 0.95 * fp32.estimate.latency_ms
    assert any(r.startswith("accuracy drop") for r in rows["onnx-int8-static-minmax"].rejected)
    assert fp16.accuracy_basis == "board (emulated cortex-a76, 4 samples)"
    assert fp16.board_drop is not None and fp16.board_drop > 2e-7
    (problem,) = fp16.rejected
    basis = "board (emulated cortex-a76, 4 samples)"
    assert problem == f"accuracy drop {fp16.board_drop:.3g} > bound 2e-07 ({basis})"
    assert fp16.host_board_difference is not None and 0.9 < fp16.host_board_difference < 1.0
    assert report.plan.chosen.name == "onnx-fp32" and report.plan.chosen.estimate.basis == "emulated cortex-a76"
