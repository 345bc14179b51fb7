"""Every fallback is reported: an accelerator the backend cannot drive, or a kind the board lacks, is in info.fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.errors import BackendError
from edgesdk.testing import random_mlp, write_mlp_onnx, write_mlp_tflite


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fallback-models")
    weights = random_mlp([64, 16, 10])
    return {"onnxruntime": write_mlp_onnx(weights, folder / "m.onnx"), "litert": write_mlp_tflite(weights, folder / "m.tflite")}


@pytest.mark.parametrize("backend, says", [
    ("onnxruntime", "rknpu (npu) has no ONNX Runtime execution provider in profile rk3588; running on CPU"),
    ("litert", "rknpu (npu) has no LiteRT delegate in profile rk3588; running on CPU"),
])
def test_an_npu_without_a_delegate_or_provider_is_a_reported_fallback(models, backend, says, caplog):
    with caplog.at_level(logging.WARNING), Runtime(models[backend], profile="rk3588", accelerator="npu") as rt:
        assert rt.info.backend == backend
        assert any(says in note for note in rt.info.fallbacks), rt.info.fallbacks
        assert rt.info.accelerator in ("CPUExecutionProvider", "xnnpack")
        assert rt.predict(np.zeros((1, 64), np.float32)).shape == (1, 10)
    assert any(says in r.getMessage() for r in caplog.records)


def test_a_gpu_without_an_ort_provider_is_a_reported_fallback(models, caplog):
    with caplog.at_level(logging.WARNING), Runtime(models["onnxruntime"], profile="rk3588", accelerator="gpu") as rt:
        assert rt.info.accelerator == "CPUExecutionProvider"
        notes = " | ".join(rt.info.fallbacks)
    assert "mali-g610 (gpu) has no ONNX Runtime execution provider in profile rk3588; running on CPU" in notes
    assert "rknpu" not in notes  # only the accelerator asked for is tried
    assert any("mali-g610 (gpu)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("backend, gpu_says", [("onnxruntime", "mali-g610 (gpu) has no ONNX Runtime execution provider"),
                                              ("litert", "LiteRT delegate libtensorflowlite_gpu_delegate.so for "
                                                         "mali-g610 did not load")])
def test_auto_reports_each_accelerator_the_backend_cannot_drive(models, backend, gpu_says):
    with Runtime(models[backend], profile="rk3588") as rt:
        notes = " | ".join(rt.info.fallbacks)
    assert gpu_says in notes and "rknpu (npu) has no" in notes, notes


def test_cpu_and_a_profile_without_accelerators_report_nothing(models):
    for backend in ("onnxruntime", "litert"):
        with Runtime(models[backend], profile="rk3588", accelerator="cpu") as rt:
            assert not [n for n in rt.info.fallbacks if "accelerator" in n or "(gpu)" in n or "(npu)" in n]
        with Runtime(models[backend], profile="raspberry-pi-4") as rt:
            assert not [n for n in rt.info.fallbacks if "(gpu)" in n or "(npu)" in n]


def test_a_kind_the_board_lacks_falls_back_and_a_typo_is_an_error(models, caplog):
    with caplog.at_level(logging.WARNING), Runtime(models["onnxruntime"], profile="raspberry-pi-4",
                                                   accelerator="gpu") as rt:
        assert "profile raspberry-pi-4 has no gpu accelerator; running on CPU" in rt.info.fallbacks
    assert any("no gpu accelerator" in r.getMessage() for r in caplog.records)
    with pytest.raises(BackendError, match="no accelerator 'mali-g61'.*mali-g610"):
        Runtime(models["onnxruntime"], profile="rk3588", accelerator="mali-g61")
