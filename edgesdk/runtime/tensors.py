"""Typed tensor signatures and input validation for ``Runtime.predict``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.errors import InputError

__all__ = ["TensorSpec", "validate_inputs", "adapt_layout", "signature_changes"]


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its name, shape (None marks a dynamic dim) and dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]

    def describe(self) -> str:
        """The spec for messages, e.g. ``input: float32[?, 64]``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype.name}[{dims}]"

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        """True when ``shape`` has this rank and equals every fixed dimension."""
        return len(shape) == len(self.shape) and all(e is None or e == s for e, s in zip(self.shape, shape))


def _check(spec: TensorSpec, value: Any, check_finite: bool) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InputError(
            f"input {spec.name!r} must be a numpy array ({spec.describe()}), got {type(value).__name__}; "
            f"wrap it with np.asarray(value, dtype=np.{spec.dtype.name})"
        )
    if value.dtype != spec.dtype:
        # Silent casts hide preprocessing bugs (float64 images, int64 labels), so refuse them.
        raise InputError(
            f"input {spec.name!r} expects dtype {spec.dtype.name}, got {value.dtype.name}; "
            f"convert explicitly with x.astype(np.{spec.dtype.name})"
        )
    if not spec.accepts_shape(value.shape):
        what = "rank" if value.ndim != len(spec.shape) else "shape"
        raise InputError(
            f"input {spec.name!r} has wrong {what}: expected {spec.describe()}, got shape {tuple(value.shape)}"
        )
    if check_finite and value.dtype.kind == "f" and not np.isfinite(value).all():
        nan = int(np.count_nonzero(np.isnan(value)))
        inf = int(np.count_nonzero(np.isinf(value)))
        raise InputError(
            f"input {spec.name!r} has {nan + inf} non-finite value(s) of {value.size} ({nan} NaN, {inf} Inf); "
            f"fix the preprocessing that produced them (e.g. a division by zero, an uninitialised buffer), "
            f"or pass check_finite=False to the Runtime if the model expects them"
        )
    return value


def validate_inputs(specs: tuple[TensorSpec, ...], inputs: Any, check_finite: bool = False) -> dict[str, np.ndarray]:
    """Map ``inputs`` (one array, or a dict of arrays) onto ``specs``; raise InputError on any mismatch.

    With ``check_finite``, a floating input holding NaN or Inf is refused too (integer inputs are not checked).
    """
    if isinstance(inputs, Mapping):
        expected = [s.name for s in specs]
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        if missing or unknown:
            raise InputError(
                f"input names do not match the model: missing {missing}, unexpected {unknown}; "
                f"the model takes {[s.describe() for s in specs]}"
            )
        return {s.name: _check(s, inputs[s.name], check_finite) for s in specs}
    if len(specs) != 1:
        raise InputError(
            f"this model has {len(specs)} inputs {[s.describe() for s in specs]}; "
            f"pass a dict {{name: array}} instead of a single {type(inputs).__name__}"
        )
    return {specs[0].name: _check(specs[0], inputs, check_finite)}


def adapt_layout(arrays: Mapping[str, np.ndarray], specs: Any) -> dict[str, np.ndarray]:
    """Transpose NCHW data to NHWC where a TFLite input (converted by onnx2tf) wants NHWC.

    Only the per-sample dims decide: data already in the input's layout is left alone whatever its batch size (a
    fixed batch of 1 with a stack of samples whose channels, height and width are equal is not NHWC).
    """
    adapted = {}
    for spec in specs:
        array = arrays[spec.name]
        wanted = spec.shape
        same_layout = len(wanted) == 4 and spec.accepts_shape((wanted[0] or array.shape[0], *array.shape[1:]))
        if array.ndim == 4 and len(wanted) == 4 and not same_layout:
            nhwc = array.transpose(0, 2, 3, 1)
            if spec.accepts_shape((wanted[0] or nhwc.shape[0], *nhwc.shape[1:])):
                array = np.ascontiguousarray(nhwc)
        adapted[spec.name] = array
    return adapted


def signature_changes(before_inputs: Sequence[TensorSpec], before_outputs: Sequence[TensorSpec],
                      after_inputs: Sequence[TensorSpec], after_outputs: Sequence[TensorSpec]) -> list[str]:
    """How a model's inputs and outputs changed, one line each (``input image: float32[1, 3, 224, 224] ->
    float32[?, 64]``, ``output probs: removed``); [] when they are the same names, shapes and dtypes."""
    changes = []
    for kind, before, after in (("input", before_inputs, after_inputs), ("output", before_outputs, after_outputs)):
        old = {spec.name: spec for spec in before}
        new = {spec.name: spec for spec in after}
        for name in sorted(old.keys() | new.keys()):
            was, now = old.get(name), new.get(name)
            if was is None and now is not None:
                changes.append(f"{kind} {now.describe()}: added")
            elif now is None and was is not None:
                changes.append(f"{kind} {was.describe()}: removed")
            elif was is not None and now is not None and (was.shape, was.dtype) != (now.shape, now.dtype):
                changes.append(f"{kind} {was.describe()} -> {now.describe().split(': ', 1)[1]}")
    return changes
