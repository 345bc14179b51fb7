"""Measuring a model variant on a real board of the fleet, through the OTA server.

:func:`measure_on_device` packs the model and the evaluation inputs
(:func:`edgesdk.fleet.measurement.pack_measurement`, signed with the keys of the fleet root's ``bundles``
role: a device with a root of trust measures only what their threshold signed, as it installs), asks the
server's admin API to have one device measure them (the signed OTA ``measure`` command: the device fetches the archive into a
scratch directory, measures it in a child process under its own profile, and never
installs it), and polls until the figures and outputs come back.

>>> client = AdminClient("http://127.0.0.1:8080", token)                 # doctest: +SKIP
>>> m = measure_on_device(client, "cam01", Path("variant.onnx"), {"input": x}, "latency", sign_keys=[ci_key])
>>> m.latency_p50_ms, m.peak_rss_mb, m.outputs["probabilities"].shape
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import BundleError, ConversionError, EdgeSDKError, SignatureError, TransferError
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.measurement import decode_array, pack_measurement

__all__ = ["RemoteMeasurement", "measure_on_device", "board_measure"]

#: Failures a device reports that concern the archive's way there rather than the model.
_TRANSFER_ERRORS = {cls.__name__ for cls in (TransferError, BundleError, SignatureError)}


@dataclass(frozen=True)
class RemoteMeasurement:
    """What one device of the fleet measured for one model, and its outputs on the evaluation data."""

    device: str
    #: Name of the device profile the board ran the model under.
    profile: str
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    load_ms: float
    rss_before_mb: float
    peak_rss_mb: float
    threads: int
    backend: str
    accelerator: str
    #: SHA-256 of the model bytes the device loaded.
    sha256: str
    #: Every output by name, batch-first over the evaluation samples.
    outputs: dict[str, np.ndarray]
    #: What the board's power sensor measured (``edgesdk.runtime.energy.EnergyResult.as_dict()``), or None without a sensor.
    energy: dict[str, Any] | None = None

    @property
    def energy_mj(self) -> float | None:
        """Energy per inference above idle (mJ), measured by the board's sensor; None without one."""
        value = (self.energy or {}).get("energy_per_inference_mj")
        return None if value is None else float(value)

    @property
    def energy_basis(self) -> str:
        """``measured on board (ina3221-iio, module scope)``, or "" without a sensor."""
        if self.energy_mj is None or self.energy is None:
            return ""
        return f"measured on board ({self.energy.get('sensor')}, {self.energy.get('scope')} scope)"

    @property
    def model_memory_mb(self) -> float:
        """Peak resident memory attributable to the loaded, running model on the device."""
        return max(0.0, self.peak_rss_mb - self.rss_before_mb)


def measure_on_device(client: AdminClient, device: str, model: Path, evaluation: Mapping[str, np.ndarray],
                      mode: str, runs: int = 50, timeout_s: float = 600, poll_s: float = 0.5,
                      sign_keys: Sequence[Any] = ()) -> RemoteMeasurement:
    """Have ``device`` measure ``model`` (.onnx/.tflite) on ``evaluation`` in power mode ``mode``.

    ``runs`` timed single-sample predictions follow a warm-up; ``evaluation`` maps each
    input name to a batch-first array. ``sign_keys`` (Ed25519 private keys of the root's
    ``bundles`` role, as many as its threshold) sign the archive's manifest: a device with a
    root of trust refuses an archive without them (a ``TransferError`` naming the signatures),
    before it writes or runs anything. The server fails the measurement if the device has
    not answered within ``timeout_s``. Raises :class:`TransferError` when the server or
    device cannot be reached, the device is unknown or offline, the archive did not arrive
    intact, or time ran out; :class:`ConversionError` when the model did not run there.
    """
    model = Path(model)
    archive = pack_measurement(model, evaluation, sign_keys)
    where = f"measuring {model.name} on {device!r}"
    deadline = time.monotonic() + timeout_s
    try:
        measurement_id = client.request_measurement(device, archive, mode, runs, timeout_s=timeout_s)
        status = client.measurement(measurement_id)
        while status["status"] not in ("done", "failed"):
            if time.monotonic() > deadline:
                raise TransferError(f"{where}: no result within {timeout_s:g} s (measurement {measurement_id} is "
                                    f"{status['status']}); check the device's agent or pass a longer timeout_s")
            time.sleep(poll_s)
            status = client.measurement(measurement_id)
    except (TransferError, ConversionError):
        raise
    except EdgeSDKError as exc:
        raise TransferError(f"{where}: {exc}") from exc
    if status["status"] == "failed":
        kind = TransferError if status.get("error_type") in _TRANSFER_ERRORS else ConversionError
        raise kind(f"{where} failed: {status.get('error')}")
    return _result(device, status)


def _result(device: str, status: Mapping[str, Any]) -> RemoteMeasurement:
    try:
        f = status["figures"]
        return RemoteMeasurement(
            device=device, profile=str(f["profile"]), latency_p50_ms=float(f["latency_p50_ms"]),
            latency_p90_ms=float(f["latency_p90_ms"]), latency_p99_ms=float(f["latency_p99_ms"]),
            load_ms=float(f["load_ms"]), rss_before_mb=float(f["rss_before_mb"]),
            peak_rss_mb=float(f["peak_rss_mb"]), threads=int(f["threads"]), backend=str(f["backend"]),
            accelerator=str(f["accelerator"]), sha256=str(f["sha256"]),
            outputs={name: decode_array(text) for name, text in status["outputs"].items()},
            energy=f.get("energy") if isinstance(f.get("energy"), dict) else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise TransferError(f"measurement of {device!r} came back without figure {exc}; is the device's edgesdk "
                            "older than the server's?") from exc


def board_measure(client: AdminClient, device: str, mode: str, runs: int = 50, timeout_s: float = 600,
                  sign_keys: Sequence[Any] = ()) -> Callable[[Path, Mapping[str, np.ndarray]], RemoteMeasurement]:
    """A ``measure_on`` for :func:`~edgesdk.converters.pipeline.convert`: each variant goes to ``device`` via the OTA server.

    The device runs it with :class:`edgesdk.Runtime` under ``mode`` (a signed measurement
    command; the variant is never installed) and returns latency, memory and outputs.
    ``sign_keys`` sign each variant's archive (see :func:`measure_on_device`).
    """
    # Checked now, not after the first variant's minutes of work.
    row = next((d for d in client.devices() if d.id == device), None)
    if row is None or row.status == "offline":
        state = "is not in the fleet" if row is None else "is offline"
        raise TransferError(f"--measure-on {device}: the device {state} on {client.url}; start its agent "
                            "(edgesdk agent ...) or pick an online device from `edgesdk devices`")
    keys = tuple(sign_keys)
    return lambda model, evaluation: measure_on_device(client, device, model, evaluation, mode, runs, timeout_s,
                                                       sign_keys=keys)
