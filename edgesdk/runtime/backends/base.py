"""The interface every inference backend implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from edgesdk.runtime.tensors import TensorSpec

__all__ = ["Backend", "BackendInfo"]


@dataclass(frozen=True)
class BackendInfo:
    """What a backend actually set up, after every fallback."""

    #: "litert" or "onnxruntime".
    backend: str
    #: Version of the inference library (LiteRT: the distribution and its version).
    version: str
    #: The delegate or execution provider that runs the model (e.g. "xnnpack", "CUDAExecutionProvider").
    accelerator: str
    threads: int
    #: Why the backend did not use an accelerator it was offered, one note each.
    fallbacks: tuple[str, ...] = ()


class Backend(abc.ABC):
    """A loaded model ready to run: ``run`` feeds validated arrays, ``close`` frees it."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    info: BackendInfo

    @abc.abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one inference; ``feeds`` match ``inputs`` already. Outputs in ``outputs`` order."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the interpreter/session; ``run`` must not be called afterwards."""
