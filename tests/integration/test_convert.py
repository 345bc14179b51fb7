"""edgesdk convert end to end: real ONNX Runtime quantization, subprocess measurement, bundles."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from edgesdk import Runtime
from edgesdk.cli import cli
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, QuantizationConfig, Source, Target, convert
from edgesdk.converters.board.remote import RemoteMeasurement
from edgesdk.converters.planning.data import split_evaluation
from edgesdk.converters.planning.metrics import resolve_metric
from edgesdk.converters.quantization.model_runs import run_model
from edgesdk.errors import BudgetError, DataError, ModelFormatError
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.profiles import list_profiles, profile_from_dict
from tests.conftest import host_profile_dict


@pytest.fixture(scope="module")
def digits_arrays(digits):
    return {"input": digits.x_train[:256]}, {"input": digits.x_test}


@pytest.fixture(scope="module")
def digits_report(digits_onnx, digits, digits_arrays, tmp_path_factory):
    calibration, evaluation = digits_arrays
    return convert(ConversionRequest(
        Source(digits_onnx), Target("raspberry-pi-5"), Data(calibration, evaluation, labels=digits.y_test),
        Output(tmp_path_factory.mktemp("convert") / "out", name="digits", version="1.2.0")))


def test_every_onnx_variant_is_built_measured_and_judged(digits_report):
    names = {c.name for c in digits_report.plan.candidates}
    assert {"onnx-fp32", "onnx-fp16", "onnx-int8-dynamic", "onnx-int8-static-minmax", "onnx-int8-static-entropy",
            "onnx-int8-static-percentile"} <= names
    for c in digits_report.plan.candidates:
        m = c.measurement
        # A digits-sized variant may fit in heap pages the worker already held (VmHWM need not rise): measured, not
        # necessarily above the baseline.
        assert m.size_bytes > 0 and m.latency_p50_ms > 0 and m.peak_rss_mb >= m.rss_before_mb > 0
        assert c.chosen or c.rejected or c.estimate.latency_ms >= digits_report.plan.chosen.estimate.latency_ms
        assert c.estimate.basis == "estimated"
    sizes = {c.name: c.measurement.size_bytes for c in digits_report.plan.candidates}
    assert sizes["onnx-int8-static-minmax"] < 0.6 * sizes["onnx-fp32"]
    assert sizes["onnx-fp16"] < 0.7 * sizes["onnx-fp32"]


def test_static_int8_on_digits_stays_within_half_a_point(digits_report):
    drops = {c.name: c.accuracy_drop for c in digits_report.plan.candidates}
    assert digits_report.metric == "top1_accuracy" and drops["onnx-fp32"] == 0
    assert min(d for n, d in drops.items() if n.startswith("onnx-int8-static")) <= 0.5


def test_chosen_variant_is_bundled_with_a_health_check_that_passes(digits_report):
    bundle = read_bundle(digits_report.bundle.path)
    m = bundle.manifest
    assert (m.name, m.version, m.target_profile, m.power_mode) == ("digits", "1.2.0", "raspberry-pi-5", "latency")
    assert m.variant == digits_report.plan.chosen.name
    assert m.measured["board"]["basis"] == "estimated" and m.measured["accuracy"]["metric"] == "top1_accuracy"
    if m.variant != "onnx-fp32":
        assert m.quantization is not None and m.quantization["per_channel"] is True
    inputs, expected = bundle.health_sample()
    with Runtime(bundle.path, profile="generic-x86_64") as rt:
        out = rt.predict(inputs)
    np.testing.assert_allclose(out, expected["probabilities"], atol=m.health_check.atol, rtol=m.health_check.rtol)


def test_each_variant_is_scored_on_the_selection_samples_and_checked_on_the_held_out_ones(digits_report, digits):
    # 450 evaluation samples, 30% held out: 135 check, 315 choose; the drops are those of the outputs sliced by index.
    split = split_evaluation(450, 0.3, seed=0, minimum=20, labels=digits.y_test)
    report = digits_report
    assert report.holdout is not None and (len(report.holdout.selection), len(report.holdout.holdout)) == (315, 135)
    np.testing.assert_array_equal(report.holdout.holdout, split.holdout)
    metric = resolve_metric("top1_accuracy", digits.y_test)
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32").measurement.outputs
    assert len(fp32) == 450  # one run over every evaluation sample, sliced afterwards
    for c in report.plan.candidates:
        out = c.measurement.outputs
        for rows, drop in ((split.selection, c.accuracy_drop), (split.holdout, c.holdout_drop)):
            assert drop == pytest.approx(metric.drop(fp32[rows], out[rows], digits.y_test[rows])), c.name
    assert report.plan.chosen.holdout_drop <= report.max_accuracy_drop

    data = report.to_dict()
    assert data["holdout"] == {"selection_samples": 315, "holdout_samples": 135, "holdout_fraction": 0.3,
                               "holdout_seed": 0, "holdout_min": 20, "holdout_note": None}
    rows = {v["name"]: v for v in data["variants"]}
    for c in report.plan.candidates:
        assert (rows[c.name]["accuracy_drop"], rows[c.name]["holdout_drop"]) == (
            round(c.accuracy_drop, 4), round(c.holdout_drop, 4))
    json.dumps(data)  # JSON-ready

    accuracy = read_bundle(report.bundle.path).manifest.measured["accuracy"]
    chosen = report.plan.chosen
    assert accuracy["selection_drop"] == chosen.accuracy_drop and accuracy["holdout_drop"] == chosen.holdout_drop
    assert accuracy["drop_vs_fp32"] == (chosen.holdout_drop if chosen.holdout_drop is not None else chosen.accuracy_drop)
    assert accuracy["holdout_drop"] == report.plan.chosen.holdout_drop
    assert (accuracy["selection_samples"], accuracy["holdout_samples"], accuracy["holdout_seed"]) == (315, 135, 0)


def _board_with_latencies(latencies: dict[str, float]):
    """A stand-in board of the fleet: ONNX Runtime's outputs on this host, and latencies the test chooses."""
    def measure_on(path, evaluation):
        latency = latencies.get(path.stem, 1.0)
        outputs = {"probabilities": run_model(path, evaluation)[0]}
        return RemoteMeasurement("bench-board", "raspberry-pi-5", latency, latency, latency, 1.0, 50.0, 60.0, 1,
                                 "onnxruntime", "CPUExecutionProvider", "", outputs)
    return measure_on


def test_a_variant_that_fails_on_held_out_samples_is_not_shipped(digits_onnx, digits, tmp_path):
    # Ten-fold inputs, outside the calibrated range, are planted exactly where the split holds out: static INT8
    # saturates there and nowhere else, so it wins on the selection samples and must fail the held-out check.
    x = digits.x_test[:100].copy()
    split = split_evaluation(100, 0.3, seed=5, minimum=20)
    x[split.holdout] *= 8
    fastest = {"onnx-int8-static-minmax": 0.1, "onnx-int8-dynamic": 0.5}  # ms; every other variant 1 ms
    report = convert(ConversionRequest(
        Source(digits_onnx), Target("raspberry-pi-5", measure_on=_board_with_latencies(fastest)),
        Data({"input": digits.x_train[:256]}, {"input": x}, metric="max_abs_error", holdout_seed=5),
        Output(tmp_path / "o"), Bounds(max_accuracy_drop=0.2),
        quantization=QuantizationConfig(calibration_methods=("minmax",))))
    static = next(c for c in report.plan.candidates if c.name == "onnx-int8-static-minmax")
    assert static.accuracy_drop <= 0.2 < static.holdout_drop, (static.accuracy_drop, static.holdout_drop)
    assert static.rejected == (f"held-out drop {static.holdout_drop:.3g} > bound 0.2 (selection drop "
                               f"{static.accuracy_drop:.3g})",) and not static.chosen
    # The next fastest variant that holds on the held-out samples ships. Which one that is depends on the installed
    # quantizer's numbers: INT8 dynamic held until 2026-11-23's installs; on a fresh install of 2026-11-24 it
    # drops 0.86 on the ten-fold inputs too, and FP32 and FP16 tie (1 ms each, within noise): the more accurate
    # of the two ships (the tie rule is accuracy, then size; FP16's drop is above FP32's 0 unless it is exact).
    dynamic = next(c for c in report.plan.candidates if c.name == "onnx-int8-dynamic")
    fp16 = next(c for c in report.plan.candidates if c.name == "onnx-fp16")
    tied = "onnx-fp16" if fp16.judged_drop <= 0 else "onnx-fp32"
    expected = "onnx-int8-dynamic" if dynamic.holdout_drop <= 0.2 else tied
    rejected_first = "onnx-int8-static-minmax" + ("" if dynamic.holdout_drop <= 0.2 else ", onnx-int8-dynamic")
    chosen = report.plan.chosen
    assert chosen.name == expected and chosen.holdout_drop <= 0.2
    assert f"{rejected_first} chosen first and rejected: held-out drop over the bound" in report.plan.reason
    manifest = read_bundle(report.bundle.path).manifest
    assert manifest.variant == expected
    assert manifest.measured["accuracy"]["holdout_drop"] == chosen.holdout_drop
    # Measured on the (stand-in) board: the manifest names that basis and carries a measurement's band.
    assert (manifest.measured["board"]["basis_label"], manifest.measured["board"]["band"]) == ("measured", 0.05)


def test_too_few_evaluation_samples_convert_without_a_split_and_say_so(digits_onnx, digits, tmp_path):
    x = {"input": digits.x_test[:30]}
    report = convert(ConversionRequest(Source(digits_onnx), Target("raspberry-pi-5"), Data(x, x),
                                       Output(tmp_path / "o"),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    assert report.holdout is not None and not report.holdout.is_split
    assert "30 evaluation samples, a split needs at least 40" in report.holdout.note
    assert all(c.holdout_drop is None for c in report.plan.candidates)
    assert report.calibration is not None and report.calibration.samples == 30  # no split: all of them calibrate
    data = report.to_dict()
    assert data["holdout"]["holdout_samples"] == 0 and "30 evaluation samples" in data["holdout"]["holdout_note"]
    assert all(v["holdout_drop"] is None for v in data["variants"])
    accuracy = read_bundle(report.bundle.path).manifest.measured["accuracy"]
    assert (accuracy["holdout_drop"], accuracy["selection_samples"], accuracy["holdout_samples"]) == (None, 30, 0)


@pytest.mark.parametrize("profile", [p.name for p in list_profiles()])
def test_a_valid_bundle_for_every_shipped_profile(profile, digits_onnx, digits_arrays, tmp_path):
    calibration, evaluation = digits_arrays
    report = convert(ConversionRequest(Source(digits_onnx), Target(profile), Data(calibration, evaluation),
                                       Output(tmp_path / "o"),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    bundle = read_bundle(report.bundle.path)
    assert bundle.manifest.target_profile == profile
    assert bundle.manifest.measured["board"]["latency_ms"] > 0


def test_not_an_onnx_file(tmp_path, digits_arrays):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x01garbage that is not protobuf" * 4)
    with pytest.raises(ModelFormatError, match="not an ONNX model"):
        convert(ConversionRequest(Source(path), Target("raspberry-pi-5"), Data(*digits_arrays), Output(tmp_path / "o")))


def test_model_the_onnx_checker_rejects(tmp_path, digits_arrays):
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Relu", ["missing_tensor"], ["y"])], "bad", [x], [y])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(ModelFormatError, match="checker rejects"):
        convert(ConversionRequest(Source(path), Target("raspberry-pi-5"), Data(*digits_arrays), Output(tmp_path / "o")))


@pytest.mark.parametrize(
    ("calibration", "pattern"),
    [
        ({"input": np.zeros((8, 63), np.float32)}, r"shape \(8, 63\).*input: float32\[\?, 64\]"),
        ({"input": np.zeros((8, 64), np.float64)}, "is float64, the model takes float32"),
        ({"input": np.zeros((0, 64), np.float32)}, "is empty"),
        ({"pixels": np.zeros((8, 64), np.float32)}, "no data for input"),
    ],
    ids=["shape", "dtype", "empty", "name"],
)
def test_calibration_data_that_does_not_fit_the_model(digits_onnx, digits_arrays, tmp_path, calibration, pattern):
    with pytest.raises(DataError, match=pattern):
        convert(ConversionRequest(Source(digits_onnx), Target("raspberry-pi-5"), Data(calibration, digits_arrays[1]),
                                  Output(tmp_path / "o")))


def test_empty_evaluation_set(digits_onnx, digits_arrays, tmp_path):
    with pytest.raises(DataError, match="evaluation data.*empty"):
        convert(ConversionRequest(Source(digits_onnx), Target("raspberry-pi-5"),
                                  Data(digits_arrays[0], {"input": np.zeros((0, 64), np.float32)}),
                                  Output(tmp_path / "o")))


def test_budget_no_variant_fits(digits_onnx, digits_arrays, tmp_path):
    data = host_profile_dict([0], [1])
    data["memory"] = {"ram_mb": 64, "model_budget_mb": 1}
    with pytest.raises(BudgetError, match=r"no variant fits host-big-little .*model budget 1 MiB.*closest"):
        convert(ConversionRequest(Source(digits_onnx), Target(profile_from_dict(data)), Data(*digits_arrays),
                                  Output(tmp_path / "o"),
                                  quantization=QuantizationConfig(calibration_methods=("minmax",))))


def test_cli_convert_prints_the_table_and_signs(tmp_path, digits_onnx, digits):
    np.save(tmp_path / "calib.npy", digits.x_train[:128])
    np.save(tmp_path / "eval.npy", digits.x_test)
    np.save(tmp_path / "labels.npy", digits.y_test)
    runner = CliRunner()
    assert runner.invoke(cli, ["keys", "generate", "--out", str(tmp_path / "keys")]).exit_code == 0
    result = runner.invoke(cli, [
        "convert", str(digits_onnx), "--profile", "rk3588", "--calibration", str(tmp_path / "calib.npy"),
        "--eval", str(tmp_path / "eval.npy"), "--labels", str(tmp_path / "labels.npy"), "--out", str(tmp_path / "o"),
        "--sign", str(tmp_path / "keys" / "edgesdk.key"), "--name", "digits"])
    assert result.exit_code == 0, result.output
    assert "CHOSEN" in result.output and "onnx-int8-static-minmax" in result.output and "(signed)" in result.output
    header = next(line for line in result.output.splitlines() if "size KiB" in line)
    assert "drop (points)  held-out drop  accuracy on  host-board diff  verdict" in header
    assert "on 315 selection samples" in result.output and "135 samples nothing was chosen on" in result.output
    verified = runner.invoke(cli, ["verify", str(tmp_path / "o" / "bundle"), "--pub", str(tmp_path / "keys" / "edgesdk.pub")])
    assert verified.exit_code == 0 and "signed by" in verified.output
    bad = runner.invoke(cli, ["convert", str(digits_onnx), "--profile", "rk3588", "--eval", str(tmp_path / "labels.npy"),
                              "--out", str(tmp_path / "o2")])
    assert bad.exit_code == DataError.exit_code and "error:" in bad.output and "Traceback" not in bad.output


def test_cli_convert_json(tmp_path, digits_onnx, digits):
    np.save(tmp_path / "eval.npy", digits.x_test[:100])
    result = CliRunner().invoke(cli, ["convert", str(digits_onnx), "--profile", "jetson-orin-nano", "--eval",
                                      str(tmp_path / "eval.npy"), "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["profile"] == "jetson-orin-nano" and data["metric"] == "top1_agreement"
    assert sum(v["chosen"] for v in data["variants"]) == 1
    # Without --calibration the evaluation data calibrates: only its 70 selection samples, never the 30 held out.
    assert (data["holdout"]["selection_samples"], data["holdout"]["holdout_samples"]) == (70, 30)
    assert data["calibration"]["samples"] == 70
    assert all(isinstance(v["holdout_drop"], float) for v in data["variants"])
    # Emulation is off in these tests: every variant is judged on this host's outputs, none on a board's.
    assert {(v["accuracy_basis"], v["board_drop"], v["host_board_difference"]) for v in data["variants"]} == {
        ("this host", None, None)}
    again = CliRunner().invoke(cli, ["convert", str(digits_onnx), "--profile", "jetson-orin-nano", "--eval",
                                     str(tmp_path / "eval.npy"), "--out", str(tmp_path / "o2"), "--json",
                                     "--holdout", "0"])
    assert again.exit_code == 0, again.output
    unsplit = json.loads(again.stdout)
    assert unsplit["holdout"]["holdout_samples"] == 0 and "holdout is 0" in unsplit["holdout"]["holdout_note"]
    assert unsplit["calibration"]["samples"] == 100


def test_pytorch_module_is_exported_then_converted(digits, tmp_path):
    import torch

    from edgesdk.testing import digits_cnn

    cnn = digits_cnn(digits, epochs=3)
    images = digits.x_test.reshape(-1, 1, 8, 8)
    report = convert(ConversionRequest(
        Source(cnn, example_inputs=[torch.zeros(1, 1, 8, 8)]), Target("raspberry-pi-5"),
        Data({"input": digits.x_train[:128].reshape(-1, 1, 8, 8)}, {"input": images}, labels=digits.y_test),
        Output(tmp_path / "o"), quantization=QuantizationConfig(calibration_methods=("minmax",))))
    spec = report.bundle.manifest.inputs[0]
    assert (spec.name, spec.shape) == ("input", (None, 1, 8, 8))
    fp32 = next(c for c in report.plan.candidates if c.name == "onnx-fp32")
    with torch.no_grad():
        reference = cnn(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(fp32.measurement.outputs, reference, atol=1e-4)


def test_dynamic_batch_can_be_fixed_from_the_users_shape(digits_onnx, digits_arrays, tmp_path):
    report = convert(ConversionRequest(Source(digits_onnx, input_shapes={"input": [1, 64]}), Target("raspberry-pi-5"),
                                       Data(*digits_arrays), Output(tmp_path / "o"),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    assert report.bundle.manifest.inputs[0].shape == (1, 64)
    assert len(report.plan.chosen.measurement.outputs) == len(digits_arrays[1]["input"])


@pytest.mark.tflite
def test_tflite_variants_are_measured_and_planned_with_the_onnx_ones(digits_onnx, digits, digits_arrays, tmp_path):
    calibration, evaluation = digits_arrays
    report = convert(ConversionRequest(Source(digits_onnx), Target("raspberry-pi-4"),
                                       Data(calibration, evaluation, labels=digits.y_test), Output(tmp_path / "o"),
                                       formats=("onnx", "tflite"),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    tflite = {c.name: c for c in report.plan.candidates if c.format == "tflite"}
    assert set(tflite) == {"tflite-fp32", "tflite-fp16", "tflite-int8-dynamic", "tflite-int8-full"}
    assert report.tflite_error is None and report.tflite_parity_max_abs_diff < 1e-4
    assert tflite["tflite-fp32"].accuracy_drop == 0 and tflite["tflite-int8-full"].accuracy_drop <= 2
    assert all(c.measurement.backend == "litert" for c in tflite.values())
    read_bundle(report.bundle.path)


@pytest.mark.tflite
def test_op_tflite_cannot_take_is_named_and_the_onnx_bundle_is_still_made(tmp_path):
    # STFT: ONNX Runtime runs it, onnx2tf's converter for it fails; it survives simplification.
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64, 1])
    y = helper.make_tensor_value_info("spectrum", TensorProto.FLOAT, ["N", 7, 9, 2])
    nodes = [helper.make_node("Relu", ["input"], ["r"], name="relu"),
             helper.make_node("STFT", ["r", "step", "", "length"], ["spectrum"], name="stft", onesided=1)]
    graph = helper.make_graph(nodes, "stft", [x], [y], [
        onnx.numpy_helper.from_array(np.array(8, np.int64), "step"),
        onnx.numpy_helper.from_array(np.array(16, np.int64), "length")])
    path = tmp_path / "stft.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    data = {"input": np.random.default_rng(0).standard_normal((32, 64, 1)).astype(np.float32)}
    report = convert(ConversionRequest(Source(path), Target("raspberry-pi-4"), Data(data, data, metric="cosine"),
                                       Output(tmp_path / "o"), Bounds(max_accuracy_drop=1.0), formats=("onnx", "tflite"),
                                       quantization=QuantizationConfig(calibration_methods=("minmax",))))
    assert report.tflite_error is not None and "STFT" in report.tflite_error, report.tflite_error
    assert all(c.format == "onnx" for c in report.plan.candidates)
    assert read_bundle(report.bundle.path).manifest.model_format.value == "onnx"
