"""A variant that crashes or hangs on the emulated board is vetoed alone; the others keep their
emulated figures (issue 59, item 3). Real qemu-user, the real aarch64 userland and onnxruntime;
the crash and the hang are real too: the guest's test-only fault hook (``EDGESDK_GUEST_FAULT``,
see ``converters/board/_guest_count.py``) makes the emulated process read its unmapped first
page (SIGSEGV) or block on a pipe inside its counted window."""

from __future__ import annotations

import re
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

X = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
#: Short enough to keep the tests fast, long enough for a tiny model's count on a loaded 2-core
#: host (10-20 s measured here): over 4x that, so only the hanging guest reaches it.
TIMEOUT_S = 90




def _processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line names ``text`` (a unique temporary path)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def _costs(tmp_path: Path, required: bool | None = None) -> ConversionCosts:
    emulator = Emulator(counts_dir=tmp_path / "counts", timeout_s=TIMEOUT_S)
    board = load_profile("raspberry-pi-5")
    return ConversionCosts(required, board, "latency", X, emulator=emulator, workers=2)


def test_a_crash_and_a_hang_are_each_vetoed_alone_and_the_others_stay_emulated(tmp_path,
                                                                               monkeypatch):
    fp32, crash, hang, good = (_gather(tmp_path / f"{name}.onnx", i)
                               for i, name in enumerate(("fp32", "crash", "hang", "good")))
    monkeypatch.setenv("EDGESDK_GUEST_FAULT", "segv:crash.onnx,hang:hang.onnx")
    monkeypatch.delenv("EDGESDK_EMULATE")  # the tests' default is off; here auto, as a user's
    costs = _costs(tmp_path)
    # The hang first, so that its wait overlaps the other counts.
    for label, path in (("onnx-hang", hang), ("onnx-fp32", fp32), ("onnx-crash", crash),
                        ("onnx-good", good), ("onnx-good-again", good)):
        costs.submit(label, path)
    lines: list[tuple[str, int, int]] = []
    costs.wait_all(lambda line, done, total: lines.append((line, done, total)))

    assert set(costs.failures) == {"onnx-crash", "onnx-hang"}
    crashed = "crash.onnx crashed on the emulated cortex-a76 (signal 11, SIGSEGV) in its counted"
    assert crashed in costs.failures["onnx-crash"]
    hung = f"hang.onnx did not finish in {TIMEOUT_S} s on the emulated cortex-a76"
    assert hung in costs.failures["onnx-hang"]
    assert costs.active
    assert costs.note.startswith("board latency from instructions counted on emulated cortex-a76")
    assert set(costs.costs) == {"onnx-fp32", "onnx-good", "onnx-good-again"}
    assert all(c.basis == "emulated cortex-a76" for c in costs.costs.values())
    # One file under two labels is counted once: the second waits for the first, reads its count.
    twice = costs.costs["onnx-good"].counts[0], costs.costs["onnx-good-again"].counts[0]
    assert sorted(c.cached for c in twice) == [False, True]
    assert twice[0].instructions == twice[1].instructions
    assert lines[-1][1:] == (5, 5) and lines[-1][0].endswith(": 5/5 variants")
    assert not _processes_naming(str(hang)), "the hung guest's qemu must be killed, not left"


def test_the_reference_failing_on_the_board_turns_emulation_off_with_its_reason(tmp_path,
                                                                              monkeypatch):
    """FP32 is what every variant's latency is compared with: when it crashes on the board, no count
    can be compared, so every variant is costed from this host's timings and the note says why;
    nothing is vetoed. Required (--emulate), that is an error."""
    fp32, other = _gather(tmp_path / "fp32.onnx", 0), _gather(tmp_path / "other.onnx", 1)
    monkeypatch.setenv("EDGESDK_GUEST_FAULT", "segv:fp32.onnx")
    monkeypatch.delenv("EDGESDK_EMULATE")
    costs = _costs(tmp_path)
    costs.submit("onnx-fp32", fp32)
    costs.submit("onnx-int8", other)
    assert costs.cost("onnx-int8") is None  # waits for the reference first
    costs.wait_all()
    assert not costs.active and costs.costs == {} and costs.failures == {}
    assert costs.note.startswith("board latency scaled from this host's timings: onnx-fp32, the "
                                 "reference every variant is compared with, could not be counted "
                                 "on the emulated board (")
    assert "crashed on the emulated cortex-a76 (signal 11, SIGSEGV)" in costs.note
    assert not _processes_naming(str(other)), "a count left when emulation is turned off is killed"
    required = _costs(tmp_path, required=True)  # --emulate
    with pytest.raises(BoardRuntimeError, match="onnx-fp32, the reference .* Without --emulate"):
        required.count("onnx-fp32", fp32)


def _conv(path: Path) -> Path:
    """Conv 4->8 3x3, Relu, global average pool on 4x8x8, then MatMul 8->8: small, and every
    precision of it (INT8 dynamic takes the MatMul) runs on both machines."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["h"]),
             helper.make_node("MatMul", ["h", "m"], ["y"])]
    weights = {"w": rng.standard_normal((8, 4, 3, 3)) / 6, "b": rng.standard_normal(8) * 0.1 + 0.5,
               "m": rng.standard_normal((8, 8)) / 3}
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", f, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", f, [1, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.slow  # a real conversion, as tests/integration/test_convert.py: 50-110 s here
def test_convert_rejects_a_crashed_and_a_hung_variant_with_the_boards_reason(tmp_path, monkeypatch):
    """Through convert(): FP16 hangs and INT8 dynamic crashes on the emulated board; both are
    rejected with the board's reason in the report's rows (the CLI table's verdict column), FP32
    and INT8 static keep their emulated figures, and the choice is made among them."""
    from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert
    from edgesdk.converters.quantization.config import QuantizationConfig

    monkeypatch.delenv("EDGESDK_EMULATE")
    monkeypatch.setenv("EDGESDK_GUEST_FAULT", "hang:onnx-fp16.onnx,segv:onnx-int8-dynamic.onnx")
    monkeypatch.setenv("EDGESDK_EMULATOR_TIMEOUT_S", str(TIMEOUT_S))
    model = _conv(tmp_path / "conv.onnx")
    data = {"x": np.random.default_rng(1).standard_normal((8, 4, 8, 8)).astype(np.float32)}
    arm64 = QuantizationConfig.arm64()
    config = arm64.__class__(**{**arm64.__dict__, "calibration_methods": ("minmax",),
                                "max_search_candidates": 0})
    stages: list[str] = []
    request = ConversionRequest(Source(model), Target("raspberry-pi-5"),
                                Data(data, data, metric="cosine", holdout=0),
                                Output(tmp_path / "out"), Bounds(max_accuracy_drop=0.05),
                                quantization=config)
    report = convert(request, progress=lambda stage, done, total: stages.append(stage))

    verdicts = {row["name"]: "; ".join(row["rejected"]) for row in report.to_dict()["variants"]}
    hung = f"onnx-fp16.onnx did not finish in {TIMEOUT_S} s on the emulated cortex-a76"
    assert hung in verdicts["onnx-fp16"]
    crashed = "onnx-int8-dynamic.onnx crashed on the emulated cortex-a76 (signal 11, SIGSEGV)"
    assert crashed in verdicts["onnx-int8-dynamic"]
    rows = {c.name: c for c in report.plan.candidates}
    kept = ("onnx-fp32", "onnx-int8-static-minmax")
    assert {n: rows[n].estimate.basis for n in kept} == dict.fromkeys(kept, "emulated cortex-a76")
    assert report.board_estimates.startswith("board latency from instructions counted on emulated")
    assert report.plan.chosen.name in kept
    done = r"counting on the board's emulated cores \(\d+ at a time\): 4/4 variants"
    assert any(re.fullmatch(done, stage) for stage in stages), stages
    assert not _processes_naming(str(tmp_path)), "no guest of this conversion may outlive it"
