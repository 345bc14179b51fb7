"""TensorRT as a deployment (issue 38, item 5): provider options per variant, the engine cache in the slot.

This host has no GPU and its onnxruntime build has no TensorRT provider, so no engine is built here: the tests
check the options and the cache path ONNX Runtime is asked for. Where a session is made, onnxruntime's
``get_available_providers`` claims TensorRT and CUDA, and ``InferenceSession`` records the providers it is given
and then runs on the CPU provider (the provider edge is the only thing stood in for).
"""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import pytest

from edgesdk.agent import Installer, ManagedRuntime, ModelStore
from edgesdk.errors import BackendError
from edgesdk.runtime.backends.tensorrt import (
    CUDA_PROVIDER,
    TRT_PROVIDER,
    TrtDeployment,
    providers_with_options,
    variant_precision,
)
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.runtime import Runtime
from edgesdk.testing import random_mlp, write_mlp_onnx

CPU = "CPUExecutionProvider"
GIB = 2**30


@pytest.mark.parametrize(("variant", "precision"), [
    ("onnx-fp16", "fp16"), ("onnx-int8-static-minmax", "int8"), ("onnx-int8-static-entropy", "int8"),
    ("onnx-mixed-3", "int8"), ("onnx-int8-dynamic", "fp32"), ("onnx-fp32", "fp32"), ("as-given", "fp32"), (None, "fp32"),
])
def test_the_variant_decides_the_precision_flags(variant, precision):
    assert variant_precision(variant) == precision


def test_an_fp16_bundle_gets_fp16_a_cache_in_its_slot_and_half_the_model_budget(tmp_path):
    slot = tmp_path / "slots" / "det-1.0.0"
    slot.mkdir(parents=True)
    options, note = TrtDeployment.for_model(slot / "model.onnx", "onnx-fp16", 2048).provider_options()
    assert note is None and (slot / "trt_cache").is_dir()
    assert options == {"trt_fp16_enable": True, "trt_int8_enable": False, "trt_max_workspace_size": GIB,
                       "trt_engine_cache_enable": True, "trt_engine_cache_path": str(slot / "trt_cache"),
                       "trt_timing_cache_enable": True, "trt_timing_cache_path": str(slot / "trt_cache")}


def test_an_int8_qdq_bundle_gets_int8_and_not_fp16(tmp_path):
    options, _ = TrtDeployment.for_model(tmp_path / "model.onnx", "onnx-int8-static-percentile", 1024).provider_options()
    assert (options["trt_int8_enable"], options["trt_fp16_enable"]) == (True, False)
    assert options["trt_max_workspace_size"] == GIB // 2


def test_a_bare_model_caches_where_the_caller_says(tmp_path):
    deployment = TrtDeployment.for_model(tmp_path / "m" / "model.onnx", None, 2048, cache_dir=tmp_path / "engines")
    options, _ = deployment.provider_options()
    assert options["trt_engine_cache_path"] == str(tmp_path / "engines") and options["trt_fp16_enable"] is False


def test_a_cache_directory_that_cannot_be_made_turns_the_cache_off_with_a_note(tmp_path):
    (tmp_path / "blocked").write_text("a file where the directory should go")
    options, note = TrtDeployment(precision="fp16", cache_dir=tmp_path / "blocked" / "trt_cache",
                                  workspace_bytes=GIB).provider_options()
    assert "trt_engine_cache_enable" not in options and options["trt_fp16_enable"] is True
    assert note is not None and note.startswith(f"TensorRT engine cache directory {tmp_path / 'blocked' / 'trt_cache'} "
                                                "cannot be written")


def test_a_bad_precision_is_refused_naming_it():
    with pytest.raises(BackendError, match="TensorRT precision 'bf16' is not one of"):
        TrtDeployment(precision="bf16", cache_dir=None, workspace_bytes=1)


def test_only_the_tensorrt_provider_gets_options(tmp_path):
    deployment = TrtDeployment("fp16", None, GIB)
    providers, notes = providers_with_options([TRT_PROVIDER, CUDA_PROVIDER, CPU], deployment)
    assert providers == [(TRT_PROVIDER, {"trt_fp16_enable": True, "trt_int8_enable": False,
                                         "trt_max_workspace_size": GIB}), CUDA_PROVIDER, CPU]
    assert notes == []
    assert providers_with_options([CUDA_PROVIDER, CPU], deployment) == ([CUDA_PROVIDER, CPU], [])


@pytest.fixture
def sessions(monkeypatch) -> list:
    """The providers each InferenceSession was asked for, on a build that claims TensorRT and CUDA."""
    asked: list = []
    real = ort.InferenceSession

    def recording(model, options=None, providers=None, **kwargs):
        asked.append(providers)
        return real(model, options, providers=[CPU], **kwargs)

    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT_PROVIDER, CUDA_PROVIDER, CPU])
    monkeypatch.setattr(ort, "InferenceSession", recording)
    return asked


def _bundle(out, variant: str):
    model = write_mlp_onnx(random_mlp([64, 16, 10], seed=4), out.parent / f"{out.name}.onnx")
    x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
    spec = BundleSpec("det", "1.0.0", variant, "jetson-orin-nano", "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
    return bundle_from_model(out, model, spec, {"input": x}).path


def test_the_runtime_asks_onnxruntime_for_the_bundles_tensorrt_deployment(tmp_path, sessions):
    bundle = _bundle(tmp_path / "bundle", "onnx-fp16")
    sessions.clear()  # writing the bundle ran its sample on this host's CPU
    with Runtime(bundle, profile="jetson-orin-nano") as rt:
        assert rt.info.accelerator == CPU  # the stand-in runs on the CPU: no GPU here
        assert any(f.startswith(f"{TRT_PROVIDER} was requested") for f in rt.info.fallbacks)
    [providers] = sessions
    name, options = providers[0]
    assert name == TRT_PROVIDER and providers[1:] == [CUDA_PROVIDER, CPU]
    assert options["trt_fp16_enable"] is True and options["trt_engine_cache_path"] == str(bundle / "trt_cache")
    assert options["trt_max_workspace_size"] == GIB  # half of the Orin Nano profile's 2048 MiB budget


def test_the_install_health_check_builds_the_engine_into_the_slot_and_a_restart_reuses_it(tmp_path, sessions):
    bundle = _bundle(tmp_path / "bundle", "onnx-int8-static-minmax")
    store = ModelStore(tmp_path / "store")
    store.add_slot("det-1.0.0", lambda tmp: shutil.copytree(bundle, tmp, dirs_exist_ok=True))
    sessions.clear()
    with ManagedRuntime(profile="jetson-orin-nano") as managed:  # what `edgesdk agent` gives its installer
        assert Installer(store, managed).install("det-1.0.0").event == "committed"
        assert managed.bundle is not None and managed.bundle.path == store.slots / "det-1.0.0"
    slot_cache = str(store.slots / "det-1.0.0" / "trt_cache")
    # one session, the health check's, which serves afterwards: its first run of the sample builds the engine
    assert [p[0][1]["trt_engine_cache_path"] for p in sessions] == [slot_cache]
    assert sessions[0][0][1]["trt_int8_enable"] is True
    assert store.verify_slot("det-1.0.0").manifest.variant == "onnx-int8-static-minmax"  # the cache breaks no hash
    with Runtime(store.current_path(), profile="jetson-orin-nano"):  # the app (re)starting on the committed slot
        pass
    assert sessions[-1][0][1]["trt_engine_cache_path"] == slot_cache
