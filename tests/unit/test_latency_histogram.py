"""The log-bucket latency histogram: bucket edges, percentiles against numpy on measured latencies,
merge and subtract, and LatencyStats keeping it on every call."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgesdk.runtime.latency_histogram import (
    N_BUCKETS,
    bucket_bounds,
    bucket_of,
    bucket_value_ns,
    merge,
    percentile,
    subtract,
    to_sparse,
    total,
)
from edgesdk.runtime.stats import LatencyStats


def test_buckets_tile_the_line_each_at_most_an_eighth_wide_up_to_about_39_hours():
    edge = 0
    for index in range(N_BUCKETS):
        low, high = bucket_bounds(index)
        assert low == edge, f"bucket {index} starts at {low}, the previous ended at {edge}"
        assert bucket_of(low) == index and bucket_of(high - 1) == index
        if low >= 8:
            assert (high - low) / low <= 0.125
        edge = high
    assert 38 * 3600e9 < edge < 40 * 3600e9
    assert bucket_of(10**18) == N_BUCKETS - 1 and bucket_of(-5) == 0
    assert [bucket_of(ns) for ns in (0, 7, 8, 15, 16, 17, 18)] == [0, 7, 8, 15, 16, 16, 17]
    assert bucket_value_ns(bucket_of(1_000_000)) == pytest.approx(1_000_000, rel=0.0625)
    with pytest.raises(ValueError, match="outside"):
        bucket_bounds(N_BUCKETS)


def _measured_latencies(n: int) -> np.ndarray:
    """Real latencies: ``n`` timed runs of small matrix products (with the host's own tail)."""
    rng = np.random.default_rng(0)
    matrices = [rng.standard_normal((size, size)) for size in (8, 32, 64)]
    samples = []
    for i in range(n):
        a = matrices[i % 3 if i % 10 else 2]
        start = time.perf_counter_ns()
        a @ a
        samples.append(time.perf_counter_ns() - start)
    return np.array(samples)


@pytest.mark.parametrize("q", [1, 10, 50, 90, 95, 99, 99.9, 100])
def test_percentiles_are_within_a_bucket_of_numpys_on_measured_latencies(q):
    samples = _measured_latencies(3000)
    stats = LatencyStats(window=len(samples))
    for ns in samples:
        stats.record(int(ns))
    count, errors, buckets = stats.counters()
    assert (count, errors, sum(buckets)) == (3000, 0, 3000)
    ours = percentile(to_sparse(buckets), q)
    exact = float(np.percentile(samples, q)) / 1e6
    assert ours == pytest.approx(exact, rel=0.125), f"p{q}: {ours} ms against numpy's {exact} ms"
    assert abs(ours - exact) <= 0.0625 * exact + 1e-9  # half a bucket: the midpoint rule's bound


def test_percentiles_of_lognormal_latencies_and_edge_cases():
    samples = np.random.default_rng(1).lognormal(np.log(2e6), 0.8, 20_000).astype(np.int64)
    sparse = merge([[[bucket_of(int(ns)), 1]] for ns in samples])
    for q in (50, 95, 99):
        assert percentile(sparse, q) == pytest.approx(np.percentile(samples, q) / 1e6, rel=0.0625)
    assert percentile([], 50) is None and percentile([[3, 0]], 99) is None
    one = [[bucket_of(1_500_000), 7]]
    assert percentile(one, 0) == percentile(one, 100) == pytest.approx(1.5, rel=0.0625)
    with pytest.raises(ValueError, match="outside 0..100"):
        percentile(one, 101)


def test_merge_adds_and_subtract_gives_what_was_added_between_two_readings():
    stats = LatencyStats()
    for ns in (1_000, 2_000, 2_100, 50_000):
        stats.record(ns)
    _, _, before = stats.counters()
    for ns in (2_050, 50_000, 50_000, 9_000_000):
        stats.record(ns)
    stats.record_error()
    count, errors, after = stats.counters()
    delta = subtract(after, before)
    assert (count, errors, total(delta)) == (9, 1, 4)
    added = [[[bucket_of(2_050), 1]], [[bucket_of(50_000), 2]], [[bucket_of(9_000_000), 1]]]
    assert delta == merge(added)
    assert merge([to_sparse(before), delta]) == to_sparse(after)
    assert merge([[[5, 2], [9, 1]], [[5, 3]], []]) == [[5, 5], [9, 1]]
    with pytest.raises(ValueError, match="not a later reading"):
        subtract(before, after)
    with pytest.raises(ValueError, match="cannot be subtracted"):
        subtract(after, after[:-1])


def test_counters_are_a_copy():
    stats = LatencyStats()
    stats.record(1_000)
    _, _, buckets = stats.counters()
    buckets[0] = 99
    assert stats.counters()[2][0] == 0
