"""ONNX Runtime backend: providers ordered by the profile, intra-op threads pinned, TensorRT given its deployment.

The TensorRT provider gets the options of :class:`~edgesdk.runtime.backends.tensorrt.TrtDeployment`
(precision flags, engine and timing caches, workspace) when the runtime passes one.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edgesdk.errors import BackendError, ModelFormatError
from edgesdk.runtime.backends.base import Backend, BackendInfo
from edgesdk.runtime.backends.tensorrt import TrtDeployment, providers_with_options
from edgesdk.runtime.model_file import ModelFile
from edgesdk.runtime.profiles import Accelerator, RuntimeMode
from edgesdk.runtime.scheduling import CorePlan
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["OnnxRuntimeBackend", "CPU_PROVIDER"]

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


def _spec(arg: Any) -> TensorSpec:
    if arg.type not in _ORT_TYPES:
        raise BackendError(f"tensor {arg.name!r} has type {arg.type}, which edgesdk does not support yet")
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape)
    return TensorSpec(arg.name, shape, np.dtype(_ORT_TYPES[arg.type]))


def _affinity_string(cores: tuple[int, ...], threads: int) -> str:
    """ORT's per-worker affinity list: one entry per thread except the caller's; ids are 1-based."""
    one = ",".join(str(c + 1) for c in cores)
    return ";".join([one] * (threads - 1))


class OnnxRuntimeBackend(Backend):
    """Runs an ONNX model in an ``onnxruntime.InferenceSession``; ``trt`` configures the TensorRT provider if used."""

    def __init__(self, model: ModelFile, plan: CorePlan, accelerators: tuple[Accelerator, ...], profile: str,
                 trt: TrtDeployment | None = None) -> None:
        import onnxruntime as ort

        fallbacks: list[str] = []
        available = set(ort.get_available_providers())
        providers: list[str] = []
        for acc in accelerators:
            if not acc.onnxruntime_providers:
                hint = " (its LiteRT delegate needs the model as .tflite)" if acc.litert_delegates else ""
                fallbacks.append(f"{acc.name} ({acc.kind.value}) has no ONNX Runtime execution provider in profile "
                                 f"{profile}; running on CPU{hint}")
            for provider in acc.onnxruntime_providers:
                if provider in available:
                    providers.append(provider)
                else:
                    fallbacks.append(f"{provider} for {acc.name} is not in this onnxruntime build")
        providers.append(CPU_PROVIDER)
        session_providers, notes = providers_with_options(providers, trt)
        fallbacks.extend(notes)

        options = ort.SessionOptions()
        options.intra_op_num_threads = plan.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if plan.threads > 1:
            options.add_session_config_entry("session.intra_op_thread_affinities", _affinity_string(plan.cores, plan.threads))
        if plan.mode is RuntimeMode.POWER:
            # Spinning workers keep cores busy between ops; in power mode let them sleep.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(model.content, options, providers=session_providers)
        except Exception as exc:  # onnxruntime raises its own pybind classes; translate once here
            kind = type(exc).__name__
            if kind in ("InvalidProtobuf", "InvalidGraph", "Fail", "InvalidArgument"):
                raise ModelFormatError(
                    f"{model.path}: onnxruntime cannot load this ONNX model ({kind}: {exc}); "
                    "the file is corrupt or truncated, or not an ONNX model: re-export or copy it again"
                ) from exc
            raise BackendError(f"{model.path}: onnxruntime failed to create a session ({kind}: {exc})") from exc
        used = self._session.get_providers()
        for provider in providers:
            if provider not in used:
                fallbacks.append(f"{provider} was requested but onnxruntime did not enable it")
        for note in fallbacks:
            log.warning("onnxruntime fallback: %s", note)
        self.inputs = tuple(_spec(a) for a in self._session.get_inputs())
        self.outputs = tuple(_spec(a) for a in self._session.get_outputs())
        self._output_names = [o.name for o in self.outputs]
        self.info = BackendInfo("onnxruntime", ort.__version__, used[0], plan.threads, tuple(fallbacks))

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one inference; sessions run calls from several threads concurrently."""
        return self._session.run(self._output_names, feeds)

    def close(self) -> None:
        """Drop the session so its memory is freed; ``run`` fails afterwards."""
        self.__dict__.pop("_session", None)
