"""Big/little scheduling: which cores and how many threads a runtime mode gets.

The rule (also in the README):

* The profile's power mode that ``serves`` the runtime mode names the clusters to run on;
  its ``online_cores`` (if set) keeps only that many of their cores.
* ``latency`` and ``power`` start one thread per chosen core; ``balanced`` starts half as
  many (rounded up) on the same cores, leaving room for the application's own threads.
* A profile with no power mode for the runtime mode falls back, and says so in ``notes``:
  ``latency`` and ``balanced`` take the fastest cluster; ``power`` takes the slowest cluster
  on big.LITTLE boards, and on boards with one kind of core half of the fastest cluster.
* The chosen cores are intersected with the CPUs this process may use; when none of them
  exist here (a profile of another board), all usable CPUs are taken and that is noted.
* ``threads=`` overrides the count; more threads than cores is allowed but noted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from edgesdk.errors import ScheduleError
from edgesdk.runtime.profiles import DeviceProfile, RuntimeMode

__all__ = ["CorePlan", "plan_cores", "pinned", "usable_cpus"]


@dataclass(frozen=True)
class CorePlan:
    """The cores a runtime's threads are confined to and how many threads it starts."""

    mode: RuntimeMode
    #: Name of the profile's power mode that served ``mode``; None when a fallback chose the cores.
    power_mode: str | None
    #: Names of the profile clusters chosen for ``mode``.
    clusters: tuple[str, ...]
    #: CPU ids, already limited to those this process may use.
    cores: tuple[int, ...]
    threads: int
    #: Every fallback or override taken, for people to read (the runtime logs them as warnings).
    notes: tuple[str, ...] = ()


def usable_cpus() -> frozenset[int]:
    """CPUs this process may run on (its affinity mask, not just the CPU count)."""
    return frozenset(os.sched_getaffinity(0))


def plan_cores(
    profile: DeviceProfile,
    mode: RuntimeMode | str = RuntimeMode.LATENCY,
    threads: int | None = None,
    available: frozenset[int] | None = None,
) -> CorePlan:
    """Choose cores and thread count for ``mode`` on ``profile`` (see the module rule)."""
    mode = RuntimeMode.parse(mode)
    if threads is not None and threads < 1:
        raise ScheduleError(f"threads must be >= 1, got {threads}; leave it None to follow the power mode")
    notes: list[str] = []
    fastest = max(profile.clusters, key=lambda c: (c.capacity, c.max_mhz))
    slowest = min(profile.clusters, key=lambda c: (c.capacity, c.max_mhz))
    power_mode = profile.power_mode_for(mode)
    if power_mode is not None:
        clusters = power_mode.clusters
        cores = sorted(core for name in clusters for core in profile.cluster(name).cores)
        if power_mode.online_cores is not None:
            cores = cores[: power_mode.online_cores]
    elif mode is RuntimeMode.POWER and profile.is_heterogeneous:
        clusters, cores = (slowest.name,), sorted(slowest.cores)
        notes.append(f"profile {profile.name!r} declares no power mode for 'power'; using little cluster {slowest.name!r}")
    elif mode is RuntimeMode.POWER:
        clusters = (fastest.name,)
        cores = sorted(fastest.cores)[: max(1, len(fastest.cores) // 2)]
        notes.append(
            f"profile {profile.name!r} has no little cluster and no power mode for 'power'; "
            f"using {len(cores)} of the {len(fastest.cores)} cores of cluster {fastest.name!r}"
        )
    else:
        clusters, cores = (fastest.name,), sorted(fastest.cores)
        notes.append(f"profile {profile.name!r} declares no power mode for {mode.value!r}; using cluster {fastest.name!r}")

    usable = usable_cpus() if available is None else available
    here = [c for c in cores if c in usable]
    if not here:
        here = sorted(usable)
        notes.append(f"profile cores {cores} are not usable on this host (usable: {sorted(usable)}); using {here}")
    elif len(here) < len(cores):
        notes.append(f"profile cores {sorted(set(cores) - set(here))} are not usable on this host; using {here}")

    wanted = len(here) if mode is not RuntimeMode.BALANCED else math.ceil(len(here) / 2)
    if threads is None:
        threads = wanted
    elif threads > len(here):
        notes.append(f"{threads} threads on {len(here)} cores {here}: threads will share cores")
    return CorePlan(mode, power_mode.name if power_mode else None, tuple(clusters), tuple(here), threads, tuple(notes))


@contextmanager
def pinned(cores: tuple[int, ...] | frozenset[int]) -> Iterator[None]:
    """Confine the calling thread to ``cores`` for the block, then restore its mask.

    Threads created inside the block inherit the mask, which is how LiteRT's worker
    threads end up on the chosen cluster. Does nothing when the thread already runs
    only on those cores.
    """
    target = frozenset(cores)
    previous = os.sched_getaffinity(0)
    if previous <= target:
        yield
        return
    try:
        os.sched_setaffinity(0, target)
    except OSError as exc:
        raise ScheduleError(f"cannot pin thread to cores {sorted(target)}: {exc.strerror}") from exc
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)
