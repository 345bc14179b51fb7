"""Power budgets on real models and boards, and the energy sensors that check them.

* **Budget sweep.** The quantization benchmark's three real models (benchmarks/models.py) are
  converted once for a Raspberry Pi 5 (every variant measured here, counted on the emulated
  Cortex-A76). Each variant is then costed on the Pi 4, the Pi 5 and the RK3588 (every
  cluster's core type counted under qemu-user) and planned under a sweep of power budgets at
  a fixed frame rate: from below the board's idle power (infeasible), through idle + 0.1 W,
  in steps up to the most power any variant draws, then with no power limit at all. Checked:
  the chosen average power never falls as the budget rises, every choice fits its budget,
  and the budgets refused as infeasible are exactly those under the board's idle power.
* **Sensors.** The recorded sensor traces under tests/data/power are integrated by
  :mod:`edgesdk.energy` and compared with their known totals; a sensor read is timed; and
  ``bench`` with the sampler on is timed against it off, interleaved (this VM has no readable
  RAPL, so the sampler reads a recorded sysfs tree).

    python benchmarks/power.py [--quick]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, goal, log  # noqa: E402
from models import DATA, MODELS, fetch  # noqa: E402

from edgesdk import load_profile  # noqa: E402
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert  # noqa: E402
from edgesdk.converters.board_latency import board_cost, operating_points  # noqa: E402
from edgesdk.converters.config import CalibrationMethod, QuantizationConfig  # noqa: E402
from edgesdk.converters.emulate import Emulator  # noqa: E402
from edgesdk.converters.planner import Candidate, choose, estimate_on_board  # noqa: E402
from edgesdk.converters.power import PowerBudget, power_at  # noqa: E402
from edgesdk.errors import BudgetError, InfeasibleBudgetError  # noqa: E402
from edgesdk.profiles import DeviceProfile  # noqa: E402

CONVERTED_FOR, BOARDS = "raspberry-pi-5", ("raspberry-pi-4", "raspberry-pi-5", "rk3588")
BOUND, HOLDOUT, STEP_W = 1.0, 0.3, 0.1
#: The frame rate of the sweep: this share of what FP32 sustains on the board's fastest point, so that a
#: budget has something to trade (a rate the board barely keeps up with leaves one point).
RATE_SHARE = 0.5


def convert_once(name: str, work: Path, quick: bool) -> tuple[list[Candidate], dict]:
    """One conversion for the Pi 5: every variant measured here, counted on the emulated A76."""
    spec = MODELS[name]
    source = fetch(name)
    n_cal, n_eval = (32, 64) if quick else (128, 200)
    calibration, evaluation = DATA[name](n_cal, 1), DATA[name](n_eval, 2)
    config = QuantizationConfig.for_profile(load_profile(CONVERTED_FOR))
    if quick:
        config = QuantizationConfig(**{**config.__dict__, "calibration_methods": (CalibrationMethod.MINMAX,),
                                       "max_search_candidates": 0})
    log(f"{name}: convert() for {CONVERTED_FOR} (emulated), bound {BOUND}")
    started = time.perf_counter()
    request = ConversionRequest(Source(source, input_shapes={spec.input_name: spec.shape}),
                                Target(CONVERTED_FOR, emulate=True),
                                Data({spec.input_name: calibration}, {spec.input_name: evaluation}, metric=spec.metric,
                                     holdout=HOLDOUT),
                                Output(work / f"{name}-out", name=name), Bounds(max_accuracy_drop=BOUND),
                                quantization=config)
    report = convert(request, progress=lambda stage, done, total: log(f"  {stage}") if done == 0 else None)
    sample = {spec.input_name: evaluation[:1]}
    return list(report.plan.candidates), {"sample": sample, "convert_s": round(time.perf_counter() - started, 1),
                                          "metric": report.metric}


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


def sweep(board: DeviceProfile, candidates: list[Candidate]) -> dict:
    """Plan under every budget of the sweep; the rows and the counts the goals are made of."""
    fp32 = next(c for c in candidates if c.precision == "fp32")
    assert fp32.estimate.model is not None
    fastest_ms = min(fp32.estimate.model.at(board, p)[0] for p in operating_points(board))
    fps = round(RATE_SHARE * 1000 / fastest_ms, 3)
    idle = min(m.idle_watts for m in board.power_modes)
    rate_only = PowerBudget(fps=fps)
    top = max(power_at(board, p, *c.estimate.model.at(board, p), rate_only).avg_watts or 0.0
              for c in candidates if c.estimate.model is not None for p in operating_points(board))
    budgets = [round(idle - 0.3, 2), round(idle - 0.05, 2)]
    budgets += [round(b, 2) for b in np.arange(idle + STEP_W, top + STEP_W, STEP_W)]
    rows = []
    for watts in [*budgets, None]:
        budget = PowerBudget(fps=fps, watts=watts)
        row: dict = {"budget_w": watts}
        try:
            plan = choose(candidates, board, "latency", BOUND, budget=budget)
        except InfeasibleBudgetError as exc:
            row.update(outcome="infeasible", message=str(exc))
        except BudgetError as exc:
            row.update(outcome="no variant fits", message=str(exc)[:300])
        else:
            power = plan.chosen.power
            assert power is not None and power.avg_watts is not None
            row.update(outcome="chosen", variant=plan.chosen.name, power_mode=power.point.power_mode,
                       threads=power.point.threads, avg_w=round(power.avg_watts, 4),
                       energy_mj=round(power.energy_mj, 4), latency_ms=round(power.latency_ms, 4),
                       basis=power.basis)
        rows.append(row)
    chosen = [r for r in rows if r["outcome"] == "chosen"]
    over = [r for r in chosen if r["budget_w"] is not None and r["avg_w"] > r["budget_w"] + 1e-9]
    falls = [(a["budget_w"], b["budget_w"]) for a, b in zip(chosen, chosen[1:]) if b["avg_w"] < a["avg_w"] - 1e-9]
    wrong_infeasible = [r["budget_w"] for r in rows if (r["outcome"] == "infeasible") != (
        r["budget_w"] is not None and r["budget_w"] < idle)]
    return {"fps": fps, "idle_w": idle, "budgets": len(rows), "rows": rows, "over_budget": len(over),
            "falls": falls, "wrong_infeasible": wrong_infeasible,
            "points": sorted({f"{r['power_mode']} x{r['threads']}" for r in chosen}),
            "variants": sorted({r["variant"] for r in chosen})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one model, one calibration method (under a minute warm)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    names = ["orientation"] if args.quick else list(MODELS)
    emulator = Emulator()
    results: dict = {"sweep": {}}
    goals = []
    with tempfile.TemporaryDirectory(prefix="edgesdk-power-") as tmp:
        for name in names:
            candidates, info = convert_once(name, Path(tmp), args.quick)
            results["sweep"][name] = {"convert_s": info["convert_s"], "metric": info["metric"], "boards": {}}
            for board_name in BOARDS:
                board = load_profile(board_name)
                log(f"{name}: costing {len(candidates)} variants on {board_name}'s emulated cores, sweeping budgets")
                results["sweep"][name]["boards"][board_name] = sweep(board, costed_on(board, candidates,
                                                                                      info["sample"], emulator))
    runs = [s for model in results["sweep"].values() for s in model["boards"].values()]
    goals.append(goal("budget sweep: choices whose average power exceeds their budget", "0",
                      sum(s["over_budget"] for s in runs), all(s["over_budget"] == 0 for s in runs)))
    goals.append(goal("budget sweep: a higher budget choosing a lower average power than the one below it "
                      "(chosen P_avg not monotone)", "0", sum(len(s["falls"]) for s in runs),
                      all(not s["falls"] for s in runs)))
    goals.append(goal("budget sweep: budgets refused as infeasible that are not under idle, or under idle and "
                      "not refused", "0", sum(len(s["wrong_infeasible"]) for s in runs),
                      all(not s["wrong_infeasible"] for s in runs)))
    emit("power", {"quick": args.quick, "models": names, "boards": list(BOARDS), "bound": BOUND,
                   "rate_share_of_fp32_fastest": RATE_SHARE, "step_w": STEP_W}, results, goals)


if __name__ == "__main__":
    main()
