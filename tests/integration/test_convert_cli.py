"""`edgesdk convert` as an operator meets it: arguments checked before the work, --out/--force, quiet output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, QuantizationConfig, Source, Target, convert
from edgesdk.errors import BudgetError, BundleError, ConversionError, DataError, ProfileError, SignatureError
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.profiles import profile_from_dict
from tests.conftest import host_profile_dict

FAST = QuantizationConfig(calibration_methods=("minmax",))




@pytest.fixture(scope="module")
def arrays(sample):
    return {"input": np.load(sample / "calib.npy")}, {"input": np.load(sample / "eval.npy")}


class Stages(list):
    def __call__(self, stage: str, done: int, total: int) -> None:
        self.append(stage)


def _request(model, arrays, out, profile="raspberry-pi-5", mode="latency", version="1.0.0", name="model",
             formats=("onnx",), metric=None, max_accuracy_drop=0.5, fps=None, input_shapes=None, private_key=None,
             force=False, quantization=None, holdout=0.3) -> ConversionRequest:
    """A request for the sample model, each argument given to the part that checks it."""
    return ConversionRequest(Source(model, input_shapes=input_shapes), Target(profile, mode),
                             Data(arrays[0], arrays[1], metric=metric, holdout=holdout),
                             Output(out, name=name, version=version, force=force, private_key=private_key),
                             Bounds(max_accuracy_drop, fps), formats, quantization)


@pytest.mark.parametrize(("change", "error", "pattern"), [
    ({"version": "v2"}, BundleError, "version 'v2' must be dotted integers"),
    ({"name": "../escape"}, BundleError, "not a safe name"),
    ({"formats": ("onnx", "tfl")}, ConversionError, r"unknown format\(s\) \['tfl'\]"),
    ({"metric": "top5"}, DataError, "unknown metric 'top5'"),
    ({"metric": "top1_accuracy"}, DataError, "needs labels"),
    ({"max_accuracy_drop": -1}, ConversionError, "max accuracy drop -1 must be a number >= 0"),
    ({"fps": 0}, ConversionError, "fps 0 must be a number > 0"),
    ({"holdout": 0.9}, DataError, "holdout 0.9 must be a fraction from 0 to 0.5"),
    ({"input_shapes": {"input": [1, 0]}}, ConversionError, "must be a list of integers >= 1"),
    ({"private_key": "edgesdk.key"}, SignatureError, "private_key is a str"),
    ({"profile": "raspberry-pi-9"}, ProfileError, "no device profile named 'raspberry-pi-9'"),
    ({"mode": "turbo"}, ProfileError, "unknown mode 'turbo'"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_a_bad_argument_fails_before_any_work(sample, arrays, tmp_path, change, error, pattern):
    stages = Stages()
    with pytest.raises(error, match=pattern):
        convert(_request(sample / "model.onnx", arrays, tmp_path / "out", **change), progress=stages)
    assert stages == [] and list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.parametrize(("args", "option", "pattern"), [
    (["--version", "v2"], "--version", "version 'v2' must be dotted integers"),
    (["--name", "a/b"], "--name", "not a safe name"),
    (["--formats", "onnx,tfl"], "--formats", "unknown format"),
    (["--max-accuracy-drop", "nan"], "--max-accuracy-drop", "must be a number >= 0"),
    (["--fps", "-5"], "--fps", "must be a number > 0"),
    (["--input-shape", "input:1,64"], "--input-shape", "use NAME=D1,D2"),
    (["--mean", "0.5,0.5"], "--mean", "has 2 values"),
    (["--std", "1,x,1"], "--std", "comma-separated numbers"),
    (["--metric", "top1_accuracy"], "--metric", "needs labels"),
    (["--holdout", "0.7"], "--holdout", "holdout 0.7 must be a fraction from 0 to 0.5"),
    (["--holdout-seed", "-2"], "--holdout-seed", "holdout seed -2 must be an integer >= 0"),
    (["--holdout-min", "0"], "--holdout-min", "holdout minimum 0 must be an integer >= 1"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_cli_refuses_a_bad_option_as_a_usage_error_before_any_work(sample, tmp_path, args, option, pattern):
    result = CliRunner().invoke(cli, ["convert", str(sample / "model.onnx"), "--profile", "raspberry-pi-5",
                                      "--eval", str(sample / "eval.npy"), "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert option in result.output and pattern in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_measure_sign_key_that_is_not_a_private_key_fails_before_any_work(sample, tmp_path):
    """--measure-sign-key signs each measurement archive for a fleet on a root of trust; a wrong file stops at once."""
    keys = tmp_path.parent / f"{tmp_path.name}-keys"
    keys.mkdir()
    (keys / "ci.pub").write_text("-----BEGIN PUBLIC KEY-----\n")
    result = CliRunner().invoke(cli, ["convert", str(sample / "model.onnx"), "--profile", "raspberry-pi-5",
                                      "--eval", str(sample / "eval.npy"), "--out", str(tmp_path / "out"),
                                      "--measure-on", "rk1", "--measure-sign-key", str(keys / "ci.pub")])
    assert result.exit_code == SignatureError.exit_code, result.output
    assert "ci.pub is not an unencrypted PEM private key" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_an_out_dir_holding_a_conversion_needs_force_and_is_replaced_only_when_the_new_one_is_complete(
        sample, arrays, tmp_path):
    out = tmp_path / "out"
    model = sample / "model.onnx"
    first = convert(_request(model, arrays, out, version="1.0.0", quantization=FAST))
    assert first.bundle.path == out / "bundle" and first.plan.chosen.path.parent == out / "variants"
    assert all(Path(c.path).exists() for c in first.plan.candidates)

    stages = Stages()
    with pytest.raises(ConversionError, match=r"already holds a conversion \(variants/, bundle/\); pass --force"):
        convert(_request(model, arrays, out, version="2.0.0", quantization=FAST), progress=stages)
    assert stages == []

    # A forced conversion that fails (nothing fits this budget) leaves the old one whole.
    tiny = host_profile_dict([0], [1])
    tiny["memory"] = {"ram_mb": 64, "model_budget_mb": 1}
    with pytest.raises(BudgetError):
        convert(_request(model, arrays, out, profile=profile_from_dict(tiny), version="2.0.0", quantization=FAST,
                         force=True))
    assert read_bundle(out / "bundle").manifest.version == "1.0.0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left behind

    stages = Stages()
    second = convert(_request(model, arrays, out, version="2.0.0", quantization=FAST, force=True), progress=stages)
    assert read_bundle(out / "bundle").manifest.version == "2.0.0" == second.bundle.manifest.version
    assert second.bundle.path == out / "bundle" and all(Path(c.path).exists() for c in second.plan.candidates)
    assert all(str(out) in Path(p).as_posix() for p in second.calibration.caches.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # Every stage is announced, in order, ending with "done".
    for stage in ("loading and simplifying the model", "measuring onnx-fp32", "building onnx-fp16", "calibrating",
                  "building onnx-int8-static-minmax", "choosing a variant", "writing the bundle"):
        assert stage in stages, stages
    assert stages.index("calibrating") < stages.index("choosing a variant") < stages.index("writing the bundle")
    assert stages[-1] == "done"


def test_cli_out_dir_without_and_with_force(sample, tmp_path):
    out = tmp_path / "out"
    base = ["convert", str(sample / "model.onnx"), "--profile", "raspberry-pi-5", "--eval", str(sample / "eval.npy"),
            "--out", str(out), "--json"]
    runner = CliRunner()
    assert runner.invoke(cli, base).exit_code == 0
    refused = runner.invoke(cli, [*base, "--version", "2.0.0"])
    assert refused.exit_code == 2 and "--out" in refused.output and "--force" in refused.output
    assert read_bundle(out / "bundle").manifest.version == "1.0.0"
    forced = runner.invoke(cli, [*base, "--version", "2.0.0", "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["bundle"] == str(out / "bundle")
    assert read_bundle(out / "bundle").manifest.version == "2.0.0"


def _edgesdk(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGESDK_VERBOSE"}
    return subprocess.run([str(Path(sys.executable).parent / "edgesdk"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def elsewhere_profile(tmp_path_factory) -> Path:
    """A board whose cores this host does not have: every model load warns about scheduling (shown only with -v)."""
    path = tmp_path_factory.mktemp("profiles") / "elsewhere.yaml"
    path.write_text(yaml.safe_dump({**host_profile_dict([1000], [1001]), "name": "elsewhere"}))
    return path


@pytest.mark.parametrize(("model", "noise"), [
    ("model.tflite", ["INFO: Created TensorFlow Lite XNNPACK delegate"]),
    ("model.onnx", ["Finding optimal threshold for each tensor", "Please consider to run pre-processing"]),
])
def test_third_party_noise_and_repeated_warnings_show_only_with_verbose(sample, elsewhere_profile, tmp_path, model,
                                                                        noise):
    args = ["convert", model, "--profile", str(elsewhere_profile), "--eval", "eval.npy", "--calibration", "calib.npy"]
    quiet = _edgesdk(*args, "--out", str(tmp_path / "quiet"), cwd=sample)
    assert quiet.returncode == 0, quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if any(n in line for n in noise)], quiet.stderr
    warnings = [line for line in quiet.stderr.splitlines() if line.startswith("WARNING")]
    # The board's cores are not this host's: true when running, irrelevant when converting (issue 38).
    assert not any("not usable on this host" in w for w in warnings), quiet.stderr
    assert len(warnings) == len(set(warnings)), quiet.stderr  # any other warning of edgesdk's own shows once
    assert "writing the bundle" in quiet.stderr  # the stages, one line each when stderr is not a terminal

    verbose = _edgesdk("-v", *args, "--out", str(tmp_path / "verbose"), cwd=sample)
    assert verbose.returncode == 0, verbose.stderr
    for n in noise:
        assert n in verbose.stderr, verbose.stderr
    assert sum("not usable on this host" in line for line in verbose.stderr.splitlines()) > 1


def test_the_tool_environment_install_is_announced_before_it_starts(tmp_path):
    from edgesdk.converters.formats.onnx2tf_tool import Onnx2TfTool

    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the install cannot even create its directory here, so it stops right after announcing
    said: list[str] = []
    with pytest.raises(OSError):
        Onnx2TfTool(blocker / "onnx2tf").ensure(announce=said.append)
    assert said == [f"installing the onnx2tf tool environment (about 2.6 GB, a minute or more) in {blocker / 'onnx2tf'}"]
