"""Image preprocessing shared by the converter (calibration/evaluation folders) and apps on the device.

The converter records the :class:`ImagePreprocessing` it used in the bundle's manifest
(``preprocessing``); an app rebuilds it with :meth:`ImagePreprocessing.from_manifest` and
turns camera frames into model input with :func:`image_to_tensor`, so the device feeds the
model exactly what it was calibrated and measured on. OpenCV (the ``[vision]`` extra) does
the resizing and colour conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgesdk.errors import DataError
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["ImagePreprocessing", "image_layout", "image_to_tensor"]


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image becomes model input: resized to the model's H x W, colour order, ``scale``, ``mean``/``std``."""

    color: str = "RGB"
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    def __post_init__(self) -> None:
        if self.color not in ("RGB", "BGR", "GRAY"):
            raise DataError(f"color must be RGB, BGR or GRAY, got {self.color!r}")
        for what, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, 3):
                raise DataError(f"{what} {list(values)} has {len(values)} values; give 1 (all channels) or 3 "
                                "(one per channel), e.g. 0.485,0.456,0.406")
        if any(s == 0 for s in self.std):
            raise DataError(f"std {self.std} has a zero; every channel's std must be non-zero")
        if not self.scale or self.scale != self.scale:
            raise DataError(f"scale {self.scale} must be a non-zero number, e.g. 1/255 = 0.00392")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a dict (saved in the bundle's ``preprocessing``)."""
        return asdict(self)

    @classmethod
    def from_manifest(cls, preprocessing: Mapping[str, Any]) -> ImagePreprocessing:
        """The settings a bundle's ``preprocessing`` records (the defaults for keys it lacks)."""
        defaults = cls()
        return cls(color=str(preprocessing.get("color", defaults.color)),
                   scale=float(preprocessing.get("scale", defaults.scale)),
                   mean=tuple(float(v) for v in preprocessing.get("mean", defaults.mean)),
                   std=tuple(float(v) for v in preprocessing.get("std", defaults.std)))


def image_layout(spec: TensorSpec) -> tuple[str, int, int, int]:
    """``(layout, channels, height, width)`` of a 4-D image input: NCHW when dim 1 is 1 or 3, else NHWC."""
    if len(spec.shape) != 4:
        raise DataError(f"images need a 4-D model input; {spec.describe()} is not")
    _, a, b, c = spec.shape
    if a in (1, 3) and c not in (1, 3):
        return "NCHW", int(a), int(b or 0), int(c or 0)
    return "NHWC", int(c or 0), int(a or 0), int(b or 0)


def image_to_tensor(image: np.ndarray, spec: TensorSpec, prep: ImagePreprocessing) -> np.ndarray:
    """One OpenCV image (BGR, or gray for 1-channel inputs) as a batch of one for ``spec``."""
    import cv2

    layout, channels, height, width = image_layout(spec)
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
