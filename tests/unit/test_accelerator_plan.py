"""Planning a Jetson's GPU engines: which engines a variant becomes, their costs per power mode, energy, the choice
between CPU and GPU, and the bundle's record of the engine the runtime then takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk import load_profile  # noqa: E402
from edgesdk.converters.board.accelerator_plan import accelerator_candidates, engine_costs, planned_accelerator  # noqa: E402
from edgesdk.converters.board.board_latency import operating_points, target_point  # noqa: E402
from edgesdk.converters.board.measure import Measurement  # noqa: E402
from edgesdk.converters.board.power import PowerBudget, busy_watts  # noqa: E402
from edgesdk.converters.planning.planner import Candidate, choose, estimate_on_board  # noqa: E402
from edgesdk.errors import BundleError, ConversionError  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.profile_json import profile_to_dict  # noqa: E402
from edgesdk.runtime.profiles import profile_from_dict  # noqa: E402

ORIN = load_profile("jetson-orin-nano")
NANO = load_profile("jetson-nano")


def _conv_net(path: Path, qdq: bool = False, channels: int = 32, size: int = 64) -> Path:
    """Two 3x3 convolutions; with ``qdq`` the first one's input and weight come through DequantizeLinear."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), "w2")
    nodes, inits, first_in, first_w = [], [w1, w2], "x", "w1"
    if qdq:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                  numpy_helper.from_array(np.array(0, np.int8), "z")]
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
                  helper.make_node("QuantizeLinear", ["w1", "s", "z"], ["wq"]),
                  helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"])]
        first_in, first_w = "xd", "wd"
    nodes += [helper.make_node("Conv", [first_in, first_w], ["a"], pads=[1, 1, 1, 1], name="conv1"),
              helper.make_node("Relu", ["a"], ["b"]),
              helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", channels, size, size])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


SHAPES = {"x": (1, 3, 64, 64)}


def _m(latency_ms: float = 5.0, size_mb: float = 1.0) -> Measurement:
    return Measurement(size_bytes=int(size_mb * 2**20), sha256="s", load_ms=1.0, latency_p50_ms=latency_ms,
                       latency_p95_ms=latency_ms, rss_before_mb=50.0, peak_rss_mb=60.0, threads=2,
                       backend="onnxruntime", accelerator="CPUExecutionProvider", outputs=np.zeros((1, 1)))


def test_the_planned_accelerator_is_one_with_gpu_providers_and_data_sheet_ceilings() -> None:
    assert planned_accelerator(ORIN).name == "ampere-gpu"
    assert planned_accelerator(NANO).name == "maxwell-gpu"
    for cpu_only in ("rk3588", "raspberry-pi-5"):  # the RK3588's Mali and NPU have no ONNX Runtime provider
        assert planned_accelerator(load_profile(cpu_only)) is None


def test_each_variant_becomes_the_engines_that_can_run_it(tmp_path: Path) -> None:
    fp32, qdq = _conv_net(tmp_path / "fp32.onnx"), _conv_net(tmp_path / "qdq.onnx", qdq=True)
    acc = planned_accelerator(ORIN)
    assert [e.engine for e in engine_costs(fp32, "fp32", acc, SHAPES)] == ["TensorRT fp32", "CUDA fp32"]
    assert [e.engine for e in engine_costs(fp32, "fp16", acc, SHAPES)] == ["TensorRT fp16"]
    assert [e.engine for e in engine_costs(qdq, "int8_static", acc, SHAPES)] == ["TensorRT int8"]
    assert engine_costs(fp32, "int8_dynamic", acc, SHAPES) == []  # TensorRT has no dynamic quantization
    # Maxwell lists no int8 peak: no INT8 engine is planned on a Jetson Nano.
    assert engine_costs(qdq, "int8_static", planned_accelerator(NANO), SHAPES) == []


def test_explicit_quantization_runs_only_the_dequantized_nodes_at_int8(tmp_path: Path) -> None:
    (engine,) = engine_costs(_conv_net(tmp_path / "qdq.onnx", qdq=True), "int8_static", planned_accelerator(ORIN),
                             SHAPES)
    groups = {precision: [c.name for c in nodes if c.op == "Conv"] for precision, nodes in engine.groups}
    assert groups == {"int8": ["conv1"], "fp32": ["conv2"]}


def test_the_cuda_fallback_fuses_nothing_and_costs_more_than_tensorrt(tmp_path: Path) -> None:
    trt, cuda = engine_costs(_conv_net(tmp_path / "fp32.onnx"), "fp32", planned_accelerator(ORIN), SHAPES)
    assert sum(c.kernel for _, g in cuda.groups for c in g) > sum(c.kernel for _, g in trt.groups for c in g)
    assert cuda.latency_ms(ORIN, "15w") > trt.latency_ms(ORIN, "15w")


def test_a_lower_gpu_clock_in_a_power_mode_makes_a_compute_bound_engine_slower(tmp_path: Path) -> None:
    (trt, _) = engine_costs(_conv_net(tmp_path / "fp32.onnx", channels=64, size=128), "fp32",
                            planned_accelerator(ORIN), {"x": (1, 3, 128, 128)})
    fast, slow = trt.latency_ms(ORIN, "15w"), trt.latency_ms(ORIN, "7w")
    assert 1.2 < slow / fast <= 625 / 408 + 1e-9  # compute scales with the clock (408 of 625 MHz), memory does not


def test_energy_on_the_gpu_is_the_accelerators_active_watts_and_a_missing_figure_is_a_clear_error() -> None:
    point = target_point(ORIN, "latency", accelerator="ampere-gpu")
    assert (point.accelerator, point.threads, point.label) == ("ampere-gpu", 1, "15w ampere-gpu")
    assert busy_watts(ORIN, point) == 5.0
    assert [p.label for p in operating_points(ORIN, "ampere-gpu")] == ["15w ampere-gpu", "7w ampere-gpu"]
    data = profile_to_dict(ORIN)
    data["power_modes"][0]["active_watts"] = {"cpu": 4.5}
    with pytest.raises(ConversionError, match="no active_watts for 'ampere-gpu'"):
        busy_watts(profile_from_dict(data), point)


def _candidates(tmp_path: Path, cpu_ms: float) -> list[Candidate]:
    fp32 = _conv_net(tmp_path / "fp32.onnx", channels=64, size=128)
    host = load_profile("generic-x86_64")
    cpu = Candidate("onnx-fp32", "onnx", fp32, "fp32", _m(cpu_ms), 0.0,
                    estimate_on_board(cpu_ms, host, 2, ORIN, "latency", measured_ms=cpu_ms))
    return [cpu, *accelerator_candidates([cpu], ORIN, "latency", {"x": np.zeros((1, 3, 128, 128), np.float32)})]


def test_the_planner_weighs_cpu_and_gpu_and_names_the_engine(tmp_path: Path) -> None:
    slow_cpu = choose(_candidates(tmp_path, 200.0), ORIN, "latency", 0.5)
    assert slow_cpu.chosen.name == "onnx-fp32+tensorrt" and slow_cpu.chosen.runs_on == "ampere-gpu TensorRT fp32"
    assert slow_cpu.chosen.estimate.basis == "estimated GPU roofline (TensorRT fp32)"
    assert "on ampere-gpu TensorRT fp32 in power mode 15w" in slow_cpu.reason
    assert {c.name for c in slow_cpu.candidates} == {"onnx-fp32", "onnx-fp32+tensorrt", "onnx-fp32+cuda"}
    # The CPU stays a candidate: where it is faster, it is chosen.
    fast_cpu = choose(_candidates(tmp_path, 0.01), ORIN, "latency", 0.5)
    assert fast_cpu.chosen.name == "onnx-fp32" and fast_cpu.chosen.runs_on == "cpu"


def test_a_budget_moves_the_gpu_to_its_lower_power_mode(tmp_path: Path) -> None:
    candidates = _candidates(tmp_path, 200.0)
    gpu = next(c for c in choose(candidates, ORIN, "latency", 0.5).candidates if c.name == "onnx-fp32+tensorrt")
    assert gpu.power is not None
    fps = 100 / gpu.power.latency_ms  # duty 0.1 at 15w
    at_15w = 3.5 + fps * 5.0 * gpu.power.latency_ms / 1000
    plan = choose(candidates, ORIN, "latency", 0.5, budget=PowerBudget(fps=fps, watts=at_15w - 0.01))
    assert plan.chosen.accelerator == "ampere-gpu" and plan.point.power_mode == "7w"
    assert plan.chosen.power is not None and plan.chosen.power.avg_watts <= at_15w - 0.01


def test_the_manifest_records_the_engine_and_refuses_a_provider_without_an_accelerator() -> None:
    spec = BundleSpec("m", "1.0.0", "onnx-fp16+tensorrt", "jetson-orin-nano", "latency", accelerator="ampere-gpu",
                      provider="TensorrtExecutionProvider")
    assert (spec.accelerator, spec.provider) == ("ampere-gpu", "TensorrtExecutionProvider")
    with pytest.raises(BundleError, match="needs target.accelerator"):
        BundleSpec("m", "1.0.0", "v", "jetson-orin-nano", "latency", accelerator="cpu",
                   provider="TensorrtExecutionProvider")
    with pytest.raises(BundleError, match="not a safe name"):
        BundleSpec("m", "1.0.0", "v", "jetson-orin-nano", "latency", accelerator="../gpu")
    for hostile in (2**70, ["gpu"], "g" * 10_000_000):  # a manifest from the network: refused, the error stays short
        with pytest.raises(BundleError, match="not a safe name") as refused:
            BundleSpec("m", "1.0.0", "v", "jetson-orin-nano", "latency", accelerator=hostile)
        assert len(str(refused.value)) < 300


@pytest.mark.parametrize(("accelerator", "provider", "requested"), [
    ("cpu", None, []),
    ("ampere-gpu", "CUDAExecutionProvider", ["CUDAExecutionProvider"]),
    ("ampere-gpu", "TensorrtExecutionProvider", ["TensorrtExecutionProvider", "CUDAExecutionProvider"]),
])
def test_the_runtime_takes_the_engine_the_bundle_was_planned_on(tmp_path: Path, accelerator: str,
                                                                provider: str | None, requested: list[str]) -> None:
    """This host's onnxruntime has neither GPU provider, so each one the runtime asked for is a recorded fallback:
    a CPU plan asks for none, a CUDA plan for CUDA only (not TensorRT, which would be another engine)."""
    from edgesdk import Runtime
    from edgesdk.runtime.bundling import bundle_from_model

    model = _conv_net(tmp_path / "fp32.onnx", channels=4, size=8)
    spec = BundleSpec("m", "1.0.0", "onnx-fp32", "jetson-orin-nano", "latency", accelerator=accelerator,
                      provider=provider)
    bundle = bundle_from_model(tmp_path / "bundle", model, spec, {"x": np.zeros((1, 3, 8, 8), np.float32)},
                               profile=ORIN)
    with Runtime(bundle.path, profile=ORIN) as rt:
        asked = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider")
                 if any(note.startswith(p) for note in rt.info.fallbacks)]
        assert asked == requested and rt.info.accelerator == "CPUExecutionProvider"
    with Runtime(bundle.path, profile=ORIN, accelerator="cpu") as rt:  # the caller's explicit choice outranks the plan
        assert not any("ExecutionProvider for" in note for note in rt.info.fallbacks)


def test_a_figure_the_board_measured_on_its_gpu_is_that_engines_basis_and_scales_with_the_gpu_clock(tmp_path: Path):
    """--measure-on through the fleet: the Jetson's runtime ran the file on TensorRT, so the TensorRT engine takes
    the board's figure (scaled to 7w by the GPU clock), and the CUDA fallback keeps its estimate."""
    from dataclasses import replace

    fp32 = _conv_net(tmp_path / "fp32.onnx")
    host = load_profile("generic-x86_64")
    on_board = replace(_m(3.0), measured_on="cam01", accelerator="TensorrtExecutionProvider")
    cpu = Candidate("onnx-fp32", "onnx", fp32, "fp32", on_board, 0.0, estimate_on_board(3.0, host, 2, ORIN, "latency"))
    trt, cuda = accelerator_candidates([cpu], ORIN, "latency", {"x": np.zeros((1, 3, 64, 64), np.float32)})
    assert (trt.estimate.basis, trt.estimate.latency_ms) == ("measured on board", 3.0)
    assert cuda.estimate.basis.startswith("estimated GPU roofline")
    assert trt.estimate.model is not None
    slow, basis = trt.estimate.model.at(ORIN, operating_points(ORIN, "ampere-gpu")[1])
    assert basis == "measured on board, scaled to 7w ampere-gpu" and slow == pytest.approx(3.0 * 625 / 408)
