"""SmoothQuant keeps the FP32 model's function and flattens its MatMul inputs' outlier channels."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.smoothquant import activation_channel_max, smooth
from edgesdk.errors import ConversionError

CHANNELS, OUT = 16, 12


def _model(head: str) -> onnx.ModelProto:
    """x [N, 8, 16] -> ``head`` -> MatMul by a constant -> Add a bias; ``h``: the MatMul input."""
    rng = np.random.default_rng(0)
    gamma = np.ones(CHANNELS, np.float32)
    gamma[[3, 11]] = [
        40.0,
        -25.0,
    ]  # the outlier channels a trained LayerNorm's gamma gives (SmoothQuant's case)
    inits = [
        numpy_helper.from_array(gamma, "gamma"),
        numpy_helper.from_array(rng.normal(size=CHANNELS).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.normal(size=(CHANNELS, OUT)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=OUT).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.normal(size=(CHANNELS, CHANNELS)).astype(np.float32), "w0"),
    ]
    nodes = {
        "layernorm": [
            helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1)
        ],
        # a LayerNorm decomposed by an exporter ends in Mul(gamma) and Add(beta)
        "mul_add": [
            helper.make_node("Mul", ["x", "gamma"], ["g"]),
            helper.make_node("Add", ["g", "beta"], ["h"]),
        ],
        # a MatMul after a MatMul and its bias: the scale goes into the first one's output columns
        "matmul": [
            helper.make_node("MatMul", ["x", "w0"], ["m"]),
            helper.make_node("Add", ["m", "gamma"], ["h"]),
        ],
        # a ReLU in between: nothing linear to fold the scale into
        "relu": [
            helper.make_node("Mul", ["x", "gamma"], ["g"]),
            helper.make_node("Relu", ["g"], ["h"]),
        ],
    }[head]
    nodes += [
        helper.make_node("MatMul", ["h", "w"], ["y0"]),
        helper.make_node("Add", ["y0", "bias"], ["y"]),
    ]
    inits = [i for i in inits if any(i.name in n.input for n in nodes)]
    graph = helper.make_graph(
        nodes,
        head,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, CHANNELS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, OUT])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(size=(n, 8, CHANNELS)).astype(np.float32)}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


def _outlier_ratio(model: onnx.ModelProto, tensor: str, feeds: dict[str, np.ndarray]) -> float:
    peaks = activation_channel_max(model, feeds, [tensor])[tensor]
    return float(peaks.max() / np.median(peaks))


@pytest.mark.parametrize("head", ["layernorm", "mul_add", "matmul"])
def test_smoothing_keeps_the_fp32_outputs_and_flattens_the_matmul_inputs_outliers(head):
    model = _model(head)
    result = smooth(model, _data(32, 1))
    held = _data(16, 2)
    assert result.changed == 1
    np.testing.assert_allclose(_run(result.model, held), _run(model, held), rtol=1e-4, atol=1e-4)
    before, after = _outlier_ratio(model, "h", held), _outlier_ratio(result.model, "h", held)
    assert after < before / 2, (before, after)
    assert [n.op_type for n in result.model.graph.node] == [
        n.op_type for n in model.graph.node
    ]  # folded, no op added


def test_an_input_that_cannot_be_folded_is_left_and_counted_unless_a_mul_is_asked_for():
    model = _model("relu")
    left = smooth(model, _data(32, 1))
    assert left.changed == 0
    assert "1 left" in left.note
    assert left.model.SerializeToString() == model.SerializeToString()

    inserted = smooth(model, _data(32, 1), insert_mul=True)
    held = _data(16, 2)
    assert inserted.changed == 1 and "1 by an inserted Mul" in inserted.note
    np.testing.assert_allclose(_run(inserted.model, held), _run(model, held), rtol=1e-4, atol=1e-4)
    assert [n.op_type for n in inserted.model.graph.node].count("Mul") == 2


def test_a_model_without_a_constant_weight_matmul_is_returned_unchanged():
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["x", "t"], ["y"]),
        ],
        "self-attention-like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, CHANNELS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = smooth(model, _data(8, 1))
    assert result.changed == 0
    assert result.model.SerializeToString() == model.SerializeToString()


def test_alpha_outside_zero_to_one_is_refused_with_the_range():
    with pytest.raises(ConversionError, match=r"alpha must be in \[0, 1\], got 1.5"):
        smooth(_model("layernorm"), _data(4, 1), alpha=1.5)
