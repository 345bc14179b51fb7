"""ManagedRuntime swap orders, with real ONNX Runtime sessions and bundles."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgesdk.agent.managed import ManagedRuntime
from edgesdk.errors import BackendError, HealthCheckError
from tests.ota.conftest import make_bundle


@pytest.fixture(scope="module")
def three(tmp_path_factory, keys):
    folder = tmp_path_factory.mktemp("managed")
    return (make_bundle(folder / "a", "1.0.0", keys, seed=1), make_bundle(folder / "b", "2.0.0", keys, seed=2),
            make_bundle(folder / "bad", "3.0.0", keys, seed=3, wrong_health_output=True))


@pytest.mark.parametrize("order", ["load-first", "unload-first"])
def test_swap_under_traffic_loses_no_request_in_either_order(three, order):
    a, b, _ = three
    managed = ManagedRuntime(a, profile="generic-x86_64", swap_order=order)
    x = np.ones((1, 64), np.float32)
    before = managed.predict(x)
    failures: list[Exception] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                managed.predict(x)
            except Exception as exc:
                failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    managed.swap(b)
    stop.set()
    for t in threads:
        t.join()
    assert failures == [] and managed.swaps == 1
    assert managed.bundle.manifest.version == "2.0.0"
    assert not np.allclose(managed.predict(x), before)
    managed.close()


@pytest.mark.parametrize("order", ["load-first", "unload-first"])
def test_failed_health_check_keeps_the_old_model_serving(three, order):
    a, _, bad = three
    managed = ManagedRuntime(a, profile="generic-x86_64", swap_order=order)
    with pytest.raises(HealthCheckError, match="differs from the expected sample output"):
        managed.swap(bad)
    assert managed.bundle.manifest.version == "1.0.0"
    assert managed.predict(np.ones((1, 64), np.float32)).shape == (1, 10)
    managed.close()


def test_auto_order_unloads_first_when_two_models_exceed_the_budget(tmp_path, keys):
    from edgesdk.runtime.profile_json import profile_to_dict
    from edgesdk.runtime.profiles import load_profile, profile_from_dict

    a = make_bundle(tmp_path / "big", "1.0.0", keys, width=8192)  # a 2 MiB model: two copies need ~8 MiB
    tight = profile_to_dict(load_profile("generic-x86_64"))
    tight["memory"] = {"ram_mb": 64, "model_budget_mb": 1}
    managed = ManagedRuntime(a, profile=profile_from_dict(tight), swap_order="auto")
    roomy = ManagedRuntime(a, profile="generic-x86_64", swap_order="auto")
    assert managed._unload_first(managed.bundle) and not roomy._unload_first(roomy.bundle)
    managed.close()
    roomy.close()


def test_predict_without_a_model_times_out_with_a_clear_error():
    managed = ManagedRuntime(profile="generic-x86_64", wait_timeout_s=0.1)
    with pytest.raises(BackendError, match="no model is active"):
        managed.predict(np.ones((1, 64), np.float32))
    with pytest.raises(BackendError, match="swap_order"):
        ManagedRuntime(profile="generic-x86_64", swap_order="sideways")
