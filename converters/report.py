"""What a conversion reports: every variant with its figures and verdict, the chosen one, and the bundle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgesdk.converters.board.board_latency import latency_band
from edgesdk.converters.board.emulate import InstructionCount
from edgesdk.converters.planning.data import EvaluationSplit
from edgesdk.converters.planning.planner import PlanResult
from edgesdk.converters.quantization.calibrate import CalibrationResult
from edgesdk.converters.quantization.search import SearchResult
from edgesdk.runtime.bundle import Bundle

__all__ = ["ConversionReport"]


@dataclass(frozen=True)
class ConversionReport:
    """Every variant with its figures and verdict, the chosen one, and the bundle."""

    profile: str
    mode: str
    metric: str
    metric_unit: str
    max_accuracy_drop: float
    plan: PlanResult
    bundle: Bundle
    #: Why TFLite variants are missing, if they were asked for and could not be made.
    tflite_error: str | None
    tflite_parity_max_abs_diff: float | None
    calibration: CalibrationResult | None = None
    #: The mixed-precision search, when static INT8 missed the bound.
    search: SearchResult | None = None
    #: Which evaluation samples chose the variant and which checked it.
    holdout: EvaluationSplit | None = None
    #: Where board latencies come from: emulated cores (which, with which libraries), or why they are scaled.
    board_estimates: str = ""
    #: FP32's own score against the labels (the baseline of every drop); None without labels.
    reference_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what ``edgesdk convert --json`` prints (one row per variant).

        ``accuracy_drop`` is on the selection samples, ``holdout_drop`` on the held-out ones
        (None when none were held out); ``holdout`` has the split's sizes and settings.
        ``accuracy_basis`` says whose outputs judge a variant: ``this host`` or ``board (emulated cortex-a76, 64
        samples)``, with ``board_drop``/``board_holdout_drop`` (vs FP32 on the same board) and
        ``host_board_difference`` (largest difference of its board outputs from this host's; None when not run).
        ``board_latency_ms``/``energy_mj`` are at the asked mode's point; ``board_basis``
        labels where the latency comes from (``measured``, ``emulated``, ``scaled``,
        ``roofline``) and ``board_band`` is the relative band the calibration's held-out half
        supports for it on this board (0.3: +/-30%; None: unvalidated, ``board_band_text`` says
        so); ``power`` has each
        variant's planned point (power mode, threads, accelerator), its energy per inference and average
        power with their bases; ``runs_on`` is ``cpu`` or the accelerator and engine (``ampere-gpu TensorRT
        fp16``); ``planned`` is where the bundle runs it.
        """
        rows = []
        for c in self.plan.candidates:
            m = c.measurement
            rows.append({
                "name": c.name, "format": c.format, "precision": c.precision, "chosen": c.chosen, "runs_on": c.runs_on,
                "size_bytes": m.size_bytes, "peak_memory_mb": round(m.model_memory_mb, 2),
                "latency_p50_ms": round(m.latency_p50_ms, 4), "latency_p95_ms": round(m.latency_p95_ms, 4),
                "measured_on": m.measured_on,
                "accuracy_drop": round(c.accuracy_drop, 4),
                "holdout_drop": None if c.holdout_drop is None else round(c.holdout_drop, 4),
                # Accuracy judged on the board's own outputs when it ran there (issue 59): its drops vs FP32 on that
                # board, and how far its board outputs are from this host's (reported, not a veto).
                "accuracy_basis": c.accuracy_basis, "board_drop": _rounded(c.board_drop),
                "board_holdout_drop": _rounded(c.board_holdout_drop),
                "host_board_difference": _rounded(c.host_board_difference, 6),
                "board_latency_ms": round(c.estimate.latency_ms, 4), "energy_mj": round(c.estimate.energy_mj, 4),
                "estimate_basis": c.estimate.basis, "emulated": [_count_row(n) for n in c.estimate.counts],
                # That basis's label and the band the held-out calibration supports for it on this
                # board (None: unvalidated): how far the figure may be from the board's own.
                **_band_fields(self.profile, c.estimate.basis),
                # Where the planner would run it (the target point, or under a power budget the best that fits).
                "power": None if c.power is None else c.power.to_dict(),
                "rejected": list(c.rejected), "notes": list(c.notes),
                "sha256": m.sha256, "file": str(c.path),
            })
        return {"profile": self.profile, "mode": self.mode, "metric": self.metric, "metric_unit": self.metric_unit,
                "max_accuracy_drop": self.max_accuracy_drop, "chosen": self.plan.chosen.name,
                "reason": self.plan.reason, "bundle": str(self.bundle.path), "variants": rows,
                "budget": self.plan.budget.to_dict(), "objective": self.plan.budget.objective,
                "reference_score": None if self.reference_score is None else round(self.reference_score, 4),
                "planned": {"power_mode": self.plan.point.power_mode, "threads": self.plan.point.threads,
                            "runs_on": self.plan.chosen.runs_on, "runtime_mode": self.bundle.manifest.power_mode},
                "tflite_error": self.tflite_error, "tflite_parity_max_abs_diff": self.tflite_parity_max_abs_diff,
                "calibration": None if self.calibration is None else {
                    "samples": self.calibration.samples, "tensors": self.calibration.tensors,
                    "batch_size": self.calibration.batch_size, "seconds": round(self.calibration.seconds, 2)},
                "search": None if self.search is None else self.search.to_dict(),
                "holdout": None if self.holdout is None else self.holdout.to_dict(),
                "board_estimates": self.board_estimates}


def _band_fields(profile: str, basis: str) -> dict[str, Any]:
    band = latency_band(profile, basis)
    return {"board_basis": band.label, "board_band": band.relative, "board_band_text": band.text}


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _count_row(count: InstructionCount) -> dict[str, Any]:
    """One emulated core's figures for a report row: instructions, and what ORT fused on that ISA."""
    row: dict[str, Any] = {"cpu": count.cpu, "instructions": round(count.instructions),
                           "simd_share": round(count.simd / count.instructions, 4), "cached": count.cached}
    if count.fusion is not None:
        row.update({k: v for k, v in count.fusion.to_dict().items() if k != "op_types"})
    return row
