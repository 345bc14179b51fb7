"""Calibration and evaluation data: ``.npy``, ``.npz`` or a folder of images.

Arrays are batch-first in the model's own layout and dtype; they are checked against the
model's inputs and nothing is cast silently. Images (needs the ``[vision]`` extra) are
read with OpenCV and preprocessed by :class:`edgesdk.runtime.preprocess.ImagePreprocessing` (the
code apps use on the device): resized to
the model's H x W, converted to RGB (or kept BGR), scaled by ``scale``, normalised with
``mean``/``std`` per channel, and laid out NCHW or NHWC to match the model input.

Class names (:func:`load_class_names`) are a text file with one name per line, or a JSON
list of strings, in class-id order; :func:`check_class_names` checks their count against
the model's class output.

**The held-out split.** :func:`split_evaluation` cuts the evaluation samples into a
*selection* part, which every choice of the conversion sees (calibration method, the
mixed-precision search, the planner), and a *held-out* part, which only checks the chosen
variant. The rule, for ``n`` samples, a fraction ``f`` (at most 0.5) and a minimum ``m``:

* ``f == 0``: no split (the held-out check is off);
* ``n < 2m``: no split, and the report says why (``n`` samples cannot give ``m`` to
  choose with and ``m`` to check on); a conversion with little data still runs, flagged;
* otherwise ``max(m, round(f * n))`` samples are held out, so at least ``m`` on each side.

The split is a fixed function of ``n``, the seed and the labels: the samples are shuffled
with ``numpy.random.default_rng(seed)``, ordered by label (stably) when there are labels,
and every ``n / k``-th one is held out, so each class is held out in its share (to within
one sample).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import DataError
from edgesdk.runtime.preprocess import ImagePreprocessing, image_layout, image_to_tensor
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["ImagePreprocessing", "load_arrays", "load_labels", "load_class_names", "check_class_names", "check_arrays",
           "model_inputs", "EvaluationSplit", "split_evaluation", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def _load_images(folder: Path, spec: TensorSpec, prep: ImagePreprocessing) -> np.ndarray:
    try:
        import cv2
    except ImportError as exc:
        raise DataError("reading image folders needs OpenCV: pip install 'edgesdk[vision]'") from exc
    _, channels, height, width = image_layout(spec, prep.layout)
    if not height or not width:
        raise DataError(f"{spec.describe()} has dynamic H/W; fix the input shape to read images")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) found")
    batch = []
    for path in files:
        image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
        if image is None:
            raise DataError(f"{path}: OpenCV cannot decode this image; remove or replace it")
        batch.append(image_to_tensor(image, spec, prep)[0])
    return np.stack(batch).astype(spec.dtype)


def load_arrays(path: str | os.PathLike[str], specs: tuple[TensorSpec, ...],
                preprocessing: ImagePreprocessing | None = None) -> dict[str, np.ndarray]:
    """Read data for ``specs`` from ``path`` and check it (see :func:`check_arrays`)."""
    path = Path(path)
    if path.is_dir():
        if len(specs) != 1:
            raise DataError(f"{path}: an image folder feeds one input, the model has {len(specs)}; use .npz")
        arrays = {specs[0].name: _load_images(path, specs[0], preprocessing or ImagePreprocessing())}
    elif path.suffix == ".npy":
        if len(specs) != 1:
            raise DataError(f"{path}: one .npy array feeds one input, the model has {[s.name for s in specs]}; "
                            "use .npz with one array per input name")
        # Memory-mapped: calibration reads it batch by batch, so a large file is never resident at once.
        arrays = {specs[0].name: _np_load(path, mmap=True)}
    elif path.suffix == ".npz":
        with _np_load(path) as data:
            names = list(data.files)
            if len(specs) == 1 and names == ["arr_0"]:
                arrays = {specs[0].name: data["arr_0"]}
            else:
                missing = [s.name for s in specs if s.name not in names]
                if missing:
                    raise DataError(f"{path}: has arrays {names}, missing inputs {missing}; save one array per "
                                    "input name (np.savez(path, **{name: array}))")
                arrays = {s.name: data[s.name] for s in specs}
    elif not path.exists():
        raise DataError(f"{path}: data file not found")
    else:
        raise DataError(f"{path}: data must be .npy, .npz or a folder of images, got {path.suffix or 'no suffix'!r}")
    return check_arrays(arrays, specs, str(path))


def _np_load(path: Path, mmap: bool = False) -> Any:
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read numpy data ({exc}); the file is corrupt or not numpy") from exc


def check_arrays(arrays: Mapping[str, np.ndarray], specs: tuple[TensorSpec, ...], where: str) -> dict[str, np.ndarray]:
    """Every input present, non-empty, same sample count, dtype exact, sample dims matching."""
    counts = set()
    for spec in specs:
        array = arrays.get(spec.name)
        if array is None:
            raise DataError(f"{where}: no data for input {spec.describe()}")
        if array.ndim == 0 or len(array) == 0:
            raise DataError(f"{where}: data for {spec.name!r} is empty; give at least one sample")
        if array.dtype != spec.dtype:
            raise DataError(f"{where}: data for {spec.name!r} is {array.dtype.name}, the model takes "
                            f"{spec.dtype.name}; convert it with .astype(np.{spec.dtype.name}) before saving")
        if array.ndim != len(spec.shape) or not all(e is None or e == s for e, s in zip(spec.shape[1:], array.shape[1:])):
            raise DataError(f"{where}: data for {spec.name!r} has shape {array.shape}, the model takes "
                            f"{spec.describe()} (first dim = samples)")
        counts.add(len(array))
    if len(counts) > 1:
        raise DataError(f"{where}: inputs have different sample counts {sorted(counts)}")
    return {s.name: np.ascontiguousarray(arrays[s.name]) for s in specs}


def load_labels(path: str | os.PathLike[str], n_samples: int) -> np.ndarray:
    """A 1-D integer ``.npy`` of class ids, one per evaluation sample (DataError otherwise)."""
    labels = _np_load(Path(path))
    if not isinstance(labels, np.ndarray) or labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{path}: labels must be a 1-D integer .npy array of class ids")
    if len(labels) != n_samples:
        raise DataError(f"{path}: {len(labels)} labels for {n_samples} evaluation samples; they must match")
    return labels


def load_class_names(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Class names in class-id order from a text file (one per line) or a JSON list of strings (DataError otherwise).

    Surrounding whitespace and blank lines at the end are dropped; an empty name inside the
    list, or a name given twice, is refused.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read class names ({exc}); give a UTF-8 text file, one name per line") from exc
    if path.suffix.lower() == ".json" or text.lstrip().startswith("["):
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise DataError(f"{path}: not valid JSON ({exc}); give a JSON list of strings, or one name per line") \
                from None
        if not isinstance(loaded, list) or not all(isinstance(n, str) for n in loaded):
            raise DataError(f"{path}: JSON class names must be a list of strings, e.g. [\"cat\", \"dog\"]")
        names = [n.strip() for n in loaded]
    else:
        names = [line.strip() for line in text.splitlines()]
        while names and not names[-1]:
            names.pop()
    if not names:
        raise DataError(f"{path}: no class names; give one name per line, in class-id order")
    for index, name in enumerate(names):
        if not name:
            raise DataError(f"{path}: class {index} has an empty name; give every class a name, in class-id order")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"{path}: class name(s) {twice} given more than once; every class needs its own name")
    return tuple(names)


def check_class_names(names: Sequence[str], outputs: tuple[TensorSpec, ...], labels: np.ndarray | None = None,
                      where: str = "class names") -> tuple[str, ...]:
    """``names`` if they fit the model: one per class of its first output's last dim (when static), every label's id.

    The class count is checked only when the first output has at least 2 dims and a static
    last one (e.g. ``[batch, 10]``); a dynamic one cannot be checked.
    """
    if outputs and len(outputs[0].shape) >= 2:
        classes = outputs[0].shape[-1]
        if classes is not None and classes > 0 and classes != len(names):
            raise DataError(f"{where}: {len(names)} names, the model's output {outputs[0].describe()} has {classes} "
                            f"classes; give one name per class, in class-id order")
    if labels is not None and len(labels) and int(labels.max()) >= len(names):
        raise DataError(f"{where}: {len(names)} names, but the labels have class id {int(labels.max())}; give a name "
                        "for every class id the labels use")
    return tuple(names)


def model_inputs(specs: tuple[TensorSpec, ...], input_shapes: Mapping[str, Sequence[int]] | None = None
                 ) -> tuple[TensorSpec, ...]:
    """The inputs data must fit once the model is converted: dims of -1 or 0 are dynamic, ``input_shapes`` fix dims.

    A runtime reports a model's inputs as they are in the file; older exporters write a
    dynamic dim as -1 or 0 (ONNX Runtime keeps 0 as a size), and the conversion fixes the
    dims ``input_shapes`` names (:func:`edgesdk.converters.formats.onnx_model.fix_input_shapes`).
    """
    fixed = input_shapes or {}
    made = []
    for spec in specs:
        shape = tuple(None if d is None or d < 1 else d for d in spec.shape)
        if spec.name in fixed and len(fixed[spec.name]) == len(shape):
            shape = tuple(int(d) for d in fixed[spec.name])
        made.append(replace(spec, shape=shape))
    return tuple(made)


@dataclass(frozen=True)
class EvaluationSplit:
    """Which evaluation samples choose the variant (``selection``) and which only check it (``holdout``).

    Both are sorted sample indices; ``holdout`` is empty when no split was made, and
    ``note`` then says why.
    """

    selection: np.ndarray
    holdout: np.ndarray
    fraction: float
    seed: int
    minimum: int
    note: str = ""

    @property
    def is_split(self) -> bool:
        """True when some samples are held out."""
        return len(self.holdout) > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the split's sizes and settings (for the report and the bundle manifest)."""
        return {"selection_samples": len(self.selection), "holdout_samples": len(self.holdout),
                "holdout_fraction": self.fraction, "holdout_seed": self.seed, "holdout_min": self.minimum,
                "holdout_note": self.note or None}


def split_evaluation(count: int, fraction: float, seed: int = 0, minimum: int = 20,
                     labels: np.ndarray | None = None) -> EvaluationSplit:
    """Split ``count`` evaluation samples into selection and held-out parts (see the module doc for the rule)."""
    everything = np.arange(count)
    none = np.arange(0)
    if fraction == 0:
        return EvaluationSplit(everything, none, fraction, seed, minimum,
                               "no held-out check: holdout is 0, so the chosen variant's drop is measured on the "
                               "samples it was chosen on")
    if count < 2 * minimum:
        return EvaluationSplit(everything, none, fraction, seed, minimum,
                               f"no held-out check: {count} evaluation samples, a split needs at least {2 * minimum} "
                               f"({minimum} held out, {minimum} to choose with); give more evaluation samples or a "
                               "lower holdout minimum (--holdout-min)")
    held = min(max(minimum, int(np.floor(fraction * count + 0.5))), count - minimum)
    order = np.random.default_rng(seed).permutation(count)
    if labels is not None:
        order = order[np.argsort(np.asarray(labels)[order], kind="stable")]
    picked = order[np.floor((np.arange(held) + 0.5) * count / held).astype(np.int64)]
    holdout = np.sort(picked)
    return EvaluationSplit(np.setdiff1d(everything, holdout), holdout, fraction, seed, minimum)
