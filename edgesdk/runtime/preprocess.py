"""Image preprocessing shared by the converter and apps on the device, and the class names a bundle records.

The converter records the :class:`ImagePreprocessing` the model expects in the bundle's
manifest (``preprocessing``: ``color``, ``scale``, ``mean``, ``std``, ``layout``), whatever
its data was: image folders are transformed with it, ``.npy``/``.npz`` arrays are taken as
already transformed and the settings are only recorded. With ``.npy``/``.npz`` data and no
preprocessing stated, nothing is recorded (``{}``): edgesdk cannot know how those arrays were
made. ``preprocessing["labels"]`` holds the class names, in class-id order, when given.

An app rebuilds the settings with :meth:`ImagePreprocessing.from_manifest` and turns camera
frames into model input with :func:`image_to_tensor`, so the device feeds the model exactly
what it was calibrated and measured on; :func:`class_names` reads the names. OpenCV (the
``[vision]`` extra) does the resizing and colour conversion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgesdk.errors import DataError
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["ImagePreprocessing", "LAYOUTS", "class_names", "image_layout", "image_to_tensor"]

LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image becomes model input: resized to the model's H x W, colour order, ``scale``, ``mean``/``std``.

    ``layout`` is ``"NCHW"`` or ``"NHWC"``; None takes it from the model input's shape
    (:func:`image_layout`).
    """

    color: str = "RGB"
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: str | None = None

    def __post_init__(self) -> None:
        if self.color not in ("RGB", "BGR", "GRAY"):
            raise DataError(f"color must be RGB, BGR or GRAY, got {self.color!r}")
        if self.layout not in (None, *LAYOUTS):
            raise DataError(f"layout must be NCHW or NHWC, got {self.layout!r}")
        for what, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, 3):
                raise DataError(f"{what} {list(values)} has {len(values)} values; give 1 (all channels) or 3 "
                                "(one per channel), e.g. 0.485,0.456,0.406")
            if not all(math.isfinite(v) for v in values):
                raise DataError(f"{what} {list(values)} is not all finite numbers; give numbers such as 0.5")
        if any(s == 0 for s in self.std):
            raise DataError(f"std {list(self.std)} has a zero; every channel's std must be non-zero, e.g. 0.229")
        if not self.scale or not math.isfinite(self.scale):
            raise DataError(f"scale {self.scale} must be a non-zero number, e.g. 1/255 = 0.00392")

    @classmethod
    def for_input(cls, spec: TensorSpec, *, color: str | None = None, scale: float | None = None,
                  mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                  layout: str | None = None) -> ImagePreprocessing:
        """The settings stated for the image input ``spec``, checked against it; what is not stated comes from it.

        Defaults: GRAY for a 1-channel input, else RGB; scale 1/255; mean 0; std 1; the layout
        of the input's shape. A stated setting that cannot fit the input (GRAY for 3 channels,
        3 means for 1 channel, NHWC for a [N, 3, 224, 224] input) is a DataError naming it.
        """
        resolved, channels, _, _ = image_layout(spec, layout)
        if channels not in (1, 3):
            raise DataError(f"input {spec.describe()} has {channels or 'dynamic'} channels ({resolved}), an image has "
                            "1 or 3; give its layout (NCHW or NHWC), or fix its shape")
        if color is None:
            color = "GRAY" if channels == 1 else "RGB"
        elif (color == "GRAY") != (channels == 1):
            raise DataError(f"color {color}: input {spec.describe()} has {channels} channel(s) ({resolved}); use "
                            f"{'GRAY' if channels == 1 else 'RGB or BGR'}")
        for what, values in (("mean", mean), ("std", std)):
            if values is not None and len(values) not in (1, channels):
                raise DataError(f"{what} {list(values)} has {len(values)} values; input {spec.describe()} has "
                                f"{channels} channel(s): give 1{'' if channels == 1 else f' or {channels}'}")
        return cls(color=color, scale=1 / 255 if scale is None else scale,
                   mean=(0.0,) if mean is None else tuple(mean), std=(1.0,) if std is None else tuple(std),
                   layout=resolved)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a dict (saved in the bundle's ``preprocessing``; ``layout`` only when set)."""
        settings = asdict(self)
        settings["mean"], settings["std"] = list(self.mean), list(self.std)
        if self.layout is None:
            del settings["layout"]
        return settings

    @classmethod
    def from_manifest(cls, preprocessing: Mapping[str, Any]) -> ImagePreprocessing:
        """The settings a bundle's ``preprocessing`` records (the defaults for keys it lacks).

        Bundles converted before edgesdk recorded them at the top level keep them under ``images``.
        """
        nested = preprocessing.get("images")
        if isinstance(nested, Mapping):
            preprocessing = nested
        defaults = cls()
        try:
            return cls(color=str(preprocessing.get("color", defaults.color)),
                       scale=float(preprocessing.get("scale", defaults.scale)),
                       mean=tuple(float(v) for v in preprocessing.get("mean", defaults.mean)),
                       std=tuple(float(v) for v in preprocessing.get("std", defaults.std)),
                       layout=preprocessing.get("layout"))
        except (TypeError, ValueError) as exc:
            raise DataError(f"manifest preprocessing {dict(preprocessing)} has a value of the wrong type ({exc}); "
                            "convert the model again") from exc


def class_names(preprocessing: Mapping[str, Any]) -> tuple[str, ...]:
    """The class names a bundle's ``preprocessing`` records (``labels``), in class-id order; () when none."""
    names = preprocessing.get("labels") or ()
    return tuple(str(n) for n in names) if isinstance(names, (list, tuple)) else ()


def image_layout(spec: TensorSpec, layout: str | None = None) -> tuple[str, int, int, int]:
    """``(layout, channels, height, width)`` of a 4-D image input.

    ``layout`` None guesses it from the shape: NCHW when dim 1 is 1 or 3 and dim 3 is not, else
    NHWC. A given layout whose channel dim is not 1 or 3 is a DataError (the input is laid out
    the other way).
    """
    if len(spec.shape) != 4:
        raise DataError(f"images need a 4-D model input (NCHW or NHWC); {spec.describe()} is not")
    _, a, b, c = spec.shape
    if layout is None:
        if a in (1, 3) and c not in (1, 3):
            return "NCHW", int(a), int(b or 0), int(c or 0)
        return "NHWC", int(c or 0), int(a or 0), int(b or 0)
    if layout not in LAYOUTS:
        raise DataError(f"layout must be NCHW or NHWC, got {layout!r}")
    channels, height, width = (a, b, c) if layout == "NCHW" else (c, a, b)
    if channels not in (1, 3):
        raise DataError(f"layout {layout}: input {spec.describe()} would have {channels or 'dynamic'} channels, an "
                        "image has 1 or 3; give the other layout, or fix the input's shape")
    return layout, int(channels), int(height or 0), int(width or 0)


def image_to_tensor(image: np.ndarray, spec: TensorSpec, prep: ImagePreprocessing) -> np.ndarray:
    """One OpenCV image (BGR, or gray for 1-channel inputs) as a batch of one for ``spec``."""
    import cv2

    layout, channels, height, width = image_layout(spec, prep.layout)
    if not height or not width:
        raise DataError(f"{spec.describe()} has dynamic H/W; fix the input shape to feed images")
    if channels == 1 and image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    elif channels == 3 and image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    if channels == 3 and prep.color == "RGB":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    image = image.reshape(height, width, channels).astype(np.float32) * np.float32(prep.scale)
    image = (image - np.asarray(prep.mean[:channels], np.float32)) / np.asarray(prep.std[:channels], np.float32)
    tensor = image.transpose(2, 0, 1) if layout == "NCHW" else image
    return tensor[None].astype(spec.dtype)
