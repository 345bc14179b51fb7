"""The device agent: receives signed commands over MQTT, fetches, verifies, swaps, reports.

Per deployment: verify the command's signature (before anything is written) → refuse a
replay or a downgrade that is not a signed rollback → receive chunks (the group broadcast,
plus re-requests of whatever is missing, on this device's own topic) checking each hash →
check the whole archive → unpack and verify into a new slot → install it (record it as
pending, point ``current`` at it, health-check it under live traffic, commit or point back:
:mod:`edgesdk.agent.install`) → report the outcome. A restarted agent resumes unfinished
transfers and finishes or undoes a pending install, so the store always holds a working
model.

A ``measure`` command is verified the same way, then its archive comes through the same
chunk machinery into ``store/scratch/<measurement>/`` (never a slot), the model is
measured in a child process under this device's profile (:mod:`edgesdk.agent.measure`)
and the result goes to ``P/devices/D/measurements``; the scratch directory is removed
afterwards. Slots, pointers, state and the ManagedRuntime are not touched.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.agent.energy_account import runtime_energy
from edgesdk.agent.failpoints import failpoint
from edgesdk.agent.install import Installer, InstallOutcome
from edgesdk.agent.local_chunks import LAYOUTS, LocalChunks, record_layout
from edgesdk.agent.managed import ManagedRuntime
from edgesdk.agent.measure import run_measurement
from edgesdk.agent.store import ModelStore, PendingInstall, space_needed
from edgesdk.agent.transfer import IncomingTransfer
from edgesdk.errors import BrokerError, EdgeSDKError, SignatureError, StorageError, TransferError
from edgesdk.fleet.protocol import Command, MeasureCommand, Topics, check_id, encode_result, parse_command, unpack_bundle
from edgesdk.fleet.records import AgentEvent
from edgesdk.fleet.transport import MqttTransport, Transport
from edgesdk.runtime.bundle import parse_version, read_bundle
from edgesdk.runtime.measure_worker import EnergyRequest
from edgesdk.runtime.profiles import DeviceProfile, load_profile

__all__ = ["DeviceAgent", "AgentConfig", "load_credentials"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """How one device agent connects, what it trusts, and how patiently it fetches."""

    device_id: str
    group: str
    broker: str
    store: Path
    server_key: Any = None
    #: Development only: accept unsigned commands when no server key is pinned.
    allow_unsigned: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    #: How many missing chunks one request asks for.
    request_window: int = 32
    #: Re-request missing chunks after this long without progress.
    retry_interval_s: float = 1.0
    #: How long after a deploy command the agent waits for the group broadcast before asking for chunks itself.
    broadcast_wait_s: float = 2.0
    #: The board measure commands run under: a DeviceProfile, a profile name or a YAML path. None: the
    #: ManagedRuntime's profile when the agent has one, else edgesdk.runtime.detect.detect_device().
    profile: str | os.PathLike[str] | DeviceProfile | None = None
    #: Longest a measure command may take here, once for its transfer and once for the measuring.
    measure_timeout_s: float = 600.0
    #: How many of its latest protocol events the agent keeps in DeviceAgent.events (the server keeps them all).
    event_history: int = 256
    #: How many of the newest installed slots the agent keeps after a commit or rollback, besides the slots in
    #: use (current, previous, pending) and the pinned ones; older slots are deleted.
    keep_slots: int = 3
    #: Slots never deleted: a slot name (``digits-1.2.0``) or a bare version (``1.2.0``, any model name).
    pinned: tuple[str, ...] = ()
    #: Bytes of disk the agent leaves free for everything else on the device; an update that would eat into
    #: them is refused (after pruning old slots) with a StorageError reason.
    min_free_bytes: int = 0
    #: Where sysfs is: the board's power sensor is found below it (edgesdk.runtime.energy.find_sensor). Tests feed a
    #: recorded tree.
    sysfs_root: str = "/sys"
    #: Publish the retained state (runtime statistics, energy) this often besides on every change; None: only
    #: on changes. Every device's state reaches the server, so fleets set it in minutes, not seconds.
    state_interval_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("keep_slots", "min_free_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StorageError(f"{name}={value!r} is out of range; pass a whole number of 0 or more")
        if self.state_interval_s is not None and not self.state_interval_s > 0:
            raise EdgeSDKError(f"state_interval_s={self.state_interval_s!r} must be > 0 seconds, or None")
        if isinstance(self.pinned, str) or not all(isinstance(p, str) and p for p in self.pinned):
            raise StorageError(f"pinned={self.pinned!r} is not a list of slot names or versions; pass e.g. "
                               "('digits-1.2.0', '1.1.0')")
        object.__setattr__(self, "pinned", tuple(self.pinned))


#: Log levels of protocol events other than INFO: what went wrong is a warning, chunk progress is detail.
_EVENT_LEVELS = {AgentEvent.PROGRESS: logging.DEBUG, AgentEvent.REJECTED: logging.WARNING,
                 AgentEvent.FAILED: logging.WARNING, AgentEvent.ROLLED_BACK: logging.WARNING}


def load_credentials(path: str | os.PathLike[str], device_id: str) -> tuple[str, str]:
    """The broker username and password in a credentials file of ``edgesdk server mosquitto-config``.

    Raises BrokerError when the file is not such a file or names another device (the broker's ACL
    would shut this agent out of its own topics).
    """
    fix = f"pass --credentials credentials/{device_id}.json from `edgesdk server mosquitto-config`"
    try:
        creds = json.loads(Path(path).read_text())
        username, password = creds["username"], creds["password"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BrokerError(f"{path} is not a credentials file with a username and password ({exc}); {fix}") from exc
    if creds.get("device_id", device_id) != device_id:
        raise BrokerError(f"{path} holds the credentials of device {creds['device_id']!r}, not {device_id!r}; {fix}")
    return str(username), str(password)


def _describe(device: str, event: dict[str, Any]) -> str:
    """One readable log line per protocol event, e.g. ``cam01: committed digits 1.2.0 (apply 120 ms)``."""
    what = " ".join(str(event[k]) for k in ("name", "version") if event.get(k))
    facts = []
    if event.get("apply_ms") is not None:
        facts.append(f"apply {event['apply_ms']:.0f} ms")
    if event.get("bytes"):
        facts.append(f"{event['bytes']} bytes")
    if event.get("chunks"):
        facts.append(f"{event['chunks']} chunk{'s' if event['chunks'] != 1 else ''}, {event.get('missing', 0)} to fetch")
    if event.get("restored"):
        facts.append(f"back on {event['restored']}")
    if event.get("reason"):
        facts.append(str(event["reason"]))
    return f"{device}: {event['event'].replace('_', ' ')} {what}".rstrip() + (f" ({'; '.join(facts)})" if facts else "")


def _broadcast_plan(command: Command) -> frozenset[int]:
    """The chunks the server said it will broadcast for ``command`` (every chunk when it said nothing)."""
    assert command.archive is not None
    return command.broadcast if command.broadcast is not None else frozenset(range(len(command.archive.chunks)))


class DeviceAgent:
    """Runs the OTA protocol for one device; give it a ManagedRuntime to swap models under an app."""

    def __init__(self, config: AgentConfig, runtime: ManagedRuntime | None = None,
                 transport_factory: Callable[..., Transport] = MqttTransport) -> None:
        self.config = config
        check_id(config.device_id, "device id")
        check_id(config.group, "group")
        self.store = ModelStore(config.store)
        self.runtime = runtime
        self.installer = Installer(self.store, runtime)
        if config.profile is not None:
            self.profile = load_profile(config.profile)
        elif runtime is not None:
            self.profile = runtime.profile
        else:
            from edgesdk.runtime.detect import detect_device

            self.profile = detect_device()
        #: Measurement ids taken on since start (a re-delivered command is not measured twice).
        self._measurements: set[str] = set()
        self._measuring = threading.Lock()  # one measurement at a time: they would skew each other
        self._transport_factory = transport_factory
        self._transfers: dict[str, IncomingTransfer] = {}
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()
        self._work: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self.transport: Transport | None = None
        #: Why the broker shut this agent out after it started (credentials or ACL changed, seen on a
        #: reconnect): the agent can no longer be reached, so whoever runs it should stop it and say so.
        self.refusal: BrokerError | None = None
        #: The latest protocol events as published (oldest first), ``config.event_history`` at most.
        self.events: deque[dict[str, Any]] = deque(maxlen=config.event_history)
        #: Payload bytes this agent received as chunks and published (state, events, requests).
        self.bytes_received = 0
        self.bytes_published = 0
        self.energy = runtime_energy(self.profile, runtime, config.sysfs_root)
        self._state_due = time.monotonic() + (config.state_interval_s or 0)

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> DeviceAgent:
        """Connect, subscribe and publish this device's state; return once the broker accepted all of it.

        Raises BrokerError when the broker refuses the credentials, a subscription or the state publish
        (its ACL does not let this device use its own topics); a later refusal lands in :attr:`refusal`.
        """
        cfg = self.config
        resume = self.installer.recover()  # before any command: the store must hold a working model
        if resume is not None:
            self._work.put(("activate", resume))
        offline = json.dumps({"status": "offline", "group": cfg.group}).encode()
        # State is re-published on every (re)connect: a restarted broker forgets retained messages.
        self.transport = self._transport_factory(cfg.broker, client_id=f"edgesdk-agent-{cfg.device_id}",
                                                 username=cfg.username, password=cfg.password,
                                                 will=(Topics.state(cfg.device_id), offline), ca_file=cfg.ca_file,
                                                 on_connect=self._publish_state, on_refused=self._on_refused)
        self.transport.subscribe(Topics.cmd(cfg.device_id), self._on_command)
        self.transport.subscribe(Topics.device_chunks(cfg.device_id, "+") + "/+", self._on_chunk)
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
            self.transport.publish(Topics.state(self.config.device_id),
                                   json.dumps({"status": "offline", "group": self.config.group}).encode(), retain=True)
            time.sleep(0.05)
            self.transport.close()
        for transfer in self._transfers.values():
            transfer.close()
        self.energy.close()

    def __enter__(self) -> DeviceAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # state -------------------------------------------------------------------------------
    def current_version(self) -> tuple[str, str] | None:
        """The name and version of the model ``current`` points at, or None before the first install."""
        slot = self.store.pointer("current")
        if slot is None:
            return None
        manifest = read_bundle(self.store.slots / slot).manifest
        return manifest.name, manifest.version

    def state(self) -> dict[str, Any]:
        """What the agent reports as its retained state: model and version, slots, and, with a ManagedRuntime,
        its statistics (calls, latency percentiles, and where predict_async requests ran: local, cloud, refused)
        and its energy per inference since the last report where the board has a power sensor
        (:mod:`edgesdk.agent.energy_account`; else ``{"sensor": None, "note": ...}``)."""
        current = self.current_version()
        state: dict[str, Any] = {
            "status": "online", "group": self.config.group, "model": current[0] if current else None,
            "version": current[1] if current else None, "previous": self.store.pointer("previous"),
            "slots": (slots := sorted(p.name for p in self.store.slots.iterdir() if not p.name.startswith("."))),
            "chunk_slots": [slot for slot in slots if (self.store.root / LAYOUTS / f"{slot}.json").is_file()],
            "disk": self.store.disk_usage(), "keep_slots": self.config.keep_slots, "pinned": list(self.config.pinned),
            "updated": time.time()}
        if self.runtime is not None:
            stats = self.runtime.stats()
            state["runtime"] = stats.as_dict()
            state["energy"] = self.energy.report(stats.count)
        return state

    def _publish_state(self) -> None:
        if self.transport is None:
            return
        self._publish(Topics.state(self.config.device_id), json.dumps(self.state()).encode(), retain=True)

    def _event(self, about: Command | PendingInstall | None, event: AgentEvent, **details: Any) -> None:
        """Log and publish a protocol event, naming the deployment ``about`` is part of."""
        payload = {"event": event, "time": time.time(), **details}
        if about is not None:
            payload.update(deployment_id=about.deployment_id, name=about.name, version=about.version)
        self.events.append(payload)
        log.log(_EVENT_LEVELS.get(event, logging.INFO), "%s", _describe(self.config.device_id, payload))
        self._publish(Topics.events(self.config.device_id), json.dumps(payload).encode())

    # network callbacks (paho's thread) -------------------------------------------------------
    def _on_refused(self, error: BrokerError) -> None:
        self.refusal = error
        if self._worker is not None:  # before that, start() raises it
            log.error("%s: the broker shut this agent out: %s", self.config.device_id, error)

    def _on_command(self, topic: str, payload: bytes) -> None:
        self._work.put(("command", payload))

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        if self.transport is not None:
            self.bytes_published += len(payload)
            self.transport.publish(topic, payload, retain=retain)

    def _on_chunk(self, topic: str, payload: bytes) -> None:
        self.bytes_received += len(payload)
        parts = topic.split("/")
        transfer_id, index = parts[-2], parts[-1]
        with self._lock:
            transfer = self._transfers.get(transfer_id)
        if transfer is None or not index.isdigit():
            return
        if not transfer.accept(int(index), payload):
            log.warning("%s: chunk %s of %s failed its hash check; it will be fetched again",
                        self.config.device_id, index, transfer_id)
            return
        failpoint("after_chunks", transfer.received)
        if transfer.complete:
            self._work.put(("complete", transfer_id))

    # worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                kind, item = self._work.get(timeout=self.config.retry_interval_s / 2)
            except queue.Empty:
                self._expire_measurements()
                self._request_missing()
                if self.config.state_interval_s and time.monotonic() >= self._state_due:
                    self._state_due = time.monotonic() + self.config.state_interval_s
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
            except Exception:
                log.exception("%s: %s failed", self.config.device_id, kind)
            self._request_missing()

    def _handle_command(self, envelope: bytes, resume: bool) -> None:
        cfg = self.config
        try:
            command = parse_command(envelope, cfg.server_key, allow_unsigned=cfg.allow_unsigned)
        except (SignatureError, TransferError) as exc:
            self._event(None, AgentEvent.REJECTED, reason=str(exc))
            return
        if isinstance(command, MeasureCommand):
            self._accept_measurement(command)
            return
        state = self.store.load_state()
        if command.deployment_id in state.seen and not resume:
            slot = self.store.slot_name(command.name, command.version)
            with self._lock:
                in_progress = command.transfer_id in self._transfers
            if in_progress:
                return  # the server re-sent a command whose transfer is running: nothing to do
            if self.store.pointer("current") == slot and state.pending is None and state.committed == slot:
                self._event(command, AgentEvent.COMMITTED, repeated=True)  # its first report may have been lost
                return
            self._event(command, AgentEvent.REJECTED, reason=f"replayed command: deployment {command.deployment_id} was "
                                                     "already handled")
            return
        current = self.current_version()
        if (current and current[0] == command.name and not command.rollback
                and parse_version(current[1]) >= command.version_tuple):
            self._event(command, AgentEvent.REJECTED, reason=f"refused downgrade: {command.name} {command.version} <= installed "
                                                     f"{current[1]}; only a signed rollback may go back")
            self._remember(command)
            return
        self._remember(command)
        slot = self.store.slot_name(command.name, command.version)
        # Written before the install, read by apps only once this slot is committed (edgesdk.agent.follow).
        self.store.save_offload_endpoint(slot, command.offload)
        if command.type == "rollback" or self.store.has_slot(slot):
            if not self.store.has_slot(slot):
                self._event(command, AgentEvent.FAILED, reason=f"rollback target {slot} is not in this device's store")
                return
            self._install(command, slot, downloaded=False)
            return
        if not self._fits(command):
            return
        transfer = IncomingTransfer(self.store.incoming, command)
        transfer.fill(LocalChunks(self.store.root))
        with self._lock:
            self._transfers[command.transfer_id] = transfer
            self._started[command.transfer_id] = time.monotonic()
        assert self.transport is not None
        if not transfer.complete:
            self.transport.subscribe(Topics.group_chunks(command.group, command.transfer_id) + "/+", self._on_chunk)
        self._event(command, AgentEvent.ACCEPTED, chunks=len(command.archive.chunks) if command.archive else 0,
                    resumed_chunks=transfer.resumed_chunks, local_chunks=transfer.local_chunks,
                    local_corrupt=transfer.local_corrupt, missing=len(transfer.missing()))
        if transfer.complete:
            self._work.put(("complete", command.transfer_id))
        elif resume:
            self._request(transfer)
        else:  # what the broadcast will not bring (a local copy the server counted on was damaged): ask now
            self._request(transfer, exclude=_broadcast_plan(command))

    def _remember(self, command: Command) -> None:
        state = self.store.load_state()
        if command.deployment_id not in state.seen:
            state.seen.append(command.deployment_id)
            self.store.save_state(state)

    def _request(self, transfer: IncomingTransfer, exclude: frozenset[int] = frozenset()) -> None:
        missing = transfer.missing(exclude)[: self.config.request_window]
        if missing and self.transport is not None:
            self._publish(Topics.need(self.config.device_id), json.dumps(
                {"transfer_id": transfer.command.transfer_id, "chunks": missing}).encode())
            transfer.last_progress = time.monotonic()

    def _request_missing(self) -> None:
        now = time.monotonic()
        with self._lock:
            transfers = list(self._transfers.values())
        for transfer in transfers:
            tid = transfer.command.transfer_id
            if transfer.complete or now - transfer.last_progress < self.config.retry_interval_s:
                continue
            if now - self._started.get(tid, now) >= self.config.broadcast_wait_s:
                self._request(transfer)
            elif isinstance(transfer.command, Command) and transfer.command.broadcast is not None:
                self._request(transfer, exclude=transfer.command.broadcast)  # the broadcast brings the others

    def _complete(self, transfer_id: str) -> None:
        with self._lock:
            transfer = self._transfers.get(transfer_id)
        if transfer is None:
            return
        command = transfer.command
        if isinstance(command, MeasureCommand):
            self._measure(transfer, command)
            return
        started = time.perf_counter()
        try:
            archive = transfer.finish()
        except TransferError as exc:
            self._event(command, AgentEvent.PROGRESS, reason=str(exc))
            self._request(transfer)
            return
        with self._lock:
            self._transfers.pop(transfer_id, None)
        assert self.transport is not None
        self.transport.unsubscribe(Topics.group_chunks(command.group, transfer_id) + "/+")
        assert command.archive is not None
        self._event(command, AgentEvent.DOWNLOADED, bytes=command.archive.size, fetched_bytes=transfer.fetched_bytes,
                    local_bytes=transfer.local_bytes, local_chunks=transfer.local_chunks,
                    rejected_chunks=transfer.rejected)
        slot = self.store.slot_name(command.name, command.version)
        try:
            self.store.add_slot(slot, lambda tmp: unpack_bundle(archive, tmp))
        except EdgeSDKError as exc:
            transfer.discard()
            self._event(command, AgentEvent.FAILED, reason=f"bundle rejected: {exc}")
            self._publish_state()
            return
        try:  # without it the next version fetches every chunk; the install itself does not need it
            record_layout(self.store.root, slot, archive, command.archive)
        except (OSError, tarfile.TarError) as exc:
            log.warning("%s: could not record the chunk layout of %s (%s)", self.config.device_id, slot, exc)
        transfer.discard()
        self._install(command, slot, downloaded=True, started=started, rejected_chunks=transfer.rejected)

    def _install(self, command: Command, slot: str, downloaded: bool, started: float | None = None,
                 **details: Any) -> None:
        """Install a slot for a command; ``details`` (facts of its transfer) go with a commit's report."""
        outcome = self.installer.install(slot, deployment_id=command.deployment_id, name=command.name,
                                         version=command.version, verify=not downloaded, started=started)
        self._report_install(outcome, downloaded=downloaded, **details)

    def _report_install(self, outcome: InstallOutcome, **details: Any) -> None:
        extra = details if outcome.event == AgentEvent.COMMITTED else {}
        self._event(outcome.install, outcome.event, **outcome.details, **extra)
        if outcome.event in (AgentEvent.COMMITTED, AgentEvent.ROLLED_BACK):
            self._prune(self.config.keep_slots)
        self._publish_state()

    # disk --------------------------------------------------------------------------------
    def _prune(self, keep_newest: int) -> list[str]:
        """Delete old slots (the store keeps those in use, pending or pinned); log what went."""
        try:
            removed = self.store.prune(keep_newest, self.config.pinned)
        except OSError as exc:  # a slot that cannot be deleted now must not stop the agent reporting
            log.warning("%s: pruning old slots failed: %s", self.config.device_id, exc)
            return []
        if removed:
            log.info("%s: pruned %d old slot%s: %s", self.config.device_id, len(removed),
                     "" if len(removed) == 1 else "s", ", ".join(removed))
        return removed

    def _room(self) -> int:
        return self.store.disk_usage()["free_bytes"] - self.config.min_free_bytes

    def _fits(self, command: Command | MeasureCommand) -> bool:
        """Whether the command's archive fits on disk, pruning down to the protected slots if that makes room.

        If not, the command is refused: a FAILED event (a failed measurement for a measure command) whose
        ``error_type`` is StorageError and whose reason says the bytes needed and free and the fix.
        """
        if command.archive is None:
            return True
        needed = space_needed(command.archive)
        if self._room() >= needed:
            return True
        pruned = self._prune(0)
        if self._room() >= needed:
            if pruned:
                self._publish_state()  # the server plans what to send from the slots a device reports
            return True
        free, reserve = self.store.disk_usage()["free_bytes"], self.config.min_free_bytes
        what = (f"measurement {command.measurement_id}" if isinstance(command, MeasureCommand)
                else f"{command.name} {command.version}")
        error = StorageError(
            f"no room for {what}: it needs {needed} bytes (archive and unpacked slot), the store's disk has {free} "
            f"bytes free and {reserve} of them are reserved (min_free_bytes), after pruning every slot not in use or "
            "pinned; free space on the device or lower min_free_bytes")
        for leftover in self.store.incoming.glob(f"{command.transfer_id}.*"):  # a resumed transfer's partial files
            leftover.unlink(missing_ok=True)
        if isinstance(command, MeasureCommand):
            self._report(command, encode_result(command.measurement_id, "failed", error=error))
        else:
            self.store.save_offload_endpoint(self.store.slot_name(command.name, command.version), None)
            self._event(command, AgentEvent.FAILED, reason=str(error), error_type=type(error).__name__,
                        needed_bytes=needed, free_bytes=free, reserved_bytes=reserve)
        self._publish_state()
        return False

    # measurements -----------------------------------------------------------------------------
    def _accept_measurement(self, command: MeasureCommand) -> None:
        mid = command.measurement_id
        if mid in self._measurements:
            return  # a re-delivered command: the first one is running or has reported
        self._measurements.add(mid)
        if not self._fits(command):
            return
        scratch = self.store.scratch / mid
        scratch.mkdir()
        transfer = IncomingTransfer(scratch, command)
        with self._lock:
            self._transfers[command.transfer_id] = transfer
            self._started[command.transfer_id] = time.monotonic()
        self._report(command, encode_result(mid, "accepted"))

    def _report(self, command: MeasureCommand, payload: bytes) -> None:
        log.info("%s: measurement %s: %s", self.config.device_id, command.measurement_id,
                 json.loads(payload)["status"])
        self._publish(Topics.measurements(self.config.device_id), payload)

    def _fail_measurement(self, transfer: IncomingTransfer, command: MeasureCommand, error: EdgeSDKError) -> None:
        with self._lock:
            self._transfers.pop(command.transfer_id, None)
            self._started.pop(command.transfer_id, None)
        transfer.discard()
        shutil.rmtree(self.store.scratch / command.measurement_id, ignore_errors=True)
        self._report(command, encode_result(command.measurement_id, "failed", error=error))

    def _measure(self, transfer: IncomingTransfer, command: MeasureCommand) -> None:
        """The archive is complete: check its hash, then measure in a thread of its own."""
        try:
            archive = transfer.finish()
        except TransferError as exc:  # the signed hash does not match: no second try for a measurement
            self._fail_measurement(transfer, command, exc)
            return
        with self._lock:
            self._transfers.pop(command.transfer_id, None)
            self._started.pop(command.transfer_id, None)
        transfer.close()
        threading.Thread(target=self._run_measurement, args=(command, archive), daemon=True,
                         name=f"measure-{command.measurement_id}").start()

    def _run_measurement(self, command: MeasureCommand, archive: Path) -> None:
        scratch = self.store.scratch / command.measurement_id
        try:
            with self._measuring:
                payload = run_measurement(command, archive, scratch, self.profile, self.config.measure_timeout_s,
                                          EnergyRequest(self.config.sysfs_root))
        except Exception as exc:  # e.g. a full disk: report it rather than leave the server waiting
            log.exception("%s: measurement %s failed", self.config.device_id, command.measurement_id)
            payload = encode_result(command.measurement_id, "failed", error=exc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not self._stop.is_set():
            self._report(command, payload)

    def _expire_measurements(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [t for tid, t in self._transfers.items() if isinstance(t.command, MeasureCommand)
                     and now - self._started.get(tid, now) > self.config.measure_timeout_s]
        for transfer in stale:
            assert isinstance(transfer.command, MeasureCommand)
            self._fail_measurement(transfer, transfer.command, TransferError(
                f"the archive did not arrive within {self.config.measure_timeout_s:g} s; is the server still "
                "serving it?"))
