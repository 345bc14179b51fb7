"""TFLite variants through onnx2tf, for real: the tool environment is installed on the first run
(about a minute, needs PyPI) and reused afterwards; each conversion then takes a few seconds offline."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk import Runtime
from edgesdk.converters.formats.onnx2tf_tool import ONNX2TF_VERSION, Onnx2TfTool
from edgesdk.converters.formats.tflite import TFLiteInput, convert_to_tflite
from edgesdk.errors import ConversionError, UnsupportedOpError

pytestmark = pytest.mark.tflite

VARIANT_FILES = {"fp32": "model_fp32.tflite", "fp16": "model_fp16.tflite",
                 "int8_dynamic": "model_int8_dynamic.tflite", "int8_full": "model_int8_full.tflite"}


@pytest.fixture(scope="module")
def tool() -> Onnx2TfTool:
    return Onnx2TfTool().ensure()


@pytest.fixture(scope="module")
def digits_result(tool, digits, digits_onnx, tmp_path_factory):
    return convert_to_tflite(digits_onnx, tmp_path_factory.mktemp("tflite") / "digits",
                             calibration={"input": digits.x_train[:256]}, eval_inputs={"input": digits.x_test}, tool=tool)


def small_cnn(path, seed: int = 0):
    """Conv+Relu+GlobalAveragePool+Flatten+Gemm on a static [1, 3, 32, 32] NCHW input, random weights."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "conv_w"),
               numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "conv_b"),
               numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.3).astype(np.float32), "fc_w"),
               numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_digits_mlp_gives_four_variants_that_run_and_agree(digits_result, digits):
    result = digits_result
    assert {v: p.name for v, p in result.models.items()} == VARIANT_FILES
    out_dir = result.models["fp32"].parent
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([*VARIANT_FILES.values(), "onnx2tf.log"])  # no temp files
    assert result.log_path == out_dir / "onnx2tf.log" and result.converter == f"onnx2tf {ONNX2TF_VERSION}"
    assert result.inputs == (TFLiteInput("input", (None, 64), (None, 64), (0, 1)),)
    assert result.inputs[0].layout == "as ONNX"
    assert result.parity_max_abs_diff is not None and result.parity_max_abs_diff < 1e-4

    top1 = {}
    for variant, path in result.models.items():
        with Runtime(path, profile="generic-x86_64") as rt:
            assert rt.info.backend == "litert" and [s.name for s in rt.inputs] == ["input"]
            probs = rt.predict(digits.x_test)
        assert probs.shape == (len(digits.x_test), 10) and probs.dtype == np.float32
        top1[variant] = probs.argmax(1)
    assert (top1["fp32"] == digits.y_test).mean() > 0.93
    for variant in ("fp16", "int8_dynamic", "int8_full"):
        assert (top1[variant] == top1["fp32"]).mean() >= 0.9, variant


def test_nchw_cnn_becomes_nhwc_and_matches_onnx_runtime(tool, tmp_path):
    """Three-channel 4-D input: onnx2tf reads its sample-image file (written by edgesdk, no download)."""
    model = small_cnn(tmp_path / "cnn.onnx")
    x = np.random.default_rng(1).random((24, 3, 32, 32), dtype=np.float32)
    result = convert_to_tflite(model, tmp_path / "out", calibration={"image": x[:16]}, eval_inputs={"image": x[16:]},
                               tool=tool)
    assert set(result.models) == set(VARIANT_FILES)
    (image,) = result.inputs
    assert (image.layout, image.onnx_shape, image.tflite_shape) == ("NHWC", (1, 3, 32, 32), (1, 32, 32, 3))
    assert result.parity_max_abs_diff is not None and result.parity_max_abs_diff < 1e-4

    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x[16:17]})[0]
    with Runtime(result.models["fp32"], profile="generic-x86_64") as rt:
        np.testing.assert_allclose(rt.predict({"image": image.to_tflite(x[16:17])}), expected, atol=1e-4)


def test_op_onnx2tf_cannot_convert_is_named(tool, tmp_path):
    """CastLike (a standard op since opset 15) runs in ONNX Runtime, but onnx2tf has no implementation of it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("CastLike", ["r", "like"], ["y"], name="to_half")]
    graph = helper.make_graph(nodes, "castlike", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 8])],
                              [numpy_helper.from_array(np.ones(1, np.float16), "like")])
    path = tmp_path / "castlike.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": -np.ones((2, 8), np.float32)})
    assert y.dtype == np.float16

    with pytest.raises(UnsupportedOpError) as info:
        convert_to_tflite(path, tmp_path / "out", tool=tool)
    assert info.value.ops == ("CastLike",)
    assert "CastLike" in str(info.value) and "to_half" in str(info.value)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["onnx2tf.log"]
    assert str(tmp_path / "out" / "onnx2tf.log") in str(info.value)


def test_half_installed_tool_is_not_used_and_is_reinstalled(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_TOOLS_DIR", str(tmp_path))
    tool = Onnx2TfTool()
    assert tool.location == tmp_path / f"onnx2tf-{ONNX2TF_VERSION}"
    # What an interrupted install leaves behind: a venv with a working Python, some files, no marker.
    tool.python.parent.mkdir(parents=True)
    tool.python.symlink_to(sys.executable)
    (tool.location / "leftover-from-pip").write_text("")
    assert not tool.installed
    with pytest.raises(ConversionError, match="not installed"):
        tool.run(["--help"], tmp_path, timeout=10)
    tool.marker.write_text("onnx2tf==0.0.1\n")  # a marker for another version does not count either
    assert not tool.installed

    seen_at_install: list[list[str]] = []

    def fake_install(self: Onnx2TfTool, timeout_s: float) -> None:
        seen_at_install.append(sorted(p.name for p in self.location.iterdir()))
        self.python.parent.mkdir()
        self.python.symlink_to(sys.executable)

    monkeypatch.setattr(Onnx2TfTool, "_install", fake_install)
    assert tool.ensure() is tool and tool.installed
    assert seen_at_install == [[]]  # the leftovers were wiped before installing again
    tool.ensure()
    assert len(seen_at_install) == 1  # a complete install is reused


def test_failed_install_writes_no_marker(tmp_path, monkeypatch):
    def failing_install(self: Onnx2TfTool, timeout_s: float) -> None:
        raise ConversionError("pip install failed")

    monkeypatch.setattr(Onnx2TfTool, "_install", failing_install)
    tool = Onnx2TfTool(tmp_path / "onnx2tf")
    with pytest.raises(ConversionError, match="pip install failed"):
        tool.ensure()
    assert tool.location.is_dir() and not tool.marker.exists() and not tool.installed
