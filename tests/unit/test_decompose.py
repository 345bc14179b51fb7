"""The activation rewrite before static INT8 (exact in float) and the fusion counts of an optimized graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.decompose import Derived, RangeStep, decompose_activations
from edgesdk.converters.quantization.qdq import FusionCounts, fusion_counts

#: Where the pieces of HardSwish/HardSigmoid change behaviour, and values far outside them.
EDGES = np.array([-3, 3, 0, -0.0, 2.9999998, -2.9999998, 3.0000002, -3.0000002, 2.5, -2.5, 0.5, -0.5, 1e-30, -1e-30,
                  1e-7, 1e4, -1e4, 1e30, -1e30, 3.4e38, -3.4e38], np.float32)


def _single(op: str, opset: int = 17, **attrs) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="act", **attrs)], "act",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    near_minus_three = np.float32(-3) + np.arange(-64, 64, dtype=np.float32) * np.float32(2.4e-7)
    return np.concatenate([EDGES, near_minus_three, -near_minus_three, rng.normal(0, 4, 20000).astype(np.float32),
                           rng.uniform(-3.5, 3.5, 20000).astype(np.float32)])


@pytest.mark.parametrize(("op", "opset", "attrs"), [
    ("HardSwish", 17, {}), ("HardSigmoid", 17, {}), ("HardSigmoid", 17, {"alpha": 0.3, "beta": 0.4}),
    ("HardSigmoid", 17, {"alpha": -0.25, "beta": 0.6}), ("Swish", 24, {}), ("Swish", 24, {"alpha": 1.702})])
def test_the_rewrite_computes_the_same_floats(op, opset, attrs):
    model = _single(op, opset, **attrs)
    rewrite = decompose_activations(model)
    ops = [n.op_type for n in rewrite.model.graph.node]
    assert op not in ops and {"Mul"} <= set(ops)
    assert [(r.name, r.op_type) for r in rewrite.rewritten] == [("act", op)]
    x = _inputs()
    want, got = _run(model, {"x": x}), _run(rewrite.model, {"x": x})
    assert np.array_equal(np.isnan(want), np.isnan(got))  # -inf * 0 where the original makes it too
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6 * float(np.abs(want[finite]).max()))
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])


def test_the_caller_model_is_untouched_and_kept_nodes_stay_whole():
    model = _single("HardSwish")
    before = model.SerializeToString()
    assert [n.op_type for n in decompose_activations(model, keep=("act",)).model.graph.node] == ["HardSwish"]
    decompose_activations(model)
    assert model.SerializeToString() == before


def test_hardswish_becomes_mul_add_clip_mul_with_derivable_ranges():
    rewrite = decompose_activations(_single("HardSwish"))
    nodes = rewrite.model.graph.node
    assert [n.op_type for n in nodes] == ["Mul", "Add", "Clip", "Mul"]
    assert nodes[3].input[0] == "x" and nodes[3].output[0] == "y"  # the graph's tensors keep their names
    u, v, s = nodes[0].output[0], nodes[1].output[0], nodes[2].output[0]
    assert [d.step for d in rewrite.derived] == [RangeStep.SCALE, RangeStep.SHIFT, RangeStep.CLIP_UNIT]
    ranges = rewrite.ranges({"x": (-6.0, 1.5), "y": (-0.375, 1.5)})
    assert ranges[u] == pytest.approx((-1.0, 0.25)) and ranges[v] == pytest.approx((-0.5, 0.75))
    assert ranges[s] == pytest.approx((0.0, 0.75))
    assert rewrite.unit_interval == ((v, s), (s, s))  # the Clip's input takes its output's range
    assert rewrite.ranges({}) == {}  # nothing calibrated behind them: nothing derived


def test_derived_ranges_of_a_negative_scale_and_a_sigmoid():
    assert Derived("u", "x", RangeStep.SCALE, -0.5).apply(-2.0, 4.0) == (-2.0, 1.0)
    low, high = Derived("s", "u", RangeStep.SIGMOID).apply(-800.0, 0.0)
    assert low == 0.0 and high == 0.5
    assert Derived("c", "v", RangeStep.CLIP_UNIT).apply(-3.0, 0.25) == (0.0, 0.25)


def test_sigmoid_outputs_of_a_silu_are_listed_for_zero_to_one_quantization():
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                              "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    rewrite = decompose_activations(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert not rewrite.rewritten and [n.op_type for n in rewrite.model.graph.node] == ["Sigmoid", "Mul"]
    assert rewrite.unit_interval == (("s", "s"),)


def test_names_never_collide_and_constants_are_shared():
    nodes = [helper.make_node("HardSwish", ["x"], ["a"], name="act"),
             helper.make_node("HardSwish", ["a"], ["act/alpha_x"], name="act2")]  # a tensor already named like a new one
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("act/alpha_x", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewrite = decompose_activations(model)
    onnx.checker.check_model(rewrite.model, full_check=True)
    outputs = [o for n in rewrite.model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs)) and outputs[-1] == "act/alpha_x"
    assert len({n.name for n in rewrite.model.graph.node}) == len(rewrite.model.graph.node)
    assert len(rewrite.model.graph.initializer) == 4  # 1/6, 1/2, 0 and 1, shared by both
    x = np.linspace(-8, 8, 4, dtype=np.float32)
    np.testing.assert_array_equal(_run(rewrite.model, {"x": x}), _run(model, {"x": x}))


def test_a_model_before_opset_11_is_left_alone():
    model = _single("HardSigmoid", opset=10)
    rewrite = decompose_activations(model)
    assert not rewrite.rewritten and [n.op_type for n in rewrite.model.graph.node] == ["HardSigmoid"]


def _q(name: str, x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("QuantizeLinear", [x, "s", "z"], [y], name=name)


def _dq(name: str, x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", [x, "s", "z"], [y], name=name)


def test_fusion_counts_of_a_known_graph():
    """One of each: int8 kernels, Conv/MatMul/Gemm in float on dequantized inputs, pure float, QLinear ops, islands."""
    nodes = [
        _q("q_in", "x", "xq"),
        helper.make_node("QLinearConv", ["xq", "s", "z", "wq", "s", "z", "s", "z"], ["c1q"], domain="com.microsoft"),
        helper.make_node("QLinearMatMul", ["c1q", "s", "z", "wq", "s", "z", "s", "z"], ["m1q"]),
        helper.make_node("QLinearAdd", ["m1q", "s", "z", "m1q", "s", "z", "s", "z"], ["a1q"], domain="com.microsoft"),
        _dq("dq_a1", "a1q", "a1"),
        _dq("dq_w", "wq", "w"),
        helper.make_node("Conv", ["a1", "w"], ["c2"]),                      # DQ -> float Conv
        helper.make_node("HardSigmoid", ["a1"], ["h"]),                      # a float island (reads a DQ)
        helper.make_node("Mul", ["h", "c2"], ["hm"]),                        # a float island (feeds a Q)
        _q("q_hm", "hm", "hmq"),
        _dq("dq_hm", "hmq", "hm2"),
        helper.make_node("Transpose", ["hm2"], ["t"], perm=[1, 0]),         # layout: looked through, not counted
        helper.make_node("MatMul", ["t", "f"], ["m2"]),                      # DQ -> Transpose -> float MatMul
        helper.make_node("Gemm", ["f", "f"], ["g"]),                         # float, never quantized
        helper.make_node("MatMulInteger", ["xq", "wq"], ["mi"]),
        helper.make_node("QLinearSigmoid", ["a1q", "s", "z", "s", "z"], ["sq"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(nodes, "known", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("m2", "g", "mi", "sq")],
                              [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(0), "z"),
                               numpy_helper.from_array(np.ones((2, 2), np.uint8), "wq"),
                               numpy_helper.from_array(np.ones((2, 2), np.float32), "f")])
    model = helper.make_model(graph)
    counts = fusion_counts(model)
    assert counts == FusionCounts(int8_kernels=3, dq_float_q=2, float_kernels=1, qlinear_elementwise=2, float_islands=2,
                                  op_types=counts.op_types)
    assert counts.op_types["QuantizeLinear"] == 2 and counts.op_types["DequantizeLinear"] == 3
    assert counts.to_dict()["int8_kernels"] == 3 and sum(counts.to_dict()["op_types"].values()) == len(nodes)


def test_fusion_counts_reads_a_path(tmp_path):
    model = _single("HardSwish")
    onnx.save(model, tmp_path / "m.onnx")
    counts = fusion_counts(tmp_path / "m.onnx")
    assert counts.op_types == {"HardSwish": 1} and counts.int8_kernels == counts.float_islands == 0
