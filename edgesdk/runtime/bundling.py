"""Make a bundle from a model file: run its health sample through :class:`~edgesdk.Runtime`, then write it.

The bundle contract (:mod:`edgesdk.runtime.bundle`) only reads, writes and verifies bundles; running
a model to record what the device must reproduce lives here, so the contract does not depend on
the runtime that loads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgesdk.runtime.bundle import Bundle, BundleSpec, HealthSample, write_bundle
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.runtime import Runtime
from edgesdk.runtime.tensors import adapt_layout

__all__ = ["sample_model", "bundle_from_model"]


def sample_model(model: str | os.PathLike[str], inputs: Mapping[str, np.ndarray], profile: Any,
                 mode: str | None = None) -> HealthSample:
    """Run ``inputs`` through ``model`` with :class:`edgesdk.Runtime` under ``profile`` and ``mode``.

    NCHW inputs are transposed for a model that takes NHWC (a TFLite file from onnx2tf),
    so the same data serves every variant.
    """
    with Runtime(model, profile=profile, mode=mode) as rt:
        feeds = adapt_layout(inputs, rt.inputs)
        result = rt.predict(feeds)
        specs = rt.inputs, rt.outputs
    outputs = {specs[1][0].name: result} if isinstance(result, np.ndarray) else dict(result)
    return HealthSample(specs[0], specs[1], feeds, outputs)


def bundle_from_model(out_dir: str | os.PathLike[str], model: str | os.PathLike[str], spec: BundleSpec,
                      sample_inputs: Mapping[str, np.ndarray], profile: Any = None, private_key: Any = None) -> Bundle:
    """Bundle the model file ``model``, with its own output on ``sample_inputs`` as the health check.

    The sample runs under ``profile`` (default: ``spec.target_profile``) in ``spec.power_mode``
    (:func:`sample_model`); then :func:`~edgesdk.runtime.bundle.write_bundle`.
    """
    sample = sample_model(model, sample_inputs, profile or spec.target_profile, spec.power_mode)
    return write_bundle(out_dir, read_model(model), spec, sample, private_key)
