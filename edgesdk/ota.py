"""The OTA wire protocol over MQTT, shared by the server and the device agent.

Topics (``P`` = ``edgesdk``; ``D`` a device id, ``G`` its group, ``T`` a transfer id)::

    P/devices/D/cmd            server -> device  signed command (deploy / rollback), QoS 1
    P/devices/D/state          device -> server  retained state; last will {"status": "offline"}
    P/devices/D/events         device -> server  progress and results of a deployment, QoS 1
    P/devices/D/need           device -> server  chunk requests {"transfer_id", "chunks": [i, ...]}
    P/devices/D/chunks/T/I     server -> device  chunk I of transfer T, resent to one device
    P/groups/G/chunks/T/I      server -> group   chunk I of transfer T, sent once to the group

A command is ``{"manifest": b64(JSON bytes), "signature": b64(Ed25519 over those bytes),
"key_id"}``. Its manifest names the deployment, the bundle (name, version), the archive
(size, sha256, chunk size and every chunk's sha256) and whether it is a rollback. The
device verifies the signature with the server key it pins before it writes anything,
each chunk against its hash as it arrives, and the whole archive before installing.
Chunk payloads are raw bytes. Names and sizes from a manifest are checked here
(:func:`parse_command`), so neither side trusts them unchecked.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.bundle import parse_version, safe_name
from edgesdk.errors import BundleError, SignatureError, TransferError

__all__ = ["PREFIX", "Topics", "ArchiveInfo", "Command", "sign_command", "parse_command", "pack_bundle",
           "unpack_bundle", "MAX_ARCHIVE_BYTES", "DEFAULT_CHUNK_SIZE"]

PREFIX = "edgesdk"
DEFAULT_CHUNK_SIZE = 256 * 1024
#: Largest archive a device accepts (a manifest claiming more is refused before any write).
MAX_ARCHIVE_BYTES = 2 * 1024**3
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_id(value: str, what: str) -> str:
    """Ids become topic levels and file names: no '/', '+', '#', or '..'."""
    if not isinstance(value, str) or not _ID.match(value) or ".." in value:
        raise TransferError(f"{what} {value!r} must be 1-64 of letters, digits, '.', '_', '-'")
    return value


class Topics:
    """Topic names of the protocol (see the module docstring)."""

    @staticmethod
    def cmd(device: str) -> str:
        return f"{PREFIX}/devices/{device}/cmd"

    @staticmethod
    def state(device: str) -> str:
        return f"{PREFIX}/devices/{device}/state"

    @staticmethod
    def events(device: str) -> str:
        return f"{PREFIX}/devices/{device}/events"

    @staticmethod
    def need(device: str) -> str:
        return f"{PREFIX}/devices/{device}/need"

    @staticmethod
    def device_chunks(device: str, transfer: str) -> str:
        return f"{PREFIX}/devices/{device}/chunks/{transfer}"

    @staticmethod
    def group_chunks(group: str, transfer: str) -> str:
        return f"{PREFIX}/groups/{group}/chunks/{transfer}"

    ALL_STATES = f"{PREFIX}/devices/+/state"
    ALL_EVENTS = f"{PREFIX}/devices/+/events"
    ALL_NEEDS = f"{PREFIX}/devices/+/need"

    @staticmethod
    def device_of(topic: str) -> str:
        return topic.split("/")[2]


@dataclass(frozen=True)
class ArchiveInfo:
    """The bundle archive a deployment transfers: its hash, size and chunk hashes."""

    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]

    @classmethod
    def of(cls, data: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> ArchiveInfo:
        chunks = tuple(hashlib.sha256(data[i:i + chunk_size]).hexdigest() for i in range(0, len(data), chunk_size))
        return cls(hashlib.sha256(data).hexdigest(), len(data), chunk_size, chunks)

    def chunk_range(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.size)


@dataclass(frozen=True)
class Command:
    """A verified command from the server."""

    type: str  # "deploy" or "rollback"
    deployment_id: str
    transfer_id: str
    name: str
    version: str
    group: str
    rollback: bool
    issued_at: float
    archive: ArchiveInfo | None
    raw: bytes  # the signed envelope, kept so an interrupted transfer can resume after a restart

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)


def sign_command(private_key: Any, *, type: str, deployment_id: str, transfer_id: str, name: str, version: str,
                 group: str, rollback: bool = False, archive: ArchiveInfo | None = None) -> bytes:
    """The signed envelope of a command, ready to publish."""
    from edgesdk.signing import key_id, sign

    manifest = {"type": type, "deployment_id": deployment_id, "transfer_id": transfer_id, "name": name,
                "version": version, "group": group, "rollback": rollback, "issued_at": time.time(),
                "archive": None if archive is None else {"sha256": archive.sha256, "size": archive.size,
                                                         "chunk_size": archive.chunk_size,
                                                         "chunks": list(archive.chunks)}}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"manifest": base64.b64encode(body).decode(),
                       "signature": base64.b64encode(sign(private_key, body)).decode(),
                       "key_id": key_id(private_key.public_key())}).encode()


def parse_command(envelope: bytes, public_key: Any | None, allow_unsigned: bool = False,
                  max_size: int = MAX_ARCHIVE_BYTES) -> Command:
    """Verify (unless ``allow_unsigned``, a development flag) and check a command envelope."""
    from edgesdk.signing import verify

    try:
        outer = json.loads(envelope)
        body = base64.b64decode(outer["manifest"], validate=True)
        signature = base64.b64decode(outer.get("signature") or "", validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"command is not a signed envelope ({exc}); ignored") from exc
    if public_key is not None:
        verify(public_key, body, signature, "OTA command")
    elif not allow_unsigned:
        raise SignatureError("no server public key is pinned; refusing commands (pass the key, or the "
                             "development flag to accept unsigned ones)")
    try:
        m = json.loads(body)
        archive = None
        if m["archive"] is not None:
            a = m["archive"]
            archive = ArchiveInfo(str(a["sha256"]), int(a["size"]), int(a["chunk_size"]), tuple(map(str, a["chunks"])))
            expected_chunks = -(-archive.size // archive.chunk_size) if archive.chunk_size > 0 else -1
            if not 0 < archive.size <= max_size or archive.chunk_size <= 0 or len(archive.chunks) != expected_chunks:
                raise TransferError(f"archive of {archive.size} bytes in {len(archive.chunks)} chunks of "
                                    f"{archive.chunk_size} is inconsistent or over the {max_size}-byte cap")
        command = Command(type=m["type"], deployment_id=check_id(m["deployment_id"], "deployment id"),
                          transfer_id=check_id(m["transfer_id"], "transfer id"), name=safe_name(m["name"], "model name"),
                          version=m["version"], group=check_id(m["group"], "group"), rollback=bool(m["rollback"]),
                          issued_at=float(m["issued_at"]), archive=archive, raw=envelope)
        parse_version(command.version)
    except (KeyError, TypeError, ValueError) as exc:
        raise TransferError(f"command manifest is malformed: {exc}") from exc
    if command.type not in ("deploy", "rollback") or (command.type == "deploy" and archive is None):
        raise TransferError(f"unknown command type {command.type!r} or a deploy without an archive")
    return command


def pack_bundle(bundle_dir: str | os.PathLike[str]) -> bytes:
    """A bundle directory as an uncompressed tar (models are already dense); sorted, no owners or times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(Path(bundle_dir).iterdir()):
            if not path.is_file():
                raise BundleError(f"{path}: bundles contain only files")
            info = tar.gettarinfo(str(path), arcname=safe_name(path.name, "bundle file"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buffer.getvalue()


def unpack_bundle(archive: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Extract a bundle archive into an empty directory: regular files with safe names only, each fsynced."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="r:") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                raise BundleError(f"archive member {member.name!r} is not a regular file; refusing it")
            name = safe_name(member.name, "archive member")
            source = tar.extractfile(member)
            assert source is not None
            with open(target / name, "wb") as out:
                while block := source.read(1 << 20):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
