"""Resident memory of this process, read from /proc/self/status.

``VmHWM`` (the high-water mark) is used for peaks rather than ``ru_maxrss``: Linux
carries ``ru_maxrss`` over ``execve`` from the parent that spawned the process, so a
measuring subprocess started by a large parent would report the parent's size.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["rss_mb", "peak_rss_mb"]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def rss_mb() -> float:
    """Current resident set size, MiB."""
    return _status_kib("VmRSS") / 1024


def peak_rss_mb() -> float:
    """Peak resident set size of this process since it started (or exec'd), MiB."""
    return _status_kib("VmHWM") / 1024
