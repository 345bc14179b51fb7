"""Reading a model file once, checking what it really is before any backend sees it."""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from edgesdk.errors import ModelFormatError

__all__ = ["ModelFormat", "ModelFile", "read_model"]

#: TFLite flatbuffers carry the file identifier "TFL3" at bytes 4..8.
_TFLITE_MAGIC = b"TFL3"


class ModelFormat(str, enum.Enum):
    """The model file formats edgesdk runs; the value is the file extension without the dot."""

    ONNX = "onnx"
    TFLITE = "tflite"


_EXTENSIONS = {".onnx": ModelFormat.ONNX, ".tflite": ModelFormat.TFLITE}


@dataclass(frozen=True)
class ModelFile:
    """A model's bytes as read once from disk (so a file replaced mid-load is never mixed)."""

    path: Path
    format: ModelFormat
    content: bytes

    @cached_property
    def sha256(self) -> str:
        """Hex SHA-256 of :attr:`content`, computed on first use."""
        return hashlib.sha256(self.content).hexdigest()


def _looks_like_tflite(content: bytes) -> bool:
    return content[4:8] == _TFLITE_MAGIC


def read_model(path: str | os.PathLike[str]) -> ModelFile:
    """Read ``path`` once and check its extension against its content.

    An unknown extension, a missing or unreadable file, or content that is too short or of the
    other format raises ModelFormatError. Only the TFLite identifier is checked; a corrupt
    ONNX file is found by the backend.
    """
    path = Path(path)
    fmt = _EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise ModelFormatError(
            f"{path}: unknown model extension {path.suffix or '(none)'!r}; "
            f"edgesdk runs {', '.join(_EXTENSIONS)} files (rename the file if its extension is wrong)"
        )
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: model file not found; check the path") from None
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot read model file: {exc.strerror}") from exc
    if len(content) < 8:
        raise ModelFormatError(
            f"{path}: model file is {len(content)} bytes, too short to be a model; "
            "it is truncated or empty: copy it again"
        )
    if fmt is ModelFormat.ONNX and _looks_like_tflite(content):
        raise ModelFormatError(
            f"{path}: named .onnx but its content is a TFLite flatbuffer (identifier 'TFL3'); "
            "rename it to .tflite"
        )
    if fmt is ModelFormat.TFLITE and not _looks_like_tflite(content):
        raise ModelFormatError(
            f"{path}: named .tflite but has no TFLite identifier 'TFL3' at bytes 4..8 "
            f"(found {content[4:8]!r}); the file is corrupt, truncated at the start, or another format"
        )
    return ModelFile(path, fmt, content)
