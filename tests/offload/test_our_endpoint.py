"""The device's offload against our own KServe V2 endpoint (edgesdk.ota_server.inference) over loopback."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import ManagedRuntime, OffloadPolicy, Runtime
from edgesdk.errors import OffloadError
from edgesdk.ota_server.broker import free_port
from edgesdk.testing import mlp_forward

pytest.importorskip("starlette", reason="our endpoint needs the [server] extra")


@pytest.fixture(scope="module")
def endpoint(two, tmp_path_factory):
    from edgesdk.ota_server.inference import serve_inference
    from edgesdk.ota_server.repository import ModelRepository

    repository = ModelRepository(tmp_path_factory.mktemp("offload-repo"), allow_unsigned=True)
    for bundle_dir, _, _ in two:
        repository.add(bundle_dir)
    server = serve_inference(repository, f"127.0.0.1:{free_port()}", threads=1)
    yield server
    server.stop()


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(n)]


@pytest.mark.parametrize("binary", [None, False])
def test_offloaded_requests_give_the_local_results_in_binary_and_json(two, endpoint, binary):
    (a_dir, _, a_weights), _ = two
    policy = OffloadPolicy(endpoint.url, "mlp", version="1.0.0", binary=binary, max_cloud_inflight=8)
    with Runtime(a_dir, profile="generic-x86_64", offload=policy) as rt:
        assert rt.dispatcher is not None
        rt.dispatcher.predictor.observe(10.0)  # saturated: everything goes to the cloud
        xs = _inputs(8)
        futures = [rt.predict_async(x) for x in xs]
        for x, future in zip(xs, futures):
            got, local = future.result(30), rt.predict(x)
            assert got.shape == local.shape and got.dtype == local.dtype
            assert np.allclose(got, local, atol=1e-5) and np.allclose(got, mlp_forward(a_weights, x), atol=1e-5)
        stats = rt.stats()
    assert (stats.paths["cloud"].count, stats.paths["cloud"].errors, stats.fallbacks) == (8, 0, 0)


def test_the_newest_version_is_what_an_unpinned_policy_gets(two, endpoint):
    _, (b_dir, _, b_weights) = two
    x = _inputs(1)[0]
    with ManagedRuntime(b_dir, profile="generic-x86_64", offload=OffloadPolicy(endpoint.url, "mlp")) as managed:
        assert managed.dispatcher is not None
        managed.dispatcher.predictor.observe(10.0)
        assert np.allclose(managed.predict_async(x).result(30), mlp_forward(b_weights, x), atol=1e-5)
        assert managed.stats().paths["cloud"].count == 1


def test_a_version_or_model_our_endpoint_lacks_is_an_error_at_construction(two, endpoint):
    (a_dir, _, _), _ = two
    with pytest.raises(OffloadError, match="no model 'mlp' version 9.9.9"):
        Runtime(a_dir, profile="generic-x86_64", offload=OffloadPolicy(endpoint.url, "mlp", version="9.9.9"))
    with pytest.raises(OffloadError, match="no model 'digits'"):
        Runtime(a_dir, profile="generic-x86_64", offload=OffloadPolicy(endpoint.url, "digits"))
