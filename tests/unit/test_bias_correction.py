"""Bias correction: a quantized layer's mean output error, injected by biased weight rounding, taken out."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.bias_correction import bias_correction

RNG = np.random.default_rng(0)
SCALE = np.full(6, 0.02, np.float32)
#: Integer weights; the float weights lie 0.4 step below them, so rounding moves every weight up.
QUANTIZED = RNG.integers(-60, 60, (6, 4, 3, 3)).astype(np.int8)
FLOAT_W = (QUANTIZED.astype(np.float32) - 0.4) * SCALE[:, None, None, None]
BIAS = RNG.standard_normal(6).astype(np.float32)
GEMM_Q = RNG.integers(-60, 60, (5, 6)).astype(np.int8)  # transB: (out, in)
GEMM_W = (GEMM_Q.astype(np.float32) - 0.4) * 0.05


def _models(with_bias: bool = True) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(QDQ, FP32): x -> Conv 3x3 -> GlobalAveragePool -> Flatten -> Gemm(transB) -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    tail = [helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
            helper.make_node("Flatten", ["p"], ["f"], name="flat")]
    conv_bias = ["conv_b"] if with_bias else []
    fp32_nodes = [helper.make_node("Conv", ["x", "conv_w", *conv_bias], ["c"], name="conv", pads=[1] * 4), *tail,
                  helper.make_node("Gemm", ["f", "gemm_w", "gemm_b"], ["y"], name="gemm", transB=1)]
    fp32_inits = [numpy_helper.from_array(FLOAT_W, "conv_w"), numpy_helper.from_array(GEMM_W, "gemm_w"),
                  numpy_helper.from_array(np.zeros(5, np.float32), "gemm_b")]
    if with_bias:
        fp32_inits.append(numpy_helper.from_array(BIAS, "conv_b"))
    fp32 = helper.make_model(helper.make_graph(fp32_nodes, "f", [x], [y], fp32_inits),
                             opset_imports=[helper.make_opsetid("", 17)])
    # The QDQ model: weights as int8 + scale behind a DequantizeLinear, the conv bias as int32 (ORT's layout).
    bias_scale = SCALE * 0.01
    qdq_nodes = [helper.make_node("DequantizeLinear", ["conv_wq", "conv_ws"], ["conv_wd"], name="dq_w", axis=0),
                 helper.make_node("DequantizeLinear", ["gemm_wq", "gemm_ws"], ["gemm_wd"], name="dq_g", axis=0)]
    if with_bias:
        qdq_nodes.append(helper.make_node("DequantizeLinear", ["conv_bq", "conv_bs"], ["conv_bd"], name="dq_b",
                                          axis=0))
    qdq_nodes += [helper.make_node("Conv", ["x", "conv_wd", *(["conv_bd"] if with_bias else [])], ["c"],
                                   name="conv", pads=[1] * 4), *tail,
                  helper.make_node("Gemm", ["f", "gemm_wd", "gemm_b"], ["y"], name="gemm", transB=1)]
    qdq_inits = [numpy_helper.from_array(QUANTIZED, "conv_wq"), numpy_helper.from_array(SCALE, "conv_ws"),
                 numpy_helper.from_array(GEMM_Q, "gemm_wq"), numpy_helper.from_array(np.full(5, 0.05, np.float32),
                                                                                      "gemm_ws"),
                 numpy_helper.from_array(np.zeros(5, np.float32), "gemm_b"),
                 numpy_helper.from_array(np.rint(BIAS / bias_scale).astype(np.int32), "conv_bq"),
                 numpy_helper.from_array(bias_scale, "conv_bs")]
    qdq = helper.make_model(helper.make_graph(qdq_nodes, "q", [x], [y], qdq_inits),
                            opset_imports=[helper.make_opsetid("", 17)])
    return qdq, fp32


def _outputs(model: onnx.ModelProto, x: np.ndarray, name: str) -> np.ndarray:
    if name not in {o.name for o in model.graph.output}:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([name], {"x": x})[0]


def _mean_error(qdq: onnx.ModelProto, fp32: onnx.ModelProto, x: np.ndarray, name: str) -> np.ndarray:
    """Per output channel, the mean of (quantized - float) of tensor ``name``."""
    diff = _outputs(qdq, x, name) - _outputs(fp32, x, name)
    return diff.mean(axis=tuple(i for i in range(diff.ndim) if i != 1))


def test_bias_correction_takes_out_the_mean_error_of_biased_weight_rounding():
    qdq, fp32 = _models()
    calibration = {"x": RNG.uniform(0, 1, (32, 4, 8, 8)).astype(np.float32)}
    held_out = RNG.uniform(0, 1, (16, 4, 8, 8)).astype(np.float32)
    before = np.abs(_mean_error(qdq, fp32, held_out, "c"))
    assert before.min() > 0.01  # the injected bias: every weight rounded up by 0.4 of a step, inputs positive
    result = bias_correction(qdq, fp32, calibration)
    after = np.abs(_mean_error(result.model, fp32, held_out, "c"))
    assert after.max() < before.min() / 10
    assert result.changed == 2 and "2 of 2" in result.note  # the conv and the gemm
    gemm_before = np.abs(_mean_error(qdq, fp32, held_out, "y")).mean()
    assert np.abs(_mean_error(result.model, fp32, held_out, "y")).mean() < gemm_before / 5
    # the int32 bias stays int32 behind its DequantizeLinear; the input model is not modified
    stored = {i.name: i for i in result.model.graph.initializer}["conv_bq"]
    assert stored.data_type == TensorProto.INT32
    assert np.array_equal(numpy_helper.to_array({i.name: i for i in qdq.graph.initializer}["conv_bq"]),
                          numpy_helper.to_array(_models()[0].graph.initializer[5]))


def test_a_layer_without_bias_is_left_alone():
    qdq, fp32 = _models(with_bias=False)
    result = bias_correction(qdq, fp32, {"x": RNG.uniform(0, 1, (8, 4, 8, 8)).astype(np.float32)})
    assert result.changed == 1 and "1 of 1" in result.note  # only the gemm has a bias
    assert not any(n.op_type == "Conv" and len(n.input) > 2 for n in result.model.graph.node)


def _with_input_qdq(qdq: onnx.ModelProto, step: float) -> onnx.ModelProto:
    """``qdq`` with the conv's input quantized (uint8, scale ``step``) as ONNX Runtime's quantizer writes it."""
    model = onnx.ModelProto.FromString(qdq.SerializeToString())
    model.graph.initializer.extend([numpy_helper.from_array(np.array(step, np.float32), "x_s"),
                                    numpy_helper.from_array(np.array(0, np.uint8), "x_z")])
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    conv.input[0] = "x_dq"
    model.graph.node.insert(0, helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], name="dq_x"))
    model.graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], name="q_x"))
    return model


def test_empirical_correction_also_takes_out_the_error_of_quantized_inputs():
    from edgesdk.converters.quantization.bias_correction import empirical_bias_correction

    step = 0.1
    qdq, fp32 = _models()
    qdq = _with_input_qdq(qdq, step)

    def inputs(n: int) -> np.ndarray:  # every input 0.4 of a step above a level: rounding always moves it down
        return ((RNG.integers(0, 10, (n, 4, 8, 8)) + 0.4) * step).astype(np.float32)

    calibration, held_out = {"x": inputs(32)}, inputs(16)
    before = np.abs(_mean_error(qdq, fp32, held_out, "c"))
    weights_only = np.abs(_mean_error(bias_correction(qdq, fp32, calibration).model, fp32, held_out, "c"))
    result = empirical_bias_correction(qdq, fp32, calibration)
    after = np.abs(_mean_error(result.model, fp32, held_out, "c"))
    assert after.max() < before.min() / 10 and after.mean() < weights_only.mean() / 10
    assert result.changed == 2 and "empirical bias correction: 2 of 2" in result.note
