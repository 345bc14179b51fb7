"""The GPU roofline: FLOPs and bytes per node of small hand-built graphs, and the time a roofline gives them."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk.converters.board.gpu_estimate import GpuPeak, estimate_ms, node_costs, roofline_ms  # noqa: E402


def _model(nodes: list, inputs: list, outputs: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_relu_gemm() -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv 4x3x3x3 (pad 1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm 4->2."""
    weight = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    fc = numpy_helper.from_array(np.zeros((2, 4), np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="gemm", transB=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [weight, fc])


def test_conv_flops_are_two_per_multiply_add_over_the_output() -> None:
    costs = {c.name: c for c in node_costs(_conv_relu_gemm(), "fp32")}
    # 4 output channels x 8 x 8 positions, each 3 input channels x 3 x 3 multiply-adds
    assert costs["conv"].flops == 2 * (4 * 8 * 8) * (3 * 3 * 3)


def test_gemm_flops_and_elementwise_flops() -> None:
    costs = {c.name: c for c in node_costs(_conv_relu_gemm(), "fp32")}
    assert costs["gemm"].flops == 2 * 2 * 4  # M=1, N=2, K=4
    assert costs["relu"].flops == 4 * 8 * 8  # one per output element
    assert costs["pool"].flops == 4 * 8 * 8  # a global pool reads every input element once
    assert costs["flat"].flops == 0


def test_bytes_are_inputs_weights_and_outputs_at_the_precision_and_fused_nodes_move_none() -> None:
    fp32 = {c.name: c for c in node_costs(_conv_relu_gemm(), "fp32")}
    fp16 = {c.name: c for c in node_costs(_conv_relu_gemm(), "fp16")}
    conv_elements = 3 * 8 * 8 + 4 * 3 * 3 * 3 + 4 * 8 * 8  # input, weight, output
    assert fp32["conv"].bytes == 4 * conv_elements
    assert fp16["conv"].bytes == 2 * conv_elements
    assert fp32["relu"].bytes == 0 and not fp32["relu"].kernel  # fused into the convolution
    assert fp32["conv"].kernel and fp32["gemm"].kernel


def test_depthwise_conv_counts_one_input_channel_per_output() -> None:
    weight = numpy_helper.from_array(np.zeros((6, 1, 3, 3), np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=6, pads=[1, 1, 1, 1])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 5, 5])], [weight])
    (cost,) = node_costs(model, "fp32")
    assert cost.flops == 2 * (6 * 5 * 5) * 9


def test_matmul_flops_use_the_shared_dimension() -> None:
    b = numpy_helper.from_array(np.zeros((16, 32), np.float32), "b")
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 32])], [b])
    (cost,) = node_costs(model, "int8")
    assert cost.flops == 2 * (2 * 8 * 32) * 16
    assert cost.bytes == 1 * (2 * 8 * 16 + 16 * 32 + 2 * 8 * 32)


def test_roofline_takes_the_slower_of_compute_and_memory_per_node() -> None:
    costs = node_costs(_conv_relu_gemm(), "fp32")
    # 1 TFLOPS and 1 GB/s: every node here is memory-bound
    slow_memory = GpuPeak({"fp32": 1.0}, 1.0)
    expected = sum(max(c.flops / 1e12, c.bytes / 1e9) for c in costs) * 1e3
    assert roofline_ms(costs, slow_memory, "fp32") == pytest.approx(expected)
    # 1 GFLOPS and 1 TB/s: compute-bound
    slow_compute = GpuPeak({"fp32": 0.001}, 1000.0)
    assert roofline_ms(costs, slow_compute, "fp32") == pytest.approx(sum(c.flops for c in costs) / 1e9 * 1e3,
                                                                      rel=1e-3)


def test_estimate_divides_by_the_efficiency_and_adds_a_cost_per_kernel() -> None:
    costs = node_costs(_conv_relu_gemm(), "fp16")
    peak = GpuPeak({"fp16": 2.0, "fp32": 1.0}, 10.0)
    roof = roofline_ms(costs, peak, "fp16")
    kernels = sum(c.kernel for c in costs)
    assert kernels == 3  # conv, pool, gemm; relu and flatten are fused
    assert estimate_ms(costs, peak, "fp16", 0.5, per_kernel_us=10.0) == pytest.approx(roof / 0.5 + kernels * 0.01)


def test_a_precision_without_a_listed_peak_falls_back_to_a_wider_one() -> None:
    peak = GpuPeak({"fp16": 8.0, "fp32": 4.0}, 50.0)
    assert peak.peak_flops("int8") == 8.0e12
    with pytest.raises(ValueError, match="no peak"):
        GpuPeak({"int8": 8.0}, 50.0).peak_flops("fp32")


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        GpuPeak({"fp16": 0.0}, 10.0)
    with pytest.raises(ValueError, match="efficiency"):
        estimate_ms([], GpuPeak({"fp16": 1.0}, 1.0), "fp16", 1.5)
    with pytest.raises(ValueError, match="precision"):
        node_costs(_conv_relu_gemm(), "fp8")
