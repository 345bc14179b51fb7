"""The OTA server: MQTT ingest and dispatch around the rollout engine, the chunk service and measurements.

Devices announce themselves on their retained state topic; their events move their
targets (:mod:`edgesdk.ota_server.rollouts.engine` decides what happens next); chunk requests are
answered by the chunk service (:mod:`edgesdk.ota_server.devices.chunks`) on the requesting
device's own topic. The engine's dispatcher (:mod:`edgesdk.ota_server.rollouts.stage_sender`) signs
each command, publishes it, re-sends it while unacknowledged, and broadcasts a stage's
archive once to the group. A measurement (:mod:`edgesdk.ota_server.devices.measurements`) sends a candidate model
to one device to be measured there and never installed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from edgesdk.fleet.protocol import COMMAND_TTL_S, PREFIX, Topics, check_id
from edgesdk.fleet.records import AgentEvent, GroupRelease, RolloutPolicy, RolloutRecord, RolloutState
from edgesdk.fleet.reports import MAX_REPORT_BYTES
from edgesdk.fleet.transport import MqttTransport, Transport
from edgesdk.fleet.trust import parse_root
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.devices.chunk_requests import ChunkRequests
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.devices.freshness import TimestampPublisher
from edgesdk.ota_server.devices.ingest import DeviceEvent, Ingest
from edgesdk.ota_server.devices.measurements import Measurements
from edgesdk.ota_server.devices.provisioning import GroupGuard
from edgesdk.ota_server.devices.report_guard import ReportGuard, ReportLimits
from edgesdk.ota_server.devices.report_reader import ReportReader
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.rollouts.release_checks import ReleaseCheck, check_release
from edgesdk.ota_server.rollouts.stage_sender import StageSender
from edgesdk.ota_server.store.fleet_db import EventRow, FleetDB
from edgesdk.runtime.boards import artifact_for

__all__ = ["OTAServer", "ServerConfig", "MAX_REPORT_BYTES"]

log = logging.getLogger(__name__)

#: What a replica says on its liveness topic (Topics.server): online, or offline (on stop, and as its last will).
_ONLINE, _OFFLINE = b'{"status": "online"}', b'{"status": "offline"}'


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
    #: Run as one of several replicas sharing the fleet database and the broker: device reports are split
    #: between replicas through MQTT shared subscriptions (``$share/<this name>/...``). None: a single server.
    share_group: str | None = None
    #: How long a replica's claim to drive a rollout lasts without renewal (another takes over after it).
    lease_s: float = 10.0
    #: This server's name: its MQTT client id and the holder of the rollouts it drives (unique per replica;
    #: None: ``edgesdk-server-<random>``).
    name: str | None = None
    #: How long a replica in ``share_group`` listens to the retained device states at start (until quiet that long).
    catch_up_quiet_s: float = 1.0
    #: Send a chunk zstd-compressed when that saves more than this share of its bytes (None: never compress).
    compress_min_saving: float | None = 0.10
    #: With a timestamp key: publish signed timestamp metadata this often, valid for ``timestamp_expires_s``.
    timestamp_every_s: float = 60.0
    timestamp_expires_s: float = 300.0
    #: How long a signed command is valid; devices refuse it after that (stage commands are re-signed in time).
    command_ttl_s: float = COMMAND_TTL_S
    #: How many states, events and chunk requests a device may send (see :mod:`edgesdk.ota_server.devices.report_guard`).
    report_limits: ReportLimits = ReportLimits()
    #: Late targets (devices back from offline, or new to their group) downloading at once, across the fleet: a
    #: reconnect storm queues in the store beyond this, not in the broker (:mod:`edgesdk.ota_server.rollouts.reconciler`).
    max_catch_up: int = 500
    #: How often the groups with no running rollout are reconciled to their release. The devices that came back or
    #: joined since the last pass are sent their commands together, so their answers, chunk requests and database
    #: writes come in a crowd, as a stage's do: devices returning one by one otherwise cost the server twice what a
    #: device online at the push costs. A returning device waits up to this long for its command. At most half of
    #: ``lease_s`` (these passes renew the releases' leases).
    reconcile_s: float = 5.0
    #: How long a device report may wait for others to share its database transaction (group commit; see
    #: :mod:`edgesdk.ota_server.devices.ingest`): devices returning one by one otherwise cost a transaction a report.
    ingest_linger_s: float = 1.0
    #: ... but the wait ends once no other report came for this long (a lone report is written after it).
    ingest_quiet_s: float = 0.3
    #: How long late devices' chunk requests for a completed small release are gathered into one group publish (see
    #: :mod:`edgesdk.ota_server.devices.chunks`; 0: each request is answered at once, on its device's topic).
    chunk_coalesce_s: float = 0.2
    #: Refuse the states of devices nobody provisioned (False: a device's first report fixes its group). None, the
    #: default: refuse them when the server was given a devices file (:func:`~edgesdk.ota_server.app.build_server`
    #: with ``ServerSetup.devices``), since then the operator said which devices exist; trust the first report
    #: otherwise.
    require_provisioning: bool | None = None


class OTAServer:
    """Fleet state, rollouts, the chunk service and measurements over one MQTT connection."""

    def __init__(self, config: ServerConfig, repository: ModelRepository, db: FleetDB, signing_key: Any,
                 transport_factory: Any = MqttTransport, root: bytes | None = None, timestamp_key: Any = None) -> None:
        self.config, self.repo, self.db, self.key = config, repository, db, signing_key
        self._transport_factory = transport_factory
        self.transport: Transport | None = None
        self._stop = threading.Event()
        #: Set to run the engine's next tick now (an operator's action should not wait for the tick).
        self._wake = threading.Event()
        self._engine_thread: threading.Thread | None = None
        self._catch_up_thread: threading.Thread | None = None
        #: Bytes published, for tests and benchmarks.
        self.bytes_published = 0
        #: When the broker connection last came up (time.monotonic()).
        self._link_up_at = float("-inf")
        #: This server's name among replicas (its MQTT client id and its rollout leases).
        self.name = config.name or f"edgesdk-server-{uuid.uuid4().hex[:8]}"
        check_id(self.name, "server name")
        self.metrics = ServerMetrics(db)
        #: Every device message is read through typed, bounded records (edgesdk.fleet.reports); refusals counted.
        self.reports = ReportReader(self.metrics.report_refused)
        def stranger() -> None:  # a chunk request for a transfer the device is not a target of
            self.metrics.report_refused("need", "not_target")

        self.chunks = ChunkDistributor(repository.archive, self._publish, min_saving=config.compress_min_saving,
                                       outbox=self._outbox, on_stranger=stranger, coalesce_s=config.chunk_coalesce_s)
        self.measurements = Measurements(self._publish, signing_key, db, timeout_s=config.measure_timeout_s,
                                         on_refused=self.reports.refuse, on_stranger=stranger,
                                         admit=lambda device: self.guard.admit(device, "measurement"))
        self.groups = GroupGuard(db, bool(config.require_provisioning), on_refused=self.metrics.group_refused)
        self.ingest = Ingest(db, observe=self.metrics.observe_event, groups=self.groups,
                             on_dropped=self.reports.dropped, linger_s=config.ingest_linger_s,
                             quiet_s=config.ingest_quiet_s)
        self.guard = ReportGuard(config.report_limits, on_refused=self.metrics.report_refused)
        self.metrics.watch_queues(self._outbox, lambda: self.ingest.pending)
        #: The fleet's root of trust, published retained at start (devices take it as the next in their chain).
        self.root = parse_root(root)[0] if root is not None else None
        self.timestamps = (TimestampPublisher(db, self._publish, timestamp_key, self.root.version if self.root else 1,
                                              config.timestamp_every_s, config.timestamp_expires_s)
                           if timestamp_key is not None else None)
        self.sender = StageSender(db, repository, self.chunks, signing_key, self._publish, self.metrics,
                                  lambda: self.ingest.pending, self._outbox, self._stop, config.offload_url,
                                  config.broadcast_wait_s, config.command_ttl_s, link_settled=self._link_settled)
        # Leases, deadlines and re-sends go by the database's clock: replicas' own clocks may disagree.
        self.engine = RolloutEngine(db, self.sender, db.now, resend_s=config.resend_s, holder=self.name,
                                    lease_s=config.lease_s, max_catch_up=config.max_catch_up,
                                    reconcile_s=config.reconcile_s, artifacts=repository.artifacts)
        self.metrics.watch_catch_up(config.max_catch_up, db.late_in_flight)
        self.requests = ChunkRequests(self.chunks, self.measurements, self.engine, self.sender.is_target,
                                      lambda rollout_id: db.rollout(rollout_id, targets=False),
                                      self.metrics.report_refused, single_server=config.share_group is None)

    def _outbox(self) -> int:
        return self.transport.unacknowledged if self.transport is not None else 0

    def _on_link_up(self) -> None:
        self._link_up_at = time.monotonic()

    def _link_settled(self) -> bool:
        """The broker connection has been up for two re-send intervals: silence means something again (after a
        broker restart the devices reconnect over seconds, and what was sent meanwhile is still arriving)."""
        up = getattr(self.transport, "connected", True)
        return bool(up) and time.monotonic() - self._link_up_at >= 2 * self.config.resend_s

    @property
    def resent(self) -> dict[tuple[str, str], list[int]]:
        """(device, transfer) -> chunk indices re-sent on request (for tests and benchmarks)."""
        return self.chunks.resent

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> OTAServer:
        """Connect to the broker, subscribe to the devices' topics and start the rollout engine.

        With ``share_group`` the device states and events arrive through shared subscriptions (each
        report at one replica); chunk requests and measurement results reach every replica, and each
        answers only for what it drives.
        """
        cfg = self.config
        self.transport = self._transport_factory(cfg.broker, client_id=self.name, username=cfg.username,
                                                 password=cfg.password, ca_file=cfg.ca_file,
                                                 will=(Topics.server(self.name), _OFFLINE), on_connect=self._on_link_up)
        shared = f"$share/{cfg.share_group}/" if cfg.share_group else ""
        if shared:
            self._catch_up_states()
            self.transport.subscribe(Topics.ALL_SERVERS, self._on_server)
        self._publish(Topics.server(self.name), _ONLINE, retain=True)
        self.transport.subscribe(shared + Topics.ALL_STATES, self._on_state)
        self.transport.subscribe(shared + Topics.ALL_EVENTS, self._on_event)
        # At most once: a device asks again for what does not come, and thousands of devices asking at once should
        # not each cost an acknowledgement on the thread that also sends the commands.
        self.transport.subscribe(Topics.ALL_NEEDS, self._on_need, qos=0)
        self.transport.subscribe(Topics.ALL_MEASUREMENTS, self.measurements.on_result)
        if self.root is not None:
            self._publish(Topics.root(self.root.version), self.root.raw, retain=True)
        self._engine_thread = threading.Thread(target=self._run, name="rollout-engine", daemon=True)
        self._engine_thread.start()
        return self

    def _on_server(self, topic: str, payload: bytes) -> None:
        """A replica's liveness. One that died (its last will) may have taken device states with it: each device
        state goes to one replica and is acknowledged on receipt, before it is written. The retained states on the
        broker are the devices' newest word, so read them all again, in the background (also after a clean stop,
        which costs only the re-read)."""
        if payload != _OFFLINE or topic == Topics.server(self.name) or self._stop.is_set():
            return
        if self._catch_up_thread is not None and self._catch_up_thread.is_alive():
            return  # one re-read at a time (MQTT handlers run on one thread, so no race here)
        log.warning("replica %s went offline; reading the devices' retained states again", topic.rsplit("/", 1)[-1])
        self._catch_up_thread = threading.Thread(target=self._catch_up_again, name="catch-up", daemon=True)
        self._catch_up_thread.start()

    def _catch_up_again(self) -> None:
        try:
            self._catch_up_states()
        except Exception:  # the broker went away meanwhile: the next replica death (or restart) reads them
            log.exception("reading the retained device states again failed")

    def _catch_up_states(self) -> None:
        """Read the retained device states once (a shared subscription never delivers retained messages)."""
        assert self.transport is not None
        last = [time.monotonic()]

        def on_retained(topic: str, payload: bytes) -> None:
            last[0] = time.monotonic()
            self._on_state(topic, payload)

        self.transport.subscribe(Topics.ALL_STATES, on_retained)
        deadline = time.monotonic() + 60
        while (time.monotonic() - last[0] < self.config.catch_up_quiet_s and time.monotonic() < deadline
               and not self._stop.is_set()):
            time.sleep(0.05)
        self.transport.unsubscribe(Topics.ALL_STATES)

    def stop(self) -> None:
        """Stop the rollout engine, write the queued device reports and disconnect (rollouts resume from the fleet
        DB on the next start, or on another replica)."""
        self._stop.set()
        self._wake.set()
        if self._engine_thread:
            self._engine_thread.join(timeout=5)
        if self._catch_up_thread:
            self._catch_up_thread.join(timeout=5)  # its unsubscribe must not follow the DISCONNECT
        if self.transport:
            self._publish(Topics.server(self.name), _OFFLINE, retain=True)  # as its will would say
            self.transport.close()
        self.ingest.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            # With no rollout to drive and no revert to chase, a tick each release pass is enough: three reads of
            # the store five times a second were most of an idle server's CPU.
            self._wake.wait(max(self.config.tick_s, self.engine.reconcile_s) if self.engine.idle else self.config.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.measurements.expire()
            self._read_waiting_reports()
            self.engine.tick()
            if self.timestamps is not None:
                self.timestamps.tick()

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        if self.transport is None:
            # Not started (no broker connection yet): an operator's promote on the admin API or the
            # console must not fail with a 500. The targets stay sent without progress, and the
            # stage sender's re-send delivers their commands once the server is connected.
            log.warning("not connected to the broker yet: %s (%d bytes) is left to the re-send", topic,
                        len(payload))
            return
        self.bytes_published += len(payload)
        self.transport.publish(topic, payload, qos=1, retain=retain)
        if "/chunks/" in topic:
            self.metrics.chunk_bytes("broadcast" if topic.startswith(_GROUPS) else "resend", len(payload))

    def _read_waiting_reports(self) -> None:
        """Read the states a flooding device's limit held back, and log each flood as a ``flood`` event."""
        for topic, payload in self.guard.due():
            self._read_state(topic, payload)
        for device, refused, span_s in self.guard.flood_reports():
            counts = {kind: n for kind, n in refused.items() if n}
            reason = (f"device {device} sent more reports than its limit allows; refused in {span_s:.0f} s: "
                      + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
            log.warning("%s", reason)
            self.ingest.put(DeviceEvent(EventRow("flood", {"event": "flood", "refused": counts, "reason": reason},
                                                 device, None, time.time()), None))

    # MQTT handlers -------------------------------------------------------------------------
    def _on_state(self, topic: str, payload: bytes) -> None:
        if self.reports.oversize(topic, payload) or not self.guard.admit_state(Topics.device_of(topic), topic, payload):
            return
        self._read_state(topic, payload)

    def _read_state(self, topic: str, payload: bytes) -> None:
        state = self.reports.state(topic, payload)  # None: malformed, counted and logged
        if state is not None:
            self.ingest.put(state)

    def _on_event(self, topic: str, payload: bytes) -> None:
        if self.reports.oversize(topic, payload) or not self.guard.admit(Topics.device_of(topic), "event"):
            return
        event = self.reports.event(topic, payload)
        if event is None:
            return
        if event.kind == AgentEvent.ACCEPTED:  # it subscribed to its group's chunks first: they may go now
            self.chunks.accepted(event.device, event.deployment_id, event.payload.get("missing"))
        self.ingest.put(DeviceEvent(EventRow(event.kind, dict(event.payload), event.device, event.rollout_id,
                                             time.time()),
                                    self.engine.target_update(event.device, event.kind, event.deployment_id,
                                                              event.reason)))

    def _on_need(self, topic: str, payload: bytes) -> None:
        if self.reports.oversize(topic, payload) or not self.guard.admit(Topics.device_of(topic), "need"):
            return
        request = self.reports.need(topic, payload)
        if request is None:
            return
        self.requests.answer(request.device, request.transfer_id, list(request.chunks))

    # the admin API's operations ------------------------------------------------------------------
    def upload(self, archive: bytes) -> dict[str, Any]:
        """Store a bundle tar; ``stored`` is False when the identical bundle was already there."""
        manifest, stored = self.repo.add_archive(archive)
        if stored:
            self.repo.apply_policy(in_use=self._in_use())
            log.info("stored bundle %s %s", manifest.name, manifest.version)
            # A board's bundle of a version already pushed: its devices that had none get it now.
            waiting = self.db.requeue_no_artifact(manifest.name, manifest.version)
            if waiting:
                log.info("%d devices whose board %s %s had no artifact for are queued for the new one (e.g. %s)",
                         len(waiting), manifest.name, manifest.version, waiting[0])
                self._wake.set()
        return {"name": manifest.name, "version": manifest.version, "stored": stored}

    def _in_use(self) -> set[tuple[str, str]]:
        """What retention keeps besides the newest versions and pins: what devices run, each
        group's release and the one before it, running rollouts' versions and their targets'
        previous ones (reverts), releases with late targets in flight
        (:meth:`FleetDB.versions_kept`)."""
        return self.db.versions_in_use() | self.db.versions_kept()

    def release_check(self, name: str, version: str, group: str, *, replace: str | None = None,
                      allow_signature_change: bool = False) -> ReleaseCheck:
        """What a push of ``name`` ``version`` changes for ``group``; a ReleaseCheckError when it replaces the
        group's model or changes its inputs or outputs without saying so (:mod:`.rollouts.release_checks`)."""
        self.repo.path(name, version)  # NotFoundError for a version the repository does not hold
        return check_release(self.repo, self.db, name, version, group, replace=replace,
                             allow_signature_change=allow_signature_change)

    def start_rollout(self, name: str, version: str, group: str, policy: RolloutPolicy | None = None,
                      rollback: bool = False, *, replace: str | None = None,
                      allow_signature_change: bool = False) -> str:
        """Start a rollout of a stored version to ``group`` (see :meth:`RolloutEngine.start`); its id. A push that
        is not a rollback passes :meth:`release_check` first: nothing is sent when it refuses."""
        if rollback:
            self.repo.path(name, version)  # NotFoundError for a version the repository does not hold
            return self._start(name, version, group, policy, rollback=True)
        return self.start_release(name, version, group, policy, replace=replace,
                                  allow_signature_change=allow_signature_change)[0]

    def start_release(self, name: str, version: str, group: str, policy: RolloutPolicy | None = None, *,
                      replace: str | None = None, allow_signature_change: bool = False) -> tuple[str, ReleaseCheck]:
        """:meth:`start_rollout` of a push, and what its :meth:`release_check` found (printed by ``edgesdk push``)."""
        check = self.release_check(name, version, group, replace=replace, allow_signature_change=allow_signature_change)
        return self._start(name, version, group, policy, rollback=False), check

    def _start(self, name: str, version: str, group: str, policy: RolloutPolicy | None, rollback: bool) -> str:
        # A push decides on the devices' states: write those still queued (the writer would linger for company), so a
        # device that reported a moment ago counts (its group was refused as having no device).
        self.ingest.flush(timeout=5.0, hurry=True)
        rollout_id = self.engine.start(name, version, group, policy, rollback)
        self._wake.set()
        return rollout_id

    def promote(self, rollout_id: str) -> None:
        """Send the next stage now, without waiting for the health window."""
        self.engine.promote(rollout_id)
        self._wake.set()

    def abort(self, rollout_id: str, reason: str = "aborted by operator") -> None:
        """Stop a running rollout and send its updated devices back to their previous version."""
        self.engine.abort(rollout_id, reason)
        self._wake.set()

    def rollback(self, rollout_id: str, to_version: str | None = None,
                 all_at_once: bool = False) -> str:
        """Roll a rollout's group back with a signed rollback, as a new rollout; its id. Only to a
        version the group ran, older than the one it undoes; staged with the rollout's policy
        unless ``all_at_once`` (:mod:`edgesdk.ota_server.rollouts.analysis.rollback_rules`)."""
        rollout_id = self.engine.rollback(rollout_id, to_version, all_at_once)
        self._wake.set()
        return rollout_id

    def rollback_group(self, group: str, to_version: str | None = None,
                       all_at_once: bool = False) -> str:
        """Roll ``group`` back, as :meth:`rollback` does for the rollout that matters now (its
        running one, aborted first, else the one that set its release): to ``to_version``, else
        the most recent version it ran before; the new rollout's id."""
        from edgesdk.errors import NotFoundError

        check_id(group, "group")
        running = next((r.id for r in self.db.rollouts(RolloutState.RUNNING) if r.group == group),
                       None)
        release = self.db.release(group)
        undone = running or (release.rollout_id if release is not None else None)
        if undone is None:
            raise NotFoundError(f"group {group!r} has no rollout to roll back; `edgesdk groups` lists the groups")
        return self.rollback(undone, to_version, all_at_once)

    def resume(self, rollout_id: str) -> str:
        """Let a flagged release's catch-up go on (see :meth:`Reconciler.resume`); the flag's
        reason it cleared."""
        reason = self.engine.reconciler.resume(rollout_id)
        self._wake.set()
        return reason

    def provision(self, devices: dict[str, str], source: str = "admin api") -> list[str]:
        """Put devices in groups (device id -> group); the devices that moved. A moved device is queued for its new
        group's release at once and its targets of other groups' rollouts are skipped; its reports naming its old
        group are recorded under the new one, and the first command of the new group tells its agent
        (:mod:`edgesdk.ota_server.devices.provisioning`). Its broker ACL is the operator's to regenerate."""
        for device, group in devices.items():
            check_id(device, "device id")
            check_id(group, "group")
        moved = self.db.provision(devices, source)
        if moved:
            self.db.log("devices_moved", {"devices": {d: devices[d] for d in moved}, "source": source})
            log.info("moved %d devices to other groups (%s); their targets of other groups' rollouts are skipped",
                     len(moved), source)
            # The broker's ACL is the operator's file: this server cannot rewrite it on another host.
            log.warning("the broker still lets %d moved devices (e.g. %s) read their old group's broadcast chunks: "
                        "update the devices file, run `edgesdk server mosquitto-acl --devices FILE --out DIR` on the "
                        "broker's host and reload the broker (SIGHUP) so each reads only its new group's", len(moved), moved[0])
        self._wake.set()
        return moved

    def groups_status(self) -> list[GroupRelease]:
        """Each group's release (desired state) and how far its devices are from it, in all and per board (with
        the release's bundle each board gets)."""
        boards = self.db.board_counts()
        out = []
        for g in self.db.group_releases():
            stored = self.repo.artifacts(g.model, g.version) if g.model and g.version else []
            out.append(replace(g, boards=tuple(
                {**b, "artifact": artifact_for(stored, b["profile"], b["arch"])} for b in boards.get(g.group, ()))))
        return out

    def status(self, rollout_id: str, **page: Any) -> RolloutRecord:
        """A rollout with its counts and targets (``page``: see :meth:`FleetDB.rollout`); NotFoundError if unknown."""
        return self.engine.status(rollout_id, **page)

    def request_measurement(self, device_id: str, archive: bytes, mode: str, runs: int,
                            timeout_s: float | None = None) -> str:
        """Have one online device measure the model in ``archive`` (never installing it); the measurement id.

        ``archive`` comes from :func:`edgesdk.fleet.measurement.pack_measurement`; ``timeout_s`` defaults
        to the config's ``measure_timeout_s``. An unknown or offline device raises TransferError.
        """
        return self.measurements.request(device_id, archive, mode, runs, timeout_s)

    def measurement(self, measurement_id: str) -> dict[str, Any]:
        """Status of a measurement; figures and outputs (base64 ``.npy``) once it is done."""
        return self.measurements.status(measurement_id)


#: Topic prefix of the chunks sent to a whole group (the others go to one device).
_GROUPS = f"{PREFIX}/groups/"
