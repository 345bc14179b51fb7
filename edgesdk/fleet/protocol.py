"""The OTA wire protocol over MQTT, shared by the server and the device agent.

Topics (``P`` = ``edgesdk``; ``D`` a device id, ``G`` its group, ``T`` a transfer id)::

    P/devices/D/cmd            server -> device  signed command (deploy / rollback / measure), QoS 1
    P/devices/D/state          device -> server  retained state; last will {"status": "offline"}
    P/devices/D/events         device -> server  progress and results of a deployment, QoS 1
    P/devices/D/measurements   device -> server  progress and result of a measurement, QoS 1
    P/devices/D/need           device -> server  chunk requests {"transfer_id", "chunks": [i, ...]}
    P/devices/D/chunks/T/I     server -> device  chunk I of transfer T, resent to one device
    P/groups/G/chunks/T/I      server -> group   chunk I of transfer T, sent once to the group

A command is ``{"manifest": b64(JSON bytes), "signature": b64(Ed25519 over those bytes),
"key_id"}``. Its manifest names the deployment, the bundle (name, version), the archive
(size, sha256, every chunk's sha256 and size, the chunks sent zstd-compressed), the chunks
the server will broadcast (``broadcast``, the ones some target lacks) and whether it is a
rollback. The device verifies the signature with the server key it pins before it writes
anything, copies the chunks it already holds from its own slots, fetches the rest, checks
each chunk against its hash (of the uncompressed bytes) and the whole archive before
installing. Chunks are content-defined (:mod:`edgesdk.fleet.chunking`), so bytes a new version
shares with an old one make the same chunks. Chunk payloads are raw bytes, or a zstd frame
for the chunks the manifest flags (:mod:`edgesdk.fleet.chunk_codec`). Names and sizes from a
manifest are checked here (:func:`parse_command`), so neither side trusts them unchecked.

**Bound to one device** (:mod:`edgesdk.fleet.command_scope`): the manifest names its group, and a second
signature, per device, binds it to the device it is sent to (``binding``: ``{"device", "manifest_sha256"}``).
A device refuses a command bound to another one, so a broker that records commands cannot replay them
elsewhere. Why per device, not a stage envelope listing its devices: the list would add ~12 bytes a target
to every target's copy (10,000 devices: 120 KB x 10,000 messages = 1.2 GB of broker traffic per stage), while
the binding adds 268 bytes and 64 us of signing a device whatever the archive (0.64 s per 10,000-device
stage; signing the whole manifest per device instead cost 0.77 ms at a 20 MB bundle, 7.7 s per stage, and grows
with the chunk list; benchmarks/security/security_replay.py). Measure commands are bound to their one device too.

**Measure** (:func:`sign_measure_command`): "run this candidate model here and tell me how
it does", without installing it. The signed manifest is ``{"type": "measure",
"measurement_id", "transfer_id", "mode", "runs", "issued_at", "archive": {...}}``; ``mode``
is a runtime mode (latency / balanced / power) and ``runs`` the number of timed
single-sample predictions (1..:data:`MAX_MEASURE_RUNS`). The archive
(:func:`pack_measurement`) is an uncompressed tar of exactly one model file
(``*.onnx`` or ``*.tflite``) and ``evaluation.npz`` (input name -> batch-first array). Its
chunks go to the one device on ``P/devices/D/chunks/T/I``, pushed once it reports
``accepted`` and re-sent on its requests. The device checks the archive as for a deploy,
measures in a child process, and answers on ``P/devices/D/measurements``
(:mod:`edgesdk.fleet.measurement`).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from edgesdk.errors import SignatureError, TransferError
from edgesdk.fleet.chunking import cut_points, tar_boundaries
from edgesdk.fleet.command_scope import Binder, Recipient, check_expiry, check_target, read_binding
from edgesdk.runtime.bundle import parse_version, safe_name

__all__ = ["PREFIX", "COMMAND_TTL_S", "Topics", "ArchiveInfo", "Command", "MeasureCommand", "sign_command",
           "sign_measure_command", "parse_command", "MAX_ARCHIVE_BYTES",
           "MAX_MEASURE_RUNS", "MAX_CHUNK_BYTES", "archive_info", "MAX_JUDGE_S", "check_judge_s"]

PREFIX = "edgesdk"
#: Largest archive a device accepts (a manifest claiming more is refused before any write).
MAX_ARCHIVE_BYTES = 2 * 1024**3
#: Most timed runs a measure command may ask for.
MAX_MEASURE_RUNS = 10_000
_MODES = ("latency", "balanced", "power")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: Largest chunk a manifest may name (content-defined chunks are at most edgesdk.fleet.chunking.MAX_CHUNK).
MAX_CHUNK_BYTES = 8 * 1024**2
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Longest a command may ask its device to report at the fast cadence after committing (a week).
MAX_JUDGE_S = 7 * 86400.0


def check_id(value: str, what: str) -> str:
    """Return ``value`` if it is a safe id (1-64 letters, digits, '.', '_', '-'), else raise TransferError.

    Ids become topic levels and file names, so '/', '+', '#' and '..' are refused; ``what`` names
    the id in the message.
    """
    if not isinstance(value, str) or not _ID.match(value) or ".." in value:
        raise TransferError(f"{what} {value!r} must be 1-64 of letters, digits, '.', '_', '-'")
    return value


class Topics:
    """Topic names of the protocol (see the module docstring)."""

    @staticmethod
    def cmd(device: str) -> str:
        """Where the server sends ``device`` its signed commands."""
        return f"{PREFIX}/devices/{device}/cmd"

    @staticmethod
    def state(device: str) -> str:
        """Where ``device`` keeps its retained state (and its last will)."""
        return f"{PREFIX}/devices/{device}/state"

    @staticmethod
    def events(device: str) -> str:
        """Where ``device`` reports a deployment's progress and result."""
        return f"{PREFIX}/devices/{device}/events"

    @staticmethod
    def need(device: str) -> str:
        """Where ``device`` asks for the chunks it is missing."""
        return f"{PREFIX}/devices/{device}/need"

    @staticmethod
    def device_chunks(device: str, transfer: str) -> str:
        """Prefix of chunks of ``transfer`` sent to ``device`` alone; chunk ``I`` goes to ``<prefix>/I``."""
        return f"{PREFIX}/devices/{device}/chunks/{transfer}"

    @staticmethod
    def group_chunks(group: str, transfer: str) -> str:
        """Prefix of chunks of ``transfer`` sent once to every device of ``group``; chunk ``I`` goes to ``<prefix>/I``."""
        return f"{PREFIX}/groups/{group}/chunks/{transfer}"

    @staticmethod
    def measurements(device: str) -> str:
        """Where ``device`` reports a measurement's progress and result."""
        return f"{PREFIX}/devices/{device}/measurements"

    @staticmethod
    def root(version: int) -> str:
        """Where root metadata version ``version`` is kept, retained, for every device (edgesdk.fleet.trust)."""
        return f"{PREFIX}/trust/root/{version}"

    ALL_ROOTS = f"{PREFIX}/trust/root/+"

    @staticmethod
    def server(name: str) -> str:
        """Where server replica ``name`` says it is online, retained, with its last will saying offline."""
        return f"{PREFIX}/servers/{name}"

    ALL_SERVERS = f"{PREFIX}/servers/+"
    #: Where the server keeps its newest signed timestamp metadata, retained (edgesdk.fleet.trust).
    TIMESTAMP = f"{PREFIX}/trust/timestamp"
    ALL_STATES = f"{PREFIX}/devices/+/state"
    ALL_EVENTS = f"{PREFIX}/devices/+/events"
    ALL_NEEDS = f"{PREFIX}/devices/+/need"
    ALL_MEASUREMENTS = f"{PREFIX}/devices/+/measurements"

    @staticmethod
    def device_of(topic: str) -> str:
        """The device id in a ``P/devices/D/...`` topic (not checked; pass it to :func:`check_id`)."""
        return topic.split("/")[2]


@dataclass(frozen=True)
class ArchiveInfo:
    """The archive a deployment transfers: its hash and size, and every chunk's hash and size.

    Chunks are content-defined (:mod:`edgesdk.fleet.chunking`), so a version that shares bytes with one
    a device holds shares chunks too, which the device takes from its own slots. Chunks in
    ``zstd`` travel zstd-compressed; every hash is of the uncompressed bytes.
    """

    #: Hex SHA-256 of the whole archive.
    sha256: str
    #: Archive size in bytes.
    size: int
    #: Hex SHA-256 of each chunk's (uncompressed) bytes, in order.
    chunks: tuple[str, ...]
    #: Byte length of each chunk (uncompressed); they add up to ``size``.
    sizes: tuple[int, ...]
    #: Indexes of the chunks sent zstd-compressed.
    zstd: frozenset[int] = frozenset()

    @cached_property
    def _offsets(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.sizes[:-1], initial=0)) if self.sizes else ()

    @classmethod
    def of(cls, data: bytes, chunk_size: int | None = None, boundaries: Iterable[int] = ()) -> ArchiveInfo:
        """Hash ``data`` whole and in chunks: content-defined ones, or fixed ``chunk_size``-byte ones when given.

        ``boundaries`` are offsets where a content-defined cut is forced (see :func:`archive_info`).
        """
        if chunk_size is not None:
            ends = [*range(chunk_size, len(data), chunk_size), len(data)] if data else []
        else:
            ends = cut_points(data, boundaries=boundaries)
        view, starts = memoryview(data), [0, *ends[:-1]]
        chunks = tuple(hashlib.sha256(view[a:b]).hexdigest() for a, b in zip(starts, ends))
        return cls(hashlib.sha256(data).hexdigest(), len(data), chunks, tuple(b - a for a, b in zip(starts, ends)))

    def chunk_range(self, index: int) -> tuple[int, int]:
        """Byte offsets ``(start, end)`` of chunk ``index`` in the archive, end exclusive (not bounds-checked)."""
        start = self._offsets[index]
        return start, start + self.sizes[index]

    def to_json(self) -> dict[str, Any]:
        """The archive as the signed manifest carries it."""
        return {"sha256": self.sha256, "size": self.size, "chunks": list(self.chunks), "sizes": list(self.sizes),
                "zstd": sorted(self.zstd)}

    @classmethod
    def from_json(cls, a: Any, max_size: int = MAX_ARCHIVE_BYTES) -> ArchiveInfo:
        """Read and check an archive object (also the fixed ``chunk_size`` form of earlier servers).

        Raises TransferError when the sizes do not add up, a chunk is empty or over
        :data:`MAX_CHUNK_BYTES`, a hash is not 64 hex digits or the archive is over ``max_size``.
        """
        try:
            size, chunks = int(a["size"]), tuple(map(str, a["chunks"]))
            if "sizes" in a:
                sizes = tuple(int(n) for n in a["sizes"])
            else:
                step = int(a["chunk_size"])
                sizes = tuple(min(step, size - i) for i in range(0, size, step)) if step > 0 and size > 0 else ()
            zstd = frozenset(int(i) for i in a.get("zstd", ()))
            info = cls(str(a["sha256"]), size, chunks, sizes, zstd)
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferError(f"archive {a!r:.200} is malformed ({exc}); the server sent a broken manifest") from exc
        if (not 0 < size <= max_size or len(sizes) != len(chunks) or sum(sizes) != size
                or not all(0 < n <= MAX_CHUNK_BYTES for n in sizes) or not all(_HEX64.match(h) for h in chunks)
                or not all(0 <= i < len(chunks) for i in zstd)):
            raise TransferError(f"archive of {size} bytes in {len(chunks)} chunks (sizes adding up to {sum(sizes)}) is "
                                f"inconsistent, has a chunk over {MAX_CHUNK_BYTES} bytes or is over the "
                                f"{max_size}-byte cap")
        return info


def archive_info(data: bytes) -> ArchiveInfo:
    """The chunk table of a bundle archive: content-defined chunks, cut also where each file starts and ends."""
    return ArchiveInfo.of(data, boundaries=tar_boundaries(data))


@dataclass(frozen=True)
class Command:
    """A verified deploy or rollback command from the server."""

    #: "deploy" or "rollback".
    type: str
    deployment_id: str
    transfer_id: str
    #: The bundle's model name.
    name: str
    version: str
    #: The device group whose chunk topic the archive is broadcast on.
    group: str
    #: True when the server goes back on purpose; only then may ``version`` be at or below the installed one.
    rollback: bool
    #: Server time (Unix seconds) when the command was signed.
    issued_at: float
    #: None for a "rollback" command, which points back to a slot the device already holds.
    archive: ArchiveInfo | None
    #: The signed envelope, kept so an interrupted transfer can resume after a restart.
    raw: bytes
    #: The cloud endpoint the server hands its devices for this version: ``{"url", "model", "version"}`` of a
    #: KServe V2 endpoint serving the same model version (None: the server has none).
    offload: dict[str, str] | None = None
    #: The chunks the server will broadcast to the group (the ones some target lacks); None: all of them.
    #: A device asks for any other chunk it misses at once, rather than wait for a broadcast.
    broadcast: frozenset[int] | None = None
    #: An aborted rollout's revert names the version it undoes; a device that runs another one (a later rollout
    #: moved it on while the revert was on its way) refuses it. None: not a revert.
    reverts: str | None = None
    #: The device the server bound the command to (None: a server of an earlier release bound it to none).
    device: str | None = None
    #: Seconds after committing it during which the device is judged on its traffic: its agent
    #: reports every ``traffic_every_s`` (its apps hand over as often) until then. None: not judged.
    judge_s: float | None = None

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """The version as integers, for ordering (``"1.10.0"`` -> ``(1, 10, 0)``)."""
        return parse_version(self.version)


@dataclass(frozen=True)
class MeasureCommand:
    """A verified measure command: fetch a candidate model, measure it, report, install nothing."""

    measurement_id: str
    transfer_id: str
    #: Runtime mode to measure in: "latency", "balanced" or "power".
    mode: str
    #: Number of timed single-sample predictions, 1..MAX_MEASURE_RUNS.
    runs: int
    #: Server time (Unix seconds) when the command was signed.
    issued_at: float
    archive: ArchiveInfo
    #: The signed envelope as received.
    raw: bytes
    #: The device the server bound the command to (None: a server of an earlier release bound it to none).
    device: str | None = None

    type = "measure"


def check_measure(mode: object, runs: object) -> None:
    """Raise TransferError unless ``mode`` is a runtime mode and ``runs`` an int in 1..MAX_MEASURE_RUNS.

    Called before signing and after parsing, so neither side trusts the other.
    """
    if mode not in _MODES:
        raise TransferError(f"measure mode {mode!r} is unknown; use one of {', '.join(_MODES)}")
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_MEASURE_RUNS:
        raise TransferError(f"measure runs {runs!r} is out of range; ask for 1..{MAX_MEASURE_RUNS} timed runs")


def check_judge_s(value: object) -> float | None:
    """``value`` as seconds when it is None or a number in (0, :data:`MAX_JUDGE_S`], else
    TransferError.

    Called before signing and after parsing, so neither side trusts the other.
    """
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= MAX_JUDGE_S):
        raise TransferError(f"command judge_s {value!r:.40} is out of range; the seconds a device "
                            f"is judged after committing must be in (0, {MAX_JUDGE_S:g}]")
    return float(value)


def _archive_dict(archive: ArchiveInfo | None) -> dict[str, Any] | None:
    return None if archive is None else archive.to_json()


#: How long a signed command stays valid unless told otherwise: a device refuses it after that (a command
#: withheld and replayed later cannot act on a fleet that moved on). Servers re-sign well before it runs out.
COMMAND_TTL_S = 24 * 3600.0


def _seal(private_key: Any, manifest: dict[str, Any]) -> bytes:
    from edgesdk.runtime.signing import key_id, sign

    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"manifest": base64.b64encode(body).decode(),
                       "signature": base64.b64encode(sign(private_key, body)).decode(),
                       "key_id": key_id(private_key.public_key())}).encode()


def sign_command(private_key: Any, *, type: str, deployment_id: str, transfer_id: str, name: str, version: str,
                 group: str, rollback: bool = False, archive: ArchiveInfo | None = None,
                 offload_url: str | None = None, broadcast: Iterable[int] | None = None,
                 ttl_s: float = COMMAND_TTL_S, reverts: str | None = None,
                 device: str | None = None, judge_s: float | None = None) -> bytes:
    """The signed envelope of a deploy or rollback command, ready to publish; devices refuse it after ``ttl_s``.

    ``device``: bind it to that device (:class:`~edgesdk.fleet.command_scope.Binder`; to bind one stage's
    command to many, seal it once with None and bind it per device).
    ``offload_url`` is the KServe V2 endpoint devices may offload to; the command names it with
    this model and version, which the endpoint serves from the same repository. ``broadcast``
    lists the archive's chunks the server will broadcast (None: all). ``reverts`` is the version an aborted
    rollout's revert undoes. ``judge_s``: the device is judged on its traffic for that long after
    committing (its agent reports at its fast cadence meanwhile); outside (0, 7 days] it is a
    TransferError.
    """
    judge_s = check_judge_s(judge_s)
    body: dict[str, Any] = {"type": type, "deployment_id": deployment_id, "transfer_id": transfer_id, "name": name,
                            "version": version, "group": group, "rollback": rollback, "issued_at": (now := time.time()),
                            "expires_at": now + ttl_s, "archive": _archive_dict(archive)}
    if offload_url:
        body["offload"] = {"url": _offload_url(offload_url), "model": name, "version": version}
    if broadcast is not None:
        body["broadcast"] = sorted(broadcast)
    if reverts is not None:
        body["reverts"] = reverts
    if judge_s is not None:
        body["judge_s"] = judge_s
    envelope = _seal(private_key, body)
    return envelope if device is None else Binder(private_key, envelope).bind(check_id(device, "device id"))


def _offload_url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 2048:
        raise TransferError(f"offload url {url!r:.100} must be an http:// or https:// URL")
    return url


def _parse_offload(data: Any, name: str, version: str) -> dict[str, str] | None:
    """The command's offload endpoint, checked: it must serve the command's own model and version."""
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("model") != name or data.get("version") != version:
        raise TransferError(f"offload {data!r:.200} must name this command's model {name!r} and version {version!r}")
    return {"url": _offload_url(data.get("url")), "model": name, "version": version}


def sign_measure_command(private_key: Any, *, measurement_id: str, transfer_id: str, archive: ArchiveInfo,
                         mode: str, runs: int, ttl_s: float = COMMAND_TTL_S, device: str | None = None) -> bytes:
    """The signed envelope of a measure command (see the module docstring), bound to ``device`` when given (the
    server always names it); bad fields raise TransferError."""
    check_id(measurement_id, "measurement id")
    check_id(transfer_id, "transfer id")
    check_measure(mode, runs)
    envelope = _seal(private_key, {"type": "measure", "measurement_id": measurement_id, "transfer_id": transfer_id,
                                   "mode": mode, "runs": runs, "issued_at": (now := time.time()),
                                   "expires_at": now + ttl_s, "archive": _archive_dict(archive)})
    return envelope if device is None else Binder(private_key, envelope).bind(check_id(device, "device id"))


def _parse_broadcast(data: Any, archive: ArchiveInfo | None) -> frozenset[int] | None:
    if data is None:
        return None
    chunks = frozenset(int(i) for i in data)
    if archive is None or not all(0 <= i < len(archive.chunks) for i in chunks):
        raise TransferError(f"broadcast plan {sorted(chunks)[:10]} names chunks the archive does not have")
    return chunks


def _parse_archive(a: Any, max_size: int) -> ArchiveInfo | None:
    return None if a is None else ArchiveInfo.from_json(a, max_size)


def parse_command(envelope: bytes, public_key: Any | None, allow_unsigned: bool = False,
                  max_size: int = MAX_ARCHIVE_BYTES, now: float | None = None, *, to: Recipient | None = None,
                  strict: bool = False) -> Command | MeasureCommand:
    """Verify a command envelope's signatures and fields and return the command it carries.

    ``public_key`` is the pinned server key, or the :class:`~edgesdk.runtime.signing.KeySet` of the
    ``commands`` role of the device's root of trust. A bad or missing signature raises SignatureError
    (``public_key=None`` is refused unless ``allow_unsigned``, a development flag); an unsafe model
    name or a version that is not dotted integers raises BundleError; any other malformed field, a bad id or an archive over
    ``max_size`` bytes raises TransferError. ``to``: the device it reached; a command bound to another device, or
    unbound and for another group, raises CommandTargetError (a TransferError). ``strict`` (a device holding a root
    of trust): a command must be bound to a device and carry ``expires_at``.
    """
    from edgesdk.runtime.signing import KeySet, verify

    def check(data: bytes, signature: bytes, what: str) -> None:
        if isinstance(public_key, KeySet):  # the commands role of the device's root of trust
            public_key.verify(data, [(str(outer.get("key_id", "")), signature)], what)
        elif public_key is not None:
            verify(public_key, data, signature, what)
        elif not allow_unsigned:
            raise SignatureError("no server public key is pinned; refusing commands (pass the key, or the "
                                 "development flag to accept unsigned ones)")

    try:
        outer = json.loads(envelope)
        body = base64.b64decode(outer["manifest"], validate=True)
        signature = base64.b64decode(outer.get("signature") or "", validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"command is not a signed envelope ({exc}); ignored") from exc
    check(body, signature, "OTA command")
    bound = read_binding(outer, body, check)
    try:
        m = json.loads(body)
        check_expiry(m, time.time() if now is None else now, required=strict)
        if to is not None:
            if m.get("group") is not None:  # checked first: the target check logs and compares it
                check_id(m["group"], "group")
            check_target(m, bound, to, strict)
        archive = _parse_archive(m["archive"], max_size)
        if m["type"] == "measure":
            if archive is None:
                raise TransferError("measure command without an archive; the server must name the model to measure")
            check_measure(m["mode"], m["runs"])
            return MeasureCommand(measurement_id=check_id(m["measurement_id"], "measurement id"),
                                  transfer_id=check_id(m["transfer_id"], "transfer id"), mode=m["mode"],
                                  runs=m["runs"], issued_at=float(m["issued_at"]), archive=archive, raw=envelope,
                                  device=bound)
        command = Command(type=m["type"], deployment_id=check_id(m["deployment_id"], "deployment id"),
                          transfer_id=check_id(m["transfer_id"], "transfer id"), name=safe_name(m["name"], "model name"),
                          version=m["version"], group=check_id(m["group"], "group"), rollback=bool(m["rollback"]),
                          issued_at=float(m["issued_at"]), archive=archive, raw=envelope,
                          offload=_parse_offload(m.get("offload"), m["name"], m["version"]),
                          broadcast=_parse_broadcast(m.get("broadcast"), archive), reverts=m.get("reverts"),
                          device=bound, judge_s=check_judge_s(m.get("judge_s")))
        parse_version(command.version)
        if command.reverts is not None:
            parse_version(command.reverts)
    except (KeyError, TypeError, ValueError) as exc:
        raise TransferError(f"command manifest is malformed: {exc}") from exc
    if command.type not in ("deploy", "rollback") or (command.type == "deploy" and archive is None):
        raise TransferError(f"unknown command type {command.type!r} or a deploy without an archive")
    return command
