"""Failpoints for crash tests: make the agent process die at a named step.

``EDGESDK_AGENT_FAILPOINT=before_switch`` (or ``after_switch``, or ``after_chunks:N``)
ends the process there as abruptly as a kill -9 or a power cut would, so the tests can
check that a restarted agent finds its store consistent. Unset, every call is a no-op.
"""

from __future__ import annotations

import os

__all__ = ["failpoint"]

_FAILPOINT = os.environ.get("EDGESDK_AGENT_FAILPOINT", "")


def failpoint(name: str, count: int | None = None) -> None:
    """Exit with status 70 at once, skipping cleanup, when ``EDGESDK_AGENT_FAILPOINT`` names this step."""
    if _FAILPOINT == name or (count is not None and _FAILPOINT == f"{name}:{count}"):
        os._exit(70)
