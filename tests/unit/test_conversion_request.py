"""ConversionRequest: the parts of a conversion checked as they are built, and the public names of edgesdk.converters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import edgesdk.converters
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, QuantizationConfig, Source, Target, convert
from edgesdk.errors import ConversionError, DataError
from edgesdk.runtime.profiles import load_profile

X = {"input": np.zeros((4, 64), np.float32)}


def _request(tmp_path, **parts) -> ConversionRequest:
    return ConversionRequest(**{"source": Source(tmp_path / "model.onnx"), "target": Target("rk3588"),
                                "data": Data(X, X), "output": Output(tmp_path / "out"), **parts})


def test_parts_are_frozen_and_normalised_when_built(tmp_path):
    request = _request(tmp_path, formats="tflite, onnx")
    assert request.formats == ("tflite", "onnx")
    assert request.target.board == load_profile("rk3588") and request.target.mode == "latency"
    assert Target("rk3588", mode="power").board.name == "rk3588"
    assert request.source.path == tmp_path / "model.onnx" and not request.source.is_tflite
    assert Source(str(tmp_path / "m.tflite")).is_tflite
    assert request.config == QuantizationConfig.for_profile(load_profile("rk3588"))
    assert request.output.path == tmp_path / "out" and Bounds().max_accuracy_drop == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.formats = ("onnx",)  # type: ignore[misc]


def test_a_module_without_example_inputs_and_labels_that_do_not_match_fail_when_built():
    with pytest.raises(ConversionError, match="PyTorch module needs example_inputs"):
        Source(object())
    with pytest.raises(DataError, match="3 labels for 4 evaluation samples"):
        Data(X, X, labels=np.zeros(3, np.int64))


def test_an_out_dir_filled_after_the_request_was_built_is_refused_before_any_work(tmp_path):
    request = _request(tmp_path)
    (tmp_path / "out" / "bundle").mkdir(parents=True)
    stages: list[str] = []
    with pytest.raises(ConversionError, match=r"already holds a conversion \(bundle/\)"):
        convert(request, progress=lambda stage, done, total: stages.append(stage))
    assert stages == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_public_names_are_exported_from_the_package():
    for name in ("convert", "ConversionRequest", "Source", "Target", "Data", "Bounds", "Output", "ConversionReport",
                 "QuantizationConfig", "board_measure"):
        assert name in edgesdk.converters.__all__ and hasattr(edgesdk.converters, name)


def test_the_held_out_split_settings_default_and_are_checked_when_built():
    data = Data(X, X)
    assert (data.holdout, data.holdout_seed, data.holdout_min) == (0.3, 0, 20)
    assert Data(X, X, holdout=0).holdout == 0.0 and isinstance(Data(X, X, holdout=0).holdout, float)
    assert Data(X, X, holdout=0.5, holdout_seed=3, holdout_min=5).holdout_min == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.holdout = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(("field", "value", "pattern"), [
    ("holdout", 0.6, "holdout 0.6 must be a fraction from 0 to 0.5"),
    ("holdout", 1, "holdout 1 must be a fraction from 0 to 0.5"),
    ("holdout", -0.1, "holdout -0.1 must be a fraction"),
    ("holdout", float("nan"), "holdout nan must be a fraction"),
    ("holdout", True, "holdout True must be a fraction"),
    ("holdout", "0.3", "holdout '0.3' must be a fraction"),
    ("holdout_seed", -1, "holdout seed -1 must be an integer >= 0"),
    ("holdout_seed", 1.5, "holdout seed 1.5 must be an integer >= 0"),
    ("holdout_min", 0, "holdout minimum 0 must be an integer >= 1"),
], ids=lambda v: repr(v))
def test_a_bad_held_out_setting_is_a_data_error_naming_the_value(field, value, pattern):
    with pytest.raises(DataError, match=pattern.replace("(", r"\(")):
        Data(X, X, **{field: value})
