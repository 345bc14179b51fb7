"""The measurement messages: the archive a measure command carries and the results a device sends back.

A measure command (:func:`edgesdk.fleet.protocol.sign_measure_command`) carries an archive
(:func:`pack_measurement`): an uncompressed tar of exactly one model file (``*.onnx`` or
``*.tflite``), ``evaluation.npz`` (input name -> batch-first array) and a manifest listing both with
their sha256 and size, signed by the bundles role's keys (``signature.json``). The device verifies the
manifest before it writes a byte (:func:`unpack_measurement`: a device with a root of trust needs the
bundles threshold), measures in a child process, and answers on ``P/devices/D/measurements``::

    {"measurement_id", "status": "accepted"}                       the command verified
    {"measurement_id", "status": "failed", "error", "error_type"}   anything went wrong
    {"measurement_id", "status": "done", "figures": {latency_p50_ms, latency_p90_ms,
     latency_p95_ms, latency_p99_ms, load_ms, rss_before_mb, peak_rss_mb, threads, backend,
     accelerator, sha256, size_bytes, profile, mode, runs}, "outputs": {name: b64(.npy bytes)}}

``error_type`` names the edgesdk error class (``TransferError`` when the archive did not
arrive intact, ``BackendError`` when the model did not run, ...). A result message is at
most :data:`MAX_RESULT_BYTES`; the device refuses to send a larger one (it reports
``failed`` instead) and the server refuses to read one.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import tokenize
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import DataError, ReportError, TransferError
from edgesdk.fleet.archive import pack_signed, parse_signed_manifest, unpack_signed
from edgesdk.fleet.reports import MAX_ITEMS, cut_text, loads, plain, report_id
from edgesdk.runtime.bundle import FileEntry, safe_name

__all__ = ["pack_measurement", "unpack_measurement", "measurement_files", "encode_result", "parse_result", "encode_array",
           "decode_array", "MAX_RESULT_BYTES", "EVALUATION_FILE"]

#: Largest measurement result message (JSON, outputs included) either side accepts.
MAX_RESULT_BYTES = 32 * 1024**2
#: Name of the evaluation inputs inside a measurement archive.
EVALUATION_FILE = "evaluation.npz"
_MODEL_SUFFIXES = (".onnx", ".tflite")


def pack_measurement(model: str | os.PathLike[str], evaluation: Mapping[str, np.ndarray],
                     sign_keys: Iterable[Any] = ()) -> bytes:
    """The archive of a measure command: ``model`` (.onnx/.tflite), ``evaluation.npz`` and a manifest listing both
    with their sha256 and size (``"type": "measurement"``), signed by each of ``sign_keys``.

    ``sign_keys`` are Ed25519 private keys of the fleet root's ``bundles`` role: a device with a root of trust
    measures only an archive a threshold of them signed, as it installs only such bundles (the server's
    commands key alone never runs a model there). Without keys the archive is unsigned, which only a device
    pinning a single server key (whose signed command names the archive's hash) or a development one takes.
    """
    model = Path(model)
    if model.suffix not in _MODEL_SUFFIXES or not model.is_file():
        raise TransferError(f"{model}: a measurement needs an existing .onnx or .tflite model file")
    lengths = {name: len(array) for name, array in evaluation.items() if np.ndim(array) > 0}
    if not evaluation or len(lengths) != len(evaluation) or 0 in lengths.values() or len(set(lengths.values())) != 1:
        raise DataError(f"evaluation data {lengths or dict(evaluation)} must map each input name to a non-empty, "
                        "batch-first array, all with the same number of samples")
    npz = io.BytesIO()
    np.savez(npz, **{name: np.asarray(array) for name, array in evaluation.items()})  # type: ignore[arg-type]
    name = safe_name(model.name, "model file")
    return pack_signed("measurement", {name: model, EVALUATION_FILE: npz.getvalue()}, sign_keys, model_file=name)


def _measurement_manifest(data: bytes) -> tuple[dict[str, FileEntry], str]:
    """The files of a measurement manifest, checked to be one model and ``evaluation.npz`` before any is written."""
    _, files = parse_signed_manifest(data, "measurement")
    names = sorted(files)
    models = [n for n in names if Path(n).suffix in _MODEL_SUFFIXES]
    if len(models) != 1 or sorted([*models, EVALUATION_FILE]) != names:
        raise TransferError(f"measurement manifest lists {names}; it must list exactly one .onnx or .tflite model "
                            f"and {EVALUATION_FILE} (pack it with edgesdk.fleet.measurement.pack_measurement)")
    return files, f"the measurement archive of {models[0]}"


def unpack_measurement(archive: str | os.PathLike[str], target: str | os.PathLike[str],
                       keys: Any = None) -> tuple[Path, Path]:
    """Verify a measurement archive's manifest (with ``keys``, e.g. the root's bundles role: their threshold of
    signatures), then unpack its model and evaluation file into ``target``; returns their paths.

    Verify, then unpack, as for bundles (:func:`edgesdk.fleet.archive.unpack_signed`): an archive below the
    threshold, with a member its manifest does not list, or a link or sparse member, writes nothing.
    """
    unpack_signed(archive, target, _measurement_manifest, keys, keep_meta=False)
    return measurement_files(target)


def measurement_files(directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The model file and evaluation file of an unpacked measurement archive, checked to be exactly those."""
    names = sorted(p.name for p in Path(directory).iterdir())
    models = [n for n in names if Path(n).suffix in _MODEL_SUFFIXES]
    if len(models) != 1 or sorted([*models, EVALUATION_FILE]) != names:
        raise TransferError(f"measurement archive holds {names}; it must hold exactly one .onnx or .tflite model and "
                            f"{EVALUATION_FILE} (pack it with edgesdk.fleet.measurement.pack_measurement)")
    return Path(directory) / models[0], Path(directory) / EVALUATION_FILE


def encode_array(array: np.ndarray) -> str:
    """An array as base64 of its ``.npy`` bytes (dtype and shape kept, no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def decode_array(text: str) -> np.ndarray:
    """The inverse of :func:`encode_array`; malformed input raises TransferError.

    The ``.npy`` header is read and checked against the bytes that follow before any array exists: numpy's own
    loader allocates whatever shape a header claims, and parses the header with Python's tokenizer.
    """
    from numpy.lib import format as npy

    try:
        data = base64.b64decode(text, validate=True)
        header = io.BytesIO(data)
        major, _ = npy.read_magic(header)
        read = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
        shape, fortran, dtype = read(header, max_header_size=4096)
        count = math.prod(shape)
        if dtype.hasobject or count * dtype.itemsize != len(data) - header.tell():
            raise ValueError(f"header says {shape} of {dtype} after {header.tell()} bytes, the data has {len(data)}")
        flat = np.frombuffer(data, dtype=dtype, count=count, offset=header.tell())
        return flat.reshape(shape, order="F" if fortran else "C").copy()
    except (ValueError, TypeError, OSError, SyntaxError, EOFError, tokenize.TokenError) as exc:
        raise TransferError(f"a measured output is not base64 .npy data ({exc}); the device sent a corrupt result") \
            from exc


def encode_result(measurement_id: str, status: str, *, error: Exception | None = None,
                  figures: Mapping[str, Any] | None = None, outputs: Mapping[str, np.ndarray] | None = None,
                  max_size: int = MAX_RESULT_BYTES) -> bytes:
    """A measurement message for ``P/devices/D/measurements``; over ``max_size`` bytes raises TransferError."""
    message: dict[str, Any] = {"measurement_id": measurement_id, "status": status}
    if error is not None:
        message["error"], message["error_type"] = str(error), type(error).__name__
    if figures is not None:
        message["figures"] = dict(figures)
    if outputs is not None:
        message["outputs"] = {name: encode_array(array) for name, array in outputs.items()}
    payload = json.dumps(message).encode()
    if len(payload) > max_size:
        raise TransferError(f"measurement result of {len(payload)} bytes is over the {max_size}-byte cap; measure "
                            "with fewer evaluation samples")
    return payload


def parse_result(payload: bytes, max_size: int = MAX_RESULT_BYTES) -> dict[str, Any]:
    """Check a measurement message (size first, then every field) and return it as a dict.

    Anything malformed raises :class:`~edgesdk.errors.ReportError` (a TransferError) with its ``reason`` and
    ``field``: not JSON, a field missing or of the wrong type, figures out of the bounds of
    :func:`edgesdk.fleet.reports.plain`, more than ``MAX_ITEMS`` outputs. ``error`` is cut to
    ``MAX_REASON_CHARS`` characters rather than refused (a failure must still be reported).
    """
    if len(payload) > max_size:
        raise ReportError(f"measurement result of {len(payload)} bytes is over the {max_size}-byte cap; ignored",
                          reason="length")
    message = loads(payload, "measurement result", max_size)
    if not isinstance(message, dict):
        raise ReportError(f"the measurement result {str(message)[:80]!r} must be a JSON object", reason="type")
    for key in ("measurement_id", "status"):
        if key not in message:
            raise ReportError(f"the measurement result has no {key}; the device sent a malformed result",
                              reason="missing", field=key)
    checked: dict[str, Any] = {"measurement_id": report_id(message["measurement_id"], "measurement_id")}
    status = checked["status"] = message["status"]
    if status not in ("accepted", "done", "failed"):
        raise ReportError(f"measurement status {str(status)[:80]!r} is not accepted, done or failed",
                          reason="range" if isinstance(status, str) else "type", field="status")
    if status == "failed":
        if "error" not in message:
            raise ReportError("a failed measurement result has no error", reason="missing", field="error")
        checked["error"] = cut_text(message["error"], "error") or ""
        error_type = message.get("error_type") or ""
        checked["error_type"] = report_id(error_type, "error_type") if error_type else ""
    if status == "done":
        checked["figures"], checked["outputs"] = _figures(message.get("figures")), _outputs(message.get("outputs"))
    return checked


def _figures(figures: Any) -> dict[str, Any]:
    if not isinstance(figures, dict):
        raise ReportError(f"a done measurement needs a figures object, not {str(figures)[:80]!r}", reason="type",
                          field="figures")
    return dict(plain(figures, "figures"))


def _outputs(outputs: Any) -> dict[str, str]:
    if not isinstance(outputs, dict):
        raise ReportError(f"a done measurement needs an outputs object, not {str(outputs)[:80]!r}", reason="type",
                          field="outputs")
    if len(outputs) > MAX_ITEMS:
        raise ReportError(f"a measurement result names {len(outputs)} outputs; at most {MAX_ITEMS} are read",
                          reason="length", field="outputs")
    for name, text in outputs.items():
        if len(name) > 256 or not isinstance(text, str):
            raise ReportError(f"output {name[:80]!r} must have a name of at most 256 characters and base64 .npy text",
                              reason="length" if len(name) > 256 else "type", field="outputs")
    return dict(outputs)
