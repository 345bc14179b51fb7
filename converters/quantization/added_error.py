"""Which blocks go back to float: the error each one *adds* to the model as it stands, measured.

A block's own error (:func:`.search.block_sensitivity`: only it quantized, the rest float)
misranks blocks on real models. Errors compound through the quantized layers after them,
cancel or mask each other, and a unit's blocks can matter only together: on the OCR
recognizer of issue 59, its 16 worst blocks by own error kept in float still lost 3.9 points.
So this search measures each block in context, on calibration samples (never evaluation data):

1. **Options**: every block, and every residual or attention unit (:func:`.qdq.units`) as one
   option, for errors that matter only together (each block alone recovers little).
2. **Leave-one-out from the all-INT8 model**: each option put back in float in the fully
   quantized model; what that recovers (the user's metric, then output noise relative to
   FP32's) is the error it adds there.
3. **Greedy by recovery per cost**: the option that recovers the most metric drop per share
   of the model's multiply-accumulates it puts back in float (plus :data:`BLOCK_OVERHEAD` of
   the mean block per block, for its conversions) goes to float; noise per cost settles ties
   and leads when no option moves the metric. Its measurement is the new model's.
4. **Re-measured in the new context, lazily**: gains measured in an earlier model are stale.
   Before each step the options are taken best stale gain first; a stale one is measured
   again in the current model (at most ``recheck`` per step) until the best fresh gain beats
   every stale one left. When no fresh option recovers anything, every option is measured
   again (a block masked by others shows its error only once they are float), and then each
   pair of adjacent blocks (an outlier made by one block and read by the next needs both).
5. **Stops** when the calibration drop is at most ``stop_drop``, nothing left recovers any
   error, every block is float, or ``budget_s`` is spent.

The steps are nested: step k's model keeps the options of steps 1..k in float. The timed
search (:func:`.search.search_path`) measures some of them on the evaluation samples.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.quantization.model_runs import relative_noise, run_model
from edgesdk.converters.quantization.qdq import Block, QdqGraph, units

log = logging.getLogger(__name__)

__all__ = ["Step", "AddedErrorPath", "added_error_path", "BLOCK_OVERHEAD", "BUDGET_S"]

#: A block's cost floor, as a fraction of the mean block's MACs: a block with no MACs of its own
#: (an activation, the graph outputs' Q/DQ pairs) still adds conversions and float ops when floated.
BLOCK_OVERHEAD = 0.25

#: Seconds the greedy may spend running models on the calibration samples.
BUDGET_S = 900.0

#: drop(FP32 outputs, variant outputs) in the user's metric, on samples without labels.
Score = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], float]


@dataclass(frozen=True)
class Level:
    """A model's error on the calibration samples: the metric's drop and the output noise."""

    drop: float
    noise: float


@dataclass(frozen=True)
class Step:
    """One greedy step: what went back to float and the error that chose it."""

    option: str
    blocks: tuple[str, ...]
    #: Metric drop and output noise recovered by this option in the model of that moment.
    recovered_drop: float
    recovered_noise: float
    #: Share of the model's MACs this step put back in float.
    macs_share: float
    #: The calibration drop and noise once this step's blocks are float.
    drop: float
    noise: float

    def why(self) -> str:
        """One line for the report."""
        return (f"{self.option}: recovered {self.recovered_drop:.3g} metric drop and "
                f"{self.recovered_noise:.3g} noise for {self.macs_share:.1%} of the MACs "
                f"(calibration drop then {self.drop:.3g})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"option": self.option, "blocks": list(self.blocks),
                "recovered_drop": round(self.recovered_drop, 4),
                "recovered_noise": float(f"{self.recovered_noise:.4g}"),
                "macs_share": round(self.macs_share, 4), "drop": round(self.drop, 4),
                "noise": float(f"{self.noise:.4g}")}


@dataclass(frozen=True)
class AddedErrorPath:
    """The greedy's nested steps from the all-INT8 model, and what it cost."""

    start: Level
    steps: tuple[Step, ...]
    #: Each step's float blocks (step k: the blocks of steps 1..k).
    prefixes: tuple[tuple[Block, ...], ...]
    #: Model runs on the calibration samples.
    evaluations: int
    seconds: float
    stopped_because: str
    #: (option, metric drop, noise) each option recovers alone from the all-INT8 model.
    first_round: tuple[tuple[str, float, float], ...] = ()


@dataclass(frozen=True)
class _Option:
    name: str
    blocks: tuple[Block, ...]


class _Measured:
    """Runs partly-float models on the calibration samples and keeps count."""

    def __init__(self, graph: QdqGraph, float_model: Path | Any, samples: Mapping[str, np.ndarray],
                 score: Score | None) -> None:

        self.graph, self.samples, self.score, self.runs = graph, samples, score, 0
        self._run, self._noise = run_model, relative_noise
        self.reference = run_model(float_model, samples)

    def __call__(self, blocks: Sequence[Block]) -> Level:
        self.runs += 1
        outputs = self._run(self.graph.with_float(blocks), self.samples)
        drop = self.score(self.reference, outputs) if self.score is not None else 0.0
        return Level(float(drop), self._noise(self.reference, outputs))


def _options(graph: QdqGraph, max_unit_blocks: int) -> list[_Option]:
    singles = [_Option(b.name, (b,)) for b in graph.blocks]
    grouped = [_Option(f"unit {u[0].name} .. {u[-1].name} ({len(u)} blocks)", u)
               for u in units(graph, max_unit_blocks)]
    return singles + grouped


def added_error_path(graph: QdqGraph, float_model: Path | Any, samples: Mapping[str, np.ndarray],
                     score: Score | None, stop_drop: float, budget_s: float = BUDGET_S,
                     recheck: int = 3, max_unit_blocks: int = 12, stop_noise: float = 0.05,
                     progress: Callable[[int, int], None] | None = None) -> AddedErrorPath:
    """Float the option recovering the most error per cost, re-measured in context (module doc).

    Without ``score`` (a metric needing labels the calibration samples lack), the output
    noise alone guides it and it stops at ``stop_noise`` x the all-INT8 model's noise.
    """
    greedy = _Greedy(graph, _Measured(graph, float_model, samples, score), budget_s)
    options = _options(graph, max_unit_blocks)
    for i, option in enumerate(options):
        if greedy.out_of_time():
            break
        greedy.measure(option)
        if progress:
            progress(i + 1, len(options))
    start = greedy.now
    first = tuple((o.name, *greedy.gain(o)) for o in options if o.name in greedy.gains)
    # Out of time in the first round: one step from what was measured, rather than nothing.
    measured = len(greedy.gains)
    partial = "" if measured == len(options) else f" ({measured} of {len(options)} options)"
    reason = "" if measured else f"time budget ({budget_s:.0f} s) spent before any option"
    while not reason:
        now = greedy.now
        if (now.drop <= stop_drop if score is not None else now.noise <= stop_noise * start.noise):
            reason = (f"calibration drop {now.drop:.3g} <= {stop_drop:.3g}" if score is not None
                      else f"output noise {now.noise:.3g} <= {stop_noise:g} x INT8's "
                           f"{start.noise:.3g}")
            break
        open_options = [o for o in options if o.name in greedy.gains and greedy.new_blocks(o)]
        if not open_options:
            reason = "every block is in float"
            break
        best = _pick(open_options, greedy, recheck) or greedy.unstuck(open_options, options)
        if best is None:
            reason = ("no block left in INT8 recovers any error in the current model, alone "
                      "or with its neighbour")
            break
        greedy.take(best)
        if greedy.out_of_time():
            reason = (f"time budget ({budget_s:.0f} s) spent after {len(greedy.steps)} "
                      f"steps{partial}")
    return AddedErrorPath(start, tuple(greedy.steps), tuple(greedy.prefixes), greedy.measured.runs,
                          time.perf_counter() - greedy.started, reason, first)


class _Greedy:
    """The current model (which blocks are float) and what each option was measured to recover."""

    def __init__(self, graph: QdqGraph, measured: _Measured, budget_s: float) -> None:
        self.started, self.budget_s = time.perf_counter(), budget_s
        self.graph, self.measured = graph, measured
        self.total = sum(b.macs for b in graph.blocks) or 1.0
        self.floor = BLOCK_OVERHEAD * self.total / max(len(graph.blocks), 1)
        self.floated: list[Block] = []
        self.now = measured([])
        #: option -> (model before, model after floating it, step it was measured at)
        self.gains: dict[str, tuple[Level, Level, int]] = {}
        self.steps: list[Step] = []
        self.prefixes: list[tuple[Block, ...]] = []

    def out_of_time(self) -> bool:
        return time.perf_counter() - self.started > self.budget_s

    def new_blocks(self, option: _Option) -> list[Block]:
        return [b for b in option.blocks if b not in self.floated]

    def measure(self, option: _Option) -> None:
        after = self.measured([*self.floated, *self.new_blocks(option)])
        self.gains[option.name] = (self.now, after, len(self.steps))

    def stale(self, option: _Option) -> bool:
        return self.gains[option.name][2] < len(self.steps)

    def gain(self, option: _Option) -> tuple[float, float]:
        """Metric drop and noise recovered, as measured (a stale one: in the model of its time)."""
        before, after, _ = self.gains[option.name]
        return before.drop - after.drop, before.noise - after.noise

    def key(self, option: _Option) -> tuple[float, float]:
        """Recovery per cost: metric first, noise second."""
        cost = sum(b.macs + self.floor for b in self.new_blocks(option)) / self.total
        drop, noise = self.gain(option)
        return drop / cost, noise / cost

    def unstuck(self, open_options: Sequence[_Option], options: list[_Option]) -> _Option | None:
        """Nothing fresh recovers error: every option again in this model, then adjacent pairs."""
        for option in open_options:  # masked errors show once what masked them is float
            if self.stale(option) and not self.out_of_time():
                self.measure(option)
        blocks = [b for b in self.graph.blocks if b not in self.floated]
        known = {o.blocks for o in options}
        # Errors that matter only together: an outlier made by one block and read by the next.
        for a, b in zip(blocks, blocks[1:]):
            if (a, b) not in known and not self.out_of_time():
                options.append(_Option(f"{a.name} + {b.name}", (a, b)))
                self.measure(options[-1])
        fresh = [o for o in options
                 if o.name in self.gains and self.new_blocks(o) and not self.stale(o)]
        best = max(fresh, key=self.key, default=None)
        return best if best is not None and max(self.key(best)) > 0 else None

    def take(self, option: _Option) -> None:
        level = self.gains[option.name][1]
        added = self.new_blocks(option)
        self.steps.append(Step(option.name, tuple(b.name for b in added),
                               self.now.drop - level.drop, self.now.noise - level.noise,
                               sum(b.macs for b in added) / self.total, level.drop, level.noise))
        self.floated.extend(added)
        self.prefixes.append(tuple(self.floated))
        self.now = level
        log.info("mixed precision, step %d: %s", len(self.steps), self.steps[-1].why())


def _pick(options: Sequence[_Option], greedy: _Greedy, recheck: int) -> _Option | None:
    """Lazy greedy: best stale key first, re-measured until a fresh key beats every stale one left.

    None when the best fresh option recovers nothing.
    """
    best: _Option | None = None
    rechecked = 0
    for option in sorted(options, key=greedy.key, reverse=True):
        if best is not None and greedy.key(best) >= greedy.key(option):
            break
        if greedy.stale(option):
            if rechecked >= recheck or greedy.out_of_time():
                break
            greedy.measure(option)
            rechecked += 1
        if best is None or greedy.key(option) > greedy.key(best):
            best = option
    return best if best is not None and max(greedy.key(best)) > 0 else None
