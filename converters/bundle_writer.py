"""The chosen variant written as a signed bundle: its manifest's measured figures and its health check.

Split from :mod:`.pipeline`: what a conversion records about its choice (host and board figures with
their basis and band, accuracy with its basis, the power plan) and the runtime mode and health check
that put the variant at its planned point on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.board.board_latency import latency_band, target_point
from edgesdk.converters.planning.data import EvaluationSplit
from edgesdk.converters.planning.metrics import Metric
from edgesdk.converters.planning.planner import PlanResult
from edgesdk.converters.quiet import held_output
from edgesdk.converters.request import ConversionRequest
from edgesdk.errors import ConversionError
from edgesdk.runtime.bundle import Bundle, BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.profiles import DeviceProfile, RuntimeMode

__all__ = ["write_chosen_bundle", "health_tolerance"]

#: progress(stage, done, total), as :data:`edgesdk.converters.pipeline.Progress`.
Notify = Callable[[str, int, int], None]


def write_chosen_bundle(plan: PlanResult, out: Path, evaluation: Mapping[str, np.ndarray], source_sha: str, scorer: Metric,
            request: ConversionRequest, notify: Notify, split: EvaluationSplit,
            fp32_score: float | None = None) -> Bundle:
    """Write the chosen variant as a bundle, with its own output on one evaluation sample as the health check."""
    notify("writing the bundle", 0, 1)
    chosen, m = plan.chosen, plan.chosen.measurement
    measured = {
        "host": {"latency_p50_ms": m.latency_p50_ms, "latency_p95_ms": m.latency_p95_ms, "load_ms": m.load_ms,
                 "peak_memory_mb": m.model_memory_mb, "threads": m.threads, "backend": m.backend},
        # basis_label and band: where the latency comes from and how far the held-out calibration
        # says it may be off (band None: unvalidated), as in the convert table.
        "board": {"latency_ms": chosen.estimate.latency_ms, "energy_mj": chosen.estimate.energy_mj,
                  "basis": chosen.estimate.basis, "runs_on": chosen.runs_on,
                  **_band(request.target.board.name, chosen.estimate.basis)},
        # Where it is planned to run and its power there (the target point, or the one a power budget chose).
        "power": {**(chosen.power.to_dict() if chosen.power else {}), "budget": plan.budget.to_dict()},
        "size_bytes": m.size_bytes,
        # The headline drop_vs_fp32 is the held-out drop (on samples nothing was chosen on), when there are held-out
        # samples: the selection drop, which every choice saw, flatters the winner. Both are kept.
        "accuracy": {"metric": scorer.name, "unit": scorer.unit, "basis": chosen.accuracy_basis,
                     "drop_vs_fp32": chosen.judged_holdout_drop if chosen.judged_holdout_drop is not None
                     else chosen.judged_drop,
                     "selection_drop": chosen.accuracy_drop, "holdout_drop": chosen.holdout_drop,
                     "board_drop": chosen.board_drop, "board_holdout_drop": chosen.board_holdout_drop,
                     "host_board_difference": chosen.host_board_difference,
                     "fp32_score": fp32_score, **split.to_dict()},
        "chosen_because": plan.reason,
    }
    tolerance = health_tolerance(chosen.precision, chosen.host_board_difference)
    target, output = request.target, request.output
    runtime_mode, threads = _runtime_mode(plan, target.board, target.mode)
    planned_ms = chosen.power.latency_ms if chosen.power else chosen.estimate.latency_ms
    latency_gate = max(50.0, planned_ms * 5)
    spec = BundleSpec(
        output.name, output.version, chosen.name, target.board.name, runtime_mode, source_model_sha256=source_sha,
        health_check=HealthCheck(atol=tolerance, rtol=tolerance, max_latency_ms=round(latency_gate, 2)),
        quantization=dict(chosen.config) if chosen.config else None, preprocessing=output.preprocessing,
        measured=measured, threads=threads, accelerator=chosen.accelerator or "cpu",
        provider=chosen.provider)
    with held_output("computing the health check"):
        return bundle_from_model(out / "bundle", chosen.path, spec, {k: v[:1] for k, v in evaluation.items()},
                                 profile=target.board, private_key=output.private_key)


def health_tolerance(precision: str, host_board_difference: float | None = None) -> float:
    """The health check's tolerance (absolute and relative): what this host's kernels and the board's may differ by.

    The expected output is computed on this host. Where the board's own outputs were measured (emulated),
    their largest difference from this host's is known, and the tolerance covers it with half again as
    margin: an INT8 variant the board rounds differently, judged accurate on the board's outputs, must
    not fail its own install health check on the device for that rounding.
    """
    base = 1e-2 if precision in ("fp32", "fp16", "as-given") else 5e-2
    if host_board_difference is None:
        return base
    return max(base, round(1.5 * host_board_difference, 6))


def _band(board: str, basis: str) -> dict[str, Any]:
    band = latency_band(board, basis)
    return {"basis_label": band.label, "band": band.relative}


def _runtime_mode(plan: PlanResult, board: DeviceProfile, mode: str) -> tuple[str, int | None]:
    """The runtime mode and thread count that put the chosen variant at its planned point on the device.

    The asked mode and its own threads when the plan kept its point; otherwise the runtime mode
    the chosen power mode serves, with the planned threads (the bundle records both).
    """
    point = plan.chosen.power.point if plan.chosen.power else None
    if point is None or point == target_point(board, mode, accelerator=point.accelerator):
        return mode, None
    power_mode = next(m for m in board.power_modes if m.name == point.power_mode)
    wanted = RuntimeMode(mode)
    reachable = [s for s in power_mode.serves if board.power_mode_for(s) is power_mode]
    served = wanted if wanted in reachable else (reachable[0] if reachable else None)
    if served is None:
        raise ConversionError(f"power mode {power_mode.name!r} of {board.name} serves no runtime mode of its own "
                              f"(it serves {[s.value for s in power_mode.serves]}, each served first by another mode); "
                              "give it a runtime mode in the profile")
    return served.value, None if point.accelerator else point.threads  # a GPU plan keeps the mode's CPU threads
