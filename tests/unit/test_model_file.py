import pytest

from edgesdk.errors import ModelFormatError
from edgesdk.runtime.model_file import ModelFormat, read_model


def test_reads_format_from_extension_and_checks_content(digits_onnx, digits_tflite):
    assert read_model(digits_onnx).format is ModelFormat.ONNX
    tfl = read_model(digits_tflite)
    assert tfl.format is ModelFormat.TFLITE and tfl.content == digits_tflite.read_bytes()
    assert len(tfl.sha256) == 64


def test_unknown_extension(tmp_path):
    path = tmp_path / "model.pb"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ModelFormatError, match=r"unknown model extension '.pb'"):
        read_model(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="not found"):
        read_model(tmp_path / "absent.onnx")


def test_empty_or_tiny_file_is_called_truncated(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x1c\0\0")
    with pytest.raises(ModelFormatError, match="3 bytes.*truncated"):
        read_model(path)


def test_onnx_extension_with_tflite_content(tmp_path, digits_tflite):
    path = tmp_path / "really_tflite.onnx"
    path.write_bytes(digits_tflite.read_bytes())
    with pytest.raises(ModelFormatError, match="TFLite flatbuffer.*rename it to .tflite"):
        read_model(path)


def test_tflite_extension_without_identifier(tmp_path, digits_onnx):
    path = tmp_path / "really_onnx.tflite"
    path.write_bytes(digits_onnx.read_bytes())
    with pytest.raises(ModelFormatError, match="no TFLite identifier"):
        read_model(path)
