"""A log-bucket latency histogram: exact counts, percentiles within a bucket, cheap to merge.

:class:`~edgesdk.runtime.stats.LatencyStats` counts every successful call's latency (integer
nanoseconds) in one of :data:`N_BUCKETS` buckets, cumulatively since the runtime loaded. Unlike the
deque window, the histogram can be subtracted (the calls between two readings), summed over apps,
slots and processes, and sent in a few hundred bytes, so a device's agent can report what its apps
served on each model version (:mod:`edgesdk.agent.traffic_ledger`).

Bucket of ``ns``: ``ns`` itself below 8; else, with ``b = ns.bit_length()``,
``(b - 3) * 8 + ((ns >> (b - 4)) & 7)``: eight buckets per power of two, each covering
``[(8 + m) << (b - 4), (9 + m) << (b - 4))`` (12.5% of its lower edge wide). Latencies beyond the
last bucket (about 39 hours) count in it. A bucket's value is its midpoint, so a percentile read
here is within half a bucket (6.25%) of the one the samples give.

The sparse form, ``[[index, count], ...]`` with increasing indices and positive counts, is what
travels (app files, the agent's report). Standard library only: this runs on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["N_BUCKETS", "bucket_of", "bucket_bounds", "bucket_value_ns", "to_sparse", "merge",
           "subtract", "total", "percentile", "bucket_at_rank"]

#: Buckets of a histogram: they reach 2**47 ns (about 39 hours); the last also holds anything above.
N_BUCKETS = 360

Sparse = list[list[int]]


def bucket_of(ns: int) -> int:
    """The bucket of a latency of ``ns`` nanoseconds (0 below zero, the last for a huge one)."""
    if ns < 8:
        return ns if ns > 0 else 0
    b = ns.bit_length()
    return min((b - 3) * 8 + ((ns >> (b - 4)) & 7), N_BUCKETS - 1)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The nanoseconds bucket ``index`` covers, ``[low, high)``."""
    if not 0 <= index < N_BUCKETS:
        raise ValueError(f"bucket index {index} is outside 0..{N_BUCKETS - 1}")
    if index < 8:
        return index, index + 1
    b, m = index // 8 + 3, index % 8
    return (8 + m) << (b - 4), (9 + m) << (b - 4)


def bucket_value_ns(index: int) -> float:
    """The value a bucket stands for: its midpoint, in nanoseconds."""
    low, high = bucket_bounds(index)
    return (low + high) / 2


def to_sparse(buckets: Sequence[int]) -> Sparse:
    """A dense histogram (one count per bucket) as ``[[index, count], ...]`` of its used buckets."""
    return [[index, count] for index, count in enumerate(buckets) if count]


def merge(histograms: Iterable[Sequence[Sequence[int]]]) -> Sparse:
    """The sum of sparse histograms, sparse."""
    counts: dict[int, int] = {}
    for histogram in histograms:
        for index, count in histogram:
            counts[index] = counts.get(index, 0) + count
    return [[index, counts[index]] for index in sorted(counts) if counts[index]]


def subtract(now: Sequence[int], before: Sequence[int]) -> Sparse:
    """What a dense histogram gained since an earlier reading of it (both dense), sparse.

    A histogram only grows; a bucket that shrank means the readings are not of the same
    histogram, which is a ValueError.
    """
    if len(now) != len(before):
        raise ValueError(f"histograms of {len(now)} and {len(before)} buckets cannot be subtracted")
    delta = []
    for index, (a, b) in enumerate(zip(now, before)):
        if a != b:
            if a < b:
                raise ValueError(f"bucket {index} went from {b} to {a}: not a later reading of the "
                                 "same histogram")
            delta.append([index, a - b])
    return delta


def total(histogram: Sequence[Sequence[int]]) -> int:
    """How many samples a sparse histogram holds."""
    return sum(count for _, count in histogram)


def percentile(histogram: Sequence[Sequence[int]], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of a sparse histogram, in milliseconds; None when empty.

    As ``numpy.percentile``'s default (linear) method on the samples, each sample taken at its
    bucket's midpoint: the result is within half a bucket's width (6.25%) of numpy's on the
    real samples.
    """
    if not 0 <= q <= 100 or math.isnan(q):
        raise ValueError(f"percentile {q!r} is outside 0..100")
    ordered = sorted((index, count) for index, count in histogram if count > 0)
    n = sum(count for _, count in ordered)
    if n == 0:
        return None
    rank = q / 100 * (n - 1)
    low_rank = math.floor(rank)
    below, above = _sample(ordered, low_rank), _sample(ordered, min(low_rank + 1, n - 1))
    return (below + (above - below) * (rank - low_rank)) / 1e6


def bucket_at_rank(histogram: Sequence[Sequence[int]], rank: int) -> int:
    """The bucket holding the ``rank``-th smallest sample (from 0) of a sparse histogram (the last bucket
    for a rank past its samples); ValueError when it is empty."""
    ordered = sorted((index, count) for index, count in histogram if count > 0)
    if not ordered:
        raise ValueError("an empty histogram has no sample of any rank")
    return _bucket_at(ordered, rank)


def _bucket_at(ordered: Sequence[tuple[int, int]], rank: int) -> int:
    seen = 0
    for index, count in ordered:
        seen += count
        if rank < seen:
            return index
    return ordered[-1][0]


def _sample(ordered: Sequence[tuple[int, int]], rank: int) -> float:
    """The value (ns) of the ``rank``-th smallest sample (from 0) of an ordered sparse histogram."""
    return bucket_value_ns(_bucket_at(ordered, rank))
