"""One timed-predict loop (edgesdk.runtime.bench.time_predictions), one warm-up rule for bench, measurement, health."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.agent.managed import health_check
from edgesdk.cli.bench import bench
from edgesdk.runtime.bench import WARMUP, benchmark, time_predictions
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import random_mlp, write_mlp_onnx


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return write_mlp_onnx(random_mlp([16, 8, 4], seed=0), tmp_path_factory.mktemp("mlp") / "model.onnx")


def test_warmup_predictions_run_untimed_before_the_timed_ones(mlp):
    x = np.zeros((1, 16), np.float32)
    with Runtime(mlp, profile="generic-x86_64") as rt:
        timings = time_predictions(rt, x, runs=7, warmup=3)
        assert rt.stats().count == 3 + 7
    assert timings.latencies_ms.shape == (7,) and (timings.latencies_ms > 0).all()
    assert timings.wall_s * 1e3 >= timings.latencies_ms.sum()
    assert timings.median_ms == pytest.approx(float(np.median(timings.latencies_ms)))
    assert timings.percentiles(0, 100) == (timings.latencies_ms.min(), timings.latencies_ms.max())


def test_bench_measurement_and_health_check_share_the_default_warmup(mlp, tmp_path):
    assert inspect.signature(time_predictions).parameters["warmup"].default == WARMUP
    assert inspect.signature(benchmark).parameters["warmup"].default == WARMUP
    assert next(p for p in bench.params if p.name == "warmup").default == WARMUP  # the CLI writes it out
    bundle = bundle_from_model(tmp_path / "b", mlp, BundleSpec("mlp", "1.0.0", "onnx-fp32", "generic-x86_64",
                                                               "latency", health_check=HealthCheck(atol=1e-5)),
                               {"input": np.ones((1, 16), np.float32)})
    with Runtime(bundle.path, profile="generic-x86_64") as rt:
        health_check(rt, bundle, runs=4)
        assert rt.stats().count == 1 + WARMUP + 4  # the output check, the warm-up, the timed runs


def test_runs_and_warmup_are_checked(mlp):
    with Runtime(mlp, profile="generic-x86_64") as rt:
        with pytest.raises(ValueError, match="runs must be >= 1 and warmup >= 0"):
            time_predictions(rt, np.zeros((1, 16), np.float32), runs=0)
        with pytest.raises(ValueError, match="warmup=-1"):
            time_predictions(rt, np.zeros((1, 16), np.float32), runs=1, warmup=-1)
        assert rt.stats().count == 0
