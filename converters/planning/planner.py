"""Choosing the variant that fits a device: memory, power, accuracy, and speed.

**Fit.** A variant fits a profile when its file size and its peak resident memory
while loaded and running (measured here, in its own process) are both within the
profile's ``model_budget_mb``; when a frame rate (or a wake cycle) is asked for, when the
board keeps up with it (duty ≤ 1); and when a power budget is stated, when its average
power there is within it (:class:`~edgesdk.converters.board.power.PowerBudget`).

**Board latency** comes from the best source there is (:mod:`edgesdk.converters.board.board_latency`): measured on
the board, else instructions counted on its emulated cores, else this host's timings scaled;
every figure names its ``basis``. **Power** (:mod:`edgesdk.converters.board.power`): energy per inference is the
busy power of the cores it runs on times its latency (or the board's measured figure), and
average power is idle plus rate times that energy.

**The objective** (``PowerBudget.objective``, ``edgesdk convert --objective``) is what the
choice minimises among what fits: ``latency`` (the default) or ``energy`` per inference. A
power budget only constrains; it never changes the objective by itself.

**Where each variant runs.** With no budget and the latency objective, at the conversion's
target point (the runtime mode's power mode and threads). With a budget, or the energy
objective, every operating point of the board (each power mode, each thread count from 1 to
its online cores) is tried; a variant's point is the fastest that fits (latency; ties to the
lower energy) or the one of least energy per inference that fits and keeps the rate
(energy; ties to the lower latency). The bundle records the power mode and thread count.
On a board with a GPU that ONNX Runtime drives (a Jetson), each variant's TensorRT and CUDA
engines are candidates too (:mod:`edgesdk.converters.board.accelerator_plan`), at one point per power mode on the
accelerator; the CPU variants stay candidates, the same rules pick among all of them, and the
bundle records the engine (``runs_on``), which the device's runtime then takes.
A budget below the board's idle power in every mode is an
:class:`~edgesdk.errors.InfeasibleBudgetError` before anything is measured against it.

**Which variant.** Among variants that fit and whose accuracy drop is within the bound, the fastest
at its point wins (energy: the lowest energy per inference), unless others are tied with it: within
the band of the comparison or within noise, whichever is wider. A band is what the calibration's
held-out half says a figure may be off by
(:func:`~edgesdk.converters.board.board_latency.latency_band`); two variants counted on the same
emulated cores share their CPI's error, so their comparison takes the held-out band of the *ratio*
of two such figures: published ONNX Runtime pairs where the held-out half has them, else the ratio
of two counts checked against times on an x86 host, one-sided (10% today on every board with an
absolute band: the converting guide, "Ties", says how and its limit), else the absolute band;
figures of two bases (a
measured one and an emulated one) tie within the sum of their absolute bands; an unvalidated
comparison (host timings scaled, a board without published figures) and two board measurements tie
within noise, :data:`CLEAR_GAIN` (0.95: the gain edgesdk can tell from run-to-run noise, as the
side-by-side check in :func:`edgesdk.converters.pipeline.convert`). Among the tied ones the most
accurate wins (the smaller accuracy drop), then the smaller file, then the one built first, and the
reason says so ("within the emulated band (...) of X; chose the more accurate"): a choice inside the
figures' own uncertainty is made on what is known (accuracy, size), and the same inputs give the
same bundle run after run. A quantized variant slower than FP32 on the board (by the same source, on
the same engine) is never chosen, unless FP32 does not fit and size is the only way in. Nothing
fits: :class:`BudgetError` naming the closest variant's figures and the budget.

**Held-out check.** A candidate's ``accuracy_drop`` is measured on the *selection*
samples, the ones every choice of the conversion saw (calibration method, mixed-precision
search, this choice); picking the best of many variants by a drop makes that drop look
better than it is. So ``holdout_drop``, measured on evaluation samples nothing was chosen
on (:func:`edgesdk.converters.planning.data.split_evaluation`), checks the choice: the choice is
made on the selection drop alone; if the chosen variant's held-out drop exceeds the same
bound, it is rejected ("held-out drop X > bound Y"), and the choice is made again among
the rest, until one passes (FP32's drop is 0 on any samples, so one does when it fits).
The held-out drop never ranks variants; it only vetoes the chosen one, and the reason
names the vetoed ones. ``holdout_drop`` None (no held-out samples) skips the check.

**Accuracy on the board.** A variant whose outputs were computed by the board's own runtime
(:mod:`edgesdk.converters.board.board_accuracy`) is judged on its drop vs FP32 on that board
(``board_drop``, ``board_holdout_drop``) in place of this host's, everywhere above
(:attr:`Candidate.judged_drop`, :attr:`Candidate.judged_holdout_drop`); ``accuracy_basis`` says which.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgesdk.converters.board.board_latency import (
    BoardCost,
    LatencyModel,
    OperatingPoint,
    basis_label,
    comparison_band,
    latency_band,
    operating_points,
    target_point,
)
from edgesdk.converters.board.emulate import InstructionCount
from edgesdk.converters.board.gpu_estimate import EngineCost
from edgesdk.converters.board.measure import Measurement
from edgesdk.converters.board.power import PowerBudget, PowerFigures, busy_watts, check_feasible, power_at
from edgesdk.errors import BudgetError
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["Candidate", "PlanResult", "BoardEstimate", "estimate_on_board", "choose", "CLEAR_GAIN"]

_HOST_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())

#: One latency is clearly lower than another only at this ratio or below; smaller gains are within the
#: run-to-run noise of a measurement on a typical host (about 3%).
CLEAR_GAIN = 0.95


@dataclass(frozen=True)
class BoardEstimate:
    """A variant's latency (ms) and energy per inference (mJ) on the board at the conversion's target point."""

    latency_ms: float
    energy_mj: float
    #: "measured on board", "emulated <core>" (counted under qemu-user) or "estimated" (scaled from this host).
    basis: str
    #: The instruction counts an emulated estimate was made from (with ONNX Runtime's fusions on the board's ISA).
    counts: tuple[InstructionCount, ...] = ()
    #: The latency at any other operating point (a power budget may move the variant).
    model: LatencyModel | None = field(default=None, compare=False, repr=False)
    #: Energy per inference measured on the board at the model's reference point, and how.
    measured_energy_mj: float | None = None
    measured_energy_basis: str = ""


def estimate_on_board(host_latency_ms: float, host: DeviceProfile, host_threads: int, board: DeviceProfile,
                      mode: str, measured_ms: float | None = None, emulated: BoardCost | None = None,
                      measured_energy_mj: float | None = None, measured_energy_basis: str = "",
                      engine: EngineCost | None = None) -> BoardEstimate:
    """Board latency and energy per inference in ``mode``: measured on the board, else emulated, else scaled; on an
    accelerator ``engine``, measured on the board, else its roofline estimate."""
    point = target_point(board, mode, accelerator=engine.accelerator if engine is not None else None)
    if measured_ms is not None:
        model = LatencyModel.measured(measured_ms, point)
    elif engine is not None:
        model = LatencyModel.accelerated(engine)
    elif emulated is not None:
        model = LatencyModel.emulated(emulated.counts)
    else:
        model = LatencyModel.estimated(host_latency_ms, host, host_threads)
    latency, basis = model.at(board, point)
    energy = measured_energy_mj if measured_energy_mj is not None else busy_watts(board, point) * latency
    return BoardEstimate(latency, energy, basis, model.counts, model, measured_energy_mj, measured_energy_basis)


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
    #: Where :func:`choose` plans it to run and its power there (None before choosing).
    power: PowerFigures | None = None
    #: The accelerator it runs on (None: the CPU cores), the engine there (``TensorRT fp16``) and the ONNX Runtime
    #: provider that builds it.
    accelerator: str | None = None
    engine: str = ""
    provider: str | None = None
    #: Its drops vs FP32 computed from both on the board's runtime (module doc, "Accuracy on the board"), the largest
    #: difference of its board outputs from this host's (reported, never a veto), and which machine's outputs judge it.
    board_drop: float | None = None
    board_holdout_drop: float | None = None
    host_board_difference: float | None = None
    accuracy_basis: str = "this host"

    @property
    def judged_drop(self) -> float:
        """The selection drop the planner judges: on the board when it ran there, else this host's."""
        return self.accuracy_drop if self.board_drop is None else self.board_drop

    @property
    def judged_holdout_drop(self) -> float | None:
        """The held-out drop the planner checks, from the same machine as :attr:`judged_drop`."""
        return self.holdout_drop if self.board_drop is None else self.board_holdout_drop

    @property
    def runs_on(self) -> str:
        """``cpu``, or the accelerator and its engine (``ampere-gpu TensorRT fp16``)."""
        return f"{self.accelerator} {self.engine}".strip() if self.accelerator else "cpu"

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
    budget: PowerBudget = PowerBudget()

    @property
    def point(self) -> OperatingPoint:
        """Where the chosen variant is planned to run: its power mode and thread count."""
        assert self.chosen.power is not None  # choose() sets it on every candidate
        return self.chosen.power.point


def choose(candidates: Sequence[Candidate], board: DeviceProfile, mode: str, max_accuracy_drop: float,
           target_fps: float | None = None, budget: PowerBudget | None = None) -> PlanResult:
    """Mark every candidate fitting or rejected (with reasons) and pick one; see the module doc.

    ``budget`` states a rate and a power limit (:class:`PowerBudget`); ``target_fps`` alone is
    the same as ``PowerBudget(fps=target_fps)``. An infeasible budget raises
    :class:`~edgesdk.errors.InfeasibleBudgetError` at once.
    """
    budget = budget if budget is not None else PowerBudget(fps=target_fps)
    check_feasible(board, budget)
    memory_mb = board.model_budget_mb
    # A quantized variant is compared with FP32 on its own engine (the CPU, or the accelerator's first FP32 engine).
    fp32_on: dict[str | None, Candidate] = {}
    for c in candidates:
        if c.precision == "fp32" and c.format == "onnx":
            fp32_on.setdefault(c.accelerator, c)

    def memory_reasons(c: Candidate) -> list[str]:
        m, reasons = c.measurement, []
        if m.size_bytes / 2**20 > memory_mb:
            reasons.append(f"file {m.size_bytes / 2**20:.1f} MiB > budget {memory_mb} MiB")
        if m.model_memory_mb > memory_mb:
            reasons.append(f"peak memory {m.model_memory_mb:.1f} MiB > budget {memory_mb} MiB")
        return reasons

    judged = []
    for c in candidates:
        reasons = memory_reasons(c)
        power = _planned_power(c.estimate, board, target_point(board, mode, accelerator=c.accelerator), budget)
        if not power.fits:
            reasons.append(power.problem if not budget.constrains else
                           f"no power mode and thread count meets {budget.describe()}; the lowest average power: "
                           f"{power.problem}")
        if c.judged_drop > max_accuracy_drop:
            on = "" if c.board_drop is None else f" ({c.accuracy_basis})"
            reasons.append(f"accuracy drop {c.judged_drop:.3g} > bound {max_accuracy_drop:g}{on}")
        fp32 = fp32_on.get(c.accelerator)
        if (c.is_quantized and fp32 is not None and not memory_reasons(fp32)
                and c.estimate.latency_ms > fp32.estimate.latency_ms and not _other_isa_scaled(c, board)):
            reasons.append(f"slower than FP32 on {board.name}{'' if c.accelerator is None else ' ' + c.runs_on} "
                           f"({c.estimate.latency_ms:.3f} ms vs {fp32.estimate.latency_ms:.3f} ms, {c.estimate.basis})")
        judged.append(replace(c, rejected=(*c.rejected, *reasons), power=power))  # a caller's reason stays

    vetoed: list[Candidate] = []
    while True:
        fitting = [c for c in judged if not c.rejected]
        if not fitting:
            raise _nothing_fits(judged, board, mode, memory_mb, budget, max_accuracy_drop)
        winner, reason = _pick(fitting, board, max_accuracy_drop, budget)
        held_out = winner.judged_holdout_drop
        if held_out is None or held_out <= max_accuracy_drop:
            break
        # Chosen on the selection samples, but it does not hold on samples nothing was chosen on: choose again.
        index = next(i for i, c in enumerate(judged) if c is winner)
        judged[index] = replace(winner, rejected=(
            f"held-out drop {held_out:.3g} > bound {max_accuracy_drop:g} (selection drop "
            f"{winner.judged_drop:.3g})",))
        vetoed.append(winner)
    if vetoed:
        reason += (f"; {', '.join(c.name for c in vetoed)} chosen first and rejected: held-out drop over the bound "
                   "(the drop on the selection samples did not hold on unseen ones)")
    final = tuple(replace(c, chosen=c is winner) for c in judged)
    return PlanResult(final, next(c for c in final if c.chosen), reason, budget)


def _planned_power(estimate: BoardEstimate, board: DeviceProfile, target: OperatingPoint,
                   budget: PowerBudget) -> PowerFigures:
    """Where the variant would run: the target point, or (under a budget, or for the energy objective) the point
    that fits with the best figure for the objective.

    When no point fits a budget, the figures of the point with the lowest average power among those that keep up
    with the rate (the nearest miss; among all points when none keeps up).
    """
    model = estimate.model
    reference = model.reference if model is not None and model.reference is not None else target

    def at(point: OperatingPoint) -> PowerFigures:
        latency, basis = (estimate.latency_ms, estimate.basis) if point == target or model is None else model.at(
            board, point)
        measured = estimate.measured_energy_mj if point == reference else None
        return power_at(board, point, latency, basis, budget, measured, estimate.measured_energy_basis)

    if (not budget.constrains and budget.objective == "latency") or model is None:
        return at(target)
    figures = [at(p) for p in operating_points(board, target.accelerator) if model.covers(board, p)] or [at(target)]
    fitting = [f for f in figures if f.fits]
    if fitting:
        if budget.objective == "energy":
            return min(fitting, key=lambda f: (f.energy_mj, f.latency_ms))
        return min(fitting, key=lambda f: (f.latency_ms, f.energy_mj))
    keeping_up = [f for f in figures if f.duty is None or f.duty <= 1] or figures  # a miss the rate allows first
    return min(keeping_up, key=lambda f: (f.avg_watts if f.avg_watts is not None else 0.0, f.latency_ms))


def _other_isa_scaled(c: Candidate, board: DeviceProfile) -> bool:
    """True when ``c``'s board latency is this host's timing scaled and the board is of another architecture: an
    int8 preset for arm64 kernels (dot-product, NEON) runs slowly on x86, which says nothing about the board, so
    such timings never veto a quantized variant by themselves."""
    return c.estimate.basis == "estimated" and board.arch != _HOST_ARCH


def _worst_drop(c: Candidate) -> float:
    """The larger of the selection and held-out drops."""
    held_out = c.judged_holdout_drop
    return max(c.judged_drop, held_out if held_out is not None else c.judged_drop)


def _nothing_fits(judged: Sequence[Candidate], board: DeviceProfile, mode: str, budget: float,
                  power: PowerBudget, max_accuracy_drop: float) -> BudgetError:
    """The error naming the variant closest to fitting, its figures and why it was rejected."""
    def closeness(c: Candidate) -> tuple[float, float]:
        m = c.measurement
        over_memory = max(0.0, max(m.size_bytes / 2**20, m.model_memory_mb) - budget)
        return (over_memory, max(0.0, _worst_drop(c) - max_accuracy_drop))

    best = min(judged, key=closeness)
    m = best.measurement
    held = "" if best.judged_holdout_drop is None else f" (held-out {best.judged_holdout_drop:.3g})"
    return BudgetError(
        f"no variant fits {board.name} ({mode}, model budget {budget} MiB, {power.describe()}, max accuracy drop "
        f"{max_accuracy_drop:g}); closest: {best.name} — file {m.size_bytes / 2**20:.2f} MiB, peak memory "
        f"{m.model_memory_mb:.1f} MiB, accuracy drop {best.judged_drop:.3g}{held}, {best.estimate.latency_ms:.2f} ms "
        f"({best.estimate.basis}); rejected because: {'; '.join(best.rejected)}. Loosen --max-accuracy-drop, "
        "raise the power budget, lower the frame rate, choose a larger board or a smaller model"
    )


def _pick(fitting: list[Candidate], board: DeviceProfile, bound: float, budget: PowerBudget) -> tuple[Candidate, str]:
    """The best for the objective at its planned point (the fastest, or the least energy per
    inference); among those tied with it (:func:`_tolerance`), the most accurate, then the smallest
    file, then the first built."""
    energy = budget.objective == "energy"

    def figure(c: Candidate) -> float:
        assert c.power is not None  # choose() sets it on every candidate
        return c.power.energy_mj if energy else c.power.latency_ms

    best = min(fitting, key=figure)
    near = [c for c in fitting if figure(c) < figure(best) * (1 + _tolerance(best, c, board)[0])]
    # Accuracy, then size; min keeps the first built of equals.
    winner = min(near, key=lambda c: (c.judged_drop, c.measurement.size_bytes))
    power = winner.power
    assert power is not None
    held = "" if winner.judged_holdout_drop is None else f", held-out {winner.judged_holdout_drop:.3g}"
    where = (f" in power mode {power.point.power_mode} with {power.point.threads} thread(s)"
             if (budget.constrains or energy) and winner.accelerator is None else
             f" on {winner.runs_on} in power mode {power.point.power_mode}" if winner.accelerator else "")
    watts = f", average {power.avg_watts:.3g} W" if power.avg_watts is not None else ""
    band = latency_band(board.name, power.basis)
    basis = power.basis if power.basis.startswith(band.label) else f"{band.label}: {power.basis}"
    figures = (f"{band.describe(power.latency_ms)} on {board.name}{where}, {basis}, "
               f"{power.energy_mj:.3g} mJ per inference ({power.energy_basis}){watts}, accuracy drop "
               f"{winner.judged_drop:.3g}{held} <= {bound:g}")
    what = "lowest energy per inference" if energy else "fastest variant"
    within = f" at {budget.describe()}" if budget.constrains else " within budget"
    others = [c for c in near if c is not winner]
    if not others:
        return winner, f"{what}{within} ({figures})"
    drop, size = winner.judged_drop, winner.measurement.size_bytes
    if all(c.judged_drop > drop for c in others):
        why = "the more accurate"
    elif all(c.measurement.size_bytes > size for c in others if c.judged_drop == drop):
        equally_accurate = all(c.judged_drop == drop for c in others)
        why = "the smaller" if equally_accurate else "the smaller of the most accurate"
    else:
        why = "the first built of equally accurate and small ones"
    tied = _tolerance(best, winner if winner is not best else others[0], board)[1]
    if winner is best:
        return winner, (f"{what}{within}, and {why} of those within {tied} of it "
                        f"({', '.join(c.name for c in others)}) ({figures})")
    unit = "mJ" if energy else "ms"
    gap, _ = _tolerance(best, winner, board)
    inside = "which is measurement noise" if tied == "noise" else "inside that band"
    return winner, (f"within {tied} of {best.name} ({figure(best):.3g} {unit}: less than {gap:.0%} "
                    f"better, {inside}); chose {why} "
                    f"(accuracy, then size) ({figures})")


def _tolerance(best: Candidate, other: Candidate, board: DeviceProfile) -> tuple[float, str]:
    """How much slower than ``best`` ``other`` may be and still tie with it, and what says so.

    The band of the comparison (:func:`comparison_band`): two variants counted on the same emulated
    cores share the CPI's error, so the held-out band of a *ratio* of two such figures applies where
    the held-out half has one (else the absolute band); figures of two bases tie
    within the sum of their absolute bands. Never less than measurement noise (:data:`CLEAR_GAIN`),
    and noise alone where the comparison is unvalidated.
    """
    assert best.power is not None and other.power is not None
    noise = 1 / CLEAR_GAIN - 1
    band = comparison_band(board.name, best.power.basis, other.power.basis)
    if band is None or band <= noise:
        return noise, "noise"
    label = basis_label(best.power.basis)
    same = best.power.basis == other.power.basis
    kind = "between variants counted on the same cores" if same else "combined"
    return band, f"the {label} band ({kind}, +/-{band:.0%})"
