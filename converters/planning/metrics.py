"""Accuracy metrics comparing a variant's outputs with the FP32 model's (or with labels).

``drop`` is how much worse a variant is, in the metric's unit: percentage points for the
top-1 metrics, plain numbers for cosine similarity and max abs error. Zero means as good
as FP32; ``--max-accuracy-drop`` bounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import DataError

__all__ = ["Metric", "resolve_metric", "check_metric", "METRIC_NAMES"]

Score = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], float]


def _top1_agreement(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
    return 100.0 * float(np.mean(reference.argmax(axis=-1) == outputs.argmax(axis=-1)))


def _top1_accuracy(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
    assert labels is not None  # resolve_metric refuses top1_accuracy without labels
    return 100.0 * float(np.mean(outputs.argmax(axis=-1) == labels))


def _cosine(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
    a = reference.reshape(len(reference), -1).astype(np.float64)
    b = outputs.reshape(len(outputs), -1).astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(np.sum(a * b, axis=1) / np.where(denom == 0, 1, denom)))


def _neg_max_abs(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
    return -float(np.max(np.abs(reference.astype(np.float64) - outputs)))


_BUILTIN: dict[str, tuple[Score, str]] = {
    "top1_agreement": (_top1_agreement, "points"),
    "top1_accuracy": (_top1_accuracy, "points"),
    "cosine": (_cosine, "cosine"),
    "max_abs_error": (_neg_max_abs, "abs error"),
}
METRIC_NAMES = tuple(_BUILTIN)


@dataclass(frozen=True)
class Metric:
    """A score where higher is better; ``drop`` compares a variant to the FP32 reference."""

    name: str
    unit: str
    score: Score

    def drop(self, reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
        """How much worse ``outputs`` are than the reference outputs themselves (>= 0 is worse)."""
        return self.score(reference, reference, labels) - self.score(reference, outputs, labels)


def resolve_metric(metric: str | Score | None, labels: np.ndarray | None) -> Metric:
    """A built-in metric by name, or a user callable ``(reference, outputs, labels) -> score``.

    Default: top-1 accuracy when labels are given, else top-1 agreement with FP32.
    """
    if metric is None:
        metric = "top1_accuracy" if labels is not None else "top1_agreement"
    check_metric(metric, labels is not None)
    if callable(metric):
        return Metric(getattr(metric, "__name__", "custom"), "score", metric)
    score, unit = _BUILTIN[metric]
    return Metric(metric, unit, score)


def check_metric(metric: str | Score | None, has_labels: bool) -> None:
    """Refuse an unknown metric name, or top-1 accuracy without labels (before any conversion work)."""
    if metric is None or callable(metric):
        return
    if metric not in _BUILTIN:
        raise DataError(f"unknown metric {metric!r}; use one of {list(METRIC_NAMES)} or pass a callable")
    if metric == "top1_accuracy" and not has_labels:
        raise DataError("metric top1_accuracy needs labels; pass --labels FILE.npy or use top1_agreement")
