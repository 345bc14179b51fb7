"""The TFLite variants' FP32 parity check runs on a model onnx2tf wrote without a SignatureDef.

onnx2tf wrote PP-OCRv4's text detector with no SignatureDef; LiteRT's signature runner then
refused to start and the whole conversion died with a raw ValueError. The MLP here is written
without TensorFlow and has no SignatureDef either.
"""

import numpy as np
import pytest

from edgesdk.converters.formats.tflite import TFLiteInput, _parity
from edgesdk.errors import ConversionError
from edgesdk.runtime.backends.litert import import_litert
from edgesdk.testing import random_mlp, write_mlp_onnx, write_mlp_tflite


def _pair(tmp_path, weights):
    onnx_path = write_mlp_onnx(weights, tmp_path / "m.onnx", batch=1)
    tflite_path = write_mlp_tflite(weights, tmp_path / "m.tflite")
    assert not import_litert().interpreter(model_path=str(tflite_path)).get_signature_list()
    return onnx_path, tflite_path


def test_parity_of_a_model_without_a_signature_is_measured_through_its_tensors(tmp_path):
    weights = random_mlp([8, 16, 4])
    onnx_path, tflite_path = _pair(tmp_path, weights)
    inputs = (TFLiteInput("input", (1, 8), (1, 8), (0, 1)),)
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    assert _parity(onnx_path, tflite_path, inputs, {"input": x}) < 1e-4


def test_a_model_whose_tensors_cannot_be_matched_is_a_conversion_error(tmp_path):
    weights = random_mlp([8, 16, 4])
    onnx_path, tflite_path = _pair(tmp_path, weights)
    other = write_mlp_onnx(random_mlp([8, 16, 4]), tmp_path / "two.onnx", batch=1)
    # The ONNX side names an input the TFLite model does not have (and has two of them).
    inputs = (TFLiteInput("input", (1, 8), (1, 8), (0, 1)), TFLiteInput("extra", (1, 8), (1, 8), (0, 1)))
    x = np.zeros((1, 8), np.float32)
    with pytest.raises(ConversionError, match="no SignatureDef"):
        _parity(other, tflite_path, inputs, {"input": x, "extra": x})
