"""The converter's cost models checked against published board figures (issue 38, item 2).

``benchmarks/converter/data/published_latency.yaml`` holds published latencies (board, core, clock,
runtime, model, input, precision, threads, source). This script:

1. rebuilds each figure's model from its public definition (``calibration_models.py``);
2. **CPU figures**: counts the model's instructions per inference on the figure's core with the
   converter's own :class:`~edgesdk.converters.board.emulate.Emulator` (the board's aarch64 ONNX Runtime
   under qemu-user; the Cortex-A55 on the stand-in of ``calibration_counts.py``), and estimates
   ``count * CPI / clock / (1 + e * (threads - 1))``, the formula of
   :func:`~edgesdk.converters.board.emulate.board_latency_ms`;
3. **GPU figures** (Jetson Orin Nano, TensorRT): the roofline of
   :mod:`edgesdk.converters.board.gpu_estimate` against the data-sheet ceilings of the figure's power
   mode, divided by an efficiency, plus a fixed cost per kernel;
4. splits the figures deterministically into a **fit half** and a **validation half**, stratified by
   board, core and runtime (:func:`split`: each source's figures alternately to the two halves);
5. fits, on the fit half only, one CPI per core type and a time factor per runtime relative to ONNX
   Runtime (whose kernels the converter counts; most published CPU figures are ncnn's), by least squares
   of log error, with the converter's own thread rule
   (:data:`~edgesdk.converters.board.emulate.PARALLEL_EFFICIENCY`), so the goals judge what the converter
   computes; and the GPU efficiency and per-kernel cost. It also fits the thread efficiency the fit
   half supports and reports the errors with it;
6. reports each validation figure's error (estimate / published - 1) and, per board, the median
   and worst absolute error and the number of sources, against the issue's goals.

Counting is CPU-heavy (about a minute of qemu per model and core); counts are cached by the
Emulator, so a second run costs file reads. ``--quick`` uses cached counts only and skips CPU
figures not yet counted (and says so).

    python benchmarks/converter/calibration.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.converter.calibration_counts import A55, COUNTED_ON, count_figure, counter  # noqa: E402
from benchmarks.converter.calibration_models import build  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk import load_profile  # noqa: E402
from edgesdk.converters.board.emulate import CYCLES_PER_INSTRUCTION, PARALLEL_EFFICIENCY  # noqa: E402
from edgesdk.converters.board.gpu_estimate import (  # noqa: E402
    EFFICIENCY,
    PER_KERNEL_US,
    GpuPeak,
    estimate_ms,
    node_costs,
    roofline_ms,
)

DATA = Path(__file__).resolve().parent / "data" / "published_latency.yaml"
#: The issue's targets (issue 38, "Figures"); never loosened.
MEDIAN_TARGET, WORST_TARGET, SOURCES_TARGET, GPU_MEDIAN_TARGET = 0.25, 0.50, 3, 0.30
CPU_BOARDS = ("raspberry-pi-4", "raspberry-pi-5", "rk3588")


def family(figure: dict) -> str:
    """The runtime a figure was measured with: ``onnxruntime`` (what the converter counts), ``ncnn`` or ``tensorrt``."""
    runtime = figure["runtime"].lower()
    return next((name for name in ("onnxruntime", "ncnn", "tensorrt") if runtime.startswith(name)), runtime.split()[0])


def split(figures: list[dict]) -> dict[str, str]:
    """id -> "fit" | "validation", fixed before any estimate is made.

    Per (board, core, runtime family), each source's figures (sorted by id; sources in name order) go alternately to
    the two halves, starting with the half that is smaller so far (validation on a tie): every
    source is split as evenly as it can be, and a source with a single figure is validated against."""
    strata: dict[tuple[str, str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for f in figures:
        strata[(f["board"], f["core"], family(f))][f["source"]].append(f)
    half = {}
    for by_source in strata.values():
        sizes = {"validation": 0, "fit": 0}
        for source in sorted(by_source):
            first = "validation" if sizes["validation"] <= sizes["fit"] else "fit"
            other = "fit" if first == "validation" else "validation"
            for i, f in enumerate(sorted(by_source[source], key=lambda f: f["id"])):
                half[f["id"]] = first if i % 2 == 0 else other
                sizes[half[f["id"]]] += 1
    return half


def cpu_estimate(instructions: float, cpi: float, mhz: float, threads: int, efficiency: float) -> float:
    """Milliseconds: ``board_latency_ms``'s formula with an explicit CPI and thread efficiency."""
    return instructions * cpi / (mhz * 1e3) / (1 + efficiency * (max(threads, 1) - 1))


def fit_cpi(rows: list[dict], efficiency: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per core, the CPI of the converter's counts (ONNX Runtime's), and per runtime family, its time relative to
    ONNX Runtime's on the same core: least squares of log error over ``rows``.

    ``log(published / (count / clock / threads)) = log CPI[core] + log factor[runtime]`` with
    ``factor[onnxruntime] = 1``. A runtime factor is fitted only when the rows hold figures of both
    that runtime and ONNX Runtime; otherwise it stays 1 and the CPIs absorb it (said in the results)."""
    import numpy as np

    cores = sorted({r["core"] for r in rows})
    families = sorted({family(r) for r in rows} - {"onnxruntime"})
    has_ort = any(family(r) == "onnxruntime" for r in rows)
    fitted_families = families if has_ort else []
    design = np.zeros((len(rows), len(cores) + len(fitted_families)))
    target = np.zeros(len(rows))
    for i, r in enumerate(rows):
        design[i, cores.index(r["core"])] = 1.0
        if family(r) in fitted_families:
            design[i, len(cores) + fitted_families.index(family(r))] = 1.0
        target[i] = math.log(r["latency_ms"] / cpu_estimate(r["instructions"], 1.0, r["mhz"], r["threads"], efficiency))
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    cpis = {core: float(math.exp(solution[i])) for i, core in enumerate(cores)}
    factors = {"onnxruntime": 1.0, **{f: 1.0 for f in families},
               **{f: float(math.exp(solution[len(cores) + i])) for i, f in enumerate(fitted_families)}}
    return cpis, factors


def predict(r: dict, cpis: dict[str, float], factors: dict[str, float], efficiency: float) -> float:
    """The calibrated estimate of a CPU figure, in ms."""
    return cpu_estimate(r["instructions"], cpis[r["core"]] * factors.get(family(r), 1.0), r["mhz"], r["threads"],
                        efficiency)


def fit_thread_efficiency(rows: list[dict]) -> float | None:
    """The thread efficiency (0.05..1.00) that, with CPIs refitted, minimises the fit half's squared log error;
    None when the fit half has no core with both one-thread and multi-thread figures."""
    by_core: dict[str, set[bool]] = defaultdict(set)
    for r in rows:
        by_core[r["core"]].add(r["threads"] > 1)
    if not any(len(kinds) == 2 for kinds in by_core.values()):
        return None

    def loss(e: float) -> float:
        cpis, factors = fit_cpi(rows, e)
        return sum(math.log(predict(r, cpis, factors, e) / r["latency_ms"]) ** 2 for r in rows)
    return min((e / 100 for e in range(5, 101)), key=loss)


def fit_gpu(rows: list[dict]) -> tuple[float, float]:
    """(efficiency, per-kernel µs) minimising the fit half's squared log error (grid search)."""
    best = (math.inf, 1.0, 0.0)
    for e_step in range(1, 101):
        efficiency = e_step / 100
        for kernel_us in (k * 0.5 for k in range(0, 101)):
            # estimate_ms's sum, with each row's roofline and kernel count computed once
            loss = sum(math.log((r["roofline_ms"] / efficiency + r["kernels"] * kernel_us / 1e3)
                                / r["latency_ms"]) ** 2 for r in rows)
            if loss < best[0]:
                best = (loss, efficiency, kernel_us)
    return best[1], best[2]


def board_key(row: dict) -> str:
    return row["board"]


def summarise(rows: list[dict], key: Any = board_key) -> dict[str, dict[str, Any]]:
    """Per group: figures, median and worst absolute error, sources, over ``rows`` (one half)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    out = {}
    for name, members in sorted(groups.items()):
        errors = [abs(r["error"]) for r in members]
        out[name] = {"figures": len(members), "median_abs_error": round(statistics.median(errors), 4),
                     "worst_abs_error": round(max(errors), 4), "sources": len({r["source"] for r in members})}
    return out


def table(rows: list[dict]) -> str:
    """The calibration table, one line per figure."""
    lines = [f"{'figure':<38} {'half':<10} {'source':<26} {'published':>10} {'estimated':>10} {'error':>8}"]
    for r in rows:
        estimate = f"{r['estimated_ms']:.2f}" if r.get("estimated_ms") is not None else "-"
        error = f"{r['error']:+.1%}" if r.get("error") is not None else r.get("skipped", "-")
        lines.append(f"{r['id']:<38} {r['half']:<10} {r['source']:<26} {r['latency_ms']:>10.2f} {estimate:>10} "
                     f"{error:>8}")
    return "\n".join(lines)


def cpu_rows(data: dict, half: dict[str, str], quick: bool) -> tuple[list[dict], list[str]]:
    """The CPU figures with their instruction counts (counting what is not cached, unless ``quick``)."""
    emulator = counter()
    rows, skipped = [], []
    for f in data["figures"]:
        if f["core"] not in COUNTED_ON:
            continue
        log(f"counting {f['model']}@{f['input']} on {COUNTED_ON[f['core']]} for {f['id']}")
        count = count_figure(emulator, f, cached_only=quick)
        if count is None:
            skipped.append(f["id"])
            continue
        rows.append({**f, "half": half[f["id"]], "instructions": count.instructions, "counted_on": count.cpu,
                     "count_seconds": round(count.seconds, 1), "cached": count.cached})
    return rows, skipped


def gpu_rows(data: dict, half: dict[str, str]) -> list[dict]:
    """The GPU figures with their per-node costs and the data-sheet peak of their power mode."""
    import onnx

    rows = []
    for f in data["figures"]:
        if f["core"] != "ampere-gpu":
            continue
        hardware = data["hardware"][f["board"]][f["gpu_mode"]]
        peak = GpuPeak(hardware["tflops"], hardware["memory_gbps"])
        if f["gpu_mode"] == "original":  # the modes the profile models: calibrate the converter's own ceilings
            gpu = next(a for a in load_profile(f["board"]).accelerators if a.kind.value == "gpu")
            assert gpu.memory_gbps is not None and gpu.peak_tflops, f"{f['board']}'s profile lists no GPU ceilings"
            peak = GpuPeak(gpu.peak_tflops, gpu.memory_gbps)
            assert dict(peak.tflops) == hardware["tflops"], f"profile and {DATA.name} disagree on {f['board']}'s GPU"
        model = onnx.load(str(build(f["model"], f["input"], f.get("classes"))))
        costs = node_costs(model, f["precision"])
        rows.append({**f, "half": half[f["id"]], "costs": costs, "peak": peak,
                     "gflops": round(sum(c.flops for c in costs) / 1e9, 3),
                     "roofline_ms": roofline_ms(costs, peak, f["precision"]),
                     "kernels": sum(1 for c in costs if c.kernel)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="use cached instruction counts only")
    args = parser.parse_args()
    data = yaml.safe_load(DATA.read_text())
    half = split(data["figures"])

    cpu, skipped = cpu_rows(data, half, args.quick)
    fit_rows = [r for r in cpu if r["half"] == "fit"]
    # The goals judge the converter's own formula: CPIs fitted with its PARALLEL_EFFICIENCY (what
    # converters/board/emulate.py ships). The thread efficiency the fit half itself supports is fitted too, and the
    # errors with it are reported beside (applying it is the thread-scaling rule's business, not the CPIs').
    efficiency = PARALLEL_EFFICIENCY
    cpis, factors = fit_cpi(fit_rows, efficiency)
    fitted_e = fit_thread_efficiency(fit_rows)
    cpis_fitted_e, factors_fitted_e = fit_cpi(fit_rows, fitted_e if fitted_e is not None else efficiency)
    for r in cpu:
        known = r["core"] in cpis
        r["estimated_ms"] = predict(r, cpis, factors, efficiency) if known else None
        r["error"] = r["estimated_ms"] / r["latency_ms"] - 1 if known else None
        if known and fitted_e is not None:
            r["error_with_fitted_threads"] = predict(r, cpis_fitted_e, factors_fitted_e, fitted_e) / r["latency_ms"] - 1

    gpu = gpu_rows(data, half)
    gpu_efficiency, kernel_us = fit_gpu([r for r in gpu if r["half"] == "fit"])
    for r in gpu:
        r["estimated_ms"] = estimate_ms(r["costs"], r["peak"], r["precision"], gpu_efficiency, kernel_us)
        r["error"] = r["estimated_ms"] / r["latency_ms"] - 1

    rows = cpu + gpu
    for name in skipped:
        f = next(f for f in data["figures"] if f["id"] == name)
        rows.append({**f, "half": half[name], "estimated_ms": None, "error": None, "skipped": "uncounted"})
    log(table(rows))

    validation_cpu = [r for r in cpu if r["half"] == "validation" and r["error"] is not None]
    per_board = summarise(validation_cpu)
    per_core = summarise(validation_cpu, key=lambda r: f"{r['board']}/{r['core']}")
    sources_all = {b: len({f["source"] for f in data["figures"] if f["board"] == b})
                   for b in {f["board"] for f in data["figures"]}}
    gpu_validation = [r for r in gpu if r["half"] == "validation"]
    gpu_summary = summarise(gpu_validation)
    fitted_e_check = summarise([{**r, "error": r["error_with_fitted_threads"]} for r in validation_cpu
                                if "error_with_fitted_threads" in r])

    goals = []
    for board in CPU_BOARDS:
        s = per_board.get(board)
        if s is None:
            goals.append(goal(f"{board}: validation figures counted", ">= 1", 0, False))
            continue
        goals.append(goal(f"{board}: median |estimate/published - 1| (validation)", f"<= {MEDIAN_TARGET}",
                          s["median_abs_error"], s["median_abs_error"] <= MEDIAN_TARGET))
        goals.append(goal(f"{board}: worst |estimate/published - 1| (validation)", f"<= {WORST_TARGET}",
                          s["worst_abs_error"], s["worst_abs_error"] <= WORST_TARGET))
        goals.append(goal(f"{board}: sources (validation half)", f">= {SOURCES_TARGET}", s["sources"],
                          s["sources"] >= SOURCES_TARGET))
    g = gpu_summary.get("jetson-orin-nano", {"median_abs_error": math.inf, "sources": 0})
    goals.append(goal("jetson-orin-nano GPU (TensorRT): median |estimate/published - 1| (validation)",
                      f"<= {GPU_MEDIAN_TARGET}", g["median_abs_error"], g["median_abs_error"] <= GPU_MEDIAN_TARGET))

    public = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k not in ("costs", "peak")}
              for r in rows]
    emit("calibration",
         {"data": str(DATA.relative_to(Path(__file__).resolve().parents[2])), "quick": args.quick,
          "split": "per (board, core, runtime), each source's figures alternately to the halves, smaller half first",
          "a55_counted_on": f"qemu {A55.qemu_cpu} as CPU part {A55.cpu_part} r2p0 (cortex-a55r2)"},
         {"fitted_cpi": {k: round(v, 4) for k, v in sorted(cpis.items())},
          "fitted_runtime_factor": {k: round(v, 4) for k, v in sorted(factors.items())},
          "thread_efficiency": efficiency,
          "converter_cpi": {k: CYCLES_PER_INSTRUCTION.get(k) for k in sorted(cpis)},
          "converter_cpi_is_the_fit": all(abs(CYCLES_PER_INSTRUCTION.get(k, 0) - round(v, 2)) < 1e-9
                                          for k, v in cpis.items()),
          "fitted_thread_efficiency": fitted_e,
          "with_fitted_thread_efficiency": {
              "cpi": {k: round(v, 4) for k, v in sorted(cpis_fitted_e.items())},
              "runtime_factor": {k: round(v, 4) for k, v in sorted(factors_fitted_e.items())},
              "validation_per_board": fitted_e_check},
          "gpu_efficiency": gpu_efficiency, "gpu_per_kernel_us": kernel_us,
          "converter_gpu_is_the_fit": (EFFICIENCY, PER_KERNEL_US) == (gpu_efficiency, kernel_us),
          "validation_per_board": per_board, "validation_per_core": per_core, "validation_gpu": gpu_summary,
          "sources_per_board_all_figures": sources_all, "skipped_uncounted": skipped,
          "figures": public, "table": table(rows).splitlines()},
         goals)


if __name__ == "__main__":
    main()
