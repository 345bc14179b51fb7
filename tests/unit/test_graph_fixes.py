"""Graph fixes: a YOLO-like boxes+scores output Concat is found and kept from wiping the scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.calibrate import calibrate
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.graph_fixes import find_traps, ranges_from_cache
from edgesdk.converters.quantization.quantize import quantize_static_int8
from edgesdk.errors import ConversionError

RNG = np.random.default_rng(0)


def _head(pixels: float = 320.0, after_concat: str | None = None) -> onnx.ModelProto:
    """x -> conv_box -> Reshape -> Mul(pixels) ; x -> conv_cls -> Reshape -> Sigmoid ; Concat(axis 1) -> output.

    ``pixels`` is the box scale (320: boxes in pixels, 1: boxes in the scores' range). With
    ``after_concat`` (an op type), a 1x1 Conv follows the Concat, so it is no longer at the outputs.
    """
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 8, 1, 1)).astype(np.float32), "wb"),
             numpy_helper.from_array(RNG.standard_normal((3, 8, 1, 1)).astype(np.float32), "wc"),
             numpy_helper.from_array(np.array([0, 4, 16], np.int64), "shape_b"),
             numpy_helper.from_array(np.array([0, 3, 16], np.int64), "shape_c"),
             numpy_helper.from_array(np.array(pixels, np.float32), "stride")]
    nodes = [helper.make_node("Conv", ["x", "wb"], ["b0"], name="conv_box"),
             helper.make_node("Reshape", ["b0", "shape_b"], ["b1"], name="reshape_box"),
             helper.make_node("Sigmoid", ["b1"], ["b2"], name="box_sigmoid"),
             helper.make_node("Mul", ["b2", "stride"], ["boxes"], name="to_pixels"),
             helper.make_node("Conv", ["x", "wc"], ["c0"], name="conv_cls"),
             helper.make_node("Reshape", ["c0", "shape_c"], ["c1"], name="reshape_cls"),
             helper.make_node("Sigmoid", ["c1"], ["scores"], name="scores"),
             helper.make_node("Concat", ["boxes", "scores"], ["output"], name="concat", axis=1)]
    out_name = "output"
    if after_concat:
        inits += [numpy_helper.from_array(np.array([0, 7, 4, 4], np.int64), "shape_o"),
                  numpy_helper.from_array(RNG.standard_normal((2, 7, 1, 1)).astype(np.float32), "wo")]
        nodes += [helper.make_node("Reshape", ["output", "shape_o"], ["o1"], name="reshape_out"),
                  helper.make_node(after_concat, ["o1", "wo"], ["final"], name="after")]
        out_name = "final"
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8, 4, 4])],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ranges(model: onnx.ModelProto, tmp: Path) -> tuple[Path, Path]:
    tmp.mkdir(exist_ok=True)
    path = tmp / "fp32.onnx"
    onnx.save(model, str(path))
    result = calibrate(path, {"x": RNG.standard_normal((16, 8, 4, 4)).astype(np.float32)},
                       (CalibrationMethod.MINMAX,), tmp / "cal")
    return path, result.caches[CalibrationMethod.MINMAX]


def test_finds_the_boxes_and_scores_concat_at_the_output(tmp_path):
    model = _head()
    _, cache = _ranges(model, tmp_path)
    fix = find_traps(model, ranges_from_cache(cache))
    assert fix.concats == ("concat",) and fix.float_nodes == ("concat",)
    assert "concat" in fix.note and "separate scales" in fix.note
    head = find_traps(model, ranges_from_cache(cache), "head")
    assert set(head.float_nodes) == {"concat", "to_pixels", "box_sigmoid", "reshape_box", "scores", "reshape_cls"}


def test_a_concat_of_similar_ranges_or_away_from_the_outputs_is_not_a_trap(tmp_path):
    similar = _head(pixels=1.0)
    assert find_traps(similar, ranges_from_cache(_ranges(similar, tmp_path / "a")[1])).concats == ()
    inner = _head(after_concat="Conv")
    fix = find_traps(inner, ranges_from_cache(_ranges(inner, tmp_path / "b")[1]))
    assert fix.concats == () and fix.float_nodes == () and "no output Concat" in fix.note


def test_the_fix_keeps_the_scores_that_one_scale_wipes(tmp_path):
    model = _head()
    fp32, cache = _ranges(model, tmp_path)
    x = RNG.standard_normal((8, 8, 4, 4)).astype(np.float32)
    config = QuantizationConfig.x86_64()

    def score_error(float_nodes: tuple[str, ...], name: str) -> float:
        path = quantize_static_int8(fp32, tmp_path / f"{name}.onnx", cache, config, CalibrationMethod.MINMAX,
                                    float_nodes)
        out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        ref = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        return float(np.abs(out[:, 4:] - ref[:, 4:]).max())

    plain = score_error((), "plain")
    fixed = score_error(find_traps(model, ranges_from_cache(cache)).float_nodes, "fixed")
    assert plain > 0.3  # one scale for 0-320 pixels: a step of 1.25 on scores in 0-1
    assert fixed < 0.02


def test_an_unknown_strategy_is_refused():
    with pytest.raises(ConversionError, match="'tail' is not one of"):
        find_traps(_head(), {}, "tail")
