"""Cross-layer equalization: same outputs, closer per-channel weight ranges, only homogeneous pairs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.equalize import equalization_pairs, equalize


def _conv(name: str, x: str, y: str, w: np.ndarray, b: np.ndarray, group: int = 1) -> tuple[onnx.NodeProto, list]:
    inits = [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    pad = w.shape[-1] // 2
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, group=group,
                            pads=[pad] * 4)
    return node, inits


def _model(between_first: str = "Relu") -> onnx.ModelProto:
    """conv1 -> act -> conv2 (3x3) -> ReLU -> depthwise conv3 -> conv4 (1x1) -> Clip(0, 6) -> conv5.

    conv1's output channels span ranges 0.01 to 10, so conv2's input channels see them too.
    """
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * np.logspace(-2, 1, 8, dtype=np.float32)[:, None,
                                                                                                        None, None]
    layers = [("conv1", "x", "a", w1, 1), ("conv2", "a1", "b", rng.standard_normal((8, 8, 3, 3)), 1),
              ("conv3", "b1", "c", rng.standard_normal((8, 1, 3, 3)) * 3, 8),
              ("conv4", "c", "d", rng.standard_normal((6, 8, 1, 1)), 1),
              ("conv5", "d1", "y", rng.standard_normal((4, 6, 1, 1)), 1)]
    nodes, inits = [], []
    for name, x, y, w, group in layers:
        node, init = _conv(name, x, y, np.asarray(w, np.float32), rng.standard_normal(w.shape[0]).astype(np.float32),
                           group)
        nodes.append(node)
        inits += init
    six = numpy_helper.from_array(np.array(6, np.float32), "six")
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    nodes.insert(1, helper.make_node(between_first, ["a"], ["a1"], name="act1"))
    nodes.insert(3, helper.make_node("Relu", ["b"], ["b1"], name="act2"))
    nodes.append(helper.make_node("Clip", ["d", "zero", "six"], ["d1"], name="relu6"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits + [six, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _spread(model: onnx.ModelProto, name: str, axis: int) -> float:
    """Largest over smallest per-channel max |w| of an initializer along ``axis``."""
    w = np.abs(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name)))
    r = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
    return float(r.max() / r.min())


def _imbalance(model: onnx.ModelProto, first: str, second: str) -> float:
    """Largest |log(r1_i / r2_i)|: how far each shared channel's weight ranges are apart in two convs."""
    weights = {i.name: np.abs(numpy_helper.to_array(i)) for i in model.graph.initializer}
    w1, w2 = weights[f"{first}_w"], weights[f"{second}_w"]
    r1 = w1.reshape(w1.shape[0], -1).max(axis=1)
    r2 = (w2[:, 0].reshape(w2.shape[0], -1).max(axis=1) if w2.shape[1] == 1  # depthwise
          else np.moveaxis(w2, 1, 0).reshape(w2.shape[1], -1).max(axis=1))
    return float(np.abs(np.log(r1 / r2)).max())


def test_equalization_keeps_outputs_and_brings_channel_ranges_together():
    model = _model()
    result = equalize(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, x), _run(model, x), rtol=1e-4, atol=1e-4)
    assert result.changed == 3  # conv1-conv2 (ReLU), conv2-conv3 (ReLU, depthwise), conv3-conv4 (direct)
    assert _spread(model, "conv1_w", 0) > 100
    assert _spread(result.model, "conv1_w", 0) < _spread(model, "conv1_w", 0) / 10
    for first, second in (("conv1", "conv2"), ("conv2", "conv3"), ("conv3", "conv4")):
        assert _imbalance(result.model, first, second) < 0.05 < _imbalance(model, first, second)
    # the input model is left as it was
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                                  numpy_helper.to_array(_model().graph.initializer[0]))


def test_bounded_clip_and_non_homogeneous_activations_are_not_equalized():
    pairs = {(p.first, p.second) for p in equalization_pairs(_model())}
    assert ("conv4", "conv5") not in pairs  # Clip(0, 6): a per-channel scale would move its bound
    assert {("conv1", "conv2"), ("conv2", "conv3"), ("conv3", "conv4")} == pairs
    pairs = {(p.first, p.second) for p in equalization_pairs(_model("Sigmoid"))}
    assert ("conv1", "conv2") not in pairs


def test_a_model_without_pairs_is_returned_unchanged_with_zero_changed():
    model = _model("Sigmoid")
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Tanh"
    model.graph.node[-1].op_type = "Sigmoid"
    del model.graph.node[-1].input[1:]
    pairs = equalization_pairs(model)
    assert [(p.first, p.second) for p in pairs] == [("conv3", "conv4")]
