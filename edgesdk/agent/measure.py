"""The device side of the OTA ``measure`` command, once its archive is here and verified.

Unpack the archive into the measurement's scratch directory (never a model store slot),
check it holds one model and ``evaluation.npz``, measure the model in a child process
(:mod:`edgesdk.runtime.measure_worker`) under this device's profile and the command's mode, and
turn the figures and outputs into the result message. Nothing here touches the store's
slots, its pointers or a :class:`~edgesdk.agent.managed.ManagedRuntime`.
"""

from __future__ import annotations

from pathlib import Path

from edgesdk.errors import EdgeSDKError, TransferError
from edgesdk.fleet.protocol import MeasureCommand, encode_result, measurement_files, unpack_bundle
from edgesdk.runtime.measure_worker import EnergyRequest, measure_model
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["run_measurement"]


def run_measurement(command: MeasureCommand, archive: Path, scratch: Path, profile: DeviceProfile,
                    timeout_s: float, energy: EnergyRequest | None = None) -> bytes:
    """Measure the model in ``archive`` and return the result message, ``done`` or ``failed``.

    ``scratch`` is an empty directory the caller removes afterwards; ``energy`` says where the
    board's power sensor is (the figures then carry the energy per inference where it has one).
    """
    try:
        files = scratch / "files"
        unpack_bundle(archive, files)
        archive.unlink()
        model, evaluation = measurement_files(files)
        figures, outputs = measure_model(model, evaluation, profile, command.mode, command.runs, timeout_s=timeout_s,
                                         energy=energy)
    except EdgeSDKError as exc:
        return encode_result(command.measurement_id, "failed", error=exc)
    try:
        return encode_result(command.measurement_id, "done", figures=figures.as_dict(), outputs=outputs)
    except TransferError as exc:  # over the result size cap
        return encode_result(command.measurement_id, "failed", error=exc)
