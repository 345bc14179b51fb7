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

       perf = (1 + e * (threads - 1)) * mean clock (MHz) * mean ipc(core)

   ``ipc`` is a per-microarchitecture relative throughput (Cortex-A76 = 1.0; :data:`IPC`,
   from published per-clock benchmark ratios), and ``e`` the busy clusters' thread efficiency
   (the profile's ``parallel_efficiency``, fitted per board from published 1- and 4-thread
   runs; else :data:`PARALLEL_EFFICIENCY`). It keeps this host's order of the variants on every
   board, which is wrong where the ISAs differ; emulation exists for that.

An accelerator engine (TensorRT or CUDA on a Jetson's GPU, :mod:`.accelerator_plan`) has its
own points, one per power mode (``OperatingPoint.accelerator``), and its own source:
4. ``estimated GPU roofline (<engine>)``: :class:`~edgesdk.converters.board.gpu_estimate.EngineCost`,
   the roofline at the mode's GPU clock (``max_mhz`` of the accelerator in the mode) over
   a fitted efficiency; a board measurement on the accelerator outranks it, scaled between
   modes by the GPU clock.

**Labels and bands** (:func:`latency_band`). Reports name each figure's source with one of four
labels, ``measured`` (1), ``emulated`` (2), ``scaled`` (3) and ``roofline`` (4), and carry the
band the calibration's held-out half supports for that label on that board (``12 ms +/-30%``;
the numbers and how they are made: :mod:`.calibration_constants`): the 90th percentile of the
held-out error of emulated (per core) and roofline figures; 5% for a board measurement at its own
point; and no band ("unvalidated") where nothing validates the figure: a host timing scaled by
clocks and :data:`IPC`, a board measurement scaled to another point, a board or core without
published figures.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgesdk.converters.board.calibration_constants import (
    FIT,
    HOST_NOISE,
    MEASURED_BAND,
    absolute_band,
    ratio_band,
)
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
           "board_cost", "Band", "basis_label", "latency_band", "comparison_band", "BASIS_LABELS"]

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


#: What each label means, for reports and the converting guide.
BASIS_LABELS = {
    "measured": "measured on the board (--measure-on, --board-figures)",
    "emulated": "instructions counted on the board's emulated core x cycles per instruction / clock",
    "scaled": "this host's timing scaled by clock, IPC and threads (unvalidated)",
    "roofline": "the accelerator's roofline estimate (FLOPs and bytes against data-sheet peaks)",
}


@dataclass(frozen=True)
class Band:
    """How far a board latency may be from the board's own: its basis label and a relative band
    (None: unvalidated)."""

    label: str
    relative: float | None

    @property
    def text(self) -> str:
        """``+/-30%`` or ``unvalidated``."""
        return "unvalidated" if self.relative is None else f"+/-{self.relative:.0%}"

    def describe(self, ms: float) -> str:
        """``12 ms +/-30%``: the figure to the digits its band supports (2 significant digits, 3
        under a 10% band)."""
        digits = 3 if self.relative is not None and self.relative < 0.1 else 2
        rounded = float(f"{ms:.{digits}g}")
        decimals = max(0, digits - 1 - int(np.floor(np.log10(abs(rounded))))) if rounded else 0
        shown = f"{rounded:.{decimals}f}"
        return f"{shown} ms {self.text}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: ``{"basis": "emulated", "band": 0.3}`` (band None: unvalidated)."""
        return {"basis": self.label, "band": self.relative}


def basis_label(basis: str) -> str:
    """The label of a :class:`LatencyModel` basis: measured, emulated, scaled or roofline."""
    if basis.startswith("measured"):
        return "measured"
    if basis.startswith("emulated"):
        return "emulated"
    return "roofline" if "roofline" in basis else "scaled"


def _cores(basis: str) -> tuple[str, ...]:
    if not basis.startswith("emulated "):
        return ()
    return tuple(basis.removeprefix("emulated ").split("+"))


def _accelerator_keys(board: str) -> tuple[str, ...]:
    keys = FIT["bands"].get("roofline", {})
    return tuple(k.split("/", 1)[1] for k in keys if k.startswith(f"{board}/"))


def latency_band(board: str, basis: str) -> Band:
    """The band of a ``basis`` figure on profile ``board`` (module doc)."""
    label = basis_label(basis)
    if label == "measured":
        return Band(label, MEASURED_BAND if ", scaled to" not in basis else None)
    if label == "emulated":
        return Band(label, absolute_band("emulated", board, _cores(basis)))
    if label == "roofline":
        return Band(label, absolute_band("roofline", board, _accelerator_keys(board)))
    return Band(label, None)


def comparison_band(board: str, basis_a: str, basis_b: str) -> float | None:
    """How far apart two figures on ``board`` must be before one is known to be faster (a relative
    gap), or None when the two bases cannot be compared beyond noise.

    Two figures of one basis share its systematic error: two variants counted on the same cores
    share the CPI, the clock and the thread rule, so their *ratio* is off by far less than either
    figure (:func:`~edgesdk.converters.board.calibration_constants.ratio_band`, where the held-out
    half has pairs; else the absolute band, the safe side). Two host timings scaled alike differ by
    this host's noise; two board measurements at one point by theirs. Figures of different bases are
    compared by their absolute bands (their intervals overlap or not); an unvalidated one gives
    None.
    """
    a, b = latency_band(board, basis_a), latency_band(board, basis_b)
    if basis_a == basis_b:
        if a.label == "emulated":
            return ratio_band("emulated", board, _cores(basis_a)) or a.relative
        if a.label == "scaled":
            return HOST_NOISE
        return a.relative
    if a.relative is None or b.relative is None:
        return None
    return a.relative + b.relative
