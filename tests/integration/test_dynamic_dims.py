"""Dynamic dims written as -1 or 0 by older exporters (e.g. PP-OCR v2's direction classifier) are dynamic.

They are fixed by ``--input-shape`` like symbolic dims; a dim with a real value still is not.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgesdk import Runtime
from edgesdk.cli import cli
from edgesdk.converters.formats.onnx_model import fix_input_shapes, load_onnx, save_onnx
from edgesdk.converters.quantization.model_runs import run_model
from edgesdk.errors import ConversionError, InputError
from edgesdk.runtime.bundle import read_bundle

SHAPE = [1, 3, 48, 320]


def _write(path, dynamic: int):
    """Conv 3->4, ReLU, global average pool, flatten: x[d, 3, d, d] -> y[d, 4], with d = ``dynamic`` as a dim_value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dynamic, 3, dynamic, dynamic])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dynamic, 4])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "old-exporter", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module", params=[-1, 0], ids=["minus-one", "zero"])
def old_model(request, tmp_path_factory):
    return _write(tmp_path_factory.mktemp("dims") / f"dim{request.param}.onnx", request.param)


def _dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_loading_reads_minus_one_and_zero_as_symbolic_dims(old_model):
    model = load_onnx(old_model)
    assert _dims(model.graph.input[0]) == ["x_dim0", 3, "x_dim2", "x_dim3"]
    assert _dims(model.graph.output[0]) == ["y_dim0", 4]


@pytest.mark.parametrize("load", [load_onnx, lambda p: onnx.load(str(p))], ids=["loaded", "as-written"])
def test_a_minus_one_or_zero_dim_is_fixed_to_the_given_size_and_the_model_runs_with_it(old_model, tmp_path, load):
    fixed = fix_input_shapes(load(old_model), {"x": SHAPE})
    assert _dims(fixed.graph.input[0]) == SHAPE and _dims(fixed.graph.output[0]) == [1, 4]
    path = save_onnx(fixed, tmp_path / "fixed.onnx")
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    reference = run_model(load_onnx(old_model), {"x": x})[0]  # the dynamic model, run at this size
    with Runtime(path, profile="generic-x86_64") as rt:
        assert rt.inputs[0].shape == tuple(SHAPE)
        np.testing.assert_allclose(rt.predict(x), reference, rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match=r"expected x: float32\[1, 3, 48, 320\], got shape \(1, 3, 48, 321\)"):
            rt.predict(np.zeros((1, 3, 48, 321), np.float32))


def test_a_dim_with_a_real_value_still_cannot_be_changed(old_model):
    with pytest.raises(ConversionError, match=r"input 'x' has the shape \[\?, 3, \?, \?\]: its fixed dim 3 cannot "
                                              r"become 4; give x=1,3,48,320"):
        fix_input_shapes(load_onnx(old_model), {"x": [1, 4, 48, 320]})
    with pytest.raises(ConversionError, match=r"input 'x' has rank 4, the fixed shape \[1, 3, 48\] has 3"):
        fix_input_shapes(load_onnx(old_model), {"x": [1, 3, 48]})


def test_the_runtime_reads_a_minus_one_dim_as_dynamic(tmp_path):
    with Runtime(_write(tmp_path / "m.onnx", -1), profile="generic-x86_64") as rt:
        assert rt.inputs[0].shape == (None, 3, None, None)
        assert rt.predict(np.zeros((2, 3, 8, 16), np.float32)).shape == (2, 4)


@pytest.mark.slow
def test_cli_convert_fixes_the_dim_an_old_exporter_wrote_as_minus_one_or_zero(old_model, tmp_path):
    # The issue: exit 12, "input 'x' dim is -1, cannot fix it to 1".
    x = np.random.default_rng(2).standard_normal((8, *SHAPE[1:])).astype(np.float32)
    np.save(tmp_path / "eval.npy", x)
    result = CliRunner().invoke(cli, ["convert", str(old_model), "--profile", "raspberry-pi-5", "--eval",
                                      str(tmp_path / "eval.npy"), "--input-shape", "x=1,3,48,320",
                                      "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    bundle = read_bundle(tmp_path / "out" / "bundle")
    assert bundle.manifest.inputs[0].shape == tuple(SHAPE)
    with Runtime(bundle.path, profile="generic-x86_64") as rt:
        assert rt.predict(x[:1]).shape == (1, 4)
