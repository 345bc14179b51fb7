"""Fixtures shared by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """The README's digits sample (``python -m edgesdk.testing sample``): model.onnx (input[batch, 64] ->
    probabilities[batch, 10]), model.tflite, calib.npy, eval.npy, labels.npy."""
    from edgesdk.testing import write_sample

    folder = tmp_path_factory.mktemp("sample")
    write_sample(folder)
    return folder
