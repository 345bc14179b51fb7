"""Static INT8 per target on real ONNX Runtime: the presets' quantization parameters, and decomposed activations.

Fusion is judged on ONNX Runtime's optimized graph for this (x86-64) host; an aarch64 graph
needs the board's own wheels (:mod:`edgesdk.converters.board.emulate`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.quantization.calibrate import calibrate
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.decompose import decompose_activations
from edgesdk.converters.quantization.model_runs import run_model
from edgesdk.converters.quantization.qdq import QdqGraph, fusion_counts, host_optimized_model
from edgesdk.converters.quantization.quantize import quantize_dynamic_int8, quantize_static_int8

MINMAX = CalibrationMethod.MINMAX


def _conv(name: str, cin: int, cout: int, x: str, y: str, rng: np.random.Generator, k: int = 3,
          group: int = 1) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    w = numpy_helper.from_array(rng.normal(0, 0.4, (cout, cin // group, k, k)).astype(np.float32), f"{name}.w")
    b = numpy_helper.from_array(rng.normal(0, 0.2, cout).astype(np.float32), f"{name}.b")
    return helper.make_node("Conv", [x, w.name, b.name], [y], name=name, pads=[k // 2] * 4, group=group), [w, b]


@pytest.fixture(scope="module")
def mobile_block(tmp_path_factory) -> Path:
    """conv -> HardSwish -> depthwise conv -> HardSigmoid gate -> 1x1 conv -> SiLU (Sigmoid + Mul) -> 1x1 conv."""
    rng = np.random.default_rng(7)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    for made in (_conv("conv1", 3, 8, "x", "c1", rng),
                 _conv("dw", 8, 8, "h1", "c2", rng, group=8),
                 _conv("pw", 8, 8, "g", "c3", rng, k=1),
                 _conv("head", 8, 4, "silu", "y", rng, k=1)):
        nodes.append(made[0])
        weights += made[1]
    nodes[1:1] = [helper.make_node("HardSwish", ["c1"], ["h1"], name="hswish")]
    nodes[3:3] = [helper.make_node("HardSigmoid", ["c2"], ["gate"], name="hsigmoid", alpha=1 / 6, beta=0.5),
                  helper.make_node("Mul", ["c2", "gate"], ["g"], name="gate_mul")]
    nodes[6:6] = [helper.make_node("Sigmoid", ["c3"], ["sig"], name="sigmoid"),
                  helper.make_node("Mul", ["c3", "sig"], ["silu"], name="silu_mul")]
    graph = helper.make_graph(nodes, "mobile_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("mobile") / "fp32.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).normal(0, 1.5, (24, 3, 16, 16)).astype(np.float32)}


def _quantized(model: Path, samples: dict[str, np.ndarray], config: QuantizationConfig, out: Path,
               float_nodes: tuple[str, ...] = ()) -> Path:
    ranges = calibrate(model, samples, [MINMAX], out.parent / f"ranges-{out.stem}", symmetric=config.activation_symmetric)
    return quantize_static_int8(model, out, ranges.caches[MINMAX], config, MINMAX, float_nodes)


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_decomposed_fp32_graph_computes_what_the_original_does(mobile_block, samples):
    rewrite = decompose_activations(onnx.load(str(mobile_block)))
    assert {r.op_type for r in rewrite.rewritten} == {"HardSwish", "HardSigmoid"}
    want = run_model(mobile_block, samples)[0]
    got = run_model(rewrite.model, samples)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


def test_x86_preset_with_decomposition_runs_every_activation_in_int8(mobile_block, samples, tmp_path):
    """Measured on this host's optimized graph: the activations leave float, the Convs stay fused."""
    config = QuantizationConfig.x86_64()
    whole = _quantized(mobile_block, samples, dataclasses.replace(config, decompose_activations=False),
                       tmp_path / "whole.onnx")
    split = _quantized(mobile_block, samples, config, tmp_path / "split.onnx")
    assert {"HardSwish", "HardSigmoid"} <= set(_ops(whole))
    assert not {"HardSwish", "HardSigmoid"} & set(_ops(split))
    before = fusion_counts(host_optimized_model(whole, tmp_path / "whole-opt.onnx"))
    after = fusion_counts(host_optimized_model(split, tmp_path / "split-opt.onnx"))
    assert before.int8_kernels == after.int8_kernels == 4 and before.dq_float_q == after.dq_float_q == 0
    assert before.float_islands >= 2  # HardSwish (as HardSigmoid + Mul) and HardSigmoid, between DQ and Q
    assert after.float_islands == 0
    assert after.qlinear_elementwise > before.qlinear_elementwise
    assert after.op_types.get("QLinearAdd") == 2 and "Clip" not in after.op_types  # the Clips folded into their Q
    assert after.op_types["QuantizeLinear"] == after.op_types["DequantizeLinear"] == 1  # integer from input to output
    # No worse than without the rewrite (the added tensors' ranges were derived, not calibrated).
    reference = run_model(mobile_block, samples)[0]
    noise = {p.stem: float(np.mean((run_model(p, samples)[0] - reference) ** 2) / np.mean(reference ** 2))
             for p in (whole, split)}
    assert noise["split"] < max(2 * noise["whole"], 1e-4), noise


def test_arm64_preset_with_decomposition_runs_every_activation_in_int8_on_emulated_a76(mobile_block, samples,
                                                                                        tmp_path):
    """The graph ONNX Runtime's aarch64 wheel optimizes under qemu -cpu cortex-a76 (edgesdk.converters.board.emulate)."""
    from edgesdk.converters.board.emulate import Emulator

    config = QuantizationConfig.arm64()
    whole = _quantized(mobile_block, samples, dataclasses.replace(config, decompose_activations=False),
                       tmp_path / "whole.onnx")
    split = _quantized(mobile_block, samples, config, tmp_path / "split.onnx")
    emulator = Emulator(counts_dir=tmp_path / "counts")
    x = {"x": samples["x"][:1]}
    before, after = (emulator.count(p, x, "cortex-a76") for p in (whole, split))
    assert before.fusion is not None and after.fusion is not None
    assert before.fusion.int8_kernels == after.fusion.int8_kernels == 4
    assert before.fusion.float_islands >= 2 and after.fusion.float_islands == 0
    assert after.fusion.op_types["QuantizeLinear"] == after.fusion.op_types["DequantizeLinear"] == 1


def _zero_points(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Zero points of the weights (DQ of an initializer) and of the activations (Q nodes), by tensor."""
    model = onnx.load(str(path))
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = {n.input[0]: init[n.input[2]] for n in model.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in init and init[n.input[0]].ndim == 4}
    activations = {n.input[0]: init[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return weights, activations


def test_arm64_preset_makes_symmetric_int8_weights_and_asymmetric_int8_activations(mobile_block, samples, tmp_path):
    config = QuantizationConfig.arm64()
    path = _quantized(mobile_block, samples, config, tmp_path / "arm.onnx")
    weights, activations = _zero_points(path)
    assert len(weights) == 4 and all(z.dtype == np.int8 and z.size > 1 and not z.any() for z in weights.values())
    rewrite = decompose_activations(onnx.load(str(mobile_block)))
    zero_to_one = {t for t, _ in rewrite.unit_interval}
    assert "sig" in zero_to_one and "gate" in zero_to_one
    for tensor, zero in activations.items():
        assert zero.dtype == np.int8
        if tensor in zero_to_one:  # Clip/Sigmoid outputs (and Clip inputs): over [0, max]
            assert int(zero) == -128, tensor
    assert any(int(zero) != 0 for zero in activations.values())  # zero points kept: asymmetric
    # The Clip's input and output are quantized alike, so the Clip folds and no requantization is left.
    scales = {n.input[0]: numpy_helper.to_array(next(i for i in onnx.load(str(path)).graph.initializer
                                                     if i.name == n.input[1]))
              for n in onnx.load(str(path)).graph.node if n.op_type == "QuantizeLinear"}
    for tensor, range_of in rewrite.unit_interval:
        assert scales[tensor] == scales[range_of]


def test_x86_preset_makes_uint8_activations_and_symmetric_int8_weights(mobile_block, samples, tmp_path):
    path = _quantized(mobile_block, samples, QuantizationConfig.x86_64(), tmp_path / "x86.onnx")
    weights, activations = _zero_points(path)
    assert all(z.dtype == np.int8 and not z.any() for z in weights.values())
    assert activations and all(z.dtype == np.uint8 for z in activations.values())
    # Per-channel weights are symmetric whatever is asked (one zero point for all channels); per-tensor ones follow
    # the field, which shows it reaches the quantizer.
    per_tensor = dataclasses.replace(QuantizationConfig.x86_64(), per_channel=False)
    symmetric = _quantized(mobile_block, samples, per_tensor, tmp_path / "sym.onnx")
    asymmetric = _quantized(mobile_block, samples, dataclasses.replace(per_tensor, weight_symmetric=False),
                            tmp_path / "asym.onnx")
    assert not any(z.any() for z in _zero_points(symmetric)[0].values())
    assert any(z.any() for z in _zero_points(asymmetric)[0].values())


def test_an_excluded_activation_is_left_whole_and_float(mobile_block, samples, tmp_path):
    path = _quantized(mobile_block, samples, QuantizationConfig.x86_64(), tmp_path / "kept.onnx", float_nodes=("hswish",))
    ops = _ops(path)
    assert ops.count("HardSwish") == 1 and "HardSigmoid" not in ops


def test_mixed_precision_edits_a_decomposed_model(mobile_block, samples, tmp_path):
    """The search's QDQ edits still work: every block back in float gives the FP32 outputs."""
    path = _quantized(mobile_block, samples, QuantizationConfig.x86_64(), tmp_path / "mixed.onnx")
    graph = QdqGraph(path, mobile_block)
    names = graph.node_names(graph.blocks)
    assert any("hswish/" in n for n in names)  # the pieces of HardSwish belong to a block
    floated = graph.with_float(graph.blocks)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in floated.graph.node)
    want = run_model(mobile_block, samples)[0]
    np.testing.assert_allclose(run_model(floated, samples)[0], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_dynamic_int8_honours_weight_symmetry(tmp_path):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0.3, 1, (16, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mm.onnx")
    for symmetric in (True, False):
        config = dataclasses.replace(QuantizationConfig.x86_64(), weight_symmetric=symmetric)
        out = quantize_dynamic_int8(tmp_path / "mm.onnx", tmp_path / f"mm-{symmetric}.onnx", config)
        zeros = [numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer if "zero_point" in i.name
                 and i.name.startswith("w")]
        assert zeros and all(z.dtype == np.int8 for z in zeros)
        assert (not any(z.any() for z in zeros)) is symmetric


def _tflite_ops(path: Path) -> set[str]:
    from ai_edge_litert import schema_py_generated as fb

    names = {v: k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_")}
    model = fb.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    return {names[max(c.builtinCode, c.deprecatedBuiltinCode)] for c in model.operatorCodes}


def test_tflite_rewrite_of_hardswish_and_hardsigmoid_keeps_the_floats():
    """The form XNNPACK runs in int8 (:func:`edgesdk.converters.formats.tflite._xnnpack_activations`) computes the same values."""
    from edgesdk.converters.formats.tflite import _xnnpack_activations

    nodes = [helper.make_node("HardSwish", ["x"], ["a"], name="hswish"),
             helper.make_node("HardSigmoid", ["a"], ["s"], name="hsig", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["s", "a"], ["b"], name="hswish_as_two"),        # x * HardSigmoid(x): merged
             helper.make_node("HardSigmoid", ["b"], ["gate"], name="gate", alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["a", "gate"], ["y"], name="se")]                # a gate on another tensor
    graph = helper.make_graph(nodes, "acts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert _xnnpack_activations(rewritten) == 3
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("Clip") == 3 and not {"HardSwish", "HardSigmoid"} & set(ops) and ops[-1] == "Mul"
    onnx.checker.check_model(rewritten, full_check=True)
    x = {"x": np.concatenate([np.linspace(-8, 8, 4001, dtype=np.float32),
                              np.float32([-3, 3, 0, 1e4, -1e4, 2.9999998, -2.9999998])])}
    want, got = run_model(model, x)[0], run_model(rewritten, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    assert _xnnpack_activations(old) == 0  # Clip's bounds are attributes before opset 11: left alone


@pytest.mark.tflite
def test_full_int8_tflite_has_only_ops_xnnpack_runs_in_int8(mobile_block, samples, tmp_path):
    """No HARD_SWISH (XNNPACK: float only) or RELU_0_TO_1 (XNNPACK: none): each cut the int8 graph apart."""
    from edgesdk.converters.formats.onnx2tf_tool import Onnx2TfTool
    from edgesdk.converters.formats.tflite import convert_to_tflite

    result = convert_to_tflite(mobile_block, tmp_path / "tflite", calibration={"x": samples["x"][:16]},
                               eval_inputs={"x": samples["x"][16:]}, tool=Onnx2TfTool().ensure())
    assert result.parity_max_abs_diff is not None and result.parity_max_abs_diff < 1e-4
    ops = _tflite_ops(result.models["int8_full"])
    assert not {"HARD_SWISH", "RELU_0_TO_1"} & ops, ops
    assert ops <= {"QUANTIZE", "DEQUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "ADD",
                                                       "MUL", "LOGISTIC", "PAD", "RELU6"}


def test_a_scalar_activation_is_calibrated_over_several_batches(tmp_path):
    """A ReduceMean with keepdims=0 gives a 0-d activation: the runs of a batch are folded in
    without an axis to join them along (it raised ``zero-dimensional arrays cannot be
    concatenated``), and its range covers every sample."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
             helper.make_node("Mul", ["m", "two"], ["y"])]
    graph = helper.make_graph(nodes, "scalar", [helper.make_tensor_value_info("x", f, [1, 8])],
                              [helper.make_tensor_value_info("y", f, [])],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = tmp_path / "scalar.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    ranges = calibrate(model, {"x": x}, [MINMAX], tmp_path / "ranges")
    assert ranges.samples == 6
    m = json.loads(ranges.caches[MINMAX].read_text())["data"]["m"]
    assert json.dumps(m).count("3.5") and json.dumps(m).count("43.5"), m
