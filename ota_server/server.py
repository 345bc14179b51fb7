"""The OTA server: MQTT ingest and dispatch around the rollout engine, the chunk service and measurements.

Devices announce themselves on their retained state topic; their events move their
targets (:mod:`edgesdk.ota_server.engine` decides what happens next); chunk requests are
answered by the chunk service (:mod:`edgesdk.ota_server.chunks`) on the requesting
device's own topic. The server is the engine's dispatcher: it signs each command,
publishes it, re-sends it while unacknowledged, and broadcasts a stage's archive once to
the group. A measurement (:mod:`edgesdk.ota_server.measurements`) sends a candidate model
to one device to be measured there and never installed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet_protocol import AgentEvent, RolloutPolicy, RolloutRecord, RolloutState, TargetRecord
from edgesdk.ota import ArchiveInfo, Topics, check_id, sign_command
from edgesdk.ota_server.chunks import ChunkDistributor
from edgesdk.ota_server.engine import RolloutEngine
from edgesdk.ota_server.fleet import FleetDB
from edgesdk.ota_server.measurements import Measurements
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.transport import MqttTransport, Transport

__all__ = ["OTAServer", "ServerConfig"]

log = logging.getLogger(__name__)

#: Device state, event and chunk-request messages are small JSON; anything larger is refused unparsed.
MAX_REPORT_BYTES = 64 * 1024


def _too_large(topic: str, payload: bytes) -> bool:
    """True (and a warning naming the device) for a report too large to be a real one; it is never parsed."""
    if len(payload) <= MAX_REPORT_BYTES:
        return False
    parts = topic.split("/")
    device, kind = (parts[2], parts[3]) if len(parts) > 3 else (topic, "message")
    log.warning("ignoring a %d-byte %s from device %s (topic %s): device reports are at most %d bytes",
                len(payload), kind, device, topic, MAX_REPORT_BYTES)
    return True


@dataclass(frozen=True)
class ServerConfig:
    """How the server reaches its broker, and the timings of its rollout engine."""

    broker: str
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    tick_s: float = 0.2
    #: Broadcast after every target accepted, or after this long (late devices pull what they miss).
    broadcast_wait_s: float = 2.0
    #: Re-send a command a device has not acknowledged after this long (a broker restart can drop it).
    resend_s: float = 3.0
    #: A measurement that has no result after this long fails (request_measurement can ask for another).
    measure_timeout_s: float = 600.0
    #: The KServe V2 endpoint (as devices reach it) that deploy commands hand to devices for cloud offload;
    #: it must serve this repository (``edgesdk server --inference``). None: commands name no endpoint.
    offload_url: str | None = None


class OTAServer:
    """Fleet state, rollouts, the chunk service and measurements over one MQTT connection."""

    def __init__(self, config: ServerConfig, repository: ModelRepository, db: FleetDB, signing_key: Any,
                 transport_factory: Any = MqttTransport) -> None:
        self.config, self.repo, self.db, self.key = config, repository, db, signing_key
        self._transport_factory = transport_factory
        self.transport: Transport | None = None
        self._stop = threading.Event()
        self._engine_thread: threading.Thread | None = None
        self._accepted: dict[str, set[str]] = defaultdict(set)
        #: Bytes published, for tests and benchmarks.
        self.bytes_published = 0
        self._envelopes: dict[tuple[str, str], tuple[bytes, float]] = {}
        self.chunks = ChunkDistributor(repository.archive, self._publish)
        self.engine = RolloutEngine(db, self)
        self.measurements = Measurements(self._publish, signing_key, db, timeout_s=config.measure_timeout_s)

    @property
    def resent(self) -> dict[tuple[str, str], list[int]]:
        """(device, transfer) -> chunk indices re-sent on request (for tests and benchmarks)."""
        return self.chunks.resent

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> OTAServer:
        """Connect to the broker, subscribe to the devices' topics and start the rollout engine."""
        cfg = self.config
        self.transport = self._transport_factory(cfg.broker, client_id=f"edgesdk-server-{uuid.uuid4().hex[:8]}",
                                                 username=cfg.username, password=cfg.password, ca_file=cfg.ca_file)
        self.transport.subscribe(Topics.ALL_STATES, self._on_state)
        self.transport.subscribe(Topics.ALL_EVENTS, self._on_event)
        self.transport.subscribe(Topics.ALL_NEEDS, self._on_need)
        self.transport.subscribe(Topics.ALL_MEASUREMENTS, self.measurements.on_result)
        self._engine_thread = threading.Thread(target=self._run, name="rollout-engine", daemon=True)
        self._engine_thread.start()
        return self

    def stop(self) -> None:
        """Stop the rollout engine and disconnect (rollouts resume from the fleet DB on the next start)."""
        self._stop.set()
        if self._engine_thread:
            self._engine_thread.join(timeout=5)
        if self.transport:
            self.transport.close()

    def _run(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            self.measurements.expire()
            self.engine.tick()

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        assert self.transport is not None
        self.bytes_published += len(payload)
        self.transport.publish(topic, payload, qos=1, retain=retain)

    # MQTT handlers -------------------------------------------------------------------------
    def _on_state(self, topic: str, payload: bytes) -> None:
        if _too_large(topic, payload):
            return
        try:
            device = check_id(Topics.device_of(topic), "device id")
            state = json.loads(payload)
            self.db.upsert_device(device, check_id(state.get("group", "default"), "group"), str(state["status"]),
                                  state.get("model"), state.get("version"), list(state.get("slots", [])))
        except (EdgeSDKError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed state on %s: %s", topic, exc)

    def _on_event(self, topic: str, payload: bytes) -> None:
        if _too_large(topic, payload):
            return
        try:
            device = check_id(Topics.device_of(topic), "device id")
            event = json.loads(payload)
            kind = str(event["event"])
        except (EdgeSDKError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed event on %s: %s", topic, exc)
            return
        deployment = str(event.get("deployment_id") or "")
        rollout_id = deployment.removesuffix("-rollback")
        self.db.log(kind, event, device_id=device, rollout_id=rollout_id or None)
        if rollout_id and kind == AgentEvent.ACCEPTED:
            self._accepted[rollout_id].add(device)
        self.engine.on_event(device, kind, deployment, event.get("reason"))

    def _on_need(self, topic: str, payload: bytes) -> None:
        if _too_large(topic, payload):
            return
        try:
            device = check_id(Topics.device_of(topic), "device id")
            request = json.loads(payload)
            transfer_id = check_id(request["transfer_id"], "transfer id")
            indices = [int(i) for i in request["chunks"]][:256]
        except (EdgeSDKError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed chunk request on %s: %s", topic, exc)
            return
        if not self.chunks.serve(device, transfer_id, indices):
            self.measurements.serve(device, transfer_id, indices)

    # the admin API's operations ------------------------------------------------------------------
    def upload(self, archive: bytes) -> dict[str, Any]:
        """Store a bundle tar; ``stored`` is False when the identical bundle was already there."""
        manifest, stored = self.repo.add_archive(archive)
        if stored:
            self.repo.apply_policy(in_use=self._in_use())
            log.info("stored bundle %s %s", manifest.name, manifest.version)
        return {"name": manifest.name, "version": manifest.version, "stored": stored}

    def _in_use(self) -> set[tuple[str, str]]:
        used = {(d.model, d.version) for d in self.db.devices() if d.model and d.version}
        used |= {(r.model, r.version) for r in self.db.rollouts(RolloutState.RUNNING)}
        return used

    def start_rollout(self, name: str, version: str, group: str, policy: RolloutPolicy | None = None,
                      rollback: bool = False) -> str:
        """Start a rollout of a stored version to ``group`` (see :meth:`RolloutEngine.start`); its id."""
        self.repo.path(name, version)  # NotFoundError for a version the repository does not hold
        return self.engine.start(name, version, group, policy, rollback)

    def promote(self, rollout_id: str) -> None:
        """Send the next stage now, without waiting for the health window."""
        self.engine.promote(rollout_id)

    def abort(self, rollout_id: str, reason: str = "aborted by operator") -> None:
        """Stop a running rollout and send its updated devices back to their previous version."""
        self.engine.abort(rollout_id, reason)

    def rollback(self, rollout_id: str, to_version: str | None = None) -> str:
        """Roll a rollout's group back with a signed rollback, as a new rollout; its id."""
        return self.engine.rollback(rollout_id, to_version)

    def status(self, rollout_id: str) -> RolloutRecord:
        """A rollout with its targets; NotFoundError for an unknown id."""
        return self.engine.status(rollout_id)

    def request_measurement(self, device_id: str, archive: bytes, mode: str, runs: int,
                            timeout_s: float | None = None) -> str:
        """Have one online device measure the model in ``archive`` (never installing it); the measurement id.

        ``archive`` comes from :func:`edgesdk.ota.pack_measurement`; ``timeout_s`` defaults
        to the config's ``measure_timeout_s``. An unknown or offline device raises TransferError.
        """
        return self.measurements.request(device_id, archive, mode, runs, timeout_s)

    def measurement(self, measurement_id: str) -> dict[str, Any]:
        """Status of a measurement; figures and outputs (base64 ``.npy``) once it is done."""
        return self.measurements.status(measurement_id)

    # the engine's dispatcher -----------------------------------------------------------------------
    def _command(self, r: RolloutRecord, rollback: bool, deployment_id: str, version: str, transfer_id: str,
                 archive: ArchiveInfo | None) -> bytes:
        kind = "deploy" if archive is not None else "rollback"
        return sign_command(self.key, type=kind, deployment_id=deployment_id, transfer_id=transfer_id, name=r.model,
                            version=version, group=r.group, rollback=rollback, archive=archive,
                            offload_url=self.config.offload_url)

    def _slots(self, device_id: str) -> tuple[str, ...]:
        device = self.db.device(device_id)
        return device.slots if device else ()

    def send_stage(self, rollout: RolloutRecord, stage: int, targets: list[TargetRecord]) -> None:
        """Sign and publish the stage's commands; broadcast its archive once the targets accepted (or soon)."""
        r = rollout
        transfer_id = f"{r.id}-w{stage}"
        info = self.chunks.open(transfer_id, r.model, r.version)
        slot = f"{r.model}-{r.version}"
        needs_download = []
        for t in targets:
            has_slot = slot in self._slots(t.device_id)
            archive = None if (r.rollback and has_slot) else info
            envelope = self._command(r, r.rollback, r.id, r.version, transfer_id, archive)
            self._envelopes[(r.id, t.device_id)] = (envelope, time.time())
            self._publish(Topics.cmd(t.device_id), envelope)
            if not has_slot:
                needs_download.append(t.device_id)
        if needs_download:
            threading.Thread(target=self._broadcast, args=(r.id, r.group, transfer_id, set(needs_download)),
                             daemon=True).start()

    def resend(self, rollout_id: str, device_id: str, now: float) -> None:
        """Publish a target's command again when it has gone unacknowledged for ``resend_s``."""
        envelope, last = self._envelopes.get((rollout_id, device_id), (b"", now))
        if envelope and now - last >= self.config.resend_s:
            self._envelopes[(rollout_id, device_id)] = (envelope, now)
            self._publish(Topics.cmd(device_id), envelope)

    def send_revert(self, rollout: RolloutRecord, target: TargetRecord) -> None:
        """Send a signed rollback to the target's previous version (with its archive when the device lacks it)."""
        r, previous = rollout, target.previous_version
        assert previous is not None
        info = None
        if f"{r.model}-{previous}" not in self._slots(target.device_id):  # the device pulls the old version's chunks
            info = self.chunks.open(f"{r.id}-rb", r.model, previous)
        envelope = self._command(r, True, f"{r.id}-rollback", previous, f"{r.id}-rb", info)
        self._publish(Topics.cmd(target.device_id), envelope)

    def finish(self, rollout_id: str) -> None:
        """Release the rollout's archives and per-device bookkeeping."""
        self.chunks.close_all(f"{rollout_id}-")
        self._accepted.pop(rollout_id, None)
        for key in [k for k in self._envelopes if k[0] == rollout_id]:
            del self._envelopes[key]

    def _broadcast(self, rollout_id: str, group: str, transfer_id: str, devices: set[str]) -> None:
        deadline = time.monotonic() + self.config.broadcast_wait_s
        while time.monotonic() < deadline and not devices <= self._accepted[rollout_id] and not self._stop.is_set():
            time.sleep(0.02)
        self.chunks.broadcast(group, transfer_id)
