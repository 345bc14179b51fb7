"""Recipes: each builds a static INT8 file that runs, says what ran, and is skipped when it adds nothing."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.recipes import Recipe, build_recipes
from edgesdk.errors import ConversionError

RNG = np.random.default_rng(0)


def _detector(path):  # type: ignore[no-untyped-def]
    """conv1 -> ReLU -> conv2 -> ReLU -> {boxes in pixels, sigmoid scores} -> Concat (a YOLO-like output)."""
    w1 = RNG.standard_normal((8, 3, 3, 3)) * np.logspace(-2, 1, 8)[:, None, None, None]
    arrays = {"w1": w1, "b1": RNG.standard_normal(8), "w2": RNG.standard_normal((8, 8, 3, 3)) * 0.3,
              "b2": RNG.standard_normal(8), "wb": RNG.standard_normal((4, 8, 1, 1)), "bb": RNG.standard_normal(4),
              "wc": RNG.standard_normal((3, 8, 1, 1)), "bc": RNG.standard_normal(3), "pixels": np.array(320.0)}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in arrays.items()]
    inits += [numpy_helper.from_array(np.array([0, 4, 64], np.int64), "sb"),
              numpy_helper.from_array(np.array([0, 3, 64], np.int64), "sc")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["a_r"], name="relu1"),
             helper.make_node("Conv", ["a_r", "w2", "b2"], ["b"], name="conv2", pads=[1] * 4),
             helper.make_node("Relu", ["b"], ["b_r"], name="relu2"),
             helper.make_node("Conv", ["b_r", "wb", "bb"], ["box0"], name="conv_box"),
             helper.make_node("Reshape", ["box0", "sb"], ["box1"], name="reshape_box"),
             helper.make_node("Sigmoid", ["box1"], ["box2"], name="box_sigmoid"),
             helper.make_node("Mul", ["box2", "pixels"], ["boxes"], name="to_pixels"),
             helper.make_node("Conv", ["b_r", "wc", "bc"], ["cls0"], name="conv_cls"),
             helper.make_node("Reshape", ["cls0", "sc"], ["cls1"], name="reshape_cls"),
             helper.make_node("Sigmoid", ["cls1"], ["scores"], name="scores"),
             helper.make_node("Concat", ["boxes", "scores"], ["output"], name="concat", axis=1)]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _run(path, x):  # type: ignore[no-untyped-def]
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_each_recipe_builds_a_runnable_variant_whose_notes_say_what_ran(tmp_path):
    fp32 = _detector(tmp_path / "fp32.onnx")
    calibration = {"x": RNG.uniform(0, 1, (16, 3, 8, 8)).astype(np.float32)}
    recipes = (Recipe("fix"), Recipe("bc", post=("bias_correction",)), Recipe("cle-bc", ("cle",), ("bias_correction",)))
    built = build_recipes(fp32, calibration, QuantizationConfig.x86_64(), CalibrationMethod.MINMAX,
                          tmp_path / "recipes", recipes=recipes)
    by_name = {v.recipe.name: v for v in built}
    assert list(by_name) == ["fix", "bc", "cle-bc"]
    x = calibration["x"][:4]
    reference = _run(fp32, x)
    for variant in built:
        out = _run(variant.path, x)
        assert out.shape == reference.shape and np.isfinite(out).all()
        assert variant.float_nodes == ("concat",)  # the trap fix goes with every recipe
        assert any(n.startswith("graph fixes: output Concat concat") for n in variant.notes)
        assert any(n.op_type == "DequantizeLinear" for n in onnx.load(str(variant.path)).graph.node)
    assert by_name["fix"].applied == () and by_name["fix"].label == "onnx-int8-static-fix"
    assert by_name["bc"].applied == ("bias_correction",)
    assert any(n.startswith("bias correction: 4 of 4") for n in by_name["bc"].notes)
    cle = by_name["cle-bc"]
    assert cle.applied == ("cle", "bias_correction")
    assert any(n.startswith("cross-layer equalization: 1 of 1") for n in cle.notes)
    # equalization rewrote the float model: the variant is quantized from (and its search must restore) that one
    assert cle.fp32_path != fp32 and cle.fp32_path.exists()
    np.testing.assert_allclose(_run(cle.fp32_path, x), reference, rtol=1e-4, atol=1e-3)
    assert cle.config() == {"calibration_method": "minmax", "recipe": "cle-bc", "methods": ["cle", "bias_correction"],
                            "float_nodes": ["concat"]}


def test_recipes_that_change_nothing_new_are_not_built(tmp_path):
    fp32 = _detector(tmp_path / "fp32.onnx")
    calibration = {"x": RNG.uniform(0, 1, (8, 3, 8, 8)).astype(np.float32)}
    recipes = (Recipe("bc", post=("bias_correction",), fixes=None),
               Recipe("bc-again", post=("bias_correction",), fixes=None),  # the same methods: the same variant
               Recipe("nothing", fixes=None))  # no method, no fix: the plain static variant
    built = build_recipes(fp32, calibration, QuantizationConfig.x86_64(), CalibrationMethod.MINMAX,
                          tmp_path / "recipes", recipes=recipes)
    assert [v.recipe.name for v in built] == ["bc"]
    assert not (tmp_path / "recipes" / "onnx-int8-static-bc-again.onnx").exists()


def test_an_unknown_method_is_refused():
    with pytest.raises(ConversionError, match="unknown method"):
        Recipe("odd", pre=("equalise",))
