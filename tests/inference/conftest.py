"""Inference endpoint fixtures: a repository with small ONNX bundles (built once per session), started endpoints."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgesdk.ota_server.broker import free_port
from edgesdk.ota_server.inference import InferenceServer, serve_inference
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import random_mlp, write_mlp_onnx
from tests.shared_cache import shared_dir

WIDTH_IN, WIDTH_OUT = 16, 4


def make_bundle(out: Path, name: str, version: str, seed: int, batch: int | None = None) -> Path:
    """An unsigned bundle of a small MLP (16 -> 8 -> 4); ``batch`` None leaves the batch dim dynamic."""
    work = out.parent / f".{out.name}-model"
    work.mkdir(parents=True, exist_ok=True)
    model = write_mlp_onnx(random_mlp([WIDTH_IN, 8, WIDTH_OUT], seed=seed), work / "model.onnx", batch=batch)
    x = np.random.default_rng(seed).standard_normal((1, WIDTH_IN)).astype(np.float32)
    bundle_from_model(out, model, BundleSpec(name, version, "onnx-fp32", "generic-x86_64", "latency"), {"input": x})
    return out


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Bundles by key: mlp 1.0.0 and 2.0.0 (dynamic batch, different weights), fixed (batch fixed at 1)."""
    def build(folder: Path) -> None:
        make_bundle(folder / "mlp-1", "mlp", "1.0.0", seed=1)
        make_bundle(folder / "mlp-2", "mlp", "2.0.0", seed=2)
        make_bundle(folder / "fixed", "fixed", "1.0.0", seed=3, batch=1)

    folder = shared_dir(tmp_path_factory, "inference-bundles", build)  # built once per run, read-only for tests
    return {key: folder / key for key in ("mlp-1", "mlp-2", "fixed")}


@pytest.fixture
def repo(tmp_path, bundles) -> ModelRepository:
    """A repository holding mlp 1.0.0 and fixed 1.0.0 (push mlp-2 in a test to see a new version served)."""
    repository = ModelRepository(tmp_path / "repo", allow_unsigned=True)
    repository.add(bundles["mlp-1"])
    repository.add(bundles["fixed"])
    return repository


@pytest.fixture
def serve(repo) -> Iterator[Callable[..., InferenceServer]]:
    """Factory: ``serve(**serve_inference keywords)`` starts an endpoint on a free loopback port over ``repo``."""
    running: list[InferenceServer] = []

    def factory(**kwargs: object) -> InferenceServer:
        server = serve_inference(kwargs.pop("repository", repo), f"127.0.0.1:{free_port()}", **kwargs)  # type: ignore[arg-type]
        running.append(server)
        return server

    yield factory
    for server in running:
        server.stop()


@pytest.fixture
def endpoint(serve) -> InferenceServer:
    """An endpoint with the defaults: every model, newest version, batching on."""
    return serve()


def reference(bundle: Path, x: np.ndarray) -> np.ndarray:
    """The bundle's model run directly in ONNX Runtime (the answer the endpoint must give)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def host_port(server: InferenceServer) -> str:
    """``HOST:PORT`` of an endpoint, as tritonclient takes it."""
    return server.url.removeprefix("http://")


__all__ = ["make_bundle", "reference", "host_port", "shutil", "WIDTH_IN", "WIDTH_OUT"]
