"""Waiting in the benchmarks' scenarios: poll a condition until it holds, or fail naming what did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> float:
    """Seconds until ``predicate()`` held, polling every ``interval`` seconds; RuntimeError naming ``what`` once
    ``timeout`` seconds have passed without it."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no {what} within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - started
