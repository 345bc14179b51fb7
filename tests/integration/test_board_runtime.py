"""A variant the board's own runtime refuses is rejected with the board's error; the others keep their emulated figures
(issue 38, item 7). Real qemu-user, the real aarch64 userland `scripts/setup.sh` builds, real onnxruntime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.board.conversion_costs import ConversionCosts
from edgesdk.converters.board.emulate import Emulator
from edgesdk.errors import BoardRuntimeError
from edgesdk.runtime.profiles import load_profile
from tests.integration.gather_model import gather as _gather

GUEST = Path(__file__).resolve().parents[2] / "converters" / "board" / "_guest_count.py"
X = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}




@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("board-runtime")
    return _gather(folder / "good.onnx", 2), _gather(folder / "bad.onnx", 7)


def test_the_guest_reports_a_refused_model_in_one_line_with_its_own_exit_status(models, tmp_path):
    np.savez(tmp_path / "inputs.npz", **X)
    done = subprocess.run([sys.executable, str(GUEST), str(models[1]), str(tmp_path / "inputs.npz"), "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("edgesdk-board-error: ")]
    assert "indices element out of data bounds" in line


def test_a_model_the_runtime_refuses_raises_board_runtime_error_naming_the_runtime(models, tmp_path):
    with pytest.raises(BoardRuntimeError, match=r"bad\.onnx fails in the board's runtime on emulated haswell "
                                                r"\(onnxruntime .*\): .*out of data bounds"):
        Emulator(cache=tmp_path, require_userland=False).count(models[1], X, "haswell")


def test_a_variant_the_boards_runtime_refuses_is_rejected_and_the_others_stay_emulated(models, tmp_path_factory):
    emulator = Emulator(counts_dir=tmp_path_factory.mktemp("counts"))
    costs = ConversionCosts(True, load_profile("raspberry-pi-5"), "latency", X, emulator=emulator)  # --emulate
    good, bad = models
    assert costs.count("onnx-fp32", good) is not None
    assert costs.count("onnx-broken", bad) is None
    assert costs.active, "one variant the board refuses must not turn emulation off for the others"
    assert set(costs.failures) == {"onnx-broken"} and "cortex-a76" in costs.failures["onnx-broken"]
    assert costs.count("onnx-fp32-again", good) is not None and costs.note.startswith(
        "board latency from instructions counted on emulated cortex-a76")


def test_the_boards_own_outputs_are_this_hosts_and_a_refusal_is_a_board_runtime_error(tmp_path):
    """Issue 59: the board's answers are computed on every sample, not compared on one. For a model
    both run (column 2 of each row) they are this host's; a column the model does not have is
    refused by the board's runtime, and that refusal, not a difference, fails the variant
    (BoardRuntimeError naming the board's error)."""
    import onnxruntime as ort

    from edgesdk.converters.board.board_outputs import board_outputs

    emulator = Emulator(counts_dir=tmp_path / "emulator" / "counts")
    rows = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
    good, bad = _column(tmp_path / "column.onnx", 2), _column(tmp_path / "missing.onnx", 7)
    session = ort.InferenceSession(str(good), providers=["CPUExecutionProvider"])
    host = np.concatenate([session.run(None, {"x": rows["x"][i:i + 1]})[0] for i in range(4)])
    board = board_outputs(emulator, good, rows, "cortex-a76")
    assert np.array_equal(board.outputs, host)
    assert np.array_equal(board.outputs[:, 0], rows["x"][:, 2])
    refused = r"missing\.onnx on emulated cortex-a76 \(.*\) fails in the board's runtime: .*bounds"
    with pytest.raises(BoardRuntimeError, match=refused):
        board_outputs(emulator, bad, rows, "cortex-a76")


def _column(path: Path, index: int) -> Path:
    """y = Gather(x, [index], axis=1) over x [1, 3]: refused at run time for index >= 3."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], "column",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.array([index], dtype=np.int64), "i")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_boards_output_is_kept_per_input_values_not_per_shapes(models, tmp_path_factory):
    """Counts are cached per input shapes; the board's output must not be: one kept for other values of the same
    shapes would be compared with this host's answer to these, and reject a variant that computes them right. A count
    cached for other values is still a file read; the output for these values comes from a run made for them."""
    emulator = Emulator(counts_dir=tmp_path_factory.mktemp("counts"))
    good = models[0]
    other = {"x": X["x"] + 100}
    emulator.count(good, X, "cortex-a76")
    assert emulator.count(good, other, "cortex-a76").cached  # same shapes: the count is not redone
    for inputs in (X, other):
        board = emulator.first_output(good, inputs, "cortex-a76")
        assert board is not None and np.array_equal(board, inputs["x"][2:3])


def test_emulated_counts_under_a_budget_move_a_two_cluster_board_to_its_little_cores(tmp_path_factory):
    """Issue 38: no power test used emulated counts. An RK3588 counted on both clusters' emulated cores, at a rate
    and budget that the big cluster cannot meet but the little one can: the choice moves there, on counts."""
    from edgesdk.converters.board.board_latency import operating_points
    from edgesdk.converters.board.measure import Measurement
    from edgesdk.converters.board.power import PowerBudget, power_at
    from edgesdk.converters.planning.planner import Candidate, choose, estimate_on_board
    from tests.integration.test_emulate import _conv_net

    rk3588 = load_profile("rk3588")
    model = _conv_net(tmp_path_factory.mktemp("conv") / "conv.onnx")
    x = {"x": np.random.default_rng(0).standard_normal((1, 16, 32, 32)).astype(np.float32)}
    costs = ConversionCosts(True, rk3588, "latency", x, emulator=Emulator(counts_dir=tmp_path_factory.mktemp("c")),
                            every_cluster=True)
    cost = costs.count("onnx-fp32", model)
    assert cost is not None and {c.cpu for c in cost.counts} == {"cortex-a76", "cortex-a55"}
    m = Measurement(size_bytes=1 << 20, sha256="conv", load_ms=1.0, latency_p50_ms=5.0, latency_p95_ms=5.0,
                    rss_before_mb=50.0, peak_rss_mb=60.0, threads=2, backend="onnxruntime",
                    accelerator="CPUExecutionProvider", outputs=np.zeros((1, 32)))
    estimate = estimate_on_board(5.0, load_profile("generic-x86_64"), 2, rk3588, "latency", emulated=cost)
    fp32 = Candidate("onnx-fp32", "onnx", model, "fp32", m, 0.0, estimate)
    points = operating_points(rk3588)
    little_ms = max(estimate.model.at(rk3588, p)[0] for p in points if p.power_mode == "efficiency")
    fps = 0.5 / (little_ms / 1000)  # a rate every little-core point keeps up with (duty at most 0.5)

    def lowest_average(mode: str) -> float:
        return min(power_at(rk3588, p, *estimate.model.at(rk3588, p), PowerBudget(fps=fps)).avg_watts
                   for p in points if p.power_mode == mode)

    big, little = lowest_average("performance"), lowest_average("efficiency")
    assert little < big, "on these counts the little cores must be the cheaper way to keep up"
    free = choose([fp32], rk3588, "latency", 0.5, budget=PowerBudget(fps=fps))
    assert free.point.power_mode == "performance" and free.chosen.power.basis.startswith("emulated cortex-a76")
    budget = PowerBudget(fps=fps, watts=(big + little) / 2)  # between what the two clusters draw at this rate
    tight = choose([fp32], rk3588, "latency", 0.5, budget=budget)
    power = tight.chosen.power
    assert tight.point.power_mode == "efficiency" and power.basis.startswith("emulated cortex-a55")
    assert power.avg_watts <= budget.watts
