"""The board emulator: real qemu-user, the real aarch64 onnxruntime/LiteRT wheels, the real counting plugin.

`scripts/setup.sh` builds the userland (`edgesdk emulator setup`); these tests fail, not skip,
when it is missing, since board estimates are a feature of the converter.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.converters.board.board_latency import board_cost
from edgesdk.converters.board.emulate import (
    CYCLES_PER_INSTRUCTION,
    PARALLEL_EFFICIENCY,
    Emulator,
    InstructionCount,
    board_latency_ms,
    emulated_cpu,
)
from edgesdk.converters.board.userland import build_userland
from edgesdk.errors import EmulatorError, ModelFormatError
from edgesdk.runtime.profiles import load_profile


def _conv_net(path: Path) -> Path:
    """Three 3x3 convolutions with ReLU on 16x32x32: enough arithmetic for the kernels to dominate a count."""
    rng = np.random.default_rng(0)
    nodes, inits, channels = [], [], 16
    for i, out in enumerate((32, 32, 32)):
        w = (rng.standard_normal((out, channels, 3, 3)) * (2 / (channels * 9)) ** 0.5).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(out, np.float32), f"b{i}")]
        source = "x" if i == 0 else f"r{i - 1}"
        nodes += [helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        channels = out
    nodes += [helper.make_node("GlobalAveragePool", ["r2"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Emulator:
    """The user's userland and plugin; counts kept apart, so every test run really emulates."""
    return Emulator(counts_dir=tmp_path_factory.mktemp("counts"))


@pytest.fixture(scope="module")
def conv_models(tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    work = tmp_path_factory.mktemp("emulate")
    fp32 = _conv_net(work / "conv.onnx")
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 16, 32, 32)).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(samples)

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.items, None)

    int8 = work / "conv-int8.onnx"
    quantize_static(str(fp32), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return fp32, int8, samples[0]


def test_int8_uses_the_dot_product_kernels_of_a76_that_a72_lacks(emulator, conv_models):
    fp32, int8, x = conv_models
    counts = {(m.name, cpu): emulator.count(m, x, cpu) for m in (fp32, int8) for cpu in ("cortex-a72", "cortex-a76")}
    # FP32 kernels are the same NEON code on both cores.
    a72_fp32, a76_fp32 = counts["conv.onnx", "cortex-a72"].instructions, counts["conv.onnx", "cortex-a76"].instructions
    assert a76_fp32 == pytest.approx(a72_fp32, rel=0.02)
    # sdot does four multiply-accumulates per lane where A72 widens and multiplies: far fewer instructions.
    a72_int8, a76_int8 = counts["conv-int8.onnx", "cortex-a72"].instructions, counts["conv-int8.onnx", "cortex-a76"].instructions
    assert a76_int8 < 0.8 * a72_int8
    assert a76_int8 < a76_fp32
    for count in counts.values():
        assert count.spread < 0.01  # the two counted windows agree
        assert 0 < count.simd < count.instructions and 0 < count.memory < count.instructions


def test_an_a55_is_counted_with_its_own_dot_product_kernels_not_as_an_a53(emulator, conv_models):
    """qemu 7.2 has no Cortex-A55: its stand-in (qemu's cortex-a76 ISA as part 0xd05 r2p0) makes ONNX Runtime pick the
    A55's sdot/udot int8 kernels, which counting on cortex-a53 (the profiles' choice before issue 38) never did."""
    fp32, int8, x = conv_models
    tree = emulator.userland.core_root("cortex-a55")
    assert "CPU part\t: 0xd05" in (tree / "proc" / "cpuinfo").read_text()
    assert "CPU variant\t: 0x2" in (tree / "proc" / "cpuinfo").read_text()
    midr = tree / "sys" / "devices" / "system" / "cpu" / "cpu0" / "regs" / "identification" / "midr_el1"
    assert int(midr.read_text(), 16) == 0x412FD050
    a53, a55 = (emulator.count(int8, x, cpu).instructions for cpu in ("cortex-a53", "cortex-a55"))
    assert a55 < 0.8 * a53
    fp32_a53, fp32_a55 = (emulator.count(fp32, x, cpu).instructions for cpu in ("cortex-a53", "cortex-a55"))
    assert fp32_a55 == pytest.approx(fp32_a53, rel=0.05)  # FP32 kernels: the same NEON code either way


def test_the_optimized_graph_on_aarch64_is_recorded(emulator, conv_models):
    _, int8, x = conv_models
    count = emulator.count(int8, x, "cortex-a76")
    assert count.fusion is not None
    assert (count.fusion.int8_kernels, count.fusion.dq_float_q) == (3, 0)
    assert count.fusion.op_types.get("QLinearConv") == 3 and "Conv" not in count.fusion.op_types
    again = emulator.count(int8, x, "cortex-a76")
    assert again.cached and again.fusion == count.fusion  # the cache keeps it


def test_a_repeated_count_comes_from_the_cache_and_a_changed_model_does_not(emulator, conv_models, tmp_path):
    fp32, _, x = conv_models
    first = emulator.count(fp32, x, "cortex-a76")
    again = emulator.count(fp32, x, "cortex-a76")
    assert again.cached and again.seconds == 0 and again.instructions == first.instructions
    changed = tmp_path / "conv.onnx"
    model = onnx.load(str(fp32))
    model.graph.initializer[0].raw_data = (numpy_helper.to_array(model.graph.initializer[0]) * 2).tobytes()
    onnx.save(model, changed)
    assert not emulator.count(changed, x, "cortex-a76").cached


def test_tflite_runs_under_litert_in_the_emulator(emulator, digits_tflite, digits):
    count = emulator.count(digits_tflite, {"input": digits.x_test[:1].astype(np.float32)}, "cortex-a76")
    assert count.instructions > 0 and count.fusion is None and "ai-edge-litert" in count.runtime


def test_this_hosts_isa_is_counted_by_qemu_x86_64(conv_models, tmp_path):
    fp32, _, x = conv_models
    count = Emulator(cache=tmp_path, require_userland=False).count(fp32, x, "haswell")
    assert count.instructions > 0 and "this host's" in count.runtime


def test_an_unknown_cpu_is_refused_with_the_choices(emulator, conv_models):
    fp32, _, x = conv_models
    with pytest.raises(EmulatorError, match="no emulated CPU 'cortex-a99'.*cortex-a76"):
        emulator.count(fp32, x, "cortex-a99")


def test_a_corrupt_model_is_a_model_format_error(emulator, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelFormatError):
        emulator.count(bad, {"x": np.zeros((1, 16, 32, 32), np.float32)}, "cortex-a76")


def test_a_model_that_fails_in_the_guest_is_an_emulator_error(emulator, conv_models):
    fp32, _, _ = conv_models
    with pytest.raises(EmulatorError, match="fails in the board's runtime on emulated cortex-a76"):
        emulator.count(fp32, {"x": np.zeros((1, 3, 8, 8), np.float32)}, "cortex-a76")


def test_without_a_userland_the_error_says_how_to_build_one(tmp_path):
    with pytest.raises(EmulatorError, match="edgesdk emulator setup"):
        Emulator(cache=tmp_path)


def test_without_arm64_packages_in_apt_the_build_says_how_to_add_them(tmp_path, monkeypatch):
    # dpkg is the edge this machine cannot vary: a stand-in that lists no foreign architecture.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dpkg").write_text("#!/bin/sh\necho\n")
    (fake / "dpkg").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{fake}:{Path(shutil.which('qemu-aarch64') or '/usr/bin').parent}")
    with pytest.raises(EmulatorError, match="dpkg --add-architecture arm64"):
        build_userland(cache=tmp_path / "cache", log=lambda line: None)


def test_profiles_name_the_core_they_are_emulated_on():
    assert [emulated_cpu(c) for c in load_profile("rk3588").clusters] == ["cortex-a55", "cortex-a76"]
    assert emulated_cpu(load_profile("raspberry-pi-4").clusters[0]) == "cortex-a72"
    assert emulated_cpu(load_profile("jetson-orin-nano").clusters[0]) == "neoverse-n1"
    assert emulated_cpu(load_profile("generic-x86_64").clusters[0]) is None


def test_board_latency_is_instructions_times_cpi_over_clock_scaled_by_threads():
    # The CPIs are fitted on published figures (benchmarks/converter/calibration.py); the formula is what is pinned here.
    count = InstructionCount("cortex-a76", 2.4e9, 1e9, 5e8, 0.0, 1, "test")
    a76, a53 = CYCLES_PER_INSTRUCTION["cortex-a76"], CYCLES_PER_INSTRUCTION["cortex-a53"]
    assert board_latency_ms(count, "cortex-a76", 2400) == pytest.approx(1000.0 * a76)  # 2.4e9 * CPI / 2.4e9 Hz
    assert board_latency_ms(count, "cortex-a76", 2400, threads=3) == \
        pytest.approx(1000.0 * a76 / (1 + 2 * PARALLEL_EFFICIENCY))
    assert board_latency_ms(count, "cortex-a53", 2400) == pytest.approx(1000.0 * a53)


def test_board_cost_counts_on_the_cores_of_the_mode(emulator, conv_models):
    fp32, _, x = conv_models
    rk3588 = load_profile("rk3588")
    big, little = board_cost(emulator, fp32, x, rk3588, "latency"), board_cost(emulator, fp32, x, rk3588, "power")
    assert big.basis == "emulated cortex-a76" and little.basis == "emulated cortex-a55"
    assert little.latency_ms > 2 * big.latency_ms  # A55 at 1.8 GHz and CPI 1.98 against A76 at 2.4 GHz and 0.73
    pi5 = board_cost(emulator, fp32, x, load_profile("raspberry-pi-5"), "latency")
    assert pi5.counts[0].cached and pi5.counts[0].instructions == big.counts[0].instructions  # one count, every board


def test_board_cost_on_a_profile_without_an_emulated_core_says_which_cluster(emulator, conv_models):
    fp32, _, x = conv_models
    with pytest.raises(EmulatorError, match="cluster 'cpu' \\(x86_64\\) has no emulated CPU"):
        board_cost(emulator, fp32, x, load_profile("generic-x86_64"), "latency")
