"""A variant's latency on the board, at any of its power modes and thread counts, from the best source there is.

Where a board runs a variant is an :class:`OperatingPoint`: a power mode of the profile
(its clusters, clock caps and online cores) and a thread count. The planner asks for the
latency at the point a conversion targets, and, when a power budget is stated, at every
point of the board (:func:`operating_points`), since a slower mode or fewer threads may be
what fits the budget.

The sources, best first (:class:`LatencyModel`; every figure carries its ``basis``):

1. ``measured on board``: a latency measured on the board (``--measure-on``,
   ``--board-figures``) at one point; other points are scaled from it by :func:`perf`
   (``measured on board, scaled to <point>``);
2. ``emulated <core>``: instructions per inference counted on each cluster's own core type
   (:mod:`.emulate`), turned into milliseconds at each core's clock in that mode;
3. ``estimated``: this host's measured latency scaled by ``perf(host) / perf(board point)``::

       perf = (1 + 0.7 * (threads - 1)) * mean clock (MHz) * mean ipc(core)

   ``ipc`` is a per-microarchitecture relative throughput (Cortex-A76 = 1.0; :data:`IPC`,
   from published per-clock benchmark ratios), and 0.7 the assumed parallel efficiency of
   each extra thread. It keeps this host's order of the variants on every board, which is
   wrong where the ISAs differ; emulation exists for that.

An accelerator engine (TensorRT or CUDA on a Jetson's GPU, :mod:`.accelerator_plan`) has its
own points, one per power mode (``OperatingPoint.accelerator``), and its own source:
4. ``estimated GPU roofline (<engine>)``: :class:`~edgesdk.converters.board.gpu_estimate.EngineCost`,
   the roofline at the mode's GPU clock (``max_mhz`` of the accelerator in the mode) over
   a fitted efficiency; a board measurement on the accelerator outranks it, scaled between
   modes by the GPU clock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgesdk.converters.board.emulate import (
    PARALLEL_EFFICIENCY,
    Emulator,
    InstructionCount,
    board_latency_ms,
    emulated_cpu,
)
from edgesdk.converters.board.gpu_estimate import EngineCost, clock_share
from edgesdk.converters.board.userland import CORES
from edgesdk.errors import EmulatorError
from edgesdk.runtime.profiles import CoreCluster, DeviceProfile, PowerMode, RuntimeMode
from edgesdk.runtime.scheduling import plan_cores

log = logging.getLogger(__name__)

__all__ = ["IPC", "OperatingPoint", "operating_points", "target_point", "perf", "LatencyModel", "BoardCost",
           "board_cost"]

IPC = {
    "cortex-a53": 0.40, "cortex-a55": 0.45, "cortex-a57": 0.60, "cortex-a72": 0.75, "cortex-a73": 0.75,
    "cortex-a75": 0.90, "cortex-a76": 1.00, "cortex-a77": 1.10, "cortex-a78": 1.15, "cortex-a78ae": 1.10,
    "cortex-x1": 1.30, "x86_64": 1.40,
}
_ALL = frozenset(range(1024))


@dataclass(frozen=True)
class OperatingPoint:
    """Where a variant runs on the board: a power mode, the cores it keeps online, and a thread count; or, for an
    accelerator engine, the power mode and the accelerator (one CPU thread feeds it)."""

    power_mode: str
    cores: tuple[int, ...]
    threads: int
    #: The accelerator's name when the variant runs on it (None: on the CPU cores).
    accelerator: str | None = None

    @property
    def label(self) -> str:
        """``performance x4``: the mode and the thread count (``15w ampere-gpu`` on an accelerator)."""
        return f"{self.power_mode} {self.accelerator}" if self.accelerator else f"{self.power_mode} x{self.threads}"


def mode_cores(board: DeviceProfile, mode: PowerMode) -> tuple[int, ...]:
    """The cores a power mode keeps running: its clusters' cores, limited to ``online_cores``."""
    cores = sorted(core for name in mode.clusters for core in board.cluster(name).cores)
    return tuple(cores[: mode.online_cores] if mode.online_cores is not None else cores)


def operating_points(board: DeviceProfile, accelerator: str | None = None) -> list[OperatingPoint]:
    """Every power mode of the board with every thread count from 1 to its online cores, in profile order; with
    ``accelerator``, every power mode on that accelerator instead.

    Only modes a runtime can be put in: those that are the first to serve one of their runtime modes.
    """
    points: list[OperatingPoint] = []
    for mode in board.power_modes:
        if not any(board.power_mode_for(served) is mode for served in mode.serves):
            continue
        cores = mode_cores(board, mode)
        if accelerator is not None:
            points.append(OperatingPoint(mode.name, cores[:1], 1, accelerator))
        else:
            points.extend(OperatingPoint(mode.name, cores, threads) for threads in range(1, len(cores) + 1))
    return points


def target_point(board: DeviceProfile, mode: str | RuntimeMode, threads: int | None = None,
                 accelerator: str | None = None) -> OperatingPoint:
    """The point a runtime mode runs at on the board (:func:`edgesdk.runtime.scheduling.plan_cores`, all cores usable);
    with ``accelerator``, the same power mode on that accelerator."""
    plan = plan_cores(board, mode, threads, available=_ALL)
    name = plan.power_mode
    if name is None:  # a fallback chose the cores: the power mode whose clusters hold them, else the first
        name = next((m.name for m in board.power_modes if set(plan.cores) <= set(mode_cores(board, m))),
                    board.power_modes[0].name)
    if accelerator is not None:
        return OperatingPoint(name, plan.cores[:1], 1, accelerator)
    return OperatingPoint(name, plan.cores, plan.threads)


def _power_mode(board: DeviceProfile, name: str) -> PowerMode | None:
    return next((m for m in board.power_modes if m.name == name), None)


def _busy(board: DeviceProfile, point: OperatingPoint) -> list[tuple[CoreCluster, int]]:
    """Each busy core's cluster and its clock in the point's mode (the first ``threads`` cores are busy)."""
    by_core = {core: cluster for cluster in board.clusters for core in cluster.cores}
    mode = _power_mode(board, point.power_mode)
    busy = [by_core[c] for c in point.cores[: max(1, point.threads)] if c in by_core] or [board.clusters[0]]
    return [(c, min(c.max_mhz, mode.max_mhz.get(c.name, c.max_mhz) if mode else c.max_mhz)) for c in busy]


def _parallel(board: DeviceProfile, point: OperatingPoint) -> float:
    """How many single threads' worth of work ``point.threads`` threads do: each thread beyond the first adds the
    busy clusters' ``parallel_efficiency`` (the profile's, else :data:`PARALLEL_EFFICIENCY`)."""
    busy = _busy(board, point)
    efficiency = sum(c.parallel_efficiency if c.parallel_efficiency is not None else PARALLEL_EFFICIENCY
                     for c, _ in busy) / len(busy)
    return 1 + efficiency * (min(point.threads, len(point.cores)) - 1)


def perf(board: DeviceProfile, point: OperatingPoint) -> float:
    """Relative throughput at ``point``: parallel factor × mean clock × mean ipc of the busy cores."""
    busy = _busy(board, point)
    mhz = sum(m for _, m in busy) / len(busy)
    ipc = sum(IPC.get(c.microarchitecture.lower(), IPC.get(board.arch, 1.0)) for c, _ in busy) / len(busy)
    return _parallel(board, point) * mhz * ipc


@dataclass(frozen=True)
class LatencyModel:
    """A variant's latency at any operating point of one board, from one source (see the module doc).

    Build it with :meth:`measured`, :meth:`emulated` or :meth:`estimated`.
    """

    #: "measured on board", "emulated <cores>" or "estimated".
    basis: str
    #: Measured: the board's latency at ``reference``; estimated: this host's latency.
    reference_ms: float = 0.0
    #: The point a board measurement was taken at (measured only).
    reference: OperatingPoint | None = None
    #: perf() of the host at the threads it measured with (estimated only).
    host_perf: float = 0.0
    #: One count per emulated core type (emulated only).
    counts: tuple[InstructionCount, ...] = ()
    #: The model's costs on an accelerator engine (accelerated only).
    engine: EngineCost | None = None

    @classmethod
    def measured(cls, latency_ms: float, point: OperatingPoint) -> LatencyModel:
        """A latency measured on the board at ``point``."""
        return cls("measured on board", reference_ms=latency_ms, reference=point)

    @classmethod
    def emulated(cls, counts: tuple[InstructionCount, ...]) -> LatencyModel:
        """Instructions per inference counted on the board's emulated core types."""
        return cls("emulated " + "+".join(c.cpu for c in counts), counts=counts)

    @classmethod
    def accelerated(cls, engine: EngineCost) -> LatencyModel:
        """The roofline estimate of an accelerator engine (``estimated GPU roofline (TensorRT fp16)``)."""
        return cls(f"estimated GPU roofline ({engine.engine})", engine=engine)

    @classmethod
    def estimated(cls, host_ms: float, host: DeviceProfile, host_threads: int) -> LatencyModel:
        """This host's latency, measured with ``host_threads`` threads, to be scaled by :func:`perf`."""
        point = target_point(host, RuntimeMode.LATENCY, host_threads)
        return cls("estimated", reference_ms=host_ms, host_perf=perf(host, point))

    def at(self, board: DeviceProfile, point: OperatingPoint) -> tuple[float, str]:
        """The latency (ms) at ``point`` and its basis."""
        if self.reference is not None:
            if point == self.reference:
                return self.reference_ms, self.basis
            if point.accelerator:  # a GPU figure moves with the GPU's clock, not the CPU's
                scaled = (self.reference_ms * clock_share(board, point.accelerator, self.reference.power_mode)
                          / clock_share(board, point.accelerator, point.power_mode))
            else:
                scaled = self.reference_ms * perf(board, self.reference) / perf(board, point)
            return scaled, f"{self.basis}, scaled to {point.label}"
        if self.engine is not None:
            return self.engine.latency_ms(board, point.power_mode), self.basis
        if self.counts:
            by_cpu = {c.cpu: c for c in self.counts}
            single, used = [], []
            for cluster, mhz in _busy(board, point):
                count = by_cpu.get(emulated_cpu(cluster) or "")
                if count is None:
                    raise KeyError(f"no instruction count for {cluster.name} ({emulated_cpu(cluster)}); counted: "
                                   f"{sorted(by_cpu)}")
                single.append(board_latency_ms(count, cluster.microarchitecture, mhz))
                used += [count.cpu] if count.cpu not in used else []
            return sum(single) / len(single) / _parallel(board, point), "emulated " + "+".join(used)
        return self.reference_ms * self.host_perf / perf(board, point), self.basis

    def covers(self, board: DeviceProfile, point: OperatingPoint) -> bool:
        """False for a point on another engine (CPU or accelerator) than the model's, and for an emulated model lacking
        the count of one of ``point``'s core types."""
        if point.accelerator != (self.engine.accelerator if self.engine is not None else
                                 self.reference.accelerator if self.reference is not None else None):
            return False
        if not self.counts:
            return True
        counted = {c.cpu for c in self.counts}
        return all(emulated_cpu(cluster) in counted for cluster, _ in _busy(board, point))


@dataclass(frozen=True)
class BoardCost:
    """A variant's latency on a board in one of its modes, from counts on the emulated cores that mode runs on."""

    latency_ms: float
    #: One count per distinct core type of the mode's cores.
    counts: tuple[InstructionCount, ...]

    @property
    def basis(self) -> str:
        """How reports label it: ``emulated cortex-a76`` (or ``emulated cortex-a53+cortex-a76``)."""
        return "emulated " + "+".join(c.cpu for c in self.counts)


def board_cost(emulator: Emulator, model: str | os.PathLike[str], inputs: Mapping[str, np.ndarray],
               board: DeviceProfile, mode: str, every_cluster: bool = False) -> BoardCost:
    """Latency of ``model`` on ``board`` in runtime ``mode``, from counts on the core types that mode runs on.

    ``every_cluster`` also counts the other clusters' core types, so that every operating point
    of the board (:func:`operating_points`) has a latency (a power budget may move the model to
    the little cores). A mode spanning two core types averages the per-core latencies over its
    busy cores. A cluster with no emulated CPU (x86 profiles) is an :class:`EmulatorError`.
    """
    point = target_point(board, mode)
    by_core = {core: cluster for cluster in board.clusters for core in cluster.cores}
    clusters = list(board.clusters) if every_cluster else [by_core[c] for c in point.cores if c in by_core]
    counts: dict[str, InstructionCount] = {}
    for cluster in clusters or [board.clusters[0]]:
        cpu = emulated_cpu(cluster)
        if cpu is None:
            raise EmulatorError(f"profile {board.name!r}: cluster {cluster.name!r} ({cluster.microarchitecture}) has no "
                                "emulated CPU; set emulated_cpu in the profile to one of "
                                f"{sorted(c for c, core in CORES.items() if core.arch == 'aarch64')}")
        if cpu not in counts:
            counts[cpu] = emulator.count(model, inputs, cpu)
    latency = LatencyModel.emulated(tuple(counts.values()))
    return BoardCost(latency.at(board, point)[0], latency.counts)
