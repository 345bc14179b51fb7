"""ManagedRuntime with offload: one dispatcher for its whole life, local runs on whichever model is active."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import ManagedRuntime, OffloadPolicy
from edgesdk.errors import BackendError, OffloadError
from edgesdk.testing import mlp_forward
from tests.offload.fake_v2 import FakeV2Server


def test_the_dispatcher_survives_a_swap_and_runs_locally_on_the_new_model(two):
    (a_dir, a_model, a_weights), (b_dir, _, b_weights) = two
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    with FakeV2Server(a_model) as cloud:
        # The objective is a deadline the cloud requests really wait for: as long as the other waits here.
        policy = OffloadPolicy(cloud.url, "mlp", latency_slo_ms=30_000, max_local_queue=4)
        managed = ManagedRuntime(a_dir, profile="generic-x86_64", offload=policy)
        dispatcher = managed.dispatcher
        assert dispatcher is not None
        dispatcher.predictor.observe(1000.0)  # the device looks saturated: the next request goes to the cloud
        assert np.allclose(managed.predict_async(x).result(30), mlp_forward(a_weights, x), atol=1e-5)
        metadata_reads = cloud.gets

        managed.swap(b_dir)
        assert managed.dispatcher is dispatcher
        for _ in range(60):
            dispatcher.predictor.observe(0.0001)  # now the device keeps up: local, on the new model
        assert np.allclose(managed.predict_async(x).result(30), mlp_forward(b_weights, x), atol=1e-5)

        dispatcher.predictor.observe(1e6)  # saturated again: the cloud model is checked against the new one first
        managed.predict_async(x).result(30)
        assert cloud.gets > metadata_reads
        stats = managed.stats()
        assert (stats.paths["cloud"].count, stats.paths["local"].count, stats.breaker) == (2, 1, "closed")
        managed.close()
    with pytest.raises(BackendError, match="closed"):
        managed.predict_async(x)


def test_a_managed_runtime_without_a_model_configures_the_cloud_on_first_use(two):
    (a_dir, a_model, a_weights), _ = two
    x = np.ones((1, 64), np.float32)
    with FakeV2Server(a_model) as cloud:
        managed = ManagedRuntime(profile="generic-x86_64", offload=OffloadPolicy(cloud.url, "mlp"))
        assert cloud.gets == 0
        with pytest.raises(BackendError, match="no model is active; install one first"):
            managed.predict_async(x)
        managed.swap(a_dir)
        assert np.allclose(managed.predict_async(x).result(30), mlp_forward(a_weights, x), atol=1e-5)
        managed.close()


def test_a_cloud_model_that_does_not_match_fails_the_managed_runtime_at_construction(two, wide_onnx):
    (a_dir, _, _), _ = two
    with FakeV2Server(wide_onnx) as cloud, pytest.raises(OffloadError, match=r"has shape \[-1, 256\] on the server"):
        ManagedRuntime(a_dir, profile="generic-x86_64", offload=OffloadPolicy(cloud.url, "mlp"))
