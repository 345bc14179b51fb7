"""TensorRT as a deployment: the ONNX Runtime TensorRT provider's options for one model on one board.

Without options the TensorRT execution provider builds its engine on every session (minutes
on a Jetson), in FP32, with a workspace as large as the GPU's memory. :class:`TrtDeployment`
says, for one model:

* **precision**, from the bundle's variant: ``fp16`` variants set ``trt_fp16_enable``; int8
  variants with QuantizeLinear/DequantizeLinear pairs (``onnx-int8-static-*``, ``onnx-mixed-*``,
  any name with ``qdq``) set ``trt_int8_enable``, so TensorRT keeps the converter's explicit
  scales (no calibration table); a mixed variant does not also get FP16, because the blocks it
  kept in float were kept there for accuracy. Dynamic int8 (``int8-dynamic``) and fp32 set
  neither: TensorRT has no dynamic quantization and runs those graphs' float parts in FP32.
  A bare model file has no variant and runs as fp32 unless ``precision`` is given.
* **engine and timing caches** in ``trt_cache/`` beside the model: the bundle's slot directory,
  so the engine the agent's install health check builds (its first run of the sample) is the
  one the app loads afterwards, a restart reuses it, and it is deleted with the slot. A bare
  model gets the directory beside its file, or the one the caller names. When the directory
  cannot be created or written, the caches are off and a fallback note says so.
* **workspace**: :data:`WORKSPACE_FRACTION` of the profile's ``model_budget_mb``. TensorRT's
  default is the device's whole memory, which on a Jetson is the memory the OS and the app
  share with the GPU; half the budget leaves the other half of what the planner allowed this
  model for its weights and activations.

The CUDA provider gets no options: its defaults grow its arena as needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TRT_PROVIDER", "CUDA_PROVIDER", "GPU_PROVIDERS", "CACHE_DIR", "WORKSPACE_FRACTION", "TrtDeployment",
           "variant_precision", "providers_with_options"]

TRT_PROVIDER = "TensorrtExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
#: The ONNX Runtime providers that run a model on a GPU.
GPU_PROVIDERS = (TRT_PROVIDER, CUDA_PROVIDER)
#: The cache directory's name, beside the model.
CACHE_DIR = "trt_cache"
#: The share of the profile's model budget TensorRT may use as its workspace (see the module doc).
WORKSPACE_FRACTION = 0.5
_PRECISIONS = ("fp32", "fp16", "int8")


def variant_precision(variant: str | None) -> str:
    """``fp16``, ``int8`` (explicit QDQ) or ``fp32`` for a bundle's variant name (see the module doc)."""
    name = (variant or "").lower().replace("_", "-")
    if any(tag in name for tag in ("int8-static", "mixed", "qdq", "int8-full")):
        return "int8"
    if "fp16" in name or "float16" in name:
        return "fp16"
    return "fp32"


@dataclass(frozen=True)
class TrtDeployment:
    """How the TensorRT provider builds, sizes and caches the engine of one model (see the module doc)."""

    precision: str
    #: Where the engine and timing caches live; None: no cache (the engine is built on every session).
    cache_dir: Path | None
    workspace_bytes: int

    def __post_init__(self) -> None:
        from edgesdk.errors import BackendError

        if self.precision not in _PRECISIONS:
            raise BackendError(f"TensorRT precision {self.precision!r} is not one of {list(_PRECISIONS)}")
        if self.workspace_bytes < 1:
            raise BackendError(f"TensorRT workspace of {self.workspace_bytes} bytes must be > 0; check the profile's "
                               "model_budget_mb")

    @classmethod
    def for_model(cls, model_path: str | os.PathLike[str], variant: str | None, model_budget_mb: int,
                  cache_dir: str | os.PathLike[str] | None = None, precision: str | None = None) -> TrtDeployment:
        """The deployment of the model at ``model_path`` (a bundle's model: its slot directory holds the cache)."""
        where = Path(cache_dir) if cache_dir is not None else Path(model_path).parent / CACHE_DIR
        return cls(precision or variant_precision(variant), where, int(model_budget_mb * WORKSPACE_FRACTION * 2**20))

    def provider_options(self) -> tuple[dict[str, Any], str | None]:
        """The TensorRT provider's options, and a note when the cache had to be turned off (None otherwise)."""
        options: dict[str, Any] = {"trt_fp16_enable": self.precision == "fp16", "trt_int8_enable": self.precision == "int8",
                                   "trt_max_workspace_size": self.workspace_bytes}
        note = None
        if self.cache_dir is not None:
            try:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                writable = os.access(self.cache_dir, os.W_OK)
            except OSError as exc:
                writable, note = False, f"{exc.strerror}"
            if writable:
                cache = str(self.cache_dir)
                options.update(trt_engine_cache_enable=True, trt_engine_cache_path=cache,
                               trt_timing_cache_enable=True, trt_timing_cache_path=cache)
            else:
                note = (f"TensorRT engine cache directory {self.cache_dir} cannot be written ({note or 'permission'}): "
                        "the engine is rebuilt on every start; make it writable by this user or pass trt_cache_dir")
        return options, note


def providers_with_options(providers: list[str], deployment: TrtDeployment | None) -> tuple[list[Any], list[str]]:
    """ONNX Runtime's ``providers`` argument: the TensorRT provider as ``(name, options)``, the others by name;
    and the fallback notes (a cache that cannot be written)."""
    if deployment is None or TRT_PROVIDER not in providers:
        return list(providers), []
    options, note = deployment.provider_options()
    return [(p, options) if p == TRT_PROVIDER else p for p in providers], [note] if note else []
