"""The worker side of the simulated fleet (:mod:`benchmarks.shared.fleet_sim`): one process's devices on one event loop.

Each device speaks the real OTA protocol over its own MQTT connection (see the module doc of :mod:`benchmarks.shared.fleet_sim`
for what it shows the server). A worker reads its config as the first JSON line on stdin, then requests (``snapshot``, a
fault, ``stop``) one per line, and answers on stdout; it ends by itself when stdin closes or after ``max_runtime_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.shared.fleet_sim_basics import ChunkStore, SimulationError, Transfer, device_role, raise_fd_limit, updated_twice
from benchmarks.shared.fleet_sim_faults import FAULT_COMMANDS, DeviceFaults, apply_fault, cut, wait_unblocked
from edgesdk.agent.admission import already_installed, check_still_newer, not_newer, refused_download
from edgesdk.errors import ConflictError, EdgeSDKError, SignatureError, TransferError
from edgesdk.fleet.chunk_codec import decode_chunk
from edgesdk.fleet.measurement import encode_result
from edgesdk.fleet.protocol import Command, MeasureCommand, Topics, parse_command
from edgesdk.fleet.records import AgentEvent
from edgesdk.fleet.trust import Root, parse_root, trust_root, update_root

__all__ = ["worker_main"]

ROOT_TOPICS = Topics.ALL_ROOTS.removesuffix("+")  # where root versions arrive (edgesdk.fleet.trust), retained

class _Device:
    """One simulated device agent (see the module docstring); all its work runs on the worker's loop."""

    __slots__ = ("sim", "id", "device_id", "role", "model", "version", "previous", "slots", "chunk_slots", "committed", "seen",
                 "install_log", "faults", "transfers", "client", "state_topic", "events_topic", "cmd_topic", "root", "connects",
                 "chunk_bytes", "session", "link")

    def __init__(self, sim: _Worker, device_id: str, role: str) -> None:
        self.sim, self.id, self.device_id, self.role = sim, device_id, device_id, role  # device_id: as a Recipient
        self.session = 0.0  # set at each connect
        self.model: str | None = sim.model
        self.version: str | None = sim.version
        slot = f"{sim.model}-{sim.version}"
        self.previous: str | None = None
        self.slots = {slot}
        #: Slots whose archive chunks this device holds (fetched in this run; the first slot's are not).
        self.chunk_slots: set[str] = set()
        self.committed: str | None = slot
        self.seen: set[str] = set()
        #: What this device installed, in order: [time, deployment, version, outcome, rollback?] (the chaos run reads it).
        self.install_log: list[list[Any]] = []
        #: When (time.time()) each of its connections was accepted by the broker; chunk payload bytes it received.
        self.connects: list[float] = []
        self.chunk_bytes = 0
        self.faults = DeviceFaults()
        self.transfers: dict[str, Transfer] = {}
        #: The connection once set up (``link``: once the broker accepted it, so the device answers a command that
        #: arrives while it still waits for its subscriptions to be acknowledged, as the agent does).
        self.client: Any = None
        self.link: Any = None
        self.state_topic, self.events_topic, self.cmd_topic = (Topics.state(device_id), Topics.events(device_id),
                                                               Topics.cmd(device_id))
        #: The root of trust this device holds (with ``root`` in the config), verified as the real agent does.
        self.root: Root | None = sim.root

    # connection ----------------------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect, subscribe and publish the retained state; returns once the broker acknowledged all of it."""
        from benchmarks.shared.mqtt_lite import LiteClient

        sim = self.sim
        self.session = time.time()  # one per connection (so each is its run's 1st): its will and states carry it
        will = (self.state_topic, json.dumps(self.offline()).encode())
        client: LiteClient = LiteClient(f"edgesdk-agent-{self.id}", self.on_message, keepalive=sim.keepalive, will=will,
                            counters=sim.counters, on_lost=lambda: self.on_lost(client))
        try:
            await client.connect(sim.host, sim.port, timeout=sim.connect_timeout)
            accepted, self.link = time.time(), client
            filters = [(self.cmd_topic, 1), (Topics.device_chunks(self.id, "+") + "/+", 1)]
            if self.root is not None:
                filters.append((Topics.ALL_ROOTS, 1))
            filters += [(Topics.group_chunks(t.command.group, tid) + "/+", 1) for tid, t in self.transfers.items()]
            subscribed = client.subscribe(filters)
            published = client.publish(self.state_topic, json.dumps(self.state()).encode(), qos=1, retain=True)
            assert published is not None
            codes = await asyncio.wait_for(subscribed, sim.connect_timeout)
            if any(code == 0x80 for code in codes):
                raise SimulationError(f"the broker refused the subscriptions of {self.id}; check its ACL")
            await asyncio.wait_for(published, sim.connect_timeout)
            if not client.connected:  # lost after the acknowledgements (a second broker restart): on_lost ignored it
                raise OSError(f"{self.id}: the connection closed while connecting")
        except BaseException:
            client.abort()
            self.link = None if self.link is client else self.link
            raise
        # Only now: a connection lost while connecting is retried by connect_with_retry, not by on_lost.
        self.client = client
        self.connects.append(accepted)
        if self.faults.pending_install is not None:  # restarted after a crash mid-install: finish it
            command, slot, downloaded, details = self.faults.pending_install
            self.faults.pending_install = None
            self.install(command, slot, downloaded, **details)

    def on_lost(self, client: Any) -> None:
        """The broker went away: connect again with backoff, as paho does for the real agent."""
        if client is not self.client:
            return
        self.client = self.link = None
        if not self.sim.stopping:
            self.sim.count("reconnects")
            asyncio.get_running_loop().create_task(self.sim.connect_with_retry(self, first=False))

    @property
    def group(self) -> str:
        """The group this device's reports name (its fleet's, unless a ``claim_group`` fault says otherwise)."""
        return self.faults.claimed_group or self.sim.group

    def publish(self, topic: str, payload: dict[str, Any], retain: bool = False) -> Any:
        if self.link is None or not self.link.connected:
            return None  # lost with the connection, as paho drops what it could not send (max_queued 0)
        return self.link.publish(topic, json.dumps(payload).encode(), qos=1, retain=retain)

    def state(self) -> dict[str, Any]:
        state = {"status": "online", "group": self.group, "model": self.model, "version": self.version,
                 "previous": self.previous, "slots": sorted(self.slots), "chunk_slots": sorted(self.chunk_slots),
                 "updated": time.time(), "session": self.session, "connection": 1}
        if self.root is not None:
            state["trust"] = {"root_version": self.root.version}
        return state

    def offline(self) -> dict[str, Any]:
        return {"status": "offline", "group": self.group, "session": self.session, "connection": 1}

    def publish_state(self) -> Any:
        return self.publish(self.state_topic, self.state(), retain=True)

    def event(self, command: Command | None, event: AgentEvent, **details: Any) -> None:
        payload: dict[str, Any] = {"event": event.value, "time": time.time(), **details}
        if command is not None:
            payload.update(deployment_id=command.deployment_id, name=command.name, version=command.version)
        if event != AgentEvent.PROGRESS:
            self.sim.count(event.value)
        self.publish(self.events_topic, payload)

    # messages ------------------------------------------------------------------------------------
    def on_message(self, topic: str, payload: bytes) -> None:
        """A command or a chunk from the broker."""
        if topic == self.cmd_topic:
            self.sim.count("commands")
            if self.role != "silent":
                if delay := self.faults.delay():
                    asyncio.get_running_loop().call_later(delay, self.on_command, payload)
                else:
                    self.on_command(payload)
        elif topic.startswith(ROOT_TOPICS):
            self.on_root(payload)
        elif self.role != "silent":
            self.on_chunk(topic, payload)

    def on_root(self, document: bytes) -> None:
        """The agent's TrustKeeper: take the next root version when the current root keys and its own signed it."""
        if self.root is None:
            return
        try:
            new, _ = parse_root(document)
            if new.version <= self.root.version:
                return  # a retained copy of a version this device went through
            self.root = update_root(self.root, document)
        except SignatureError as exc:  # TrustError included
            self.sim.count("roots_refused")
            self.event(None, AgentEvent.REJECTED, reason=str(exc))
            return
        self.sim.count("root_updates")
        self.publish_state()

    def on_command(self, envelope: bytes) -> None:
        """The agent's ``_handle_command``: verify, refuse replays and downgrades, then fetch or install."""
        sim = self.sim
        try:
            keys = self.root.keyset("commands") if self.root is not None else sim.server_key
            command = parse_command(envelope, keys, to=self, strict=self.root is not None)  # bound, as the agent
        except (SignatureError, TransferError) as exc:
            self.event(None, AgentEvent.REJECTED, reason=str(exc))
            return
        if isinstance(command, MeasureCommand):  # no runtime here: say so, as a device whose measuring failed
            sim.count("measure_commands")
            self.publish(Topics.measurements(self.id), json.loads(encode_result(
                command.measurement_id, "failed", error=TransferError("a simulated device has no runtime to measure "
                                                                      "with; measure on a real agent"))))
            return
        slot = f"{command.name}-{command.version}"
        if command.deployment_id in self.seen:
            sim.count("duplicate_commands")
            if command.transfer_id in self.transfers:
                return  # re-sent while the transfer runs: nothing to do
            if self.committed == slot and self.current_slot() == slot:
                sim.count("repeated_commits")
                self.event(command, AgentEvent.COMMITTED, repeated=True)
                return
            self.event(command, AgentEvent.REJECTED,
                       reason=f"replayed command: deployment {command.deployment_id} was already handled")
            return
        if already_installed(command, self.running()):  # as the agent: another deployment of it got there first
            self.seen.add(command.deployment_id)
            return self.event(command, AgentEvent.COMMITTED, already_installed=True)
        if not_newer(command, self.running()):
            self.event(command, AgentEvent.REJECTED, reason=f"refused downgrade: {command.name} {command.version} <= "
                                                            f"installed {self.version}; only a signed rollback may go back")
            self.seen.add(command.deployment_id)
            return
        self.seen.add(command.deployment_id)
        if command.type == "rollback" or slot in self.slots:
            if slot not in self.slots:
                self.event(command, AgentEvent.FAILED, reason=f"rollback target {slot} is not in this device's store")
                return
            self.install(command, slot, downloaded=False)
            return
        assert command.archive is not None
        chunks = len(command.archive.chunks)
        if not sim.fetch:
            self.event(command, AgentEvent.ACCEPTED, chunks=chunks, resumed_chunks=0, missing=chunks)
            self.event(command, AgentEvent.DOWNLOADED, bytes=command.archive.size, rejected_chunks=0)
            self.slots.add(slot)
            self.install(command, slot, downloaded=True, rejected_chunks=0)
            return
        transfer = self.transfers[command.transfer_id] = Transfer(command, time.monotonic())
        local = sim.store.fill(self.chunk_slots, transfer)
        if transfer.complete:
            self.event(command, AgentEvent.ACCEPTED, chunks=chunks, resumed_chunks=0, local_chunks=local, missing=0)
            self.complete(transfer)
            return
        sim.active.add(self)
        if self.link is not None and self.link.connected:  # SUBSCRIBE goes out before the event, as paho's
            self.link.subscribe([(Topics.group_chunks(command.group, command.transfer_id) + "/+", 1)])
        self.event(command, AgentEvent.ACCEPTED, chunks=chunks, resumed_chunks=0, local_chunks=local,
                   missing=len(transfer.missing()))
        if command.broadcast is not None:  # what the broadcast will not bring: ask at once, as the agent does
            sim.request(self, transfer, exclude=command.broadcast)

    def running(self) -> tuple[str, str] | None:
        return (self.model, self.version) if self.model and self.version else None

    def current_slot(self) -> str | None:
        return "-".join(self.running() or ()) or None

    def on_chunk(self, topic: str, payload: bytes) -> None:
        """A chunk of a running transfer: kept if its hash matches the signed one; the archive checked when complete."""
        sim = self.sim
        sim.count("chunk_bytes", len(payload))
        self.chunk_bytes += len(payload)
        parts = topic.split("/")
        transfer = self.transfers.get(parts[-2])
        if transfer is None or not parts[-1].isdigit():
            return
        archive = transfer.command.archive
        assert archive is not None
        index = int(parts[-1])
        if index in transfer.chunks:
            return
        try:
            data = decode_chunk(archive, index, payload) if 0 <= index < len(archive.chunks) else b""
        except TransferError:
            data = b""
        if data and self.faults.corrupts():
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if not data or hashlib.sha256(data).hexdigest() != archive.chunks[index]:
            transfer.rejected += 1
            sim.count("chunks_rejected")
            return
        sim.count("chunk_data_bytes", len(data))
        transfer.chunks[index] = data
        transfer.last_progress = time.monotonic()
        if transfer.complete:
            self.complete(transfer)

    def complete(self, transfer: Transfer) -> None:
        """The agent's ``_complete``: check the whole archive, report downloaded, install."""
        command, archive = transfer.command, transfer.command.archive
        assert archive is not None
        digest = hashlib.sha256(b"".join(transfer.chunks[i] for i in range(len(archive.chunks)))).hexdigest()
        if digest != archive.sha256:
            transfer.chunks.clear()
            self.event(command, AgentEvent.PROGRESS, reason=f"archive of transfer {command.transfer_id} hashes to "
                                                            f"{digest[:16]}…, the signed manifest says "
                                                            f"{archive.sha256[:16]}…; fetching it again")
            self.sim.request(self, transfer)
            return
        del self.transfers[command.transfer_id]
        if not self.transfers:
            self.sim.active.discard(self)
        try:
            check_still_newer(command, self.running())  # another deployment may have installed while it downloaded
        except ConflictError as exc:
            event, details = refused_download(exc)
            return self.event(command, event, **details)
        if self.link is not None and self.link.connected:
            self.link.unsubscribe([Topics.group_chunks(command.group, command.transfer_id) + "/+"])
        self.event(command, AgentEvent.DOWNLOADED, bytes=archive.size, rejected_chunks=transfer.rejected)
        self.slots.add(f"{command.name}-{command.version}")
        self.sim.store.keep(f"{command.name}-{command.version}", transfer)
        self.chunk_slots.add(f"{command.name}-{command.version}")
        self.install(command, f"{command.name}-{command.version}", downloaded=True, rejected_chunks=transfer.rejected)

    def install(self, command: Command, slot: str, downloaded: bool, **details: Any) -> None:
        """The installer's switch and health check, without a runtime; a ``fail`` device fails every non-rollback."""
        if self.faults.crash_for_s is not None:  # dies mid-install: nothing reported, finished on restart
            self.faults.pending_install = (command, slot, downloaded, details)
            seconds, self.faults.crash_for_s = self.faults.crash_for_s, None
            self.sim.count("crashes")
            cut(self.sim, self, seconds)
            return
        started = time.perf_counter()
        old = self.current_slot()
        failing = (self.role == "fail" or command.version in self.sim.bad_versions) and not command.rollback
        self.install_log.append([time.time(), command.deployment_id, command.version,
                                 "rolled_back" if failing else "committed", command.rollback])
        if failing:
            self.previous = old
            self.event(command, AgentEvent.ROLLED_BACK, reason="HealthCheckError: simulated health check failure "
                                                               "(a fail_share device, or one of the bad_versions)",
                       restored=old)
        else:
            self.previous = old if old and old != slot else self.previous
            self.model, self.version, self.committed = command.name, command.version, slot
            self.event(command, AgentEvent.COMMITTED, apply_ms=(time.perf_counter() - started) * 1e3,
                       health={"max_abs_error": 0.0, "latency_ms": 0.0}, downloaded=downloaded,
                       **(details if downloaded else {}))
        self.publish_state()


class _Worker:
    """The devices of one worker process, their counters, and the control channel to the parent."""

    def __init__(self, config: dict[str, Any]) -> None:
        from benchmarks.shared.mqtt_lite import LiteCounters
        from edgesdk.runtime.signing import load_public_key

        self.config = config
        self.host, self.port = config["host"], int(config["port"])
        self.group, self.model, self.version = config["group"], config["model"], config["version"]
        self.fetch = bool(config["fetch"])
        self.bad_versions = frozenset(config.get("bad_versions", ()))
        self.keepalive = int(config["keepalive"])
        self.connect_timeout = float(config["connect_timeout"])
        self.broadcast_wait_s, self.retry_interval_s = float(config["broadcast_wait_s"]), float(config["retry_interval_s"])
        self.request_window = int(config["request_window"])
        self.server_key = load_public_key(config["server_key"])
        self.root = trust_root(Path(config["root"]).read_bytes()) if config.get("root") else None
        self.counters = LiteCounters()
        self.store = ChunkStore()
        self.counts: Counter[str] = Counter()
        self.stopping = False
        self.active: set[_Device] = set()
        self.devices = [_Device(self, device_id, device_role(device_id, config["fail_share"], config["silent_share"]))
                        for device_id in config["ids"]]
        self.connect_s = 0.0
        self._connects = asyncio.Semaphore(int(config["connect_concurrency"]))

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    # connecting ------------------------------------------------------------------------------------
    async def connect_with_retry(self, device: _Device, first: bool = True) -> None:
        """Connect one device, retrying with backoff (a full listen backlog refuses or resets) until the deadline."""
        await wait_unblocked(device)  # partitioned, crashed or asleep
        deadline = time.monotonic() + float(self.config["start_timeout"])
        delay = 0.05 if first else 1.0
        while not self.stopping:
            async with self._connects:
                try:
                    await device.connect()
                    return
                except (OSError, EdgeSDKError, asyncio.TimeoutError) as exc:
                    if isinstance(exc, SimulationError) or time.monotonic() + delay > deadline:
                        raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)

    async def connect_all(self) -> None:
        """Connect every device, paced at ``connect_rate`` per second when set."""
        started, rate = time.monotonic(), self.config["connect_rate"]
        tasks = []
        for i, device in enumerate(self.devices):
            tasks.append(asyncio.ensure_future(self.connect_with_retry(device)))
            if rate and i % 10 == 9:
                await asyncio.sleep(10 / rate)
        await asyncio.gather(*tasks)
        self.connect_s = time.monotonic() - started

    # chunk requests -----------------------------------------------------------------------------------
    def request(self, device: _Device, transfer: Transfer, exclude: frozenset[int] = frozenset()) -> None:
        missing = transfer.missing(exclude)[: self.request_window]
        if missing:
            self.count("need_requests")
            device.publish(Topics.need(device.id), {"transfer_id": transfer.command.transfer_id, "chunks": missing})
            transfer.last_progress = time.monotonic()

    def request_missing(self) -> None:
        """The agent's ``_request_missing``: ask for what the broadcast did not bring, on a timer."""
        now = time.monotonic()
        for device in list(self.active):
            for transfer in list(device.transfers.values()):
                if now - transfer.last_progress < self.retry_interval_s:
                    continue
                if now - transfer.started >= self.broadcast_wait_s:
                    self.request(device, transfer)
                elif transfer.command.broadcast is not None:
                    self.request(device, transfer, exclude=transfer.command.broadcast)
        if not self.stopping:
            asyncio.get_running_loop().call_later(self.retry_interval_s / 2, self.request_missing)

    # control channel --------------------------------------------------------------------------------
    def snapshot(self, by_device: bool = False) -> dict[str, Any]:
        versions = Counter(d.version or "" for d in self.devices)
        c = self.counters
        out = {"versions": {**versions}, "counts": {**self.counts, "messages_in": c.messages_in, "messages_out": c.messages_out}}
        return {**out, "by_device": {d.id: d.version for d in self.devices}} if by_device else out

    def report(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        installs: Counter[str] = Counter(entry[1] for d in self.devices for entry in d.install_log)
        c = self.counters
        return {**self.snapshot(), "installs": dict(installs), "pid": os.getpid(), "devices": len(self.devices),
                "updated_twice": sum(1 for d in self.devices if updated_twice(d.install_log)),
                "install_log": {d.id: d.install_log for d in self.devices if d.install_log},
                "connect_log": {d.id: d.connects for d in self.devices},
                "device_chunk_bytes": {d.id: d.chunk_bytes for d in self.devices if d.chunk_bytes},
                "final": {d.id: d.version for d in self.devices},
                "messages_in": c.messages_in, "messages_out": c.messages_out, "bytes_in": c.bytes_in,
                "bytes_out": c.bytes_out, "connect_s": self.connect_s, "cpu_s": usage.ru_utime + usage.ru_stime,
                "rss_mb": usage.ru_maxrss / 1024}

    async def disconnect_all(self) -> None:
        """Publish each device offline (retained) and disconnect, as the agent's stop() does."""
        self.stopping = True
        acks = [d.publish(d.state_topic, d.offline(), retain=True) for d in self.devices]
        if pending := [a for a in acks if a is not None]:
            await asyncio.wait(pending, timeout=10)
        for device in self.devices:
            if device.client is not None:
                await device.client.disconnect()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)  # a fault may name thousands of devices in one line
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        loop.call_later(float(self.config["max_runtime_s"]), self._expire)
        try:
            await self.connect_all()
        except Exception as exc:  # the parent shows this with the worker's stderr
            _send({"type": "error", "error": f"{type(exc).__name__}: {exc}"})
            return
        self.request_missing()
        _send({"type": "started", "connect_s": self.connect_s})
        while True:
            line = await reader.readline()
            if not line:  # the parent is gone: drop the sockets (the broker publishes the wills) and leave
                self.stopping = True
                for device in self.devices:
                    if device.client is not None:
                        device.client.abort()
                return
            request = json.loads(line)
            if request["cmd"] == "snapshot":
                _send({"type": "snapshot", **self.snapshot(bool(request.get("by_device")))})
            elif request["cmd"] in FAULT_COMMANDS:
                _send({"type": "fault", "touched": apply_fault(self, request)})
            elif request["cmd"] == "stop":
                await self.disconnect_all()
                _send({"type": "report", **self.report()})
                return

    def _expire(self) -> None:
        print(f"fleet_sim worker {os.getpid()}: ran max_runtime_s, {self.config['max_runtime_s']} s", file=sys.stderr, flush=True)
        os._exit(3)


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def worker_main() -> None:
    """Entry of a worker process: read its config (the first line on stdin), run its devices until the parent says stop."""
    raise_fd_limit()
    line = b""
    while not line.endswith(b"\n"):  # os.read, not sys.stdin: nothing may sit in a buffer the event loop won't see
        block = os.read(0, 1 << 16)
        if not block:
            return
        line += block
    config = json.loads(line)
    asyncio.run(_Worker(config).run())


