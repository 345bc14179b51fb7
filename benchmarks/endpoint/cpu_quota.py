"""A slower device for benchmarks/endpoint/offload.py: this process under a CFS CPU quota in a cgroup of its own.

A Raspberry Pi 4 core is several times slower per request than a server core. The benchmark
gets there by giving its own process ``1 / factor`` of a CPU: a cgroup with
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (cgroup v1, ``/sys/fs/cgroup/cpu``) or
``cpu.max`` (cgroup v2). The quota is coarse: within each period the process runs at full speed
until its quota is spent, then waits for the next period. A long period (100 ms) leaves short
requests fast and makes some wait most of a period (a fat tail); the shortest period whose
quota the kernel accepts (1 ms) spreads the slow-down evenly. :func:`periods` lists the
candidates, the benchmark measures each, and keeps the one whose latency distribution is
closest to a uniformly slower core.

Needs root and a writable cgroup fs; otherwise :class:`QuotaUnavailable` says why, and the
benchmark runs unthrottled and labels its figures so.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CpuQuota", "QuotaUnavailable", "MIN_QUOTA_US", "periods"]

#: The kernel refuses a CFS quota under 1 ms.
MIN_QUOTA_US = 1000
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


class QuotaUnavailable(RuntimeError):
    """This machine or user cannot put the process under a CPU quota (the reason is the message)."""


def periods(factor: float) -> list[int]:
    """Candidate CFS periods (µs) for a ``1 / factor`` share: the shortest the minimum quota allows, then 10 to 100 ms."""
    shortest = int(round(MIN_QUOTA_US * factor))
    return sorted({shortest, *(max(shortest, p) for p in (10_000, 25_000, 100_000))})


class CpuQuota:
    """This process (every thread) confined to ``1 / factor`` of a CPU at ``period_us`` while inside ``with``."""

    def __init__(self, factor: float, period_us: int, name: str = "edgesdk-bench-device") -> None:
        if factor < 1:
            raise ValueError(f"factor {factor} must be >= 1 (a slower device, not a faster one)")
        self.factor, self.period_us = factor, period_us
        self.quota_us = min(period_us, int(round(period_us / factor)))
        if self.quota_us < MIN_QUOTA_US:
            raise ValueError(f"quota {self.quota_us} us at period {period_us} us is under the kernel's {MIN_QUOTA_US} us;"
                             f" use a period of at least {int(MIN_QUOTA_US * factor)} us")
        self.name = f"{name}-{os.getpid()}"
        self._group: Path | None = None
        self._home: Path | None = None
        self._version = "v1" if (V1 / "cpu.cfs_quota_us").exists() else "v2"

    @property
    def label(self) -> str:
        """``quota 1000/6000 us (cgroup v1)``."""
        return f"quota {self.quota_us}/{self.period_us} us (cgroup {self._version})"

    def __enter__(self) -> CpuQuota:
        if (V1 / "cpu.cfs_quota_us").exists():
            group, home = V1 / self.name, V1
            files = {"cpu.cfs_period_us": str(self.period_us), "cpu.cfs_quota_us": str(self.quota_us)}
        elif (V2 / "cgroup.controllers").exists() and "cpu" in (V2 / "cgroup.controllers").read_text().split():
            group, home = V2 / self.name, V2
            files = {"cpu.max": f"{self.quota_us} {self.period_us}"}
        else:
            raise QuotaUnavailable("no cgroup cpu controller at /sys/fs/cgroup/cpu (v1) or /sys/fs/cgroup (v2)")
        try:
            group.mkdir(exist_ok=True)
            for file, value in files.items():
                (group / file).write_text(value)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as exc:
            self._remove(group)
            raise QuotaUnavailable(f"cannot create the cgroup {group} ({exc.strerror}); run as root with a writable "
                                   "cgroup fs") from None
        self._group, self._home = group, home
        return self

    def __exit__(self, *exc: object) -> None:
        if self._group is None or self._home is None:
            return
        (self._home / "cgroup.procs").write_text(str(os.getpid()))
        self._remove(self._group)
        self._group = None

    def throttled_ms(self) -> float | None:
        """Total time the group was throttled so far (ms), from ``cpu.stat``; None when not inside."""
        if self._group is None:
            return None
        stat = dict(line.split() for line in (self._group / "cpu.stat").read_text().splitlines() if line.strip())
        if "throttled_time" in stat:  # v1: ns
            return int(stat["throttled_time"]) / 1e6
        return int(stat.get("throttled_usec", 0)) / 1e3

    @staticmethod
    def _remove(group: Path) -> None:
        try:
            group.rmdir()
        except OSError:
            pass  # still holds a task, or never made; the name carries the pid, so a rerun does not collide
