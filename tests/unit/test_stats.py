import numpy as np
import pytest

from edgesdk.runtime.stats import LatencyStats


def test_percentiles_come_from_the_recorded_latencies():
    stats = LatencyStats(window=1000)
    for ms in range(1, 101):
        stats.record(ms * 1_000_000)
    snap = stats.snapshot()
    assert snap.count == 100 and snap.errors == 0 and snap.window == 100
    expected = np.percentile(np.arange(1, 101), [50, 95, 99])
    assert (snap.p50_ms, snap.p95_ms, snap.p99_ms) == pytest.approx(tuple(expected))
    assert snap.mean_ms == pytest.approx(50.5)


def test_window_slides_but_counts_keep_growing():
    stats = LatencyStats(window=10)
    for _ in range(50):
        stats.record(100_000_000)
    for _ in range(10):
        stats.record(1_000_000)
    stats.record_error()
    snap = stats.snapshot()
    assert snap.count == 61 and snap.errors == 1 and snap.window == 10
    assert snap.p99_ms == pytest.approx(1.0)


def test_empty_stats_have_no_percentiles():
    snap = LatencyStats().snapshot()
    assert snap.count == 0 and snap.p50_ms is None
    assert snap.as_dict()["p95_ms"] is None


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        LatencyStats(window=0)
