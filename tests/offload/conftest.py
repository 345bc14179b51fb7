"""Fixtures of the offload tests: the wide MLP (from tests/conftest.py), a local runtime, a fake V2 server."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import mlp_forward, random_mlp, write_mlp_onnx
from tests.offload.fake_v2 import FakeV2Server
from tests.shared_cache import shared_dir


class FakeClock:
    """A clock tests move by hand (the predictor and the breaker read it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def wide_onnx(wide_mlp):
    return wide_mlp[1]


@pytest.fixture(scope="session")
def frames(wide_mlp):
    """Eight single-row inputs and the outputs the model must give for them."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(8)]
    return xs, [mlp_forward(wide_mlp[0], x) for x in xs]


@pytest.fixture
def local(wide_onnx):
    with Runtime(wide_onnx, threads=1) as rt:
        yield rt


@pytest.fixture
def cloud(wide_onnx):
    with FakeV2Server(wide_onnx) as server:
        yield server


class GatedModel:
    """A real local runtime whose predictions wait for ``gate`` (tests block the local worker with it)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.calls: list[np.ndarray] = []

    @property
    def inputs(self):
        return self.runtime.inputs

    @property
    def outputs(self):
        return self.runtime.outputs

    @property
    def check_finite(self):
        return self.runtime.check_finite

    def predict(self, inputs):
        self.calls.append(inputs["input"] if isinstance(inputs, dict) else inputs)
        self.entered.release()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.runtime.predict(inputs)


@pytest.fixture(scope="session")
def two(tmp_path_factory):
    """Two bundles of the same shape with different weights, and their weights."""
    versions = (("1.0.0", 1), ("2.0.0", 2))

    def build(folder: Path) -> None:
        for version, seed in versions:
            model = write_mlp_onnx(random_mlp([64, 32, 10], seed=seed), folder / f"m{seed}.onnx")
            spec = BundleSpec("mlp", version, "onnx-fp32", "generic-x86_64", "latency",
                              health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
            x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
            bundle_from_model(folder / version, model, spec, {"input": x})

    folder = shared_dir(tmp_path_factory, "managed-offload", build)  # built once per run; the weights are seeded
    return [(folder / version, folder / f"m{seed}.onnx", random_mlp([64, 32, 10], seed=seed))
            for version, seed in versions]
