"""convert() judging variants by the board's emulated core, not this host (real qemu-user and aarch64 wheels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.quantization.config import QuantizationConfig
from edgesdk.errors import EmulatorError


def _residual_net(path: Path) -> Path:
    """Conv-ReLU, then two residual blocks: each block's input feeds both its Conv and its Add.

    On x86 ONNX Runtime fuses an int8 QDQ Conv only after rewriting it to uint8, which needs a
    QuantizeLinear with one consumer, so these Convs stay DQ -> float -> Q; on aarch64 int8 is
    taken directly.
    """
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name: str, src: str, cin: int, cout: int) -> str:
        w = (rng.standard_normal((cout, cin, 3, 3)) * (1 / (cin * 9)) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)  # distinct biases: equal ones would be merged
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        nodes.append(helper.make_node("Conv", [src, f"{name}.w", f"{name}.b"], [f"{name}.c"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}.c"], [f"{name}.r"]))
        return f"{name}.r"

    x = conv("stem", "x", 8, 32)
    for i in range(2):
        y = conv(f"block{i}", x, 32, 32)
        nodes.append(helper.make_node("Add", [x, y], [f"sum{i}"]))
        x = f"sum{i}"
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["y"])]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def residual(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    work = tmp_path_factory.mktemp("residual")
    rng = np.random.default_rng(1)
    return _residual_net(work / "residual.onnx"), {"x": rng.standard_normal((48, 8, 32, 32)).astype(np.float32)}


def _request(model: Path, data: dict[str, np.ndarray], out: Path, emulate: bool | None) -> ConversionRequest:
    config = QuantizationConfig.arm64()
    return ConversionRequest(Source(model), Target("raspberry-pi-5", emulate=emulate),
                             Data(data, data, metric="cosine", holdout=0), Output(out, name="residual"),
                             Bounds(max_accuracy_drop=0.05), quantization=config.__class__(
                                 **{**config.__dict__, "calibration_methods": ("minmax",),
                                    "max_search_candidates": 0}))


def test_the_board_core_decides_a_variant_x86_runs_slower(residual, tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESDK_EMULATE", raising=False)  # the default: emulate when set up
    model, data = residual
    report = convert(_request(model, data, tmp_path / "out", None))
    rows = {c.name: c for c in report.plan.candidates}
    assert all(c.estimate.basis == "emulated cortex-a76" for c in rows.values())
    assert "emulated cortex-a76" in report.board_estimates
    int8 = rows["onnx-int8-static-minmax"]
    a76 = {name: c.estimate.counts[0] for name, c in rows.items()}
    fusion = a76["onnx-int8-static-minmax"].fusion
    assert fusion is not None and fusion.int8_kernels == 3 and fusion.dq_float_q == 0
    assert report.plan.chosen.name == int8.name
    assert int8.estimate.latency_ms < 0.95 * rows["onnx-fp32"].estimate.latency_ms
    assert not any("side by side" in n for n in int8.notes)  # this host's clock did not overrule the board's count
    # The same file on this host's ISA (counted, not timed): more work than FP32, with Convs left in float.
    emulator = Emulator(require_userland=False)
    x86 = {p: emulator.count(rows[p].path, {"x": data["x"][:1]}, "haswell") for p in ("onnx-fp32", int8.name)}
    assert x86[int8.name].instructions > x86["onnx-fp32"].instructions
    assert x86[int8.name].fusion is not None and x86[int8.name].fusion.dq_float_q >= 2
    row = report.to_dict()["variants"][[r["name"] for r in report.to_dict()["variants"]].index(int8.name)]
    assert row["emulated"][0]["cpu"] == "cortex-a76" and row["emulated"][0]["int8_kernels"] == 3


def test_without_emulation_the_estimate_is_scaled_and_says_so(residual, tmp_path):
    model, data = residual
    report = convert(_request(model, data, tmp_path / "out", False))
    assert {c.estimate.basis for c in report.plan.candidates} == {"estimated"}
    assert all(c.estimate.counts == () for c in report.plan.candidates)
    assert "scaled from this host" in report.board_estimates and "turned off" in report.board_estimates


def test_an_emulator_that_is_missing_falls_back_or_fails_as_asked(residual, tmp_path, monkeypatch):
    model, data = residual
    monkeypatch.delenv("EDGESDK_EMULATE", raising=False)
    monkeypatch.setenv("EDGESDK_EMULATOR_CACHE", str(tmp_path / "empty-cache"))
    report = convert(_request(model, data, tmp_path / "auto", None))
    assert {c.estimate.basis for c in report.plan.candidates} == {"estimated"}
    assert "edgesdk emulator setup" in report.board_estimates
    with pytest.raises(EmulatorError, match="edgesdk emulator setup"):
        convert(_request(model, data, tmp_path / "required", True))
