"""Whether an unbatched run may go on the event loop: only when it is provably short.

A run on the event loop saves handing it to a worker thread (about 0.15 ms of CPU per request
here), but while it runs nothing else on that loop answers: health, metrics, every other model.
Going inline by mistake therefore costs without bound, going to a thread by mistake costs
0.15 ms; so the rule errs toward the thread:

- the cost is per *element* of the request (every dimension of every input), not per row: a
  model whose latency grows with sequence length, image size or audio length has requests of
  one row that differ a thousandfold;
- it is the *maximum* recent cost per element, not the minimum or a mean;
- a request with more elements than every recent run is never inline, whatever the estimate:
  a cost superlinear in length (attention) is not bounded by a smaller run's cost per element.

So a run is inline only when a recent run at least as large was measured and
``max(recent seconds per element) x elements < INLINE_RUN_S``.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

__all__ = ["INLINE_RUN_S", "RECENT_RUNS", "RunCost", "elements"]

#: An unbatched run provably shorter than this runs on the event loop: handing it to a worker thread
#: costs more (measured here on a 16-8-4 MLP: 0.57 ms of server CPU per request through a thread, 0.42 inline).
INLINE_RUN_S = 0.5e-3
#: Runs remembered: enough that one slow run keeps a model off the loop for a while.
RECENT_RUNS = 8


def elements(inputs: dict[str, np.ndarray]) -> int:
    """Elements of a request: every dimension of every input (at least 1)."""
    return max(1, sum(int(value.size) for value in inputs.values()))


class RunCost:
    """The recent runs of one model: (elements, seconds), and the inline rule above."""

    def __init__(self, recent: int = RECENT_RUNS, inline_s: float = INLINE_RUN_S) -> None:
        self.inline_s = inline_s
        self._runs: deque[tuple[int, float]] = deque(maxlen=recent)
        self._lock = threading.Lock()

    def observe(self, size: int, seconds: float) -> None:
        """One measured run of ``size`` elements."""
        with self._lock:
            self._runs.append((max(size, 1), seconds))

    def inline(self, size: int) -> bool:
        """True when a run of ``size`` elements is provably shorter than ``inline_s`` (see the module doc)."""
        with self._lock:
            if not self._runs or size > max(n for n, _ in self._runs):
                return False
            per_element = max(seconds / n for n, seconds in self._runs)
        return per_element * size < self.inline_s
