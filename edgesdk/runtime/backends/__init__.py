"""Inference backends behind one small interface (:class:`Backend`)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from edgesdk.errors import BackendError
from edgesdk.runtime.backends.base import Backend, BackendInfo
from edgesdk.runtime.model_file import ModelFile, ModelFormat
from edgesdk.runtime.profiles import Accelerator
from edgesdk.runtime.scheduling import CorePlan

if TYPE_CHECKING:
    from edgesdk.runtime.backends.tensorrt import TrtDeployment

__all__ = ["Backend", "BackendInfo", "BackendKind", "open_backend"]


class BackendKind(str, enum.Enum):
    """Which inference library runs a model; ``AUTO`` picks the one for the model's format."""

    AUTO = "auto"
    LITERT = "litert"
    ONNXRUNTIME = "onnxruntime"


_NATIVE = {ModelFormat.TFLITE: BackendKind.LITERT, ModelFormat.ONNX: BackendKind.ONNXRUNTIME}


def open_backend(kind: BackendKind, model: ModelFile, plan: CorePlan, accelerators: tuple[Accelerator, ...],
                 profile: str, trt: TrtDeployment | None = None) -> Backend:
    """Load ``model`` in the backend that runs its format (``auto``) or the one asked for.

    ``accelerators`` come from the profile named ``profile`` (named in fallback notes); the
    backend tries them in order and falls back to the CPU, recording why. ``trt`` is how ONNX Runtime's
    TensorRT provider builds and caches this model's engine (LiteRT ignores it).
    """
    native = _NATIVE[model.format]
    if kind is BackendKind.AUTO:
        kind = native
    if kind is not native:
        raise BackendError(
            f"backend {kind.value!r} cannot run {model.format.value} model {model.path}; "
            f"use backend='{native.value}' or 'auto', or convert the model with `edgesdk convert`"
        )
    if kind is BackendKind.LITERT:
        from edgesdk.runtime.backends.litert import LiteRTBackend

        return LiteRTBackend(model, plan, accelerators, profile)
    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(model, plan, accelerators, profile, trt)
