"""The budget sweep of benchmarks/converter/power.py: the candidates a board plans with, the plans under each budget,
and the checks.

See power.py's docstring for what is measured; this module holds the planning and the counting so that the script
stays readable.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgesdk import load_profile
from edgesdk.converters.board.accelerator_plan import accelerator_candidates
from edgesdk.converters.board.board_latency import OperatingPoint, board_cost, operating_points
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.board.power import PowerBudget, power_at
from edgesdk.converters.planning.planner import CLEAR_GAIN, Candidate, PlanResult, choose, estimate_on_board
from edgesdk.errors import BudgetError, InfeasibleBudgetError
from edgesdk.runtime.profiles import DeviceProfile

STEP_W = 0.1
#: The frame rate of the sweep: this share of what FP32 on the CPU sustains at the board's fastest point, so that a
#: budget has something to trade (a rate the board barely keeps up with leaves one point).
RATE_SHARE = 0.5
#: Relative tolerance of the latency comparison: float rounding only, not a noise allowance.
ROUNDING = 1e-9


def costed_on(board: DeviceProfile, candidates: list[Candidate], sample: dict, emulator: Emulator) -> list[Candidate]:
    """The variants costed on ``board``'s emulated cores (every cluster), without the first plan's verdicts."""
    host = load_profile("generic-x86_64")
    costed = []
    for c in candidates:
        cost = board_cost(emulator, c.path, sample, board, "latency", every_cluster=True)
        estimate = estimate_on_board(c.measurement.latency_p50_ms, host, c.measurement.threads, board, "latency",
                                     emulated=cost)
        costed.append(replace(c, estimate=estimate, rejected=(), chosen=False, power=None))
    return costed


def planned_candidates(board: DeviceProfile, candidates: list[Candidate], sample: dict,
                       emulator: Emulator) -> list[Candidate]:
    """What the converter plans with on ``board``: the CPU variants on its emulated cores, plus (on a board whose
    accelerator has TensorRT/CUDA providers and data-sheet ceilings) one candidate per (ONNX variant, GPU engine)."""
    cpu = costed_on(board, candidates, sample, emulator)
    return cpu + accelerator_candidates(cpu, board, "latency", sample)


def _where(board: DeviceProfile, c: Candidate, point: OperatingPoint) -> str:
    """``cpu big`` (the clusters of the busy cores) or ``ampere-gpu TensorRT fp16``."""
    if c.accelerator is not None:
        return c.runs_on
    busy = set(point.cores[: max(1, point.threads)])
    return "cpu " + "+".join(cl.name for cl in board.clusters if busy & set(cl.cores))


def _plan(candidates: list[Candidate], board: DeviceProfile, budget: PowerBudget, bound: float) -> dict:
    """One plan as a row, with the unrounded figures the checks compare under ``_exact``."""
    row: dict = {"budget_w": budget.watts}
    try:
        plan: PlanResult = choose(candidates, board, "latency", bound, budget=budget)
    except InfeasibleBudgetError as exc:
        row.update(outcome="infeasible", message=str(exc))
        return row
    except BudgetError as exc:
        row.update(outcome="no variant fits", message=str(exc)[:300])
        return row
    power = plan.chosen.power
    assert power is not None and power.avg_watts is not None
    fastest = min((c for c in plan.candidates if not c.rejected and c.power is not None),
                  key=lambda c: c.power.latency_ms if c.power is not None else 0.0)
    assert fastest.power is not None
    row.update(outcome="chosen", variant=plan.chosen.name, runs_on=_where(board, plan.chosen, power.point),
               power_mode=power.point.power_mode, threads=power.point.threads, avg_w=round(power.avg_watts, 4),
               duty=round(power.duty or 0.0, 4), energy_mj=round(power.energy_mj, 4), latency_ms=round(power.latency_ms, 4),
               basis=power.basis, size_kib=round(plan.chosen.measurement.size_bytes / 1024, 1),
               fastest=fastest.name, fastest_ms=round(fastest.power.latency_ms, 4),
               _exact={"latency_ms": power.latency_ms, "avg_w": power.avg_watts, "duty": power.duty or 0.0,
                       "fastest_ms": fastest.power.latency_ms})
    return row


def _choice(row: dict) -> str:
    return f"{row['variant']} on {row['runs_on']}, {row['power_mode']} x{row['threads']}"


def sweep(board: DeviceProfile, candidates: list[Candidate], bound: float, energy_too: bool = True) -> dict:
    """Plan under every budget of the sweep (objective latency, and energy when ``energy_too``): the rows and the
    counts the goals are made of (power.py's docstring)."""
    fp32 = next(c for c in candidates if c.precision == "fp32" and c.accelerator is None)
    assert fp32.estimate.model is not None
    fastest_ms = min(fp32.estimate.model.at(board, p)[0] for p in operating_points(board))
    fps = round(RATE_SHARE * 1000 / fastest_ms, 3)
    idle = min(m.idle_watts for m in board.power_modes)
    rate_only = PowerBudget(fps=fps)
    top = max(power_at(board, p, *c.estimate.model.at(board, p), rate_only).avg_watts or 0.0
              for c in candidates if c.estimate.model is not None
              for p in operating_points(board, c.accelerator) if c.estimate.model.covers(board, p))
    budgets = [round(idle - 0.3, 2), round(idle - 0.05, 2)]
    budgets += [round(b, 2) for b in np.arange(idle + STEP_W, top + STEP_W, STEP_W)]
    rows = [_plan(candidates, board, PowerBudget(fps=fps, watts=w), bound) for w in [*budgets, None]]
    free = rows[-1]
    chosen = [r for r in rows if r["outcome"] == "chosen"]
    over = [r for r in chosen if r["budget_w"] is not None and r["avg_w"] > r["budget_w"] + 1e-9]
    falls = [(a["budget_w"], b["budget_w"]) for a, b in zip(chosen, chosen[1:]) if b["avg_w"] < a["avg_w"] - 1e-9]
    wrong_infeasible = [r["budget_w"] for r in rows if (r["outcome"] == "infeasible") != (
        r["budget_w"] is not None and r["budget_w"] < idle)]
    slower, strictly_slower, changed = [], [], []
    if free["outcome"] == "chosen":
        f = free["_exact"]
        for r in rows[:-1]:
            fits = f["avg_w"] <= r["budget_w"] and f["duty"] <= 1
            if r["outcome"] == "chosen" and _choice(r) != _choice(free):
                changed.append({"budget_w": r["budget_w"], "unbudgeted": _choice(free), "budgeted": _choice(r),
                                "unbudgeted_fits": fits})
            if not fits:
                continue
            if r["outcome"] != "chosen":  # refused while the unbudgeted choice fits: as bad as slower
                slower.append({"budget_w": r["budget_w"], "outcome": r["outcome"]})
                continue
            latency = r["_exact"]["latency_ms"]
            fastest_ms = r["_exact"]["fastest_ms"]
            case = {"budget_w": r["budget_w"], "unbudgeted": _choice(free), "unbudgeted_ms": round(f["latency_ms"], 4),
                    "budgeted": _choice(r), "budgeted_ms": round(latency, 4),
                    "ratio": round(latency / f["latency_ms"], 6), "budgeted_fastest": r["fastest"],
                    "budgeted_fastest_ms": round(fastest_ms, 4)}
            if latency > f["latency_ms"] * (1 + ROUNDING):
                strictly_slower.append(case)
            # Slower by the planner's rule: the unbudgeted choice clearly faster than the budgeted one; or, whatever
            # the noise rule, the budgeted plan's fastest fitting candidate slower than the unbudgeted choice, which
            # fits, i.e. the budgeted plan did not weigh the unbudgeted choice at its own point.
            if (f["latency_ms"] <= CLEAR_GAIN * latency * (1 + ROUNDING)
                    or fastest_ms > f["latency_ms"] * (1 + ROUNDING)):
                slower.append(case)
    energy = []
    if energy_too:
        for w in [*budgets[2:], None]:
            r = _plan(candidates, board, PowerBudget(fps=fps, watts=w, objective="energy"), bound)
            energy.append({k: v for k, v in r.items() if k in ("budget_w", "outcome", "variant", "runs_on", "power_mode",
                                                              "threads", "avg_w", "energy_mj", "latency_ms")})
    for r in rows:
        r.pop("_exact", None)
    return {"fps": fps, "idle_w": idle, "top_w": round(top, 4), "budgets": len(rows),
            "candidates": len(candidates), "gpu_candidates": sum(c.accelerator is not None for c in candidates),
            "unbudgeted": _choice(free) if free["outcome"] == "chosen" else free["outcome"],
            "rows": rows, "over_budget": len(over), "falls": falls, "wrong_infeasible": wrong_infeasible,
            "slower_than_unbudgeted": slower, "strictly_slower_than_unbudgeted": strictly_slower,
            "changed": changed,
            "points": sorted({f"{r['power_mode']} {r['runs_on']} x{r['threads']}" for r in chosen}),
            "variants": sorted({r["variant"] for r in chosen}),
            "energy_objective": energy}
