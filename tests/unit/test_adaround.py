"""AdaRound re-rounds a real ONNX Runtime QDQ model's int8 weights: layers answer closer to FP32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.adaround import adaround
from edgesdk.converters.quantization.calibrate import calibrate
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.quantize import quantize_static_int8
from edgesdk.errors import ConversionError

LAYERS = ("conv", "depthwise", "pointwise", "fc")


def _fp32() -> onnx.ModelProto:
    """x [N, 4, 8, 8] -> 3x3 Conv, Relu -> depthwise 3x3 -> 1x1 Conv -> pool -> Gemm (transB=1)."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name
        )

    inits = [
        weight("w1", 16, 4, 3, 3),
        weight("w2", 16, 1, 3, 3),
        weight("w3", 24, 16, 1, 1),
        weight("w4", 10, 24),
        numpy_helper.from_array(rng.normal(size=16).astype(np.float32) * 0.1, "b1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node(
            "Conv", ["r1", "w2"], ["c2"], name="depthwise", pads=[1, 1, 1, 1], group=16
        ),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], name="pointwise"),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w4"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _images(n: int, seed: int) -> np.ndarray:
    """Smooth random images (neighbouring pixels alike, as in photos): correlated 3x3 inputs."""
    noise = np.random.default_rng(seed).normal(size=(n, 4, 10, 10)).astype(np.float32)
    return sum(noise[:, :, i : i + 8, j : j + 8] for i in range(3) for j in range(3)) / 3


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The FP32 model and its static INT8 QDQ model (ONNX Runtime's quantizer, arm64 preset)."""
    work: Path = tmp_path_factory.mktemp("adaround")
    fp32 = _fp32()
    onnx.save(fp32, work / "fp32.onnx")
    method = CalibrationMethod.MINMAX
    ranges = calibrate(work / "fp32.onnx", {"x": _images(32, 1)}, (method,), work / "ranges")
    qdq = quantize_static_int8(
        work / "fp32.onnx",
        work / "int8.onnx",
        ranges.caches[method],
        QuantizationConfig.arm64(),
        method,
    )
    return fp32, onnx.load(str(qdq))


def _weights(qdq: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Each layer's dequantized weight (int8 x per-channel scale), by layer name."""
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    found = {}
    for node in qdq.graph.node:
        if node.name in LAYERS:
            dq = producer[node.input[1]]
            q, scale = inits[dq.input[0]], inits[dq.input[1]]
            found[node.name] = q.astype(np.float32) * scale.reshape((-1,) + (1,) * (q.ndim - 1))
    return found


def _layer_mse(
    fp32: onnx.ModelProto, weights: dict[str, np.ndarray], x: np.ndarray
) -> dict[str, float]:
    """Each layer's output error on FP32's own inputs to it with ``weights`` in place of FP32's."""
    wanted = [t for n in fp32.graph.node if n.name in LAYERS for t in (n.input[0], n.output[0])]
    probe = onnx.ModelProto()
    probe.CopyFrom(fp32)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in wanted)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip(wanted, session.run(wanted, {"x": x})))
    errors = {}
    for node in fp32.graph.node:
        if node.name in LAYERS:
            alone = helper.make_graph(
                [node],
                node.name,
                [helper.make_tensor_value_info(node.input[0], 1, None)],
                [helper.make_tensor_value_info(node.output[0], 1, None)],
                [
                    numpy_helper.from_array(weights[node.name], node.input[1]),
                    *(i for i in fp32.graph.initializer if i.name in node.input[2:]),
                ],
            )
            model = helper.make_model(alone, opset_imports=[helper.make_opsetid("", 17)])
            out = ort.InferenceSession(
                model.SerializeToString(), providers=["CPUExecutionProvider"]
            ).run(None, {node.input[0]: values[node.input[0]]})[0]
            errors[node.name] = float(np.mean((out - values[node.output[0]]) ** 2))
    return errors


def test_adaptive_rounding_lowers_each_changed_layers_output_error_on_held_out_samples(models):
    fp32, qdq = models
    result = adaround(qdq, fp32, {"x": _images(32, 1)}, time_budget_s=600)
    held = _images(32, 2)
    nearest, adaptive = (
        _layer_mse(fp32, _weights(qdq), held),
        _layer_mse(fp32, _weights(result.model), held),
    )
    changed = [
        name
        for name in LAYERS
        if not np.array_equal(_weights(qdq)[name], _weights(result.model)[name])
    ]
    assert result.changed == len(changed) >= 3, result.note
    assert all(adaptive[name] < nearest[name] for name in changed), (nearest, adaptive)
    assert f"{result.changed} of 4 layer(s) rounded adaptively" in result.note


def test_it_keeps_the_graph_scales_and_int8_types(models):
    fp32, qdq = models
    result = adaround(qdq, fp32, {"x": _images(16, 1)}, time_budget_s=600)
    before = {i.name: i for i in qdq.graph.initializer}
    after = {i.name: i for i in result.model.graph.initializer}
    assert [n.SerializeToString() for n in result.model.graph.node] == [
        n.SerializeToString() for n in qdq.graph.node
    ]
    assert before.keys() == after.keys()
    for name, init in after.items():
        assert init.data_type == before[name].data_type
        if name.endswith(("_scale", "_zero_point")):
            assert init.SerializeToString() == before[name].SerializeToString()


def test_a_budget_of_zero_changes_no_layer_and_says_so(models):
    fp32, qdq = models
    result = adaround(qdq, fp32, {"x": _images(16, 1)}, time_budget_s=0)
    assert result.changed == 0
    assert "time budget 0 s; 0 of 4 layer(s) rounded adaptively, 4 kept nearest" in result.note
    assert result.model.SerializeToString() == qdq.SerializeToString()


def test_a_model_without_int8_weights_has_nothing_to_round(models):
    fp32, _ = models
    result = adaround(fp32, fp32, {"x": _images(8, 1)}, time_budget_s=60)
    assert result.changed == 0
    assert "no int8 Conv/Gemm/MatMul weight" in result.note


def test_a_negative_budget_is_refused_naming_it(models):
    fp32, qdq = models
    with pytest.raises(ConversionError, match="time_budget_s must be >= 0.*-1"):
        adaround(qdq, fp32, {"x": _images(8, 1)}, time_budget_s=-1)


def test_with_the_qdq_models_own_inputs_layers_are_re_rounded_and_the_note_says_which(models):
    fp32, qdq = models
    result = adaround(qdq, fp32, {"x": _images(16, 1)}, time_budget_s=600, quantized_inputs=True)
    assert result.changed >= 1
    assert "QDQ inputs" in result.note
    assert (
        sum(
            not np.array_equal(a, b)
            for a, b in zip(_weights(qdq).values(), _weights(result.model).values())
        )
        == result.changed
    )
