"""The power model: a variant's energy per inference and the board's average power, against a budget the user states.

Per operating point (a power mode and a thread count, :mod:`.board_latency`) and variant:

* **busy power** above idle, with ``threads`` cores of the mode's clusters busy (on an accelerator: its own
  ``active_watts`` in the mode)::

      busy_W = sum over the mode's clusters of active_W(cluster) * (S + (1 - S) * busy_cores / cores)

  ``active_W`` is the profile's figure for the cluster with all its cores busy at the mode's
  clock (``PowerMode.active_watts``). ``S`` (the cluster's ``shared_power_share`` in the
  profile, else :data:`SHARED_ACTIVE_SHARE`, 0.3) is the part of it that does not grow with
  the busy core count: the cluster's shared cache, interconnect and DRAM traffic. The default
  is an assumption, not a measured figure; with it, more threads cost less energy per inference
  than one core at a time (race to idle) whenever threads scale at least as well as
  ``1 - S``, which is why the thread scaling (``parallel_efficiency``) is a profile parameter too.
  A board measurement (``edgesdk bench --energy``) replaces the whole model at its point.
* **energy per inference** ``E_inf = busy_W × latency`` (mJ), or the figure measured on the board;
* **continuous use** at ``fps`` frames per second: ``duty = fps × latency`` (one inference at a
  time: a :class:`~edgesdk.Runtime` serialises its calls), which must be ≤ 1, and
  ``P_avg = P_idle + fps × E_inf``;
* **duty-cycled use** (``wake_every`` S seconds, ``frames_per_wake`` N frames): each wake the
  board resumes (``resume_s``, ``resume_mj`` from the profile), runs N inferences back to back
  and sleeps (``sleep_watts``) for the rest of the period; a board that cannot sleep idles::

      awake_s = resume_s + N × latency                                  (must be ≤ S)
      P_avg   = (resume_mJ/1000 + P_idle × N × latency + N × E_inf/1000 + P_sleep × (S − awake_s)) / S
      P_avg   = P_idle + N × E_inf / 1000 / S                           (no sleep state)

A budget is average watts (``--power-budget``) or energy per hour (``--energy-budget``
mWh/h, the same thing in the unit a battery is sized in: 1000 mWh/h = 1 W). Below the
lowest floor of every power mode (``P_avg`` with no inference at all: idle power, or the sleep
and wake costs) it is infeasible whatever the model: :class:`InfeasibleBudgetError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgesdk.converters.board.board_latency import OperatingPoint
from edgesdk.errors import ConversionError, InfeasibleBudgetError
from edgesdk.runtime.profiles import DeviceProfile, PowerMode

__all__ = ["SHARED_ACTIVE_SHARE", "OBJECTIVES", "PowerBudget", "PowerFigures", "busy_watts", "power_at", "floor_watts",
           "check_feasible"]

#: The share of a cluster's active power that is drawn as soon as any of its cores is busy (an assumption).
SHARED_ACTIVE_SHARE = 0.3
#: What the planner minimises among the points and variants that fit: ``latency`` (the fastest; the default) or
#: ``energy`` (the lowest energy per inference that keeps the rate). A budget only constrains; it never picks one.
OBJECTIVES = ("latency", "energy")


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConversionError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PowerBudget:
    """What the board must sustain, and within what power: a frame rate or a wake cycle, and watts or mWh/h.

    ``fps`` (continuous use) and ``wake_every_s`` with ``frames_per_wake`` (duty-cycled) are
    exclusive; ``watts`` and ``energy_mwh_per_h`` are exclusive; a budget needs a rate.
    Every field None: nothing to meet beyond memory and accuracy. ``objective`` (:data:`OBJECTIVES`) is what
    the choice minimises among what fits, whether or not a budget is stated.
    """

    fps: float | None = None
    watts: float | None = None
    energy_mwh_per_h: float | None = None
    wake_every_s: float | None = None
    frames_per_wake: int | None = None
    objective: str = "latency"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConversionError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}: latency picks "
                                  "the fastest point that fits, energy the lowest energy per inference")
        for name in ("fps", "watts", "energy_mwh_per_h", "wake_every_s"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        if self.frames_per_wake is not None and (isinstance(self.frames_per_wake, bool)
                                                  or not isinstance(self.frames_per_wake, int)
                                                  or self.frames_per_wake < 1):
            raise ConversionError(f"frames_per_wake must be an integer >= 1, got {self.frames_per_wake!r}")
        if (self.wake_every_s is None) != (self.frames_per_wake is None):
            raise ConversionError("give --wake-every and --frames-per-wake together (a device that wakes every S "
                                  "seconds to run N frames)")
        if self.fps is not None and self.wake_every_s is not None:
            raise ConversionError("give either --fps (continuous) or --wake-every/--frames-per-wake (duty-cycled), "
                                  "not both")
        if self.watts is not None and self.energy_mwh_per_h is not None:
            raise ConversionError("give either --power-budget W or --energy-budget MWH_PER_H, not both: they are the "
                                  "same limit (1000 mWh/h = 1 W)")
        if self.constrains and self.rate_hz is None:
            raise ConversionError("a power or energy budget needs a rate: add --fps F, or --wake-every S with "
                                  "--frames-per-wake N")

    @property
    def limit_watts(self) -> float | None:
        """The budget as average watts, or None when none is stated."""
        return self.watts if self.watts is not None else (
            self.energy_mwh_per_h / 1000 if self.energy_mwh_per_h is not None else None)

    @property
    def constrains(self) -> bool:
        """A power or energy budget is stated (the choice then stays within it)."""
        return self.watts is not None or self.energy_mwh_per_h is not None

    @property
    def duty_cycled(self) -> bool:
        """The device wakes, runs a few frames and sleeps."""
        return self.wake_every_s is not None

    @property
    def rate_hz(self) -> float | None:
        """Inferences per second on average, or None when no rate is stated."""
        if self.fps is not None:
            return self.fps
        if self.wake_every_s is not None and self.frames_per_wake is not None:
            return self.frames_per_wake / self.wake_every_s
        return None

    def describe(self) -> str:
        """``5 fps within 3 W`` / ``4 frames every 60 s within 0.5 W``."""
        rate = (f"{self.fps:g} fps" if self.fps is not None else
                f"{self.frames_per_wake} frames every {self.wake_every_s:g} s" if self.duty_cycled else "any rate")
        limit = self.limit_watts
        return rate if limit is None else f"{rate} within {limit:g} W"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for reports and the bundle."""
        return {"fps": self.fps, "watts": self.limit_watts, "energy_mwh_per_h": self.energy_mwh_per_h,
                "wake_every_s": self.wake_every_s, "frames_per_wake": self.frames_per_wake,
                "objective": self.objective}


def _mode(board: DeviceProfile, point: OperatingPoint) -> PowerMode:
    return next(m for m in board.power_modes if m.name == point.power_mode)


def busy_watts(board: DeviceProfile, point: OperatingPoint) -> float:
    """Power above idle with ``point.threads`` of the point's cores busy (module doc), or, on an accelerator, the
    accelerator's ``active_watts`` in the mode (the one CPU thread that feeds it waits on it, and is not counted)."""
    mode = _mode(board, point)
    if point.accelerator is not None:
        if point.accelerator not in mode.active_watts:
            raise ConversionError(f"profile {board.name!r}: power mode {mode.name!r} has no active_watts for "
                                  f"{point.accelerator!r}; add its figure to plan energy on it")
        return mode.active_watts[point.accelerator]
    busy = point.cores[: max(1, min(point.threads, len(point.cores)))]
    watts = 0.0
    for name in mode.clusters:
        cores = board.cluster(name).cores
        used = sum(1 for c in busy if c in cores)
        if used:
            shared = board.cluster(name).shared_power_share
            shared = SHARED_ACTIVE_SHARE if shared is None else shared
            share = shared + (1 - shared) * used / len(cores)
            watts += mode.active_watts[name] * share
    return watts


@dataclass(frozen=True)
class PowerFigures:
    """A variant at one operating point: latency, energy per inference, average power, and whether it fits."""

    point: OperatingPoint
    latency_ms: float
    #: Energy per inference above idle, mJ.
    energy_mj: float
    #: Where the latency comes from ("emulated cortex-a76", ...).
    basis: str
    #: Where the energy comes from: "measured on board (sensor, scope)" or "modelled from <latency basis>".
    energy_basis: str
    #: Average board power at the budget's rate (None without a rate).
    avg_watts: float | None
    #: Share of the time inferring (continuous), or awake (duty-cycled); None without a rate.
    duty: float | None
    #: Why it does not fit ("" when it does).
    problem: str = ""

    @property
    def fits(self) -> bool:
        """Keeps up and stays within the budget."""
        return not self.problem

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"power_mode": self.point.power_mode, "threads": self.point.threads, "accelerator": self.point.accelerator,
                "latency_ms": round(self.latency_ms, 4), "energy_mj": round(self.energy_mj, 4),
                "avg_watts": None if self.avg_watts is None else round(self.avg_watts, 4),
                "duty": None if self.duty is None else round(self.duty, 4), "basis": self.basis,
                "energy_basis": self.energy_basis, "fits": self.fits, "problem": self.problem}


def floor_watts(board: DeviceProfile, mode: PowerMode, budget: PowerBudget) -> float:
    """Average power in ``mode`` with no inference at all: idle, or (duty-cycled, with a sleep state) sleep + wakes."""
    power = board.power
    if budget.duty_cycled and power.sleep_watts is not None and budget.wake_every_s is not None:
        period = budget.wake_every_s
        assert power.resume_mj is not None and power.resume_s is not None  # checked together by BoardPower
        return (power.resume_mj / 1000 + power.sleep_watts * max(0.0, period - power.resume_s)) / period
    return mode.idle_watts


def check_feasible(board: DeviceProfile, budget: PowerBudget) -> None:
    """Raise :class:`InfeasibleBudgetError` when even doing nothing exceeds the budget in every power mode."""
    limit = budget.limit_watts
    if limit is None:
        return
    floors = {m.name: floor_watts(board, m, budget) for m in board.power_modes}
    if min(floors.values()) <= limit:
        return
    lowest = min(floors, key=lambda name: floors[name])
    sleeping = budget.duty_cycled and board.power.sleep_watts is not None
    what = (f"sleeping and waking every {budget.wake_every_s:g} s alone averages {floors[lowest]:.3g} W" if sleeping
            else f"idle {floors[lowest]:.3g} W")
    raise InfeasibleBudgetError(
        f"infeasible on {board.name} in any mode: {what} (power mode {lowest}) > budget {limit:g} W, before any "
        "inference. Raise the budget, wake less often, or choose a board that idles lower")


def power_at(board: DeviceProfile, point: OperatingPoint, latency_ms: float, basis: str, budget: PowerBudget,
             measured_energy_mj: float | None = None, measured_basis: str = "") -> PowerFigures:
    """The figures of one variant at one point, and whether they meet ``budget`` (module doc)."""
    mode = _mode(board, point)
    if measured_energy_mj is not None:
        energy, energy_basis = measured_energy_mj, measured_basis or "measured on board"
    else:
        energy, energy_basis = busy_watts(board, point) * latency_ms, f"modelled from {basis}"
    rate, limit = budget.rate_hz, budget.limit_watts
    if rate is None:
        return PowerFigures(point, latency_ms, energy, basis, energy_basis, None, None)
    problems = []
    if budget.duty_cycled:
        assert budget.wake_every_s is not None and budget.frames_per_wake is not None
        period, frames, power = budget.wake_every_s, budget.frames_per_wake, board.power
        run_s = frames * latency_ms / 1000
        if power.sleep_watts is not None:
            assert power.resume_s is not None and power.resume_mj is not None
            awake = power.resume_s + run_s
            joules = (power.resume_mj / 1000 + mode.idle_watts * run_s + frames * energy / 1000
                      + power.sleep_watts * max(0.0, period - awake))
            avg = joules / period
        else:
            awake, avg = run_s, mode.idle_watts + frames * energy / 1000 / period
        duty = awake / period
        if duty > 1:
            problems.append(f"{frames} frames take {awake:.3g} s awake ({basis}) > the {period:g} s between wakes")
    else:
        duty = rate * latency_ms / 1000
        avg = mode.idle_watts + rate * energy / 1000
        if duty > 1:
            problems.append(f"{rate:g} fps needs {latency_ms:.3g} ms <= {1000 / rate:.3g} ms per frame ({basis}, "
                            f"{point.label}): duty {duty:.2f} > 1")
    if limit is not None and avg > limit:
        problems.append(f"average {avg:.3g} W (idle {mode.idle_watts:g} W + {energy:.3g} mJ per inference, "
                        f"{energy_basis}, {point.label}) > budget {limit:g} W")
    return PowerFigures(point, latency_ms, energy, basis, energy_basis, avg, duty, "; ".join(problems))
