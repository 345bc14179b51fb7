"""The offload benchmark's parts that decide its figures: the k-fold model (a deterministically slower device),
the CPU quota's cgroup, and the batch-size histogram read from /metrics."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgesdk.testing import random_mlp, write_mlp_onnx


def test_k_fold_model_answers_as_the_model_and_really_runs_k_copies(tmp_path):
    import onnxruntime as ort

    from benchmarks.endpoint.slow_device import k_fold_model

    model = write_mlp_onnx(random_mlp([16, 32, 4], seed=3), tmp_path / "mlp.onnx")
    folded = k_fold_model(model, 5, tmp_path / "mlp-x5.onnx")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")  # what ORT runs after its own graph passes
    got = ort.InferenceSession(str(folded), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    import onnx

    def matmuls(path: Path) -> int:
        return sum(n.op_type in ("MatMul", "Gemm", "FusedMatMul", "FusedGemm") for n in onnx.load(str(path)).graph.node)

    # Common-subexpression elimination would fold identical copies into one; the nudged inputs keep all five.
    assert matmuls(tmp_path / "optimized.onnx") == 5 * matmuls(model)


def test_quota_periods_start_at_the_shortest_the_kernel_accepts():
    from benchmarks.endpoint.cpu_quota import MIN_QUOTA_US, CpuQuota, periods

    assert periods(10.0) == [10_000, 25_000, 100_000]
    assert periods(40.0) == [40_000, 100_000]
    assert CpuQuota(4.0, 10_000).quota_us == 2500
    with pytest.raises(ValueError, match="under the kernel's 1000 us"):
        CpuQuota(20.0, 10_000)
    assert CpuQuota(20.0, 20 * MIN_QUOTA_US).quota_us == MIN_QUOTA_US


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists(),
                    reason="needs root and the cgroup v1 cpu controller (the benchmark then reports the quota unavailable)")
def test_quota_moves_this_process_into_its_group_and_back():
    from benchmarks.endpoint.cpu_quota import V1, CpuQuota

    def cpu_group() -> str:
        return next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.split(":")[1] == "cpu")

    before = cpu_group()
    quota = CpuQuota(4.0, 20_000)
    with quota:
        group = V1 / quota.name
        assert cpu_group() == f"/{quota.name}"
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"
        assert (group / "cpu.cfs_period_us").read_text().strip() == "20000"
        assert quota.throttled_ms() is not None
    assert cpu_group() == before and not group.exists()
    assert quota.label == "quota 5000/20000 us (cgroup v1)"


def test_batch_histogram_delta_gives_calls_per_bucket():
    from benchmarks.endpoint.offload_batching import _histogram_delta

    before = {"1.0": 2, "2.0": 2, "4.0": 3, "8.0": 3, "+Inf": 3}
    after = {"1.0": 5, "2.0": 5, "4.0": 9, "8.0": 19, "+Inf": 19}
    assert _histogram_delta(before, after) == {"<=1.0": 3, "<=4.0": 3, "<=8.0": 10}
