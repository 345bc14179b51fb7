"""`edgesdk convert` with a power budget: the mode and threads it plans, the bundle that runs there, the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk import Runtime
from edgesdk.cli import cli
from edgesdk.runtime.bundle import read_bundle


def _convert(sample: Path, out: Path, *args: str):
    return CliRunner().invoke(cli, ["convert", str(sample / "model.onnx"), "--eval", str(sample / "eval.npy"),
                                    "--out", str(out), "--no-emulate", "--json", *args])


def test_a_budget_with_the_energy_objective_moves_the_model_to_least_energy_and_the_bundle_runs_there(sample,
                                                                                                       tmp_path):
    free = _convert(sample, tmp_path / "free", "--profile", "rk3588", "--fps", "200")
    assert free.exit_code == 0, free.output
    unbudgeted = json.loads(free.stdout)
    assert unbudgeted["planned"] == {"power_mode": "performance", "threads": 4, "runs_on": "cpu",
                                     "runtime_mode": "latency"}
    assert read_bundle(tmp_path / "free" / "bundle").manifest.threads is None

    budgeted = _convert(sample, tmp_path / "budget", "--profile", "rk3588", "--fps", "200", "--power-budget", "3.7",
                        "--objective", "energy")
    assert budgeted.exit_code == 0, budgeted.output
    report = json.loads(budgeted.stdout)
    # The little A55 cores do each inference for less energy than the big ones (rk3588 profile figures).
    assert report["planned"]["power_mode"] == "efficiency" and report["planned"]["runtime_mode"] == "power"
    chosen = next(v for v in report["variants"] if v["chosen"])
    assert chosen["power"]["avg_watts"] <= 3.7 and chosen["power"]["fits"]
    assert chosen["power"]["energy_basis"] == "modelled from estimated"
    assert report["reason"].startswith("lowest energy per inference at 200 fps within 3.7 W")
    assert report["budget"]["watts"] == 3.7 and report["budget"]["fps"] == 200
    assert report["objective"] == report["budget"]["objective"] == "energy"
    # The same budget with the default objective: the fastest point within it (a budget never picks the objective).
    fastest = _convert(sample, tmp_path / "fastest", "--profile", "rk3588", "--fps", "200", "--power-budget", "3.7")
    assert fastest.exit_code == 0, fastest.output
    quick = json.loads(fastest.stdout)
    quick_chosen = next(v for v in quick["variants"] if v["chosen"])
    assert quick["objective"] == "latency" and quick["reason"].startswith("fastest variant at 200 fps within 3.7 W")
    assert quick_chosen["power"]["avg_watts"] <= 3.7
    # The fastest of what fits, within the 5% noise rule (two conversions time this host apart: only figures of one
    # report compare).
    fitting = [v["power"]["latency_ms"] for v in quick["variants"] if not v["rejected"]]
    assert quick_chosen["power"]["latency_ms"] * 0.95 <= min(fitting)
    bundle = read_bundle(tmp_path / "budget" / "bundle")
    assert bundle.manifest.power_mode == "power" and bundle.manifest.threads == report["planned"]["threads"]
    assert bundle.manifest.measured["power"]["power_mode"] == "efficiency"
    # On the device the bundle's mode and threads are what the runtime takes by default.
    with Runtime(tmp_path / "budget" / "bundle", profile="rk3588") as rt:
        assert rt.info.mode == "power" and rt.info.power_mode == "efficiency"
        assert rt.plan.threads == report["planned"]["threads"]


def test_a_budget_the_board_cannot_meet_idle_is_refused_before_any_work(sample, tmp_path):
    result = _convert(sample, tmp_path / "out", "--profile", "raspberry-pi-5", "--fps", "2", "--power-budget", "2")
    assert result.exit_code == 26, result.output
    assert "infeasible on raspberry-pi-5 in any mode: idle 2.8 W (power mode performance) > budget 2 W" in result.output
    assert not (tmp_path / "out").exists()
    # The same limit in mWh per hour.
    energy = _convert(sample, tmp_path / "out", "--profile", "raspberry-pi-5", "--fps", "2", "--energy-budget", "2000")
    assert energy.exit_code == 26 and "> budget 2 W" in energy.output


def test_a_duty_cycled_pi5_that_sleeps_between_wakes_fits_under_its_idle_power(sample, tmp_path):
    result = _convert(sample, tmp_path / "out", "--profile", "raspberry-pi-5", "--wake-every", "600",
                      "--frames-per-wake", "10", "--power-budget", "0.2")
    assert result.exit_code == 0, result.output
    chosen = next(v for v in json.loads(result.stdout)["variants"] if v["chosen"])
    # Sleeping at 0.01 W with a 52.5 J boot every 10 minutes: about 0.1 W, far under the 2.8 W idle.
    assert 0.09 < chosen["power"]["avg_watts"] <= 0.2


@pytest.mark.parametrize(("args", "pattern"), [
    (["--power-budget", "3"], "needs a rate"),
    (["--fps", "5", "--power-budget", "3", "--energy-budget", "3000"], "not both"),
    (["--wake-every", "60", "--power-budget", "1"], "--wake-every and --frames-per-wake together"),
    (["--fps", "5", "--power-budget", "-1"], "watts must be a number > 0"),
], ids=["no-rate", "two-limits", "wake-alone", "negative"])
def test_budget_options_that_do_not_go_together_are_a_usage_error(sample, tmp_path, args, pattern):
    result = _convert(sample, tmp_path / "out", "--profile", "raspberry-pi-5", *args)
    assert result.exit_code == 2, result.output
    assert pattern in result.output and not (tmp_path / "out").exists()


def test_energy_measured_on_the_board_replaces_the_model_at_its_point(sample, tmp_path):
    first = _convert(sample, tmp_path / "first", "--profile", "raspberry-pi-5", "--fps", "5")
    fp32 = next(v for v in json.loads(first.stdout)["variants"] if v["name"] == "onnx-fp32")
    # What `edgesdk bench --energy --json` prints on the board, for the FP32 variant.
    bench = {"p50_ms": 2.0, "info": {"model_sha256": fp32["sha256"]},
             "energy": {"energy_per_inference_mj": 9.5, "sensor": "pmic-adc", "scope": "module"}}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    second = _convert(sample, tmp_path / "second", "--profile", "raspberry-pi-5", "--fps", "5", "--board-figures",
                      str(tmp_path / "bench.json"))
    assert second.exit_code == 0, second.output
    row = next(v for v in json.loads(second.stdout)["variants"] if v["name"] == "onnx-fp32")
    assert row["power"]["latency_ms"] == 2.0 and row["power"]["basis"] == "measured on board"
    assert row["power"]["energy_mj"] == 9.5 and row["power"]["energy_basis"] == "measured on board (--board-figures)"
    assert row["power"]["avg_watts"] == pytest.approx(2.8 + 5 * 9.5 / 1000, abs=1e-4)


def test_a_jetson_conversion_plans_its_gpu_engines_beside_its_cpu_and_the_bundle_records_the_engine(sample, tmp_path):
    """The sample digits classifier on a Jetson Orin Nano: every ONNX variant is also planned on the GPU (TensorRT
    engines and the CUDA fallback, by the roofline estimate), and the bundle records the engine of the choice."""
    result = _convert(sample, tmp_path / "orin", "--profile", "jetson-orin-nano")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    engines = {v["name"]: v["runs_on"] for v in report["variants"]}
    assert engines["onnx-fp16+tensorrt"] == "ampere-gpu TensorRT fp16"
    assert engines["onnx-fp32+cuda"] == "ampere-gpu CUDA fp32" and engines["onnx-fp32"] == "cpu"
    assert "onnx-int8-dynamic+tensorrt" not in engines  # TensorRT has no dynamic quantization
    gpu = [v for v in report["variants"] if v["runs_on"] != "cpu"]
    assert all(v["estimate_basis"].startswith("estimated GPU roofline (") for v in gpu)
    assert all(v["power"]["accelerator"] == "ampere-gpu" and v["power"]["power_mode"] == "15w" for v in gpu)
    # Energy on the GPU is the GPU's active watts in the mode (5.0 W in 15w) times the latency.
    assert all(abs(v["power"]["energy_mj"] - 5.0 * v["power"]["latency_ms"]) < 1e-3 for v in gpu)
    chosen = next(v for v in report["variants"] if v["chosen"])
    manifest = read_bundle(tmp_path / "orin" / "bundle").manifest
    expected = ("cpu", None) if chosen["runs_on"] == "cpu" else (
        "ampere-gpu", "CUDAExecutionProvider" if "CUDA" in chosen["runs_on"] else "TensorrtExecutionProvider")
    assert report["planned"]["runs_on"] == chosen["runs_on"] and (manifest.accelerator, manifest.provider) == expected


def test_a_convolutional_model_is_planned_on_the_jetsons_gpu_and_its_bundle_asks_the_runtime_for_that_engine(tmp_path):
    from tests.unit.test_accelerator_plan import _conv_net

    model = _conv_net(tmp_path / "conv.onnx", channels=64, size=128)
    np.save(tmp_path / "eval.npy", np.random.default_rng(0).standard_normal((12, 3, 128, 128)).astype(np.float32))
    result = CliRunner().invoke(cli, ["convert", str(model), "--eval", str(tmp_path / "eval.npy"), "--metric", "cosine",
                                      "--profile", "jetson-orin-nano", "--out", str(tmp_path / "out"), "--no-emulate",
                                      "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    chosen = next(v for v in report["variants"] if v["chosen"])
    assert chosen["runs_on"].startswith("ampere-gpu TensorRT") and report["planned"]["runs_on"] == chosen["runs_on"]
    cpu = [v["power"]["latency_ms"] for v in report["variants"] if v["runs_on"] == "cpu" and not v["rejected"]]
    assert chosen["power"]["latency_ms"] < min(cpu)
    manifest = read_bundle(tmp_path / "out" / "bundle").manifest
    assert (manifest.accelerator, manifest.provider) == ("ampere-gpu", "TensorrtExecutionProvider")
    assert manifest.measured["board"]["runs_on"] == chosen["runs_on"]
    with Runtime(tmp_path / "out" / "bundle", profile="jetson-orin-nano") as rt:  # this host has no TensorRT: noted
        assert any(note.startswith("TensorrtExecutionProvider") for note in rt.info.fallbacks)
