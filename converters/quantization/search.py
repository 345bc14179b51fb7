"""Mixed precision: find the fastest mostly-INT8 model within the accuracy bound, by measuring.

Which blocks go back to float is chosen one of two ways; the converter uses the first.

* **Added error** (:mod:`.added_error`, issue 59): from the fully quantized model, what
  floating each block (or residual/attention unit) recovers in the model as it stands,
  greedily per share of MACs and re-measured in context. :func:`search_path` measures its
  steps, starting at the first whose calibration drop is within half the bound.
* **Own sensitivity** (:func:`block_sensitivity`, :func:`search_mixed`, the rule before issue
  59, kept to compare with): a model with *only that block* quantized and everything else
  float runs on calibration samples; blocks are floated in order of metric drop, then noise,
  per multiply-accumulate. On real models that order misranks blocks: errors compound,
  cancel and matter only together.

Both score on calibration samples only: the evaluation data is what the result is judged on.

**Timed search.** Candidates keep the first k steps (or blocks) in float, k growing with
doubling gaps; each is measured (latency, memory, accuracy on the evaluation data) by the
caller. The search stops at the first k within the bound, then bisects back towards fewer
float blocks; or when a candidate is no faster than FP32 (what is left in INT8 cannot pay
for its conversions); or when the candidate budget is spent. Every measured point is kept:
that is the accuracy/latency front in the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.formats.onnx_model import save_onnx
from edgesdk.converters.quantization.added_error import AddedErrorPath
from edgesdk.converters.quantization.model_runs import relative_noise, run_model
from edgesdk.converters.quantization.qdq import Block, QdqGraph

log = logging.getLogger(__name__)

__all__ = ["Sensitivity", "SearchPoint", "SearchResult", "block_sensitivity", "search_mixed",
           "search_path", "run_model", "relative_noise"]


@dataclass(frozen=True)
class Sensitivity:
    """How much one block hurts when it alone is quantized."""

    block: Block
    #: Output noise power / signal power with only this block quantized.
    noise: float
    #: What the user's metric loses with only this block quantized (0 when it cannot be scored).
    drop: float = 0.0

    @property
    def priority(self) -> tuple[float, float]:
        """Harm per multiply-accumulate (metric drop, then noise): the search floats the highest first."""
        macs = max(self.block.macs, 1.0)
        return (max(self.drop, 0.0) / macs, self.noise / macs)


@dataclass(frozen=True)
class SearchPoint:
    """One measured candidate of the search."""

    label: str
    float_blocks: tuple[str, ...]
    accuracy_drop: float
    latency_ms: float
    #: Why these blocks are float (the error that chose each, in the order they went to float).
    why: str = ""


@dataclass(frozen=True)
class SearchResult:
    """The mixed-precision search: every block's sensitivity, the measured front and why it stopped."""

    sensitivities: tuple[Sensitivity, ...]
    front: tuple[SearchPoint, ...]
    stopped_because: str
    seconds: float
    #: Seconds spent measuring sensitivities.
    sensitivity_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The added-error path the candidates were taken from (None: the own-sensitivity rule).
    path: AddedErrorPath | None = None
    #: "added error" or "own sensitivity": which rule ordered the blocks.
    rule: str = "own sensitivity"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``convert --json``: the front and why, the path or the worst blocks."""
        ranked = sorted(self.sensitivities, key=lambda s: (-s.drop, -s.noise))[:10]
        out: dict[str, Any] = {
            "rule": self.rule, "stopped_because": self.stopped_because,
            "seconds": round(self.seconds, 2),
            "sensitivity_seconds": round(self.sensitivity_seconds, 2),
            "front": [{"label": p.label, "float_blocks": len(p.float_blocks),
                       "accuracy_drop": round(p.accuracy_drop, 4),
                       "latency_ms": round(p.latency_ms, 4), "why": p.why} for p in self.front],
            "most_sensitive": [{"block": s.block.name, "metric_drop": round(s.drop, 4),
                                "noise": float(f"{s.noise:.4g}"), "macs": s.block.macs}
                               for s in ranked]}
        if self.path is not None:
            path = self.path
            out["added_error"] = {"steps": [s.to_dict() for s in path.steps],
                                  "start_drop": round(path.start.drop, 4),
                                  "evaluations": path.evaluations,
                                  "seconds": round(path.seconds, 2),
                                  "stopped_because": path.stopped_because}
        return out


#: drop(FP32 outputs, variant outputs) in the user's metric, on samples without labels.
Score = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], float]


def block_sensitivity(graph: QdqGraph, float_model: Path, samples: Mapping[str, np.ndarray],
                      progress: Callable[[int, int], None] | None = None,
                      budget_s: float = 600.0, score: Score | None = None) -> list[Sensitivity]:
    """Each block's own error: only it quantized, the rest float (see the module doc).

    Blocks not reached within ``budget_s`` get infinite noise (they are kept in float
    first: unmeasured is treated as unsafe).
    """
    reference = run_model(float_model, samples)
    started = time.perf_counter()
    results = []
    for i, block in enumerate(graph.blocks):
        if time.perf_counter() - started > budget_s:
            results.append(Sensitivity(block, float("inf"), float("inf")))
            continue
        others = [b for b in graph.blocks if b is not block]
        try:
            outputs = run_model(graph.with_float(others), samples)
        except Exception as exc:  # onnxruntime's own error types: a block that cannot run alone is unsafe
            log.warning("mixed precision: block %s could not be measured alone (%s); it is kept in float first",
                        block.name, str(exc).splitlines()[0])
            results.append(Sensitivity(block, float("inf")))
            continue
        results.append(Sensitivity(block, relative_noise(reference, outputs),
                                   score(reference, outputs) if score is not None else 0.0))
        if progress:
            progress(i + 1, len(graph.blocks))
    return results


#: measure(label, model path, float node names) -> (accuracy drop, latency ms); the caller records it.
Measure = Callable[[str, Path, tuple[str, ...]], tuple[float, float]]


def search_mixed(graph: QdqGraph, sensitivities: Sequence[Sensitivity], out_dir: Path, measure: Measure,
                 bound: float, fp32_latency_ms: float, max_candidates: int = 8) -> SearchResult:
    """Float the blocks of most own error, fewest first, until the bound holds (before issue 59)."""
    started = time.perf_counter()
    order = [s.block for s in sorted(sensitivities, key=lambda s: tuple(-p for p in s.priority))
             if s.noise > 0 or s.drop > 0]
    if not order:
        return SearchResult(tuple(sensitivities), (), "no block adds measurable error",
                            time.perf_counter() - started)
    prefixes = [tuple(order[:k]) for k in range(1, len(order) + 1)]
    why = [f"the {k} block(s) of most own error" for k in range(1, len(order) + 1)]
    front, reason = _timed(graph, prefixes, why, out_dir, measure, bound, fp32_latency_ms,
                           max_candidates, start=1, failing=0)
    return SearchResult(tuple(sensitivities), tuple(front), reason, time.perf_counter() - started,
                        rule="own sensitivity")


def search_path(graph: QdqGraph, path: AddedErrorPath, out_dir: Path, measure: Measure,
                bound: float, fp32_latency_ms: float, max_candidates: int = 8,
                margin: float = 0.5) -> SearchResult:
    """Measure steps of an added-error path (:mod:`.added_error`): the fewest that meet the bound.

    The first candidate is the first step whose calibration drop is within ``margin`` x
    ``bound`` (the evaluation samples are other samples: a step just inside the bound on
    calibration often is not); steps whose calibration drop exceeds the bound are taken as
    failing without being measured. Without a calibration score the search starts at step 1.
    A path that stopped short of ``margin`` x ``bound`` is continued by the blocks it left in
    INT8 (:func:`_beyond`), so the timed search can still reach the bound short of FP32.
    """
    started = time.perf_counter()
    steps = path.steps
    if not steps:
        return SearchResult((), (), f"nothing to float: {path.stopped_because}",
                            time.perf_counter() - started, path=path, rule="added error")
    scored = any(s.drop != 0 for s in steps) or path.start.drop != 0
    start, failing = 1, 0
    if scored:
        start = next((k for k, s in enumerate(steps, 1) if s.drop <= margin * bound), len(steps))
        failing = max((k for k, s in enumerate(steps[:start - 1], 1) if s.drop > bound), default=0)
    why = ["; ".join(s.why() for s in steps[:k]) for k in range(1, len(steps) + 1)]
    prefixes = list(path.prefixes)
    if steps[-1].drop > margin * bound:  # the path stopped short: go on towards FP32 (below)
        for k, block in enumerate(_beyond(graph, path), 1):
            prefixes.append((*prefixes[-1], block))
            why.append(f"{why[len(steps) - 1]}; then {k} more block(s) by recovery alone per MAC")
    front, reason = _timed(graph, prefixes, why, out_dir, measure, bound, fp32_latency_ms,
                           max_candidates, start, failing)
    return SearchResult((), tuple(front), reason, time.perf_counter() - started, path=path,
                        rule="added error")


def _beyond(graph: QdqGraph, path: AddedErrorPath) -> list[Block]:
    """The blocks the path left in INT8, by what each recovered alone in the INT8 model, per MAC.

    A path cut short (time budget, or no single block moving the metric) would otherwise end
    the timed search at its last step, short of the bound that more float blocks may meet.
    """
    floated = set(path.prefixes[-1])
    alone = {name: (drop, noise) for name, drop, noise in path.first_round}
    left = [b for b in graph.blocks if b not in floated]
    mean = sum(b.macs for b in graph.blocks) / max(len(graph.blocks), 1)

    def priority(block: Block) -> tuple[float, float]:
        drop, noise = alone.get(block.name, (float("inf"), float("inf")))  # unmeasured: unsafe
        cost = block.macs + 0.25 * mean
        return drop / cost, noise / cost

    return sorted(left, key=priority, reverse=True)


def _timed(graph: QdqGraph, prefixes: Sequence[tuple[Block, ...]], why: Sequence[str],
           out_dir: Path, measure: Measure, bound: float, fp32_latency_ms: float,
           max_candidates: int, start: int, failing: int) -> tuple[list[SearchPoint], str]:
    """Measure prefix ``start``, then later ones (gaps doubling) until one meets the bound; bisect.

    Prefix k is ``prefixes[k - 1]``; ``failing`` is a prefix known (or taken) to miss the bound.
    """
    front: list[SearchPoint] = []

    def evaluate(k: int) -> SearchPoint:
        chosen = prefixes[k - 1]
        label = f"onnx-mixed-{len(chosen)}"
        path = save_onnx(graph.with_float(chosen), out_dir / f"{label}.onnx")
        drop, latency = measure(label, path, tuple(graph.node_names(chosen)))
        point = SearchPoint(label, tuple(b.name for b in chosen), drop, latency, why[k - 1])
        front.append(point)
        return point

    n = len(prefixes)
    k, gap, passing = start, 1, None
    reason = f"every step of the path ({n}) measured"
    while len(front) < max_candidates:
        point = evaluate(k)
        if point.latency_ms >= fp32_latency_ms:
            reason = (f"{len(point.float_blocks)} block(s) in float: {point.latency_ms:.3f} ms >= "
                      f"FP32 {fp32_latency_ms:.3f} ms; the INT8 part left cannot beat FP32")
            break
        if point.accuracy_drop <= bound:
            passing = k
            reason = f"{len(point.float_blocks)} block(s) in float meet the bound"
            break
        failing = k
        if k == n:
            reason = (f"with all {len(point.float_blocks)} blocks of the last candidate in float "
                      f"the drop is {point.accuracy_drop:.3g}")
            break
        k, gap = min(k + gap, n), 2 * gap
    else:
        reason = f"candidate budget ({max_candidates}) spent"
    # Bisect towards fewer float blocks (faster) while the bound still holds.
    while passing is not None and passing - failing > 1 and len(front) < max_candidates:
        mid = (passing + failing) // 2
        point = evaluate(mid)
        if point.accuracy_drop <= bound and point.latency_ms < fp32_latency_ms:
            passing = mid
            reason = f"{len(point.float_blocks)} block(s) in float meet the bound (bisected)"
        else:
            failing = mid
    return front, reason
