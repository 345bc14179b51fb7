"""How sure a device's figures let the judge be: exact bounds of an error rate, a p99's lower bound.

**Error rates.** The one-sided 95% Clopper-Pearson bounds of ``errors`` failures in ``calls``
(exact, from the binomial distribution through the regularized incomplete beta function): a device
is above its limit only when the lower bound is, and within it only when the upper bound is.
Wilson's score interval, the usual shortcut, claims too much at a single error in few calls (1 error
in 10 calls: Wilson's lower bound 2.3%, the exact one 0.5%), which failed healthy devices at a 1%
limit whose rate was near it.

**A p99 from few calls.** Over ``n`` calls, the 95% lower confidence bound of the 99th percentile is
the order statistic of rank ``n * 0.99 - 1.645 * sqrt(n * 0.99 * 0.01)`` (97th of 100 calls, 985th
of 1,000): a device's p99 is above a limit with 95% confidence only when the latency at that rank
is. It is read from the latency histogram the agent reports with each version (the lower edge of the
bucket that holds that rank, so never above the true value); a report without one is held to its
p95. Interpolating between the p95 and the p99 is no bound: a latency tail with a few far slower
calls (a page fault, a preempted thread) puts a p99 over 300 calls in that far tail one time in
four, and the interpolation with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from edgesdk.runtime.latency_histogram import bucket_at_rank, bucket_bounds

__all__ = ["rate_lower", "rate_upper", "p99_lower", "Z_95"]

#: The one-sided 95% normal quantile.
Z_95 = 1.645
_ALPHA = 0.05


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's
    method)."""
    tiny, fraction = 1e-300, 1.0
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return fraction


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - log_beta)
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _solve(f: Callable[[float], float], target: float) -> float:
    """The p in (0, 1) where the increasing ``f(p)`` reaches ``target`` (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if f(mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def rate_lower(errors: int, calls: int) -> float:
    """The exact one-sided 95% lower bound of an error rate (0 with no error or no call)."""
    if calls <= 0 or errors <= 0:
        return 0.0
    # P(X >= errors | p) = I_p(errors, calls - errors + 1) rises with p; the bound is where it
    # reaches alpha.
    return _solve(lambda p: _betainc(errors, calls - errors + 1, p), _ALPHA)


def rate_upper(errors: int, calls: int) -> float:
    """The exact one-sided 95% upper bound of an error rate (1 with no call, or when every call
    failed)."""
    if calls <= 0 or errors >= calls:
        return 1.0
    # P(X <= errors | p) = 1 - I_p(errors + 1, calls - errors) falls with p; the bound is where it
    # drops to alpha.
    return _solve(lambda p: _betainc(errors + 1, calls - errors, p), 1.0 - _ALPHA)


def p99_rank(calls: int) -> int:
    """The rank (from 1) of the order statistic that is a 95% lower confidence bound of the p99 over
    ``calls``."""
    return max(1, math.floor(calls * 0.99 - Z_95 * math.sqrt(calls * 0.99 * 0.01)))


def p99_lower(calls: int, p95_ms: float | None, p99_ms: float | None,
              histogram: Sequence[Sequence[int]] | None = None) -> float | None:
    """The 95% lower confidence bound of the p99 over ``calls`` successful calls (ms): the lower
    edge of the histogram's bucket that holds the order statistic of :func:`p99_rank`; without a
    histogram, the p95 (never above that bound once there are 60 calls or more)."""
    if p99_ms is None or calls <= 0:
        return None
    if not histogram:
        return p95_ms if p95_ms is not None else p99_ms
    return bucket_bounds(bucket_at_rank(histogram, p99_rank(calls) - 1))[0] / 1e6
