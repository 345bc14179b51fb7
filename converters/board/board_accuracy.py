"""Accuracy judged on the board's outputs: a variant's drop vs FP32, both run on the board.

INT8 kernels round differently on Arm and x86, so a variant's output on the board differing from
this host's says nothing about which machine answers worse. The converter used to veto a variant
whose board output on one sample differed from this host's by more than a tolerance; it now measures
how well the variant answers on the board.

**What runs.** With emulation active
(:class:`~edgesdk.converters.board.conversion_costs.ConversionCosts`), FP32 and the variants that
could be chosen run on the emulated core the counts used
(:func:`~edgesdk.converters.board.board_outputs.board_outputs`), on the same rows of the evaluation
samples:

* **Rows.** At most ``max_samples`` (64): the held-out rows get their share of them, as in the
  evaluation split (``round(max_samples * held-out / all)``, at least one when any are held out and
  ``max_samples`` > 1), the selection rows the rest; in each part evenly spaced rows, in order. So a
  board drop exists on both parts, and the planner's held-out check reads the board's. Without a
  split, every row comes from the selection.
* **Variants.** Lazily, in the planner's order: the pipeline plans, and when the variant it would
  ship has not run on the board, that variant runs there and the planner plans again with its board
  drops; so every variant that is chosen was judged on the board, and variants that could never be
  chosen (slower than one that passed, over the bound on this host) cost no emulation. A variant
  runs when it is emulated, not refused by the board's runtime already, and on the CPU; at most
  ``max_variants`` (6) besides FP32, after which the rest keep this host's accuracy. The variants
  that never ran keep this host's accuracy, and a note says why. Accelerator engines (a Jetson's
  TensorRT) keep their CPU file's host accuracy: the emulated core does not run their kernels.

**The drop.** ``board_drop = metric(FP32 on the board, variant on the board, labels)`` on the
selection rows, ``board_holdout_drop`` the same on the held-out rows (FP32's own are 0). The planner
judges on them (:attr:`~edgesdk.converters.planning.planner.Candidate.judged_drop`);
``accuracy_basis`` names the board, its core and the row count. ``host_board_difference``, the
largest absolute difference of a variant's board outputs from this host's on the same rows, is
reported, never a veto.

**Vetoes.** A variant whose board run crashes, hangs or answers NaN or infinity is rejected with
the board's reason. When FP32 itself fails on the board there is no board reference: FP32 is
rejected and every variant keeps this host's accuracy, with a note. An emulator that stops working
(not a variant's failure) leaves every variant on this host's accuracy.

Without emulation every variant keeps this host's accuracy, except those a fleet device measured
(``convert(measure_on=...)``): their outputs are that device's, and their basis says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgesdk.converters.board.board_outputs import MAX_SAMPLES, board_outputs
from edgesdk.converters.board.conversion_costs import ConversionCosts
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.planning.data import EvaluationSplit
from edgesdk.converters.planning.metrics import Metric
from edgesdk.converters.planning.planner import Candidate
from edgesdk.errors import BoardRuntimeError, EmulatorError

__all__ = ["BoardEvaluation", "BoardJudge", "board_rows", "MAX_VARIANTS"]

log = logging.getLogger(__name__)

#: At most this many variants (besides FP32) run on the board (module doc, "Variants").
MAX_VARIANTS = 6


@dataclass(frozen=True)
class BoardEvaluation:
    """What a board drop is computed from: the metric, the evaluation samples, labels and split."""

    scorer: Metric
    evaluation: Mapping[str, np.ndarray]
    labels: np.ndarray | None
    split: EvaluationSplit
    bound: float
    max_samples: int = MAX_SAMPLES
    max_variants: int = MAX_VARIANTS


def board_rows(split: EvaluationSplit, max_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The selection rows and the held-out rows run on the board (module doc, "Rows")."""
    total = len(split.selection) + len(split.holdout)
    held = 0
    if split.is_split:
        held = min(
            len(split.holdout),
            max(1, round(max_samples * len(split.holdout) / total)),
            max_samples - 1,
        )
    chosen = min(len(split.selection), max_samples - held)
    return _spaced(split.selection, chosen), _spaced(split.holdout, held)


def _spaced(rows: np.ndarray, count: int) -> np.ndarray:
    if count <= 0:
        return rows[:0]
    return rows[np.unique(np.linspace(0, len(rows) - 1, count).round().astype(np.int64))]


class BoardJudge:
    """FP32 on the board once (:meth:`start`), then each variant the planner would ship
    (:meth:`judge`).

    Without emulation (or with no FP32 to compare with) it is inactive: :meth:`start` returns the
    candidates unchanged, but for variants a fleet device measured (``measure_on``), whose basis
    names that device, and :meth:`wants` is False.
    """

    def __init__(
        self,
        costs: ConversionCosts,
        data: BoardEvaluation,
        notify: Callable[[str, int, int], None],
    ) -> None:
        self.costs, self.data, self.notify = costs, data, notify
        self.judged: list[str] = []
        self._board: _Board | None = None
        self._score: _Scorer | None = None

    def start(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """``candidates`` with FP32 judged on the board (the reference of every board drop)."""
        fp32 = next((c for c in candidates if c.name == "onnx-fp32"), None)
        cost = self.costs.costs.get("onnx-fp32")
        if self.costs.emulator is None or fp32 is None or cost is None:
            return [_measured_on(c) for c in candidates]
        board = _Board(
            self.costs.emulator, cost.counts[0].cpu, self.costs.board.name, self.data, self.notify
        )
        try:
            reference = board.run(fp32)
        except BoardRuntimeError as exc:
            note = (
                f"accuracy from this host: FP32 fails on {board.name}'s runtime "
                "(no board reference)"
            )
            return [
                replace(c, rejected=(*c.rejected, f"fails on {board.name}'s own runtime: {exc}"))
                if c is fp32
                else replace(c, notes=(*c.notes, note))
                for c in candidates
            ]
        except EmulatorError as exc:
            log.warning(
                "accuracy judged on this host's outputs: the board emulator failed (%s)", exc
            )
            return list(candidates)
        self._board = board
        self._score = _Scorer(self.data, reference, len(board.selection), board.rows)
        return [
            self._score.judged(c, reference, board.basis) if c is fp32 else c for c in candidates
        ]

    def wants(self, c: Candidate) -> bool:
        """True when ``c`` should run on the board before it is shipped (module doc, "Variants")."""
        return (
            self._board is not None
            and self._is_runnable(c)
            and c.name not in self.judged
            and len(self.judged) < self.data.max_variants
        )

    def _is_runnable(self, c: Candidate) -> bool:
        return (
            c.name != "onnx-fp32"
            and c.accelerator is None
            and c.name in self.costs.costs
            and c.name not in self.costs.failures
        )

    def judge(self, c: Candidate) -> Candidate:
        """``c`` with its board drops, or rejected with the board's reason."""
        assert self._board is not None and self._score is not None, (
            "start() found no board reference"
        )
        self.judged.append(c.name)
        return self._board.judge(c, self._score)

    def noted(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """``candidates``, each variant that could have run on the board but did not with a note
        why."""
        if self._board is None:
            return list(candidates)
        capped = len(self.judged) >= self.data.max_variants
        why = (
            f"the cap of {self.data.max_variants} board runs was reached"
            if capped
            else "the planner chose another variant before it"
        )
        note = f"accuracy from this host: not run on the board ({why})"
        return [
            replace(c, notes=(*c.notes, note))
            if self._is_runnable(c) and c.name not in self.judged and not c.rejected
            else c
            for c in candidates
        ]


def _measured_on(c: Candidate) -> Candidate:
    where = c.measurement.measured_on
    return c if where == "this host" else replace(c, accuracy_basis=f"measured on {where}")


class _Board:
    """The rows run on the board, and one variant's run there."""

    def __init__(
        self,
        emulator: Emulator,
        cpu: str,
        name: str,
        data: BoardEvaluation,
        notify: Callable[[str, int, int], None],
    ) -> None:
        self.emulator, self.cpu, self.name, self.notify = emulator, cpu, name, notify
        self.selection, holdout = board_rows(data.split, data.max_samples)
        self.rows = np.concatenate([self.selection, holdout])
        self.inputs = {k: v[self.rows] for k, v in data.evaluation.items()}
        self.basis = f"board (emulated {cpu}, {len(self.rows)} samples)"

    def run(self, c: Candidate) -> np.ndarray:
        """``c``'s first output on the rows, by the board's runtime (progress per sample)."""

        def progress(done: int, total: int) -> None:
            self.notify(f"accuracy on the board: {c.name} {done}/{total} samples", done, total)

        return board_outputs(
            self.emulator,
            c.path,
            self.inputs,
            self.cpu,
            max_samples=len(self.rows),
            progress=progress,
        ).outputs

    def judge(self, c: Candidate, score: _Scorer) -> Candidate:
        """``c`` with its board drops, or rejected with the board's reason."""
        try:
            outputs = self.run(c)
        except BoardRuntimeError as exc:
            reason = f"fails on {self.name}'s own runtime: {exc}"
            return replace(c, rejected=(*c.rejected, reason), accuracy_basis=self.basis)
        except EmulatorError as exc:
            log.warning(
                "%s: accuracy judged on this host's outputs, the board emulator failed (%s)",
                c.name,
                exc,
            )
            return c
        return score.judged(c, outputs, self.basis)


class _Scorer:
    """Drops vs FP32 on the board on the selection and held-out rows; the host-board difference."""

    def __init__(
        self, data: BoardEvaluation, reference: np.ndarray, selected: int, rows: np.ndarray
    ) -> None:
        self.data, self.reference, self.rows = data, reference, rows
        per_sample = len(reference) == len(rows)
        self.parts = (
            [np.arange(selected), np.arange(selected, len(rows))]
            if per_sample
            else [np.arange(len(reference)), np.arange(0)]
        )
        self.labels = None if data.labels is None or not per_sample else data.labels[rows]

    def _drop(self, outputs: np.ndarray, part: np.ndarray) -> float | None:
        if not len(part):
            return None
        labels = None if self.labels is None else self.labels[part]
        return float(self.data.scorer.drop(self.reference[part], outputs[part], labels))

    def judged(self, c: Candidate, outputs: np.ndarray, basis: str) -> Candidate:
        if outputs.shape != self.reference.shape:
            note = (
                f"accuracy from this host: its board output has shape {list(outputs.shape)}, "
                f"FP32's {list(self.reference.shape)}"
            )
            return replace(c, notes=(*c.notes, note))
        host = np.asarray(c.measurement.outputs)
        count = len(next(iter(self.data.evaluation.values())))
        difference = None
        if len(host) == count and host[self.rows].shape == outputs.shape:
            difference = float(
                np.max(np.abs(host[self.rows].astype(np.float64) - outputs.astype(np.float64)))
            )
        selection, holdout = (self._drop(outputs, part) for part in self.parts)
        assert selection is not None
        return replace(
            c,
            board_drop=selection,
            board_holdout_drop=holdout,
            host_board_difference=difference,
            accuracy_basis=basis,
        )
