"""How often requests may make the endpoint load a model version that is not the one it serves by
default.

The data plane has no authentication, and ``/v2/models/{name}/versions/{v}`` (infer, metadata or
ready) loads version v when it is not loaded. A client cycling through stored versions therefore
made the endpoint build an ONNX Runtime session per request (CPU and memory, and evictions of the
sessions everyone else uses from the ``max_sessions`` cache). The cost is the server's, whoever
asks, so the budget is one for the whole server (a per-client budget is evaded by using more
addresses): a token bucket of ``version_loads_per_minute`` loads, refilled continuously, holding at
most a minute's worth. The default version of a model (the pinned one, or the newest) is never
limited: every client needs it, and it is loaded once. A load over the budget is answered at once
with :class:`VersionLoadLimitError` (HTTP 429 with ``Retry-After``); a version already loaded is
served without touching the budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from edgesdk.errors import EdgeSDKError

__all__ = ["LoadBudget", "VersionLoadLimitError"]


class VersionLoadLimitError(EdgeSDKError):
    """Loading another version now would go over ``version_loads_per_minute``; retry after
    ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """The ``Retry-After`` header value: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class LoadBudget:
    """A token bucket of ``per_minute`` loads (``clock`` in seconds; tests pass a fake one)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute, self._clock = per_minute, clock
        self._tokens = float(per_minute)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self, what: str) -> None:
        """Spend one load on ``what``, or VersionLoadLimitError saying when one is free."""
        with self._lock:
            now = self._clock()
            self._tokens = min(
                float(self.per_minute), self._tokens + (now - self._at) * self.per_minute / 60.0
            )
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            wait = (1.0 - self._tokens) * 60.0 / self.per_minute
        raise VersionLoadLimitError(
            f"loading {what} would go over this endpoint's version_loads_per_minute "
            f"({self.per_minute}); retry in {wait:.1f} s, or send requests to the "
            "default version (no /versions/ in the path)",
            wait,
        )
