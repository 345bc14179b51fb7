"""The agent's board-measurement service: "run this candidate model here and tell me how it does".

A verified ``measure`` command (:class:`~edgesdk.fleet.protocol.MeasureCommand`) is taken once
per measurement id. Its archive comes through the agent's :class:`~edgesdk.agent.downloads.Downloads`
into ``store/scratch/<measurement>/`` (never a slot), after the storage guard made room; once
it hashes right, the model is measured in a child process under this device's profile
(:func:`run_measurement`: its manifest verified first, with the bundles keys' threshold when the device has a
root of trust, as for an install, so the server's commands key alone never runs a model; then unpacked into the
scratch directory, only the one model and ``evaluation.npz`` the manifest lists, at their signed sizes and hashes;
measured by :mod:`edgesdk.runtime.measure_worker`), one measurement at a time, in a thread of its
own so the agent keeps serving. Every outcome (accepted, the figures, or failed with the
reason) goes out through ``publish``; the scratch directory is always removed. Slots,
pointers, state and the ManagedRuntime are never touched.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from edgesdk.agent.downloads import Downloads
from edgesdk.agent.storage_guard import StorageGuard
from edgesdk.agent.transfer import IncomingTransfer
from edgesdk.errors import EdgeSDKError, TransferError
from edgesdk.fleet.measurement import encode_result, unpack_measurement
from edgesdk.fleet.protocol import MeasureCommand
from edgesdk.runtime.measure_worker import EnergyRequest, measure_model
from edgesdk.runtime.profiles import DeviceProfile
from edgesdk.runtime.signing import KeySet

__all__ = ["MeasurementService", "run_measurement"]

log = logging.getLogger(__name__)


class MeasurementService:
    """Takes measure commands for one device and publishes their results.

    ``bundle_keys`` gives the keys a measurement archive's manifest must be signed with, asked at each measurement
    (the root's bundles role, as for installs); None: the signed command's archive hash is the only check (a
    device pinning one server key, or a development one).
    """

    def __init__(self, downloads: Downloads, guard: StorageGuard, profile: DeviceProfile,
                 publish: Callable[[bytes], None], on_pruned: Callable[[], None], timeout_s: float = 600.0,
                 energy: EnergyRequest | None = None, label: str = "agent",
                 bundle_keys: Callable[[], KeySet | None] = lambda: None) -> None:
        self.downloads = downloads
        self.bundle_keys = bundle_keys
        self.guard = guard
        self.profile = profile
        self.timeout_s = timeout_s
        self.energy = energy or EnergyRequest()
        self._publish = publish
        self._on_pruned = on_pruned  # the slots a device reports changed
        self._label = label
        #: Measurement ids taken on since start (a re-delivered command is not measured twice).
        self._seen: set[str] = set()
        self._measuring = threading.Lock()  # one measurement at a time: they would skew each other
        self._stopped = threading.Event()

    @property
    def scratch(self) -> Path:
        """Where measurement archives are fetched and unpacked: the store's ``scratch/``, never a slot."""
        return self.guard.store.scratch

    def accept(self, command: MeasureCommand) -> None:
        """Start fetching a measurement's archive, or refuse it when the disk has no room for it."""
        mid = command.measurement_id
        if mid in self._seen:
            return  # a re-delivered command: the first one is running or has reported
        self._seen.add(mid)
        room = self.guard.make_room(command.archive, f"measurement {mid}", command.transfer_id)
        if room.pruned or not room.fits:
            self._on_pruned()
        if room.error is not None:
            self._report(command, encode_result(mid, "failed", error=room.error))
            return
        scratch = self.scratch / mid
        scratch.mkdir()
        self.downloads.add(IncomingTransfer(scratch, command))
        self._report(command, encode_result(mid, "accepted"))

    def complete(self, transfer: IncomingTransfer, command: MeasureCommand) -> None:
        """The archive is complete: check its hash, then measure in a thread of its own."""
        try:
            archive = transfer.finish()
        except TransferError as exc:  # the signed hash does not match: no second try for a measurement
            self._fail(transfer, command, exc)
            return
        self.downloads.pop(command.transfer_id)
        transfer.close()
        threading.Thread(target=self._run, args=(command, archive), daemon=True,
                         name=f"measure-{command.measurement_id}").start()

    def expire(self) -> None:
        """Fail the measurements whose archive did not arrive within the timeout."""
        for transfer in self.downloads.overdue(MeasureCommand, self.timeout_s):
            assert isinstance(transfer.command, MeasureCommand)
            self._fail(transfer, transfer.command, TransferError(
                f"the archive did not arrive within {self.timeout_s:g} s; is the server still serving it?"))

    def stop(self) -> None:
        """Results of measurements still running are dropped (the agent is going offline)."""
        self._stopped.set()

    def _report(self, command: MeasureCommand, payload: bytes) -> None:
        log.info("%s: measurement %s: %s", self._label, command.measurement_id, json.loads(payload)["status"])
        self._publish(payload)

    def _fail(self, transfer: IncomingTransfer, command: MeasureCommand, error: EdgeSDKError) -> None:
        self.downloads.pop(command.transfer_id)
        transfer.discard()
        shutil.rmtree(self.scratch / command.measurement_id, ignore_errors=True)
        self._report(command, encode_result(command.measurement_id, "failed", error=error))

    def _run(self, command: MeasureCommand, archive: Path) -> None:
        scratch = self.scratch / command.measurement_id
        try:
            with self._measuring:
                payload = run_measurement(command, archive, scratch, self.profile, self.timeout_s, self.energy,
                                          self.bundle_keys())
        except Exception as exc:  # e.g. a full disk: report it rather than leave the server waiting
            log.exception("%s: measurement %s failed", self._label, command.measurement_id)
            payload = encode_result(command.measurement_id, "failed", error=exc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not self._stopped.is_set():
            self._report(command, payload)


def run_measurement(command: MeasureCommand, archive: Path, scratch: Path, profile: DeviceProfile,
                    timeout_s: float, energy: EnergyRequest | None = None, keys: KeySet | None = None) -> bytes:
    """Measure the model in ``archive`` and return the result message, ``done`` or ``failed``.

    ``scratch`` is an empty directory the caller removes afterwards; ``energy`` says where the
    board's power sensor is (the figures then carry the energy per inference where it has one).
    ``keys`` (the bundles role) must have signed the archive's manifest, checked before anything is
    unpacked or run: else the result is ``failed`` with the SignatureError.
    """
    try:
        model, evaluation = unpack_measurement(archive, scratch / "files", keys)
        archive.unlink()
        figures, outputs = measure_model(model, evaluation, profile, command.mode, command.runs, timeout_s=timeout_s,
                                         energy=energy)
    except EdgeSDKError as exc:
        return encode_result(command.measurement_id, "failed", error=exc)
    try:
        return encode_result(command.measurement_id, "done", figures=figures.as_dict(), outputs=outputs)
    except TransferError as exc:  # over the result size cap
        return encode_result(command.measurement_id, "failed", error=exc)
