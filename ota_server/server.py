"""The OTA server: fleet state from MQTT, chunk service, and the rollout engine.

Devices announce themselves on their retained state topic; events drive each target's
status; chunk requests are answered on the requesting device's own topic. A rollout
sends signed commands to one stage at a time, broadcasts the archive once to the
group's chunk topic, waits for every target to report plus the health window, and then
promotes, completes, or aborts and rolls the stage's updated devices back. A measurement
(:mod:`edgesdk.ota_server.measurements`) sends a candidate model to one device to be
measured there and never installed.
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

from edgesdk.bundle import parse_version
from edgesdk.errors import BundleError, ConflictError, EdgeSDKError, NotFoundError
from edgesdk.fleet_protocol import (
    AgentEvent,
    DeviceRecord,
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    TargetStatus,
)
from edgesdk.ota import ArchiveInfo, Topics, check_id, sign_command
from edgesdk.ota_server.fleet import FleetDB
from edgesdk.ota_server.measurements import Measurements
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.rollout import canary_order, stage_sizes
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


#: A device event's effect on its target: (status while rolling out, status while reverting after an abort).
_EVENT_STATUS: dict[AgentEvent, tuple[TargetStatus, TargetStatus]] = {
    AgentEvent.ACCEPTED: (TargetStatus.DOWNLOADING, TargetStatus.REVERTING),
    AgentEvent.DOWNLOADED: (TargetStatus.INSTALLING, TargetStatus.REVERTING),
    AgentEvent.COMMITTED: (TargetStatus.COMMITTED, TargetStatus.REVERTED),
    AgentEvent.FAILED: (TargetStatus.FAILED, TargetStatus.REVERT_FAILED),
    AgentEvent.ROLLED_BACK: (TargetStatus.ROLLED_BACK, TargetStatus.REVERT_FAILED),
    AgentEvent.REJECTED: (TargetStatus.REJECTED, TargetStatus.REVERT_FAILED),
}


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


@dataclass
class _Transfer:
    """A bundle archive being sent (a rollout stage or its revert), kept for devices that ask for chunks again."""

    name: str
    version: str
    data: bytes
    info: ArchiveInfo


class OTAServer:
    """Fleet state, chunk service, rollouts and measurements over one MQTT connection."""

    def __init__(self, config: ServerConfig, repository: ModelRepository, db: FleetDB, signing_key: Any,
                 transport_factory: Any = MqttTransport) -> None:
        self.config, self.repo, self.db, self.key = config, repository, db, signing_key
        self._transport_factory = transport_factory
        self.transport: Transport | None = None
        self._transfers: dict[str, _Transfer] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._engine: threading.Thread | None = None
        self._accepted: dict[str, set[str]] = defaultdict(set)
        #: (device, transfer) -> chunk indices resent on request; bytes published, for tests and benchmarks.
        self.resent: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.bytes_published = 0
        self._envelopes: dict[tuple[str, str], tuple[bytes, float]] = {}
        self.measurements = Measurements(self._publish, signing_key, db, timeout_s=config.measure_timeout_s)

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
        self._engine = threading.Thread(target=self._run, name="rollout-engine", daemon=True)
        self._engine.start()
        return self

    def stop(self) -> None:
        """Stop the rollout engine and disconnect (rollouts resume from the fleet DB on the next start)."""
        self._stop.set()
        if self._engine:
            self._engine.join(timeout=5)
        if self.transport:
            self.transport.close()

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
        reverting = deployment.endswith("-rollback")
        rollout_id = deployment.removesuffix("-rollback")
        self.db.log(kind, event, device_id=device, rollout_id=rollout_id or None)
        if not rollout_id:
            return
        try:
            statuses = _EVENT_STATUS.get(AgentEvent(kind))
        except ValueError:  # an event this server does not know (a newer agent's): logged above, nothing to track
            return
        if statuses is None:
            return
        if kind == AgentEvent.ACCEPTED:
            self._accepted[rollout_id].add(device)
        rolling_out, after_abort = statuses
        self.db.set_target(rollout_id, device, after_abort if reverting else rolling_out, event.get("reason"))

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
        with self._lock:
            transfer = self._transfers.get(transfer_id)
        if transfer is None:
            self.measurements.serve(device, transfer_id, indices)
            return
        for index in indices:
            if 0 <= index < len(transfer.info.chunks):
                self.resent[(device, transfer_id)].append(index)
                self._publish(f"{Topics.device_chunks(device, transfer_id)}/{index}", self._chunk(transfer, index))

    def _chunk(self, transfer: _Transfer, index: int) -> bytes:
        start, end = transfer.info.chunk_range(index)
        return transfer.data[start:end]

    # rollouts ------------------------------------------------------------------------------
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
        """Start sending ``name`` ``version`` to the online devices of ``group`` that need it; the rollout id.

        Raises ConflictError when the group has no online device, a rollout running,
        every device at that version already, or (unless ``rollback``) a newer version.
        """
        check_id(group, "group")
        self.repo.path(name, version)  # must exist
        online = [d for d in self.db.devices(group) if d.status == "online"]
        if not online:
            raise ConflictError(f"group {group!r} has no online device; start the agents first (see `edgesdk devices`)")
        running = [r for r in self.db.rollouts(RolloutState.RUNNING) if r.group == group]
        if running:
            raise ConflictError(f"group {group!r} already has rollout {running[0].id} running; abort or wait for it")
        devices = self._targets(name, version, group, online, rollback)
        policy = policy or RolloutPolicy()
        rollout_id = f"r{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.db.add_rollout(rollout_id, name, version, group, policy, rollback)
        order = canary_order(group, [d.id for d in devices])
        sizes = stage_sizes(len(order), policy)
        by_id = {d.id: d for d in devices}
        start = 0
        for stage, end in enumerate(sizes):
            for device in order[start:end]:
                self.db.add_target(rollout_id, device, stage, by_id[device].version)
            start = end
        self.db.log("rollout_started", {"name": name, "version": version, "stages": sizes, "rollback": rollback},
                    rollout_id=rollout_id)
        log.info("rollout %s started: %s %s to %d devices of group %s in stages %s%s", rollout_id, name, version,
                 len(order), group, sizes, " (rollback)" if rollback else "")
        return rollout_id

    @staticmethod
    def _targets(name: str, version: str, group: str, online: list[DeviceRecord],
                 rollback: bool) -> list[DeviceRecord]:
        """The online devices that need ``version``; refuses a version the group runs already, or a downgrade."""
        wanted = parse_version(version)
        targets = [d for d in online if not (d.model == name and d.version == version)]
        if not targets:
            raise ConflictError(f"{name} {version} is already installed on all {len(online)} online devices of group "
                                f"{group!r}; nothing to send")
        newer = sorted({d.version for d in targets if d.model == name and d.version
                        and parse_version(d.version) > wanted}, key=parse_version)
        if newer and not rollback:
            raise ConflictError(f"group {group!r} runs {name} {newer[-1]}, newer than {version}: devices refuse a "
                                f"downgrade; use `edgesdk rollout rollback ID --to {version}`")
        return targets

    def promote(self, rollout_id: str) -> None:
        """Send the next stage now, without waiting for the health window."""
        r = self._running(rollout_id)
        log.info("rollout %s promoted by operator to stage %d", rollout_id, r.stage + 2)
        self._send_stage(r, r.stage + 1)

    def abort(self, rollout_id: str, reason: str = "aborted by operator") -> None:
        """Stop a running rollout and send its updated devices back to their previous version."""
        r = self._running(rollout_id)
        self._abort(r, reason)

    def rollback(self, rollout_id: str, to_version: str | None = None) -> str:
        """Roll a finished or aborted rollout's group back with a signed rollback, as a new rollout."""
        r = self.status(rollout_id)
        if r.state == RolloutState.RUNNING:
            self._abort(r, "rolled back by operator")
        if to_version is None:
            previous = [t.previous_version for t in r.targets if t.previous_version]
            if not previous:
                raise ConflictError(f"rollout {rollout_id} has no previous version to go back to; pass --to VERSION")
            to_version = max(set(previous), key=previous.count)
        policy = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0, max_failure_rate=0.99)
        return self.start_rollout(r.model, to_version, r.group, policy, rollback=True)

    def status(self, rollout_id: str) -> RolloutRecord:
        """A rollout with its targets; NotFoundError for an unknown id."""
        r = self.db.rollout(rollout_id)
        if r is None:
            raise NotFoundError(f"no rollout {rollout_id!r}; `edgesdk rollout status` lists them")
        return r

    def _running(self, rollout_id: str) -> RolloutRecord:
        r = self.status(rollout_id)
        if r.state != RolloutState.RUNNING:
            raise ConflictError(f"rollout {rollout_id} is {r.state}, not running")
        return r

    # measurements --------------------------------------------------------------------------
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

    # engine --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            self.measurements.expire()
            for summary in self.db.rollouts(RolloutState.RUNNING):
                try:
                    self._tick(self.status(summary.id))
                except EdgeSDKError as exc:  # e.g. a bundle changed on disk after upload
                    self._abort(self.status(summary.id), f"server error: {exc}")
                except Exception:
                    log.exception("rollout %s: engine step failed", summary.id)

    def _tick(self, r: RolloutRecord) -> None:
        policy = r.policy
        if r.stage < 0:
            self._send_stage(r, 0)
            return
        now = time.time()
        timed_out = False
        for t in r.in_stage(r.stage):
            if not t.status.terminal and t.sent and now - t.sent > policy.deploy_timeout_s:
                self.db.set_target(r.id, t.device_id, TargetStatus.TIMEOUT,
                                   f"no report in {policy.deploy_timeout_s:g} s")
                timed_out = True
            elif t.status == TargetStatus.SENT:
                self._resend(r.id, t.device_id, now)
        if timed_out:
            r = self.status(r.id)
        sent = [t for t in r.targets if t.stage <= r.stage]
        failed = [t for t in sent if t.status.failed]
        if sent and len(failed) / len(sent) > policy.max_failure_rate:
            reasons = "; ".join(f"{t.device_id}: {t.reason}" for t in failed[:3])
            self._abort(r, f"{len(failed)}/{len(sent)} devices failed (> {policy.max_failure_rate:.0%}): {reasons}")
            return
        if not all(t.status.terminal for t in r.in_stage(r.stage)):
            return
        if r.stage_settled is None:
            self.db.settle_stage(r.id, now)
            return
        if now - r.stage_settled < policy.health_window_s:
            return
        if r.stage >= r.stage_count - 1:
            self.db.end_rollout(r.id, RolloutState.COMPLETED, f"{len(sent) - len(failed)}/{len(sent)} updated")
            self.db.log("rollout_completed", {"failed": len(failed)}, rollout_id=r.id)
            log.info("rollout %s completed: %d/%d devices updated", r.id, len(sent) - len(failed), len(sent))
        elif policy.auto_promote:
            self._send_stage(r, r.stage + 1)

    def _command(self, r: RolloutRecord, rollback: bool, deployment_id: str, version: str, transfer_id: str,
                 archive: ArchiveInfo | None) -> bytes:
        kind = "deploy" if archive is not None else "rollback"
        return sign_command(self.key, type=kind, deployment_id=deployment_id, transfer_id=transfer_id, name=r.model,
                            version=version, group=r.group, rollback=rollback, archive=archive)

    def _slots(self, device_id: str) -> tuple[str, ...]:
        device = self.db.device(device_id)
        return device.slots if device else ()

    def _send_stage(self, r: RolloutRecord, stage: int) -> None:
        targets = r.in_stage(stage)
        if not targets:
            raise ConflictError(f"rollout {r.id} has no stage {stage + 1}: its last stage was sent already")
        data, info = self.repo.archive(r.model, r.version)
        transfer_id = f"{r.id}-w{stage}"
        with self._lock:
            self._transfers[transfer_id] = _Transfer(r.model, r.version, data, info)
        self.db.start_stage(r.id, stage)
        slot = f"{r.model}-{r.version}"
        needs_download = []
        for t in targets:
            has_slot = slot in self._slots(t.device_id)
            archive = None if (r.rollback and has_slot) else info
            envelope = self._command(r, r.rollback, r.id, r.version, transfer_id, archive)
            self._envelopes[(r.id, t.device_id)] = (envelope, time.time())
            self._publish(Topics.cmd(t.device_id), envelope)
            self.db.set_target(r.id, t.device_id, TargetStatus.SENT, sent=True)
            if not has_slot:
                needs_download.append(t.device_id)
        self.db.log("stage_sent", {"stage": stage, "devices": [t.device_id for t in targets]}, rollout_id=r.id)
        log.info("rollout %s: stage %d sent to %d devices", r.id, stage + 1, len(targets))
        if needs_download:
            threading.Thread(target=self._broadcast, args=(r.id, r.group, transfer_id, set(needs_download)),
                             daemon=True).start()

    def _resend(self, rollout_id: str, device: str, now: float) -> None:
        envelope, last = self._envelopes.get((rollout_id, device), (b"", now))
        if envelope and now - last >= self.config.resend_s:
            self._envelopes[(rollout_id, device)] = (envelope, now)
            self._publish(Topics.cmd(device), envelope)

    def _broadcast(self, rollout_id: str, group: str, transfer_id: str, devices: set[str]) -> None:
        deadline = time.monotonic() + self.config.broadcast_wait_s
        while time.monotonic() < deadline and not devices <= self._accepted[rollout_id] and not self._stop.is_set():
            time.sleep(0.02)
        with self._lock:
            transfer = self._transfers[transfer_id]
        topic = Topics.group_chunks(group, transfer_id)
        for index in range(len(transfer.info.chunks)):
            self._publish(f"{topic}/{index}", self._chunk(transfer, index))

    def _abort(self, r: RolloutRecord, reason: str) -> None:
        self.db.end_rollout(r.id, RolloutState.ABORTED, reason)
        self.db.log("rollout_aborted", {"reason": reason}, rollout_id=r.id)
        log.warning("rollout %s aborted: %s", r.id, reason)
        for t in r.targets:
            if t.status != TargetStatus.COMMITTED or not t.previous_version:
                continue
            has_slot = f"{r.model}-{t.previous_version}" in self._slots(t.device_id)
            info = None
            if not has_slot:  # the device must download the old version; it pulls the chunks
                try:
                    data, info = self.repo.archive(r.model, t.previous_version)
                except BundleError as exc:
                    self.db.set_target(r.id, t.device_id, TargetStatus.REVERT_FAILED, str(exc))
                    continue
                with self._lock:
                    self._transfers[f"{r.id}-rb"] = _Transfer(r.model, t.previous_version, data, info)
            envelope = self._command(r, True, f"{r.id}-rollback", t.previous_version, f"{r.id}-rb", info)
            self._publish(Topics.cmd(t.device_id), envelope)
            self.db.set_target(r.id, t.device_id, TargetStatus.REVERTING, reason)
