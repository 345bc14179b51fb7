"""Measurements on one device: a signed measure command, its chunks, and the result.

:meth:`Measurements.request` checks that the device is known and online, signs a
``measure`` command for it alone (see :mod:`edgesdk.fleet.protocol`), and keeps the archive in
memory. When the device reports ``accepted`` the chunks are pushed on that device's own
chunk topic; its re-requests are answered for it and no other device. The ``done`` or
``failed`` message from ``P/devices/D/measurements`` ends the measurement, and
:meth:`Measurements.expire` fails one that has not reported in its time. Results live in
memory (the newest ``keep`` finished ones); requests and outcomes are also written to
the fleet's event log, without the outputs.

Statuses: ``sent`` -> ``accepted`` -> ``done`` | ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import EdgeSDKError, NotFoundError, ReportError, TransferError
from edgesdk.fleet.measurement import MAX_RESULT_BYTES, parse_result
from edgesdk.fleet.protocol import (
    MAX_ARCHIVE_BYTES,
    ArchiveInfo,
    Topics,
    archive_info,
    check_id,
    check_measure,
    sign_measure_command,
)
from edgesdk.ota_server.store.fleet_db import FleetDB

__all__ = ["Measurements", "MeasurementNotFound"]

log = logging.getLogger(__name__)

_FINISHED = ("done", "failed")


class MeasurementNotFound(NotFoundError):
    """No measurement with this id is kept by this server."""


@dataclass
class _Measurement:
    id: str
    device: str
    mode: str
    runs: int
    timeout_s: float
    data: bytes
    info: ArchiveInfo
    requested_at: float = field(default_factory=time.time)
    status: str = "sent"
    error: str | None = None
    error_type: str | None = None
    figures: dict[str, Any] | None = None
    outputs: dict[str, str] | None = None
    finished_at: float | None = None
    #: A chunk request for it was refused (logged once).
    refused: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The API's JSON for this measurement (figures and outputs only once ``done``)."""
        view: dict[str, Any] = {"id": self.id, "device": self.device, "mode": self.mode, "runs": self.runs,
                                "status": self.status, "requested_at": self.requested_at,
                                "finished_at": self.finished_at, "archive_bytes": self.info.size}
        if self.error is not None:
            view["error"], view["error_type"] = self.error, self.error_type
        if self.status == "done":
            view["figures"], view["outputs"] = self.figures, self.outputs
        return view


class Measurements:
    """Measurement requests of one OTA server; ``publish`` sends on its MQTT connection."""

    def __init__(self, publish: Callable[[str, bytes], None], signing_key: Any, db: FleetDB,
                 timeout_s: float = 600.0, keep: int = 100, max_result_bytes: int = MAX_RESULT_BYTES,
                 on_refused: Callable[[str, str, ReportError], None] | None = None,
                 on_stranger: Callable[[], None] = lambda: None,
                 admit: Callable[[str], bool] = lambda device: True) -> None:
        if keep < 1:
            raise TransferError(f"keep={keep} must be at least 1: a finished measurement must stay readable")
        self._publish, self._key, self._db = publish, signing_key, db
        self.timeout_s, self.keep, self.max_result_bytes = timeout_s, keep, max_result_bytes
        self._items: dict[str, _Measurement] = {}
        self._lock = threading.Lock()
        #: Chunk requests dropped: from another device than the measurement's, or after it ended (logged once each).
        self.refused = 0
        #: Called with (device, "measurement", error) for each malformed result (the server counts and logs it).
        self._on_refused = on_refused
        #: Called for each chunk request from another device than the measurement's (the server counts it).
        self._on_stranger = on_stranger
        #: Whether a result message of this device is read now (the server's per-device rate limit): a device with a
        #: measurement running could otherwise make the server parse results of up to 32 MiB as fast as it sends.
        self._admit = admit

    def request(self, device_id: str, archive: bytes, mode: str, runs: int, timeout_s: float | None = None) -> str:
        """Send ``archive`` (see :func:`edgesdk.fleet.measurement.pack_measurement`) to one online device; its id."""
        check_id(device_id, "device id")
        check_measure(mode, runs)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if not timeout_s > 0:
            raise TransferError(f"measurement timeout {timeout_s!r} s must be positive")
        if not 0 < len(archive) <= MAX_ARCHIVE_BYTES:
            raise TransferError(f"measurement archive of {len(archive)} bytes must be 1..{MAX_ARCHIVE_BYTES} bytes; "
                                "pack it with edgesdk.fleet.measurement.pack_measurement")
        device = self._db.device(device_id)
        if device is None:
            raise TransferError(f"no device {device_id!r} has reported to this server; check the id with "
                                "`edgesdk devices`")
        if device.status != "online":
            raise TransferError(f"device {device_id!r} is {device.status}; start its agent, then ask again")
        mid = f"m{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
        info = archive_info(archive)
        envelope = sign_measure_command(self._key, measurement_id=mid, transfer_id=mid, archive=info, mode=mode,
                                        runs=runs, device=device_id)
        with self._lock:
            self._items[mid] = _Measurement(mid, device_id, mode, runs, timeout_s, archive, info)
        self._db.log("measurement_requested", {"id": mid, "mode": mode, "runs": runs, "bytes": info.size},
                     device_id=device_id)
        self._publish(Topics.cmd(device_id), envelope)
        return mid

    def status(self, measurement_id: str) -> dict[str, Any]:
        """The measurement's status; with figures and base64 ``.npy`` outputs once ``done``."""
        with self._lock:
            item = self._items.get(measurement_id)
            if item is None:
                raise MeasurementNotFound(f"no measurement {measurement_id!r} on this server (it keeps the newest "
                                          f"{self.keep} finished ones, in memory); request it again")
            return item.as_dict()

    # MQTT --------------------------------------------------------------------------------
    def on_result(self, topic: str, payload: bytes) -> None:
        """Handler for ``P/devices/+/measurements``.

        A message from a device with no measurement running here is dropped unparsed: results are the
        largest device messages (up to 32 MiB), and a device must not make the server parse them at will.
        """
        with self._lock:
            expected = any(m.device == Topics.device_of(topic) and m.status not in _FINISHED
                           for m in self._items.values())
        if not expected or not self._admit(Topics.device_of(topic)):
            return
        try:
            device = check_id(Topics.device_of(topic), "device id")
            message = parse_result(payload, self.max_result_bytes)
        except EdgeSDKError as exc:
            if isinstance(exc, ReportError) and self._on_refused is not None:
                self._on_refused(Topics.device_of(topic)[:64], "measurement", exc)
            else:
                log.warning("ignoring measurement message on %s: %s", topic, exc)
            if len(payload) > self.max_result_bytes:
                self._fail_only_one_in_flight(Topics.device_of(topic), str(exc))
            return
        with self._lock:
            item = self._items.get(message["measurement_id"])
            if item is None or item.device != device or item.status in _FINISHED:
                return
            if message["status"] == "accepted":
                if item.status == "sent":  # a re-delivered "accepted" does not push the archive twice
                    item.status = "accepted"
                    threading.Thread(target=self._push, args=(item,), daemon=True, name=f"push-{item.id}").start()
                return
            item.status = message["status"]
            item.error, item.error_type = message.get("error"), message.get("error_type")
            item.figures, item.outputs = message.get("figures"), message.get("outputs")
        self._finish(item)

    def serve(self, device: str, transfer_id: str, indices: Iterable[int]) -> bool:
        """Answer a chunk request if ``transfer_id`` is a measurement's; True when it was one."""
        with self._lock:
            item = self._items.get(transfer_id)
        if item is None:
            return False
        if item.device != device or item.status in _FINISHED:
            if item.device != device:
                self._on_stranger()
            with self._lock:
                self.refused += 1
                first, item.refused = not item.refused, True
            if first:
                log.warning("refusing chunks of measurement %s (for %s, %s) to %s; further refusals are only counted",
                            transfer_id, item.device, item.status, device)
            return True
        for index in indices:
            if 0 <= index < len(item.info.chunks):
                self._send_chunk(item, index)
        return True

    def expire(self) -> None:
        """Fail measurements that did not report within their timeout."""
        now = time.time()
        with self._lock:
            late = [m for m in self._items.values() if m.status not in _FINISHED and now - m.requested_at > m.timeout_s]
            for item in late:
                item.error = (f"device {item.device!r} did not report measurement {item.id} within "
                              f"{item.timeout_s:g} s (last status: {item.status}); check its agent is running and "
                              "verifies this server's key, or allow a longer timeout")
                item.status, item.error_type = "failed", "TransferError"
        for item in late:
            self._finish(item)

    # internals ---------------------------------------------------------------------------
    def _push(self, item: _Measurement) -> None:
        for index in range(len(item.info.chunks)):
            if item.status in _FINISHED:
                return
            self._send_chunk(item, index)

    def _send_chunk(self, item: _Measurement, index: int) -> None:
        start, end = item.info.chunk_range(index)
        self._publish(f"{Topics.device_chunks(item.device, item.id)}/{index}", item.data[start:end])

    def _fail_only_one_in_flight(self, device: str, reason: str) -> None:
        """An unreadable (oversized) result names no id: fail the device's measurement if only one is running."""
        with self._lock:
            running = [m for m in self._items.values() if m.device == device and m.status == "accepted"]
            if len(running) != 1:
                return
            running[0].status, running[0].error, running[0].error_type = "failed", reason, "TransferError"
        self._finish(running[0])

    def _finish(self, item: _Measurement) -> None:
        with self._lock:
            item.finished_at, item.data = time.time(), b""
            finished = sorted((m for m in self._items.values() if m.status in _FINISHED),
                              key=lambda m: m.finished_at or 0.0)
            for old in finished[:-self.keep]:
                del self._items[old.id]
        details: dict[str, Any] = {"id": item.id}
        if item.status == "done":
            details["figures"] = item.figures
        else:
            details["error"] = item.error
        self._db.log(f"measurement_{item.status}", details, device_id=item.device)
        log.info("measurement %s on %s: %s %s", item.id, item.device, item.status, item.error or "")
