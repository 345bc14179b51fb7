"""Accelerator selection and CPU fallback, with a real delegate plugin built from C."""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.runtime.profiles import profile_from_dict
from edgesdk.testing import mlp_forward
from tests.conftest import host_profile_dict

SOURCE = Path(__file__).parent / "delegate" / "noop_delegate.c"


@pytest.fixture(scope="session")
def delegate_libs(tmp_path_factory) -> dict[str, Path]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler is needed to build the test delegate; scripts/setup.sh installs gcc"
    out = tmp_path_factory.mktemp("delegates")
    libs = {"ok": out / "libnoop_delegate.so", "failing": out / "libfailing_delegate.so"}
    for kind, lib in libs.items():
        flags = ["-DFAIL_PREPARE"] if kind == "failing" else []
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", *flags, "-o", str(lib), str(SOURCE)], check=True)
    return libs


def _profile(host_big_little, litert_delegates, providers=()):
    data = host_profile_dict(list(host_big_little.cluster("little").cores), list(host_big_little.cluster("big").cores))
    data["accelerators"] = [{"name": "test-gpu", "kind": "gpu", "litert_delegates": [str(p) for p in litert_delegates],
                             "onnxruntime_providers": list(providers)}]
    return profile_from_dict(data)


def test_profile_delegate_is_loaded_applied_and_recorded(delegate_libs, host_big_little, digits_tflite, digits,
                                                         digits_mlp):
    counter = ctypes.CDLL(str(delegate_libs["ok"])).noop_delegate_prepare_calls
    calls_before = counter()
    with Runtime(digits_tflite, profile=_profile(host_big_little, [delegate_libs["ok"]])) as rt:
        assert rt.info.accelerator == f"test-gpu ({delegate_libs['ok']})"
        assert rt.info.fallbacks == ()
        out = rt.predict(digits.x_test[:4])
    assert counter() > calls_before, "LiteRT never called the delegate's Prepare"
    np.testing.assert_allclose(out, mlp_forward(digits_mlp, digits.x_test[:4]), atol=1e-5)


def test_missing_delegate_library_falls_back_to_xnnpack_and_logs(host_big_little, digits_tflite, digits, caplog,
                                                                 tmp_path):
    missing = tmp_path / "libtensorflowlite_gpu_delegate.so"
    with caplog.at_level(logging.WARNING), Runtime(digits_tflite, profile=_profile(host_big_little, [missing])) as rt:
        assert rt.info.accelerator == "xnnpack"
        assert len(rt.info.fallbacks) == 1 and str(missing) in rt.info.fallbacks[0]
        assert rt.predict(digits.x_test[:2]).shape == (2, 10)
    assert any("did not load" in r.getMessage() for r in caplog.records)


def test_second_delegate_is_tried_when_the_first_is_missing(delegate_libs, host_big_little, digits_tflite, tmp_path):
    profile = _profile(host_big_little, [tmp_path / "libabsent.so", delegate_libs["ok"]])
    with Runtime(digits_tflite, profile=profile) as rt:
        assert rt.info.accelerator == f"test-gpu ({delegate_libs['ok']})"
        assert "libabsent.so" in rt.info.fallbacks[0]


def test_delegate_that_cannot_prepare_the_model_falls_back(delegate_libs, host_big_little, digits_tflite, digits,
                                                           digits_mlp):
    with Runtime(digits_tflite, profile=_profile(host_big_little, [delegate_libs["failing"]])) as rt:
        assert rt.info.accelerator == "xnnpack"
        assert "could not prepare this model" in rt.info.fallbacks[-1]
        out = rt.predict(digits.x_test[:3])
    np.testing.assert_allclose(out, mlp_forward(digits_mlp, digits.x_test[:3]), atol=1e-5)


def test_cpu_accelerator_skips_the_profile_delegates(delegate_libs, host_big_little, digits_tflite):
    with Runtime(digits_tflite, profile=_profile(host_big_little, [delegate_libs["ok"]]), accelerator="cpu") as rt:
        assert rt.info.accelerator == "xnnpack" and rt.info.fallbacks == ()


def test_onnxruntime_providers_are_filtered_by_the_build_and_fallback_recorded(host_big_little, digits_onnx):
    profile = _profile(host_big_little, [], providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    with Runtime(digits_onnx, profile=profile) as rt:
        assert rt.info.accelerator == "CPUExecutionProvider"
        assert [f.split()[0] for f in rt.info.fallbacks] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        assert all("not in this onnxruntime build" in f for f in rt.info.fallbacks)
