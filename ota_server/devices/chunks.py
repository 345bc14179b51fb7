"""The chunk service: archive bytes for the transfers in flight, broadcast to a group or re-sent to one device.

A transfer (one stage of a rollout, a rollback, a measurement) is opened with the archive
it carries and closed when nothing will ask for it again. Archives are shared between the
transfers that carry the same model version and evicted when the last of them closes, so
the server holds only what is in flight, not every archive it ever sent (up to 2 GiB each).
An archive's chunks are zstd-compressed once, when it is loaded, where that pays
(:mod:`edgesdk.fleet.chunk_codec`). A transfer's broadcast may be limited to the chunks some of
its targets lack (:meth:`ChunkDistributor.plan`); devices ask for the rest one by one.

Requests for a small archive's transfer that has a group (:meth:`ChunkDistributor.share`) are gathered for
``coalesce_s`` from the first: when two or more devices asked, the chunks any of them asked for go once on the
group's topic, which every asker subscribed to before it asked (MQTT keeps one client's packets in order), instead of
a copy each. Devices coming back together (the reconciler sends a pass's late commands at once) then cost the
server one publish a chunk, not one per device. Archives over ``coalesce_max_bytes`` are always re-sent one by one:
another device downloading the same archive at that moment would get the union too, and for a big archive those
bytes cost more than the messages saved. A stage's own transfer is not shared this way: thousands of its devices
may be downloading at once, and each would receive every straggler's chunks again.

The reconciler's late commands need not be asked about at all (:meth:`ChunkDistributor.expect`): their plan
names what their devices lack, and those chunks go once on the group's topic as soon as every one of them accepted
(subscribed to that topic first), or after a wait; a device that accepted too late, or lacks more, asks as above. A
late device so sends no chunk request: besides its state on return, it was its one message an online device does not
send. Its event's ``missing`` count is the device's word: any value but 0 (a wrong type, a huge number) counts as
lacking, so the worst a lying device gets is chunks it did not need.

A device's request is answered only when it is one of the transfer's targets: named when its command went
out (:meth:`ChunkDistributor.allow`), or confirmed by :attr:`ChunkDistributor.authorize` (the store's targets,
for a transfer this server did not send). Any other request is dropped and counted in ``refused``, so no
device can pull a model meant for another group. The group broadcast is unchanged.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.chunk_codec import DEFAULT_MIN_SAVING, compress_chunks
from edgesdk.fleet.protocol import ArchiveInfo, Topics

__all__ = ["ChunkDistributor", "MAX_OUTBOX"]

log = logging.getLogger(__name__)

#: Queued messages above which chunk requests wait. Far below the 65,535 message ids one MQTT connection has:
#: paho numbers queued messages too, and one past the wrap would replace a queued message of the same id.
MAX_OUTBOX = 20_000

#: Archives up to this size have their requests gathered into one group publish (a few chunks: duplicates are cheap).
COALESCE_MAX_BYTES = 256 * 1024

#: Loads a model version's archive: (name, version[, artifact]) -> (tar bytes, chunk hashes); the artifact is given only
#: when a transfer names one.
ArchiveLoader = Callable[..., tuple[bytes, ArchiveInfo]]
#: Publishes one MQTT message: (topic, payload).
Publisher = Callable[[str, bytes], None]


@dataclass
class _Archive:
    info: ArchiveInfo
    #: What is sent for each chunk: its bytes, or a zstd frame of them when ``info.zstd`` says so.
    payloads: list[bytes]
    users: int = 0

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.payloads)


class ResendLog(OrderedDict[tuple[str, str], list[int]]):
    """(device, transfer) -> the chunk indices re-sent to it on request, oldest first.

    Bounded, as a device that asks once a second for an hour would otherwise grow it without end: the newest
    ``max_keys`` pairs are kept, each with its newest ``max_indices`` indices.
    """

    def __init__(self, max_keys: int = 4096, max_indices: int = 1024) -> None:
        super().__init__()
        self.max_keys, self.max_indices = max_keys, max_indices

    def record(self, device: str, transfer_id: str, index: int) -> None:
        """Note that chunk ``index`` of ``transfer_id`` went to ``device``."""
        key = (device, transfer_id)
        indices = self.get(key)
        if indices is None:
            indices = self[key] = []
            while len(self) > self.max_keys:
                self.popitem(last=False)
        indices.append(index)
        if len(indices) > self.max_indices:
            del indices[: len(indices) - self.max_indices]


class ChunkDistributor:
    """Serves the chunks of open transfers; thread-safe (MQTT handlers and the rollout engine call it)."""

    def __init__(self, load: ArchiveLoader, publish: Publisher, repeat_s: float = 1.0, rebroadcast_after: int = 32,
                 min_saving: float | None = DEFAULT_MIN_SAVING, outbox: Callable[[], int] = lambda: 0,
                 max_outbox: int = MAX_OUTBOX, on_stranger: Callable[[], None] = lambda: None,
                 coalesce_s: float = 0.2, coalesce_max_bytes: int = COALESCE_MAX_BYTES) -> None:
        self._load, self._publish = load, publish
        #: Called for each request from a device that is not one of the transfer's targets (the server counts it).
        self._on_stranger = on_stranger
        #: Messages published and not yet taken by the broker; above ``max_outbox`` a device's request is dropped
        #: unanswered (it asks again): copies one by one must not bury the commands behind them.
        self._outbox, self.max_outbox = outbox, max_outbox
        #: Requests from the transfers' targets, and those dropped because the outbox was full (for tests and
        #: benchmarks).
        self.requests = 0
        self.deferred = 0
        #: Compress a chunk when that saves more than this share of its bytes (None: never).
        self.min_saving = min_saving
        #: A device asking again within ``repeat_s`` of its last answer is not answered twice (the chunks are on
        #: their way); when ``rebroadcast_after`` devices ask for one broadcast transfer within ``repeat_s``, the
        #: group gets the archive again instead of that many copies one by one.
        self.repeat_s, self.rebroadcast_after = repeat_s, rebroadcast_after
        self._asked: dict[str, dict[str, float]] = defaultdict(dict)
        self._broadcasts: dict[str, tuple[str, float]] = {}
        #: Broadcasts sent again because many devices missed the first (for tests and benchmarks).
        self.rebroadcasts = 0
        self._lock = threading.Lock()
        self._archives: dict[tuple[str, str, str | None], _Archive] = {}
        self._transfers: dict[str, tuple[str, str, str | None]] = {}
        #: transfer -> the chunk indexes its broadcasts carry (absent: all).
        self._plans: dict[str, list[int]] = {}
        #: (device, transfer) -> chunk indices re-sent on request (for tests and benchmarks), bounded.
        self.resent = ResendLog()
        #: transfer -> the devices it is for (:meth:`allow`).
        self._targets: dict[str, set[str]] = {}
        #: (device, transfer) -> whether ``device`` is a target of ``transfer`` by the store: asked for a device
        #: :meth:`allow` did not name (None: a transfer nobody named targets for is served to any device, as tools
        #: and tests use it; the server always sets it).
        self.authorize: Callable[[str, str], bool] | None = None
        #: Requests dropped because the device is not one of the transfer's targets (logged once per transfer).
        self.refused = 0
        #: Archives loaded, verified and packed to be served (for tests and benchmarks: a non-target causes none).
        self.loads = 0
        self._refusals_logged: set[str] = set()
        #: How long requests for a shared transfer are gathered (0: each is answered at once), and the largest
        #: archive whose requests are.
        self.coalesce_s, self.coalesce_max_bytes = coalesce_s, coalesce_max_bytes
        #: transfer -> the group whose chunk topic its gathered requests may be answered on (:meth:`share`).
        self._groups: dict[str, str] = {}
        #: transfer -> device -> chunk indexes asked for, gathered until the transfer's flush.
        self._gathered: dict[str, dict[str, set[int]]] = {}
        #: Gathered requests answered by one group publish, and the chunk messages that saved (for tests and benchmarks).
        self.coalesced = 0
        self.coalesce_saved = 0
        #: transfer -> the devices :meth:`expect` waits to accept; device -> the transfers it waits on them for.
        self._awaiting: dict[str, set[str]] = {}
        self._awaited: dict[str, set[str]] = defaultdict(set)
        #: (when, transfer) flushes due, soonest first, and the thread that runs them (started on first use).
        self._due: list[tuple[float, str]] = []
        self._due_changed = threading.Condition()
        self._flusher: threading.Thread | None = None

    def open(self, transfer_id: str, name: str, version: str, artifact: str | None = None) -> ArchiveInfo:
        """Make ``name`` ``version``'s archive (its ``artifact`` for one board; None: the release's only or host's
        one, as the repository picks) servable as ``transfer_id``; its chunk hashes (for the command).

        Opening an id that is already open is a no-op (a re-sent stage reuses its transfer).
        """
        key = (name, version, artifact)
        with self._lock:
            if transfer_id in self._transfers:
                return self._archives[self._transfers[transfer_id]].info
            archive = self._archives.get(key)
        if archive is None:  # load outside the lock: hashing 2 GiB must not stall chunk requests
            self.loads += 1
            data, info = self._load(name, version, *([artifact] if artifact else []))
            archive = _Archive(*compress_chunks(data, info, self.min_saving))
        with self._lock:
            if transfer_id in self._transfers:
                return self._archives[self._transfers[transfer_id]].info
            archive = self._archives.setdefault(key, archive)  # another transfer may have loaded or evicted it
            archive.users += 1
            self._transfers[transfer_id] = key
            return archive.info

    def close(self, transfer_id: str) -> None:
        """Stop serving ``transfer_id``; its archive's bytes go once no open transfer carries them."""
        with self._lock:
            key = self._transfers.pop(transfer_id, None)
            self._asked.pop(transfer_id, None)
            self._broadcasts.pop(transfer_id, None)
            self._plans.pop(transfer_id, None)
            self._targets.pop(transfer_id, None)
            self._groups.pop(transfer_id, None)
            self._gathered.pop(transfer_id, None)
            self._forget_awaited(transfer_id)
            self._refusals_logged.discard(transfer_id)
            if key is None:
                return
            archive = self._archives[key]
            archive.users -= 1
            if archive.users == 0:
                del self._archives[key]

    def close_all(self, prefix: str) -> None:
        """Close every transfer whose id starts with ``prefix`` (all of one rollout's stages and rollbacks)."""
        with self._lock:
            ids = [t for t in self._transfers if t.startswith(prefix)]
        for transfer_id in ids:
            self.close(transfer_id)

    def allow(self, transfer_id: str, devices: Iterable[str]) -> None:
        """Answer ``devices``' requests for the open ``transfer_id`` (its targets); a closed one is left alone."""
        with self._lock:
            if transfer_id in self._transfers:
                self._targets.setdefault(transfer_id, set()).update(devices)

    def share(self, transfer_id: str, group: str) -> None:
        """Let requests for the open ``transfer_id`` be gathered and answered on ``group``'s chunk topic (its targets
        are ``group``'s devices)."""
        with self._lock:
            if transfer_id in self._transfers:
                self._groups[transfer_id] = group

    def gathers(self, transfer_id: str) -> bool:
        """Whether requests for ``transfer_id`` are gathered into group publishes (it is open and shared, its archive
        small, and gathering on): what :meth:`expect` needs."""
        archive = self._chunks(transfer_id)
        with self._lock:
            shared = transfer_id in self._groups
        return shared and archive is not None and self.coalesce_s > 0 and archive.info.size <= self.coalesce_max_bytes

    def expect(self, transfer_id: str, devices: Iterable[str], chunks: list[int], wait_s: float) -> None:
        """Send ``chunks`` of the gathered ``transfer_id`` (:meth:`gathers`) to ``devices`` without their asking: once
        for all of them, on the group's topic, as soon as each accepted its command (:meth:`accepted`), or ``wait_s``
        from now. Their commands' plan must name ``chunks``, so that they wait for them instead of asking."""
        devices = list(devices)
        with self._lock:
            gathered = self._gathered.setdefault(transfer_id, {})
            for device in devices:
                gathered.setdefault(device, set()).update(chunks)
                self._awaited[device].add(transfer_id)
            self._awaiting.setdefault(transfer_id, set()).update(devices)
        self._schedule(time.monotonic() + wait_s, transfer_id)

    def accepted(self, device: str, deployment_id: str, missing: Any) -> None:
        """``device`` accepted ``deployment_id``'s command, lacking ``missing`` chunks (from its event): when it is the
        last one :meth:`expect` waited for, their chunks go now. A device lacking none is not sent any. (A stage's
        transfer id starts with its deployment's id and a dash.)"""
        with self._lock:
            transfer_id = next((t for t in self._awaited.get(device, ()) if t.startswith(f"{deployment_id}-")), None)
            if transfer_id is None:
                return
            self._drop_awaited(device, transfer_id)
            waiting = self._awaiting.get(transfer_id, set())
            waiting.discard(device)
            if missing == 0:
                self._gathered.get(transfer_id, {}).pop(device, None)
            last = not waiting
        if last:
            self._schedule(time.monotonic(), transfer_id)

    def _forget_awaited(self, transfer_id: str) -> None:
        """Stop waiting for the devices of ``transfer_id`` to accept (its chunks went, or it closed); under the lock."""
        for device in self._awaiting.pop(transfer_id, ()):
            self._drop_awaited(device, transfer_id)

    def _drop_awaited(self, device: str, transfer_id: str) -> None:
        """``device`` is no longer awaited for ``transfer_id``; under the lock."""
        transfers = self._awaited.get(device)
        if transfers is not None:
            transfers.discard(transfer_id)
            if not transfers:
                del self._awaited[device]

    def _is_target(self, device: str, transfer_id: str) -> bool:
        with self._lock:
            targets = self._targets.get(transfer_id)
            if targets is not None and device in targets:
                return True
        authorize = self.authorize
        if authorize is None:
            return targets is None
        if authorize(device, transfer_id):  # the store's answer, kept: a device asks many times
            self.allow(transfer_id, [device])
            return True
        return False

    def is_open(self, transfer_id: str) -> bool:
        """True while ``transfer_id`` is served."""
        with self._lock:
            return transfer_id in self._transfers

    @property
    def held_bytes(self) -> int:
        """Bytes of chunk payloads held for open transfers."""
        with self._lock:
            return sum(a.size for a in self._archives.values())

    def planned(self, transfer_id: str) -> int:
        """How many chunks a broadcast of ``transfer_id`` carries (0 when it is closed)."""
        archive = self._chunks(transfer_id)
        with self._lock:
            plan = self._plans.get(transfer_id)
        return 0 if archive is None else len(plan) if plan is not None else len(archive.info.chunks)

    def plan(self, transfer_id: str, indices: list[int], group: str) -> None:
        """Broadcast ``transfer_id`` to ``group``, limited to the chunks ``indices`` (the ones some target lacks).

        From now on a crowd of requests for it gets a group broadcast, also before the first one went out (a
        replica that took a rollout over never sent one).
        """
        with self._lock:
            self._plans[transfer_id] = sorted(indices)
            self._broadcasts.setdefault(transfer_id, (group, float("-inf")))

    def _chunks(self, transfer_id: str) -> _Archive | None:
        with self._lock:
            key = self._transfers.get(transfer_id)
            return self._archives[key] if key is not None else None

    def serve(self, device: str, transfer_id: str, indices: list[int]) -> bool:
        """Re-send the asked chunks on ``device``'s own topic; False when ``transfer_id`` is not open here.

        A device that is not one of the transfer's targets gets nothing (True: the request was handled, dropped).
        """
        archive = self._chunks(transfer_id)
        if archive is None:
            return False
        if not self._is_target(device, transfer_id):
            self.refuse(device, transfer_id)
            return True
        self.requests += 1
        if self._outbox() > self.max_outbox:
            self.deferred += 1
            return True
        now = time.monotonic()
        with self._lock:
            asked = self._asked[transfer_id]
            if now - asked.get(device, -self.repeat_s) < self.repeat_s:
                return True
            asked[device] = now
            group, last_broadcast = self._broadcasts.get(transfer_id, ("", float("-inf")))
            if group and now - last_broadcast < self.repeat_s:
                return True  # the whole archive went to the group a moment ago
            crowd = sum(1 for t in asked.values() if now - t < self.repeat_s)
            rebroadcast = bool(group) and crowd >= self.rebroadcast_after
        if rebroadcast:
            self.rebroadcasts += 1
            self.broadcast(group, transfer_id)
            return True
        wanted = [i for i in indices if 0 <= i < len(archive.info.chunks)]
        if not self._gather(transfer_id, archive, device, wanted):
            self._resend(archive, transfer_id, device, wanted)
        return True

    def refuse(self, device: str, transfer_id: str) -> None:
        """Count a chunk request ``device`` may not make: ``transfer_id`` is not one it is a target of.

        Logged once per open transfer; a request for one that is not open (the device chose the id) is only
        counted, so random ids cost no log line and no memory.
        """
        self._on_stranger()
        with self._lock:
            self.refused += 1
            first = transfer_id in self._transfers and transfer_id not in self._refusals_logged
            if first:
                self._refusals_logged.add(transfer_id)
        if first:
            log.warning("refusing chunks of transfer %s to %s: not one of its targets (further refusals of this "
                        "transfer are only counted)", transfer_id, device)

    def _gather(self, transfer_id: str, archive: _Archive, device: str, wanted: list[int]) -> bool:
        """Hold ``device``'s request for the transfer's next flush; False when its requests are not gathered."""
        if self.coalesce_s <= 0 or archive.info.size > self.coalesce_max_bytes or not wanted:
            return False
        with self._lock:
            if transfer_id not in self._groups:
                return False
            first = transfer_id not in self._gathered
            self._gathered.setdefault(transfer_id, {}).setdefault(device, set()).update(wanted)
        if first:
            self._schedule(time.monotonic() + self.coalesce_s, transfer_id)
        return True

    def _schedule(self, at: float, transfer_id: str) -> None:
        """Flush ``transfer_id``'s gathered requests at ``at`` (time.monotonic()), on one long-lived thread (a thread
        started per window showed in the late-device profile)."""
        with self._due_changed:
            heapq.heappush(self._due, (at, transfer_id))
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_due, name="chunk-flush", daemon=True)
                self._flusher.start()
            self._due_changed.notify()

    def _flush_due(self) -> None:
        while True:
            with self._due_changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._due_changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, transfer_id = heapq.heappop(self._due)
            try:
                self._flush(transfer_id)
            except Exception:  # the thread must outlive one bad flush: its devices ask again, later flushes go on
                log.exception("answering the gathered chunk requests of transfer %s failed", transfer_id)

    def _flush(self, transfer_id: str) -> None:
        """Answer the requests gathered for ``transfer_id``: on its group's topic when two or more devices asked."""
        archive = self._chunks(transfer_id)
        with self._lock:
            gathered, group = self._gathered.pop(transfer_id, {}), self._groups.get(transfer_id)
            self._forget_awaited(transfer_id)
        if archive is None or not gathered:
            return
        if len(gathered) == 1 or group is None:
            for device, wanted in gathered.items():
                self._resend(archive, transfer_id, device, sorted(wanted))
            return
        union = sorted(set().union(*gathered.values()))
        with self._lock:
            self.coalesced += len(gathered)
            self.coalesce_saved += sum(len(w) for w in gathered.values()) - len(union)
        topic = Topics.group_chunks(group, transfer_id)
        for index in union:
            self._publish(f"{topic}/{index}", archive.payloads[index])

    def _resend(self, archive: _Archive, transfer_id: str, device: str, indices: list[int]) -> None:
        for index in indices:
            with self._lock:
                self.resent.record(device, transfer_id, index)
            self._publish(f"{Topics.device_chunks(device, transfer_id)}/{index}", archive.payloads[index])

    def broadcast(self, group: str, transfer_id: str) -> None:
        """Publish the chunks of ``transfer_id``'s plan (all, without one) once on ``group``'s chunk topic.

        A closed transfer, or an empty plan, sends nothing.
        """
        archive = self._chunks(transfer_id)
        if archive is None:
            return
        with self._lock:
            self._broadcasts[transfer_id] = (group, time.monotonic())
            plan = self._plans.get(transfer_id)
            chunks = plan if plan is not None else range(len(archive.info.chunks))
            gathered = self._gathered.get(transfer_id, {})
            for device in list(gathered):  # what this broadcast carries is not sent again at the flush
                gathered[device].difference_update(chunks)
                if not gathered[device]:
                    del gathered[device]
        topic = Topics.group_chunks(group, transfer_id)
        for index in chunks:
            self._publish(f"{topic}/{index}", archive.payloads[index])
