"""Choosing the variant that fits a device: memory, power, accuracy, and speed.

**Fit.** A variant fits a profile when its file size and its peak resident memory
while loaded and running (measured here, in its own process) are both within the
profile's ``model_budget_mb``; and, when a frame rate is asked for, its estimated
energy per inference times that rate (its sustained power) is within the power mode's
watts, i.e. the board can keep up in that mode.

**Board latency, best source first** (every report names it, as the estimate's ``basis``):

1. ``measured on board``: ``edgesdk bench --json`` figures from the board (matched by
   model SHA-256) or a board of the fleet (``--measure-on``);
2. ``emulated <core>``: the variant's instructions per inference counted on the board's
   own core type under qemu-user, with the board's aarch64 kernels
   (:func:`edgesdk.converters.emulate.board_cost`): int8 and FP16 fast paths the board has
   and this host lacks count, so the order of the variants is the board's;
3. ``estimated``: scaled from the host's measured latency, when no emulator is set up::

    board_ms = host_ms * perf(host cores, threads) / perf(board cores, threads)
    perf     = (1 + 0.7 * (threads - 1)) * max_mhz * ipc(core)

``ipc`` is a per-microarchitecture relative throughput (Cortex-A76 = 1.0; table below,
from published per-clock benchmark ratios), and 0.7 is the assumed parallel efficiency
of each extra thread. This keeps the host's order of the variants on every board, which
is wrong where the ISAs differ. Energy per inference (mJ) = power-mode watts × board_ms.

**Choice.** Among variants that fit and whose accuracy drop is within the bound, the
fastest on the board wins, unless others are within noise of it: a variant is faster
only when its latency is at most :data:`CLEAR_GAIN` (0.95) times the other's, the gain
edgesdk can tell from run-to-run noise (the same rule as the side-by-side check in
:func:`edgesdk.converters.pipeline.convert`). Among the variants within noise of the
fastest, the smaller file wins, then the smaller accuracy drop, then the one built first,
and the reason says so ("within noise of X; chose the smaller"): the same inputs give the
same bundle run after run. A quantized variant slower than FP32 on the board (by the
same source) is never chosen, unless FP32 does not fit and size is the only way in. Nothing fits:
:class:`BudgetError` naming the closest variant's figures and the budget.

**Held-out check.** A candidate's ``accuracy_drop`` is measured on the *selection*
samples, the ones every choice of the conversion saw (calibration method, mixed-precision
search, this choice); picking the best of many variants by a drop makes that drop look
better than it is. So ``holdout_drop``, measured on evaluation samples nothing was chosen
on (:func:`edgesdk.converters.data.split_evaluation`), checks the choice: the choice is
made on the selection drop alone; if the chosen variant's held-out drop exceeds the same
bound, it is rejected ("held-out drop X > bound Y"), and the choice is made again among
the rest, until one passes (FP32's drop is 0 on any samples, so one does when it fits).
The held-out drop never ranks variants; it only vetoes the chosen one, and the reason
names the vetoed ones. ``holdout_drop`` None (no held-out samples) skips the check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgesdk.converters.emulate import PARALLEL_EFFICIENCY, BoardCost, InstructionCount
from edgesdk.converters.measure import Measurement
from edgesdk.errors import BudgetError
from edgesdk.profiles import CoreCluster, DeviceProfile, RuntimeMode
from edgesdk.scheduling import plan_cores

__all__ = ["Candidate", "PlanResult", "BoardEstimate", "estimate_on_board", "choose", "IPC", "PARALLEL_EFFICIENCY",
           "CLEAR_GAIN"]

IPC = {
    "cortex-a53": 0.40, "cortex-a55": 0.45, "cortex-a57": 0.60, "cortex-a72": 0.75, "cortex-a73": 0.75,
    "cortex-a75": 0.90, "cortex-a76": 1.00, "cortex-a77": 1.10, "cortex-a78": 1.15, "cortex-a78ae": 1.10,
    "cortex-x1": 1.30, "x86_64": 1.40,
}
#: One latency is clearly lower than another only at this ratio or below; smaller gains are within the
#: run-to-run noise of a measurement on a typical host (about 3%).
CLEAR_GAIN = 0.95
_ALL = frozenset(range(1024))


def _ipc(cluster: CoreCluster, arch: str) -> float:
    return IPC.get(cluster.microarchitecture.lower(), IPC.get(arch, 1.0))


def _perf(profile: DeviceProfile, mode: str, threads: int | None = None, available: frozenset[int] = _ALL) -> float:
    plan = plan_cores(profile, mode, threads, available=available)
    by_core = {core: c for c in profile.clusters for core in c.cores}
    cores = [by_core[c] for c in plan.cores if c in by_core] or [profile.clusters[0]]
    power_mode = profile.power_mode_for(mode)
    mhz = sum(min(c.max_mhz, (power_mode.max_mhz.get(c.name, c.max_mhz) if power_mode else c.max_mhz))
              for c in cores) / len(cores)
    ipc = sum(_ipc(c, profile.arch) for c in cores) / len(cores)
    threads = min(plan.threads, len(plan.cores))
    return (1 + PARALLEL_EFFICIENCY * (threads - 1)) * mhz * ipc


@dataclass(frozen=True)
class BoardEstimate:
    """A variant's latency (ms) and energy per inference (mJ) on the board, and where they come from."""

    latency_ms: float
    energy_mj: float
    #: "measured on board", "emulated <core>" (counted under qemu-user) or "estimated" (scaled from this host).
    basis: str
    #: The instruction counts an emulated estimate was made from (with ONNX Runtime's fusions on the board's ISA).
    counts: tuple[InstructionCount, ...] = ()


def estimate_on_board(host_latency_ms: float, host: DeviceProfile, host_threads: int, board: DeviceProfile,
                      mode: str, measured_ms: float | None = None, emulated: BoardCost | None = None) -> BoardEstimate:
    """Board latency and energy per inference: measured on the board, else emulated, else scaled from ``host``."""
    power_mode = board.power_mode_for(mode)
    watts = power_mode.watts if power_mode else max(m.watts for m in board.power_modes)
    if measured_ms is not None:
        return BoardEstimate(measured_ms, watts * measured_ms, "measured on board")
    if emulated is not None:
        return BoardEstimate(emulated.latency_ms, watts * emulated.latency_ms, emulated.basis, emulated.counts)
    scale = _perf(host, RuntimeMode.LATENCY.value, host_threads, available=frozenset(host.cores)) / _perf(board, mode)
    latency = host_latency_ms * scale
    return BoardEstimate(latency, watts * latency, "estimated")


@dataclass(frozen=True)
class Candidate:
    """One variant with its measurement, accuracy drop (selection samples), board estimate and verdict."""

    name: str
    format: str
    path: Any
    precision: str
    measurement: Measurement
    accuracy_drop: float
    estimate: BoardEstimate
    config: Mapping[str, Any] | None = None
    rejected: tuple[str, ...] = ()
    chosen: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The drop on the held-out samples (module doc, "Held-out check"); None when none were held out.
    holdout_drop: float | None = None

    @property
    def is_quantized(self) -> bool:
        """Anything but the FP32 variant."""
        return self.precision not in ("fp32",)


@dataclass(frozen=True)
class PlanResult:
    """Every candidate with its verdict, the chosen one, and why it was chosen."""

    candidates: tuple[Candidate, ...]
    chosen: Candidate
    reason: str


def choose(candidates: Sequence[Candidate], board: DeviceProfile, mode: str, max_accuracy_drop: float,
           target_fps: float | None = None) -> PlanResult:
    """Mark every candidate fitting or rejected (with reasons) and pick one; see the module doc."""
    budget = board.model_budget_mb
    power_mode = board.power_mode_for(mode)
    watts = power_mode.watts if power_mode else max(m.watts for m in board.power_modes)
    fp32 = next((c for c in candidates if c.precision == "fp32" and c.format == "onnx"), None)

    def memory_reasons(c: Candidate) -> list[str]:
        m, reasons = c.measurement, []
        if m.size_bytes / 2**20 > budget:
            reasons.append(f"file {m.size_bytes / 2**20:.1f} MiB > budget {budget} MiB")
        if m.model_memory_mb > budget:
            reasons.append(f"peak memory {m.model_memory_mb:.1f} MiB > budget {budget} MiB")
        return reasons

    fp32_fits = fp32 is not None and not memory_reasons(fp32)
    judged = []
    for c in candidates:
        reasons = memory_reasons(c)
        if target_fps is not None:
            sustained = c.estimate.energy_mj * target_fps / 1e3
            if sustained > watts:
                reasons.append(f"{target_fps:g} fps needs {sustained:.1f} W ({c.estimate.basis}) > "
                               f"{watts:g} W of power mode {power_mode.name if power_mode else '?'}")
        if c.accuracy_drop > max_accuracy_drop:
            reasons.append(f"accuracy drop {c.accuracy_drop:.3g} > bound {max_accuracy_drop:g}")
        if c.is_quantized and fp32 is not None and fp32_fits and c.estimate.latency_ms > fp32.estimate.latency_ms:
            reasons.append(f"slower than FP32 on {board.name} ({c.estimate.latency_ms:.3f} ms vs "
                           f"{fp32.estimate.latency_ms:.3f} ms, {c.estimate.basis})")
        judged.append(replace(c, rejected=(*c.rejected, *reasons)))  # a reason given by the caller stays

    vetoed: list[Candidate] = []
    while True:
        fitting = [c for c in judged if not c.rejected]
        if not fitting:
            raise _nothing_fits(judged, board, mode, budget, watts, max_accuracy_drop)
        winner, reason = _pick(fitting, board, max_accuracy_drop)
        if winner.holdout_drop is None or winner.holdout_drop <= max_accuracy_drop:
            break
        # Chosen on the selection samples, but it does not hold on samples nothing was chosen on: choose again.
        index = next(i for i, c in enumerate(judged) if c is winner)
        judged[index] = replace(winner, rejected=(
            f"held-out drop {winner.holdout_drop:.3g} > bound {max_accuracy_drop:g} (selection drop "
            f"{winner.accuracy_drop:.3g})",))
        vetoed.append(winner)
    if vetoed:
        reason += (f"; {', '.join(c.name for c in vetoed)} chosen first and rejected: held-out drop over the bound "
                   "(the drop on the selection samples did not hold on unseen ones)")
    final = tuple(replace(c, chosen=c is winner) for c in judged)
    return PlanResult(final, next(c for c in final if c.chosen), reason)


def _worst_drop(c: Candidate) -> float:
    """The larger of the selection and held-out drops."""
    return max(c.accuracy_drop, c.holdout_drop if c.holdout_drop is not None else c.accuracy_drop)


def _nothing_fits(judged: Sequence[Candidate], board: DeviceProfile, mode: str, budget: float, watts: float,
                  max_accuracy_drop: float) -> BudgetError:
    """The error naming the variant closest to fitting, its figures and why it was rejected."""
    def closeness(c: Candidate) -> tuple[float, float]:
        m = c.measurement
        over_memory = max(0.0, max(m.size_bytes / 2**20, m.model_memory_mb) - budget)
        return (over_memory, max(0.0, _worst_drop(c) - max_accuracy_drop))

    best = min(judged, key=closeness)
    m = best.measurement
    held = "" if best.holdout_drop is None else f" (held-out {best.holdout_drop:.3g})"
    return BudgetError(
        f"no variant fits {board.name} ({mode}, model budget {budget} MiB, {watts:g} W, max accuracy drop "
        f"{max_accuracy_drop:g}); closest: {best.name} — file {m.size_bytes / 2**20:.2f} MiB, peak memory "
        f"{m.model_memory_mb:.1f} MiB, accuracy drop {best.accuracy_drop:.3g}{held}, {best.estimate.latency_ms:.2f} ms "
        f"({best.estimate.basis}); rejected because: {'; '.join(best.rejected)}. Loosen --max-accuracy-drop, "
        "choose a larger board or a smaller model"
    )


def _pick(fitting: list[Candidate], board: DeviceProfile, bound: float) -> tuple[Candidate, str]:
    """The fastest; among those within noise of it, the smallest file, then the most accurate, then the first."""
    fastest = min(fitting, key=lambda c: c.estimate.latency_ms)
    near = [c for c in fitting if fastest.estimate.latency_ms > CLEAR_GAIN * c.estimate.latency_ms]
    winner = min(near, key=lambda c: (c.measurement.size_bytes, c.accuracy_drop))  # min keeps the first of equals
    held = "" if winner.holdout_drop is None else f", held-out {winner.holdout_drop:.3g}"
    figures = (f"{winner.estimate.latency_ms:.3f} ms on {board.name}, {winner.estimate.basis}, accuracy drop "
               f"{winner.accuracy_drop:.3g}{held} <= {bound:g}")
    others = [c for c in near if c is not winner]
    if not others:
        return winner, f"fastest variant within budget ({figures})"
    size = winner.measurement.size_bytes
    if all(c.measurement.size_bytes > size for c in others):
        why = "the smaller"
    elif all(c.accuracy_drop > winner.accuracy_drop for c in others if c.measurement.size_bytes == size):
        why = "the more accurate of the smallest"
    else:
        why = "the first built of equally small and accurate ones"
    if winner is fastest:
        return winner, (f"fastest variant within budget, and {why} of those within noise of it "
                        f"({', '.join(c.name for c in others)}) ({figures})")
    return winner, (f"within noise of {fastest.name} ({fastest.estimate.latency_ms:.3f} ms: less than "
                    f"{1 - CLEAR_GAIN:.0%} faster, which is measurement noise); chose {why} ({figures})")
