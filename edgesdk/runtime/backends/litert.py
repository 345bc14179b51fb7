"""LiteRT backend: XNNPACK by default, GPU/NPU delegates from the profile, pinned threads.

The interpreter is found at import time in this order: ``ai_edge_litert`` (the LiteRT
wheel), ``tflite_runtime`` (the older standalone wheel, last released for Python 3.11 and
built against numpy 1), then ``tensorflow.lite``.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.errors import BackendError, ModelFormatError
from edgesdk.runtime.backends.base import Backend, BackendInfo
from edgesdk.runtime.model_file import ModelFile
from edgesdk.runtime.profiles import Accelerator
from edgesdk.runtime.scheduling import CorePlan, pinned
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["LiteRTBackend", "LiteRTModule", "import_litert", "LITERT_CANDIDATES"]

log = logging.getLogger(__name__)

#: (module to import, distribution to name in messages)
LITERT_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("ai_edge_litert.interpreter", "ai-edge-litert"),
    ("tflite_runtime.interpreter", "tflite-runtime"),
    ("tensorflow.lite", "tensorflow"),
)


@dataclass(frozen=True)
class LiteRTModule:
    """The interpreter class and delegate loader of whichever LiteRT package was found."""

    #: The package that provided it, e.g. "ai-edge-litert".
    distribution: str
    #: That package's version, or "unknown".
    version: str
    #: The ``Interpreter`` class.
    interpreter: Any
    #: ``load_delegate(library_path)``.
    load_delegate: Any


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def import_litert(candidates: Sequence[tuple[str, str]] = LITERT_CANDIDATES) -> LiteRTModule:
    """Import the first usable LiteRT; say exactly which ones were present but broken."""
    problems: list[str] = []
    for module_name, distribution in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # simply not installed
            problems.append(f"{distribution} is installed but cannot be imported ({exc})")
            continue
        except Exception as exc:  # e.g. tflite_runtime 2.14 built for numpy 1, under numpy 2
            problems.append(
                f"{distribution} is installed but cannot be imported under numpy {np.__version__} "
                f"({type(exc).__name__}: {exc})"
            )
            continue
        return LiteRTModule(distribution, _version(distribution), module.Interpreter, module.load_delegate)
    found = "; ".join(problems) if problems else "none of ai-edge-litert, tflite-runtime or tensorflow is installed"
    raise BackendError(
        f"no usable LiteRT interpreter: {found}. Install one with `pip install ai-edge-litert` "
        "(or, for tflite-runtime 2.14 on Python <= 3.11, `pip install tflite-runtime 'numpy<2'`), "
        "or run the ONNX model with backend='onnxruntime'"
    )


def _spec(detail: dict[str, Any]) -> TensorSpec:
    signature = detail.get("shape_signature", detail["shape"])
    shape = tuple(None if d < 0 else int(d) for d in signature)
    return TensorSpec(detail["name"], shape, np.dtype(detail["dtype"]))


class LiteRTBackend(Backend):
    """Runs a TFLite model in a LiteRT ``Interpreter`` created on the plan's cores."""

    def __init__(self, model: ModelFile, plan: CorePlan, accelerators: tuple[Accelerator, ...], profile: str,
                 litert: LiteRTModule | None = None) -> None:
        litert = litert or import_litert()
        fallbacks: list[str] = []
        delegates: list[Any] = []
        accelerator = "xnnpack"
        for acc in accelerators:
            if not acc.litert_delegates:
                fallbacks.append(f"{acc.name} ({acc.kind.value}) has no LiteRT delegate in profile {profile}; "
                                 "running on CPU (xnnpack)")
            for library in acc.litert_delegates:
                try:
                    # dlopen first: LiteRT's Delegate object raises in __del__ when its own load fails.
                    ctypes.CDLL(library)
                    delegates = [litert.load_delegate(library)]
                except (ValueError, OSError, RuntimeError) as exc:
                    fallbacks.append(f"LiteRT delegate {library} for {acc.name} did not load ({exc})")
                    continue
                accelerator = f"{acc.name} ({library})"
                break
            if delegates:
                break

        # Threads the interpreter creates (XNNPACK's pool) inherit this thread's mask.
        with pinned(plan.cores):
            interpreter = None
            if delegates:
                try:
                    interpreter = self._create(litert, model, plan, delegates)
                except Exception as exc:
                    fallbacks.append(f"{accelerator} could not prepare this model ({exc}); using xnnpack on the CPU")
                    accelerator = "xnnpack"
            self._interpreter = interpreter or self._create(litert, model, plan, [])
        for note in fallbacks:
            log.warning("LiteRT fallback: %s", note)

        self._lock = threading.Lock()  # an Interpreter must not be invoked from two threads at once
        self._input_details = self._interpreter.get_input_details()
        self._output_details = self._interpreter.get_output_details()
        self.inputs = tuple(_spec(d) for d in self._input_details)
        self.outputs = tuple(_spec(d) for d in self._output_details)
        self._input_index = {d["name"]: d["index"] for d in self._input_details}
        self._current_shape = {d["name"]: tuple(d["shape"]) for d in self._input_details}
        self._output_index = [d["index"] for d in self._output_details]
        self.info = BackendInfo("litert", f"{litert.distribution} {litert.version}", accelerator, plan.threads,
                                tuple(fallbacks))

    @staticmethod
    def _create(litert: LiteRTModule, model: ModelFile, plan: CorePlan, delegates: list[Any]) -> Any:
        try:
            interpreter = litert.interpreter(
                model_content=model.content, num_threads=plan.threads, experimental_delegates=delegates or None
            )
        except ValueError as exc:
            raise ModelFormatError(
                f"{model.path}: LiteRT cannot read this model ({exc}); the file is corrupt or truncated: "
                "copy or convert it again"
            ) from exc
        try:
            interpreter.allocate_tensors()
        except RuntimeError as exc:
            raise BackendError(f"{model.path}: LiteRT cannot prepare this model: {exc}") from exc
        return interpreter

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one inference, resizing inputs whose shape changed; calls from several threads take turns."""
        with self._lock:
            interpreter = self._interpreter
            resized = False
            for name, array in feeds.items():
                if array.shape != self._current_shape[name]:
                    interpreter.resize_tensor_input(self._input_index[name], array.shape, strict=True)
                    self._current_shape[name] = array.shape
                    resized = True
            if resized:
                interpreter.allocate_tensors()
            for name, array in feeds.items():
                interpreter.set_tensor(self._input_index[name], array)
            interpreter.invoke()
            return [interpreter.get_tensor(i) for i in self._output_index]

    def close(self) -> None:
        """Drop the interpreter (and its delegate) so their memory is freed; ``run`` fails afterwards."""
        self.__dict__.pop("_interpreter", None)
