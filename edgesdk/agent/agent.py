"""The device agent: receives signed commands over MQTT, fetches, verifies, swaps, reports.

Per deployment: verify the command's signature (before anything is written) → refuse a
replay or a downgrade that is not a signed rollback → receive chunks (the group broadcast,
plus re-requests of whatever is missing, on this device's own topic) checking each hash →
check the whole archive → verify its manifest, then unpack into a new slot → install it (record it as
pending, point ``current`` at it, health-check it under live traffic, commit or point back:
:mod:`edgesdk.agent.install`) → report the outcome. A restarted agent resumes unfinished
transfers and finishes or undoes a pending install, so the store always holds a working
model.

A ``measure`` command is verified the same way and handed to the measurement service
(:mod:`edgesdk.agent.measurements`); its archive comes through the same transfers
(:mod:`edgesdk.agent.downloads`). Whether an archive fits on disk, and which old slots go
to make room, is the storage guard's call (:mod:`edgesdk.agent.storage_guard`); this module
keeps the protocol and the order of the steps.

The retained state (:class:`~edgesdk.agent.state_report.StateReporter`) carries the app traffic
per model version, from the apps' files and the agent's own ManagedRuntime
(:mod:`edgesdk.agent.app_traffic`). It goes out on every change, every ``state_interval_s``
(300 s by default) and, after a commit of a command that carries ``judge_s`` (a stage with
this device is being judged), every ``traffic_every_s`` (10 s) until ``judge_s`` passed
(:mod:`edgesdk.agent.report_cadence`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from edgesdk.agent.admission import admit, check_still_newer, refused_download
from edgesdk.agent.command_reader import CommandReader, with_assigned_group
from edgesdk.agent.config import AgentConfig, resolve_profile
from edgesdk.agent.downloads import Downloads
from edgesdk.agent.events import EventLog
from edgesdk.agent.install import Installer, InstallOutcome
from edgesdk.agent.local_chunks import LocalChunks
from edgesdk.agent.managed import ManagedRuntime
from edgesdk.agent.measurements import MeasurementService
from edgesdk.agent.power_keeper import PowerModeKeeper
from edgesdk.agent.state_report import StateReporter
from edgesdk.agent.storage_guard import StorageGuard
from edgesdk.agent.store import ModelStore, PendingInstall
from edgesdk.agent.trust_keeper import TrustKeeper
from edgesdk.errors import BrokerError, EdgeSDKError, SignatureError, TransferError
from edgesdk.fleet.protocol import Command, MeasureCommand, Topics
from edgesdk.fleet.records import AgentEvent
from edgesdk.fleet.transport import MqttTransport, Transport
from edgesdk.runtime.measure_worker import EnergyRequest

__all__ = ["DeviceAgent"]

log = logging.getLogger(__name__)


class DeviceAgent:
    """Runs the OTA protocol for one device; give it a ManagedRuntime to swap models under an app."""

    def __init__(self, config: AgentConfig, runtime: ManagedRuntime | None = None,
                 transport_factory: Callable[..., Transport] = MqttTransport) -> None:
        self.store = ModelStore(config.store)
        self.config = config = with_assigned_group(config, self.store)  # the group the server moved it to
        #: The device's root of trust, when it has one (else commands are checked with ``config.server_key``).
        self.trust = TrustKeeper.open(self.store.root / "trust", config.root, config.device_id,
                                      lambda reason: self._event(None, AgentEvent.REJECTED, reason=reason), self._publish_state)
        self.reader = CommandReader(self.trust, self.store)
        self.runtime = runtime
        self.profile = resolve_profile(config, runtime)
        self.installer = Installer(self.store, runtime, lambda: self.trust.root.keyset("bundles") if self.trust else None,
                                   PowerModeKeeper(self.profile, config.sysfs_root) if config.apply_power_mode else None)
        self._transport_factory, me = transport_factory, config.device_id
        self.guard = StorageGuard(self.store, config.min_free_bytes, config.pinned, label=me)
        self.downloads = Downloads(lambda payload: self._publish(Topics.need(me), payload), config.request_window,
                                   config.retry_interval_s, config.broadcast_wait_s, label=me)
        self.measurements = MeasurementService(
            self.downloads, self.guard, self.profile, lambda payload: self._publish(Topics.measurements(me), payload),
            self._publish_state, config.measure_timeout_s, EnergyRequest(config.sysfs_root), me, self.installer.bundle_keys)
        self._work: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self.transport: Transport | None = None
        #: Why the broker shut this agent out after it started (credentials or ACL changed, seen on a
        #: reconnect): the agent can no longer be reached, so whoever runs it should stop it and say so.
        self.refusal: BrokerError | None = None
        self.event_log = EventLog(me, config.event_history, lambda payload: self._publish(Topics.events(me), payload))
        #: The latest protocol events as published (oldest first), ``config.event_history`` at most.
        self.events = self.event_log.events
        #: What the device reports as its retained state (app traffic, energy...), and when.
        self.reporter = StateReporter(config, self.store, runtime, self.profile, self.trust,
                                      self.installer.power, self.event_log)
        self.energy, self.session = self.reporter.energy, self.reporter.session
        #: Payload bytes this agent received as chunks and published (state, events, requests).
        self.bytes_received = self.bytes_published = 0

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> DeviceAgent:
        """Connect, subscribe and publish this device's state; return once the broker accepted all of it. Raises
        BrokerError when it refuses the credentials, a subscription or the state (later ones land in :attr:`refusal`)."""
        cfg = self.config
        resume = self.installer.recover()  # before any command: the store must hold a working model
        if resume is not None:
            self._work.put(("activate", resume))
        self.transport = cfg.connect(self._transport_factory, self._publish_state, self._on_refused, self.session)
        self.transport.subscribe(Topics.cmd(cfg.device_id), lambda topic, payload: self._work.put(("command", payload)))
        self.transport.subscribe(Topics.device_chunks(cfg.device_id, "+") + "/+", self._on_chunk)
        if self.trust is not None:
            self.transport.subscribe(Topics.ALL_ROOTS, lambda topic, payload: self._work.put(("root", payload)))
            self.transport.subscribe(Topics.TIMESTAMP, lambda topic, payload: self._work.put(("timestamp", payload)))
        self._publish_state()  # the first connect happened before self.transport was set
        try:
            self.transport.confirm_access()  # an agent the ACL shuts out must not report itself ready
        except EdgeSDKError:
            self.transport.close()
            raise
        self._worker = threading.Thread(target=self._run, name=f"agent-{cfg.device_id}", daemon=True)
        self._worker.start()
        for cmd_file in sorted(self.store.incoming.glob("*.cmd")):
            self._work.put(("resume", cmd_file.read_bytes()))
        return self

    def stop(self) -> None:
        """Finish the work in hand, publish this device as offline and disconnect."""
        self._stop.set()
        self._work.put(("stop", None))
        if self._worker:
            self._worker.join(timeout=10)
        if self.transport:
            will = self.config.offline_state(self.session, self.transport.connection)
            self.transport.publish(Topics.state(self.config.device_id), will, retain=True)
            time.sleep(0.05)
            self.transport.close()
        self.measurements.stop()
        self.downloads.close()
        self.energy.close()

    def __enter__(self) -> DeviceAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # state -------------------------------------------------------------------------------
    def current_version(self) -> tuple[str, str] | None:
        """The name and version of the model ``current`` points at, or None before the first install."""
        return self.store.current_model()

    def state(self) -> dict[str, Any]:
        """What the agent reports as its retained state (:func:`edgesdk.agent.state_report.device_state`)."""
        return self.reporter.state(self.transport.connection if self.transport else None)

    def _event(self, about: Command | PendingInstall | None, event: AgentEvent, **details: Any) -> None:
        """Log and publish a protocol event (:class:`EventLog`), naming the deployment ``about`` is part of."""
        self.event_log.record(about, event, **details)

    def _publish_state(self) -> None:
        if self.transport is not None:
            self._publish(Topics.state(self.config.device_id), json.dumps(self.state()).encode(), retain=True)

    # network callbacks (paho's thread) -------------------------------------------------------
    def _on_refused(self, error: BrokerError) -> None:
        self.refusal = error
        if self._worker is not None:  # before that, start() raises it
            log.error("%s: the broker shut this agent out: %s", self.config.device_id, error)

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        if self.transport is not None:
            self.bytes_published += len(payload)
            self.transport.publish(topic, payload, retain=retain)

    def _on_chunk(self, topic: str, payload: bytes) -> None:
        self.bytes_received += len(payload)
        if (completed := self.downloads.accept_chunk(topic, payload)) is not None:
            self._work.put(("complete", completed))

    # worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                kind, item = self._work.get(timeout=self.config.retry_interval_s / 2)
            except queue.Empty:
                self.measurements.expire()
                for command, reason in self.downloads.expire_deploys(self.config.transfer_timeout_s):
                    self._event(command, AgentEvent.FAILED, reason=reason)
                self.downloads.request_missing()
                if self.trust is not None:
                    self.trust.check_freshness()
                if self.reporter.cadence.due():  # fast while the device is judged
                    self._publish_state()
                continue
            try:
                if kind == "stop":
                    return
                if kind in ("command", "resume"):
                    self._handle_command(item, resume=kind == "resume")
                elif kind == "complete":
                    self._complete(item)
                elif kind == "activate":
                    self._report_install(self.installer.activate(item))
                elif kind in ("root", "timestamp") and self.trust is not None:
                    self.trust.take(kind, item)
            except Exception:
                log.exception("%s: %s failed", self.config.device_id, kind)
            self.downloads.request_missing()

    def _handle_command(self, envelope: bytes, resume: bool) -> None:
        try:
            command = self.reader.read(envelope, self.config)
        except (SignatureError, TransferError) as exc:
            self._event(None, AgentEvent.REJECTED, reason=str(exc))
            return
        if isinstance(command, MeasureCommand):
            self.measurements.accept(command)
            return
        if (moved := self.reader.moved(command, self.config)) is not None:  # the server's group, reported from now
            self.config = self.reporter.config = moved
            self._publish_state()
        slot = self.store.slot_name(command.name, command.version)
        in_flight = self.downloads.get(command.transfer_id) is not None
        verdict = admit(command, self.store.load_state(), self.current_version(), self.store.pointer("current"),
                        in_flight=in_flight, resume=resume or (not in_flight and self.store.holds_transfer(
                            command.transfer_id)), held=self.store.has_slot(slot), store=self.store, trust=self.trust)
        if verdict.remember:
            self.store.remember(command.deployment_id)
        if not verdict.proceed:
            if verdict.event is not None:
                self._event(command, verdict.event, **verdict.details)
            return
        # Written before the install, read by apps only once this slot is committed (edgesdk.agent.follow).
        self.store.save_offload_endpoint(slot, command.offload)
        if self.store.has_slot(slot):  # a rollback, or a version this device still holds: nothing to fetch
            self._install(command, slot, downloaded=False)
            return
        if not self._fits(command):
            return
        transfer = self.downloads.begin(self.store.incoming, LocalChunks(self.store.root), command)
        assert self.transport is not None
        if not transfer.complete:
            self.transport.subscribe(Topics.group_chunks(command.group, command.transfer_id) + "/+", self._on_chunk)
        self._event(command, AgentEvent.ACCEPTED, chunks=len(command.archive.chunks) if command.archive else 0,
                    resumed_chunks=transfer.resumed_chunks, local_chunks=transfer.local_chunks,
                    local_corrupt=transfer.local_corrupt, missing=len(transfer.missing()))
        if transfer.complete:
            self._work.put(("complete", command.transfer_id))
        else:
            self.downloads.request_first(transfer, resume)

    def _complete(self, transfer_id: str) -> None:
        transfer = self.downloads.get(transfer_id)
        if transfer is None:
            return
        command = transfer.command
        if isinstance(command, MeasureCommand):
            self.measurements.complete(transfer, command)
            return
        started = time.perf_counter()
        try:
            archive = transfer.finish()
        except TransferError as exc:
            self._event(command, AgentEvent.PROGRESS, reason=str(exc))
            self.downloads.request(transfer)
            return
        self.downloads.pop(transfer_id)
        assert self.transport is not None
        self.transport.unsubscribe(Topics.group_chunks(command.group, transfer_id) + "/+")
        assert command.archive is not None
        self._event(command, AgentEvent.DOWNLOADED, bytes=command.archive.size, fetched_bytes=transfer.fetched_bytes,
                    local_bytes=transfer.local_bytes, local_chunks=transfer.local_chunks,
                    rejected_chunks=transfer.rejected)
        slot = self.store.slot_name(command.name, command.version)
        try:
            check_still_newer(command, self.current_version(), self.store)
            self.installer.unpack(slot, archive, command.archive)
        except EdgeSDKError as exc:
            event, details = refused_download(exc)  # committed when another deployment installed this version meanwhile
            self._event(command, event, **details)
            self._publish_state()
            return
        finally:
            transfer.discard()
        self._install(command, slot, downloaded=True, started=started, rejected_chunks=transfer.rejected)

    def _install(self, command: Command, slot: str, downloaded: bool, started: float | None = None, **details: Any) -> None:
        """Install a slot for a command; ``details`` (facts of its transfer) go with a commit's report."""
        outcome = self.installer.install(slot, deployment_id=command.deployment_id, name=command.name,
                                         version=command.version, verify=not downloaded,
                                         started=started, judge_s=command.judge_s)
        self._report_install(outcome, downloaded=downloaded, **details)

    def _report_install(self, outcome: InstallOutcome, **details: Any) -> None:
        extra = details if outcome.event == AgentEvent.COMMITTED else {}
        self._event(outcome.install, outcome.event, **outcome.details, **extra)
        if outcome.event in (AgentEvent.COMMITTED, AgentEvent.ROLLED_BACK):
            self.guard.prune(self.config.keep_slots)
        self._publish_state()

    def _fits(self, command: Command) -> bool:
        """Whether the command's archive fits on disk (:class:`StorageGuard`); else a FAILED StorageError event."""
        room = self.guard.make_room(command.archive, f"{command.name} {command.version}", command.transfer_id)
        if room.pruned or not room.fits:
            self._publish_state()  # the server plans what to send from the slots a device reports
        if room.error is None:
            return True
        self.store.save_offload_endpoint(self.store.slot_name(command.name, command.version), None)
        self._event(command, AgentEvent.FAILED, **room.report())
        return False
