"""Archives on the wire: bundles and measurements packed as plain tars, unpacked only after their manifest verifies.

An archive (:func:`pack_bundle`, :func:`edgesdk.fleet.measurement.pack_measurement`) is an uncompressed tar
of regular files: ``manifest.json`` (every other file's ``sha256`` and ``size``), ``signature.json`` (Ed25519
signatures of the manifest's bytes, :mod:`edgesdk.runtime.bundle`) when it is signed, and the files the
manifest lists. :func:`unpack_signed` is **verify, then unpack**:

1. read every member's header (at most :data:`MAX_MEMBERS`; a pax or long-name header of more than
   :data:`MAX_META_BYTES` is refused unread) and refuse any member that is not a plain regular file (GNU or
   pax sparse, links, devices, fifos, directories), has an unsafe or repeated name, or runs past the end;
2. read ``manifest.json`` and ``signature.json`` (each at most :data:`MAX_META_BYTES`) and check the
   signatures against the keys given (a threshold of a role, e.g. the root's ``bundles`` role): below it,
   nothing is written;
3. refuse a member the manifest does not list, a listed file the archive lacks, and a member whose header
   size is not its signed size;
4. only then write each listed file, never more than its signed size, hashing as it goes: a file that does
   not hash to its signed ``sha256`` is deleted with everything this call wrote, and refused.

So the bytes an archive can put on disk are the sizes its signed manifest names, whose sum is less than the
archive itself, and a key that can only sign commands cannot make a device write, or run, a model. Without
keys (a development device, or one pinning a single server key, whose signed command names the archive's
hash) steps 1, 3 and 4 still hold.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.errors import BundleError, SignatureError
from edgesdk.runtime.bundle import MANIFEST, SIGNATURE, FileEntry, Manifest, safe_name
from edgesdk.runtime.signing import KeySet

__all__ = ["pack_bundle", "unpack_bundle", "pack_files", "pack_signed", "parse_signed_manifest", "unpack_signed",
           "signature_document", "Unpacked", "MAX_META_BYTES", "MAX_MEMBERS"]

#: Largest ``manifest.json``, ``signature.json``, pax header or long-name header an archive may hold.
MAX_META_BYTES = 1024**2
#: Most members an archive may hold (a bundle has four).
MAX_MEMBERS = 64
_BLOCK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a fifo", tarfile.DIRTYPE: "a directory",
          tarfile.GNUTYPE_SPARSE: "a GNU sparse file", tarfile.CONTTYPE: "a contiguous file"}
_PACK_HINT = "pack it again (edgesdk.fleet.archive.pack_bundle / edgesdk.fleet.measurement.pack_measurement)"


def pack_files(files: Mapping[str, bytes | Path]) -> bytes:
    """An uncompressed tar of regular files by name (bytes, or a file's path), sorted, with no owners or times,
    so equal content packs to equal bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            content = files[name]
            info = tarfile.TarInfo(safe_name(name, "archive member"))
            info.mode = 0o644
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
                continue
            info.size = content.stat().st_size
            with open(content, "rb") as f:
                tar.addfile(info, f)
    return buffer.getvalue()


def pack_bundle(bundle_dir: str | os.PathLike[str]) -> bytes:
    """A bundle directory as an uncompressed tar (models are already dense); sorted, no owners or times.

    It holds ``manifest.json``, ``signature.json`` when there is one, and the files the manifest lists: exactly
    what :func:`unpack_bundle` takes (another file in the directory is not packed).
    """
    folder = Path(bundle_dir)
    try:
        manifest = Manifest.from_dict(_json((folder / MANIFEST).read_bytes()))
    except FileNotFoundError:
        raise BundleError(f"{folder} is not a bundle: {MANIFEST} not found") from None
    files: dict[str, bytes | Path] = {}
    for name in sorted([MANIFEST, *([SIGNATURE] if (folder / SIGNATURE).exists() else []), *manifest.files]):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            raise BundleError(f"{path}: the bundle's manifest lists it but it is not a regular file; write the bundle "
                              "again (edgesdk convert, or edgesdk.runtime.bundle.write_bundle)")
        files[name] = path
    return pack_files(files)


def _sha256(content: bytes | Path) -> str:
    if isinstance(content, bytes):
        return hashlib.sha256(content).hexdigest()
    digest = hashlib.sha256()
    with open(content, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def pack_signed(kind: str, files: Mapping[str, bytes | Path], private_keys: Iterable[Any] = (), **fields: Any) -> bytes:
    """An archive of ``files`` with a manifest of ``kind`` listing each one's ``sha256`` and ``size``
    (``{"format_version": 1, "type": kind, "files": {...}, **fields}``, canonical JSON), signed by each of
    ``private_keys`` (none: unsigned). :func:`parse_signed_manifest` reads the manifest back."""
    for name in files:
        if name in (MANIFEST, SIGNATURE):
            raise BundleError(f"a file may not be called {name!r} in an archive: that name is the manifest's")
    entries = {safe_name(name, "archive member"): {"sha256": _sha256(content),
                                                   "size": len(content) if isinstance(content, bytes)
                                                   else content.stat().st_size}
               for name, content in files.items()}
    manifest = json.dumps({**fields, "format_version": 1, "type": kind, "files": entries}, sort_keys=True,
                          separators=(",", ":")).encode()
    members: dict[str, bytes | Path] = {**files, MANIFEST: manifest}
    keys = list(private_keys)
    if keys:
        members[SIGNATURE] = signature_document(manifest, keys)
    return pack_files(members)


def parse_signed_manifest(data: bytes, kind: str) -> tuple[dict[str, Any], dict[str, FileEntry]]:
    """The fields and files of a :func:`pack_signed` manifest of ``kind``; anything else is a BundleError."""
    manifest = _json(data)
    if not isinstance(manifest, dict) or manifest.get("type") != kind or manifest.get("format_version") != 1:
        got = manifest.get("type") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"the archive's {MANIFEST} is not a {kind} manifest of format_version 1 (type {got!r}); "
                          f"{_PACK_HINT}")
    try:
        files = {str(name): FileEntry(e["sha256"], e["size"]) for name, e in manifest["files"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise BundleError(f"the {kind} manifest's files must map names to {{sha256, size}} ({exc!r}); "
                          f"{_PACK_HINT}") from exc
    return manifest, files


def signature_document(manifest: bytes, private_keys: Any) -> bytes:
    """``signature.json`` for ``manifest``'s bytes: one Ed25519 signature per key (as :mod:`edgesdk.runtime.bundle`
    writes it for bundles)."""
    from edgesdk.runtime.signing import key_id, sign

    entries = [{"algorithm": "ed25519", "key_id": key_id(k.public_key()),
                "signature": base64.b64encode(sign(k, manifest)).decode()} for k in private_keys]
    return json.dumps({"signatures": entries}, indent=2).encode()


def _signatures(data: bytes) -> list[tuple[str, bytes]]:
    try:
        payload = json.loads(data)
        entries = payload["signatures"] if "signatures" in payload else [payload]
        return [(str(e["key_id"]), base64.b64decode(e["signature"], validate=True)) for e in entries
                if e.get("algorithm", "ed25519") == "ed25519"]
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise SignatureError(f"the archive's {SIGNATURE} is malformed ({exc}); sign the bundle again") from exc


class _Bounded:
    """The archive file for :mod:`tarfile`: a read of more than a header's worth (a pax or long-name header
    claiming megabytes) is refused before it is made."""

    def __init__(self, f: io.BufferedReader) -> None:
        self._f = f

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_META_BYTES + tarfile.BLOCKSIZE:
            raise BundleError(f"an archive header holds more than {MAX_META_BYTES} bytes of pax or long-name "
                              f"data; refusing it unread ({_PACK_HINT})")
        return self._f.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


def _check_member(member: tarfile.TarInfo, end: int) -> None:
    """Refuse a member that is not a plain regular file with a safe name wholly inside the archive."""
    name = member.name
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        kind = _KINDS.get(member.type, f"of tar type {member.type!r}")
        raise BundleError(f"archive member {name!r} is {kind}, not a regular file; an archive holds regular files "
                          f"only: {_PACK_HINT}")
    if member.sparse is not None or any(k.startswith("GNU.sparse") for k in member.pax_headers):
        raise BundleError(f"archive member {name!r} is a pax sparse file (GNU.sparse headers), which could claim "
                          f"more disk than the archive holds; refusing it: {_PACK_HINT}")
    safe_name(name, "archive member")
    if member.offset_data + member.size > end:
        raise BundleError(f"archive member {name!r} runs past the end: not a complete uncompressed tar; resend it")


def _members(f: io.BufferedReader, where: str) -> dict[str, tarfile.TarInfo]:
    end = os.fstat(f.fileno()).st_size
    members: dict[str, tarfile.TarInfo] = {}
    try:
        with tarfile.open(fileobj=_Bounded(f), mode="r:") as tar:  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                if len(members) == MAX_MEMBERS:
                    raise BundleError(f"{where} holds more than {MAX_MEMBERS} members; refusing it: {_PACK_HINT}")
                _check_member(member, end)
                if member.name in members:
                    raise BundleError(f"archive member {member.name!r} appears twice; refusing it: {_PACK_HINT}")
                members[member.name] = member
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"{where} is not a complete uncompressed tar ({exc}); {_PACK_HINT} and resend it") from exc
    return members


def _read_meta(f: io.BufferedReader, member: tarfile.TarInfo) -> bytes:
    if member.size > MAX_META_BYTES:
        raise BundleError(f"archive member {member.name!r} is {member.size} bytes, over the {MAX_META_BYTES}-byte "
                          f"cap for {MANIFEST} and {SIGNATURE}; refusing it unread")
    return os.pread(f.fileno(), member.size, member.offset_data)


def _check_entries(files: Mapping[str, FileEntry]) -> None:
    for name, entry in files.items():
        safe_name(name, "manifest file name")
        if name in (MANIFEST, SIGNATURE):
            raise BundleError(f"the manifest lists {name!r} among its files; that name is the archive's own")
        if not isinstance(entry.sha256, str) or not _HEX64.match(entry.sha256):
            raise BundleError(f"the manifest's sha256 of {name!r}, {entry.sha256!r}, is not 64 hex digits")
        if isinstance(entry.size, bool) or not isinstance(entry.size, int) or entry.size < 0:
            raise BundleError(f"the manifest's size of {name!r}, {entry.size!r}, is not a byte count")


@dataclass(frozen=True)
class Unpacked:
    """What :func:`unpack_signed` verified and wrote."""

    manifest: bytes
    files: Mapping[str, FileEntry]
    #: Ids of the keys whose signatures verified (empty without keys).
    signed_by: tuple[str, ...]


def _write_member(f: io.BufferedReader, member: tarfile.TarInfo, entry: FileEntry, path: Path) -> None:
    """Copy one member's bytes to ``path`` (a new file), at most its signed size, hashing as it goes."""
    digest, position, left = hashlib.sha256(), member.offset_data, entry.size
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        while left:
            block = os.pread(f.fileno(), min(_BLOCK, left), position)
            if not block:
                raise BundleError(f"archive member {member.name!r} ends early: not a complete uncompressed tar; "
                                  "resend it")
            digest.update(block)
            out.write(block)
            position, left = position + len(block), left - len(block)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != entry.sha256:
        raise SignatureError(f"archive member {member.name!r}: sha256 {digest.hexdigest()[:16]}… does not match the "
                             f"manifest's {entry.sha256[:16]}…; it was changed after signing: do not install it")


def unpack_signed(archive: str | os.PathLike[str], target: str | os.PathLike[str],
                  files_of: Callable[[bytes], tuple[Mapping[str, FileEntry], str]], keys: Any,
                  keep_meta: bool = True) -> Unpacked:
    """Verify ``archive``'s manifest, then write the files it lists into ``target`` (see the module doc).

    ``files_of`` parses the manifest's bytes into its files and a label for messages (raising BundleError);
    ``keys``, when given (a :class:`~edgesdk.runtime.signing.KeySet`, or one public key), must have signed it
    (their threshold). ``target``, absent or empty, is created only once everything but the files' hashes
    checked out; with ``keep_meta`` the manifest and signature are written there too.
    Raises BundleError or SignatureError naming the member; on a refusal while writing, what this call wrote
    is deleted (and ``target``, if this call created it).
    """
    archive, target = Path(archive), Path(target)
    if target.exists() and any(target.iterdir()):
        raise BundleError(f"{target} is not empty; unpack an archive into a new directory")
    if keys is not None and not isinstance(keys, KeySet):
        keys = KeySet.of([keys])
    with open(archive, "rb") as f:
        members = _members(f, archive.name)
        if MANIFEST not in members:
            raise BundleError(f"{archive.name} has no {MANIFEST}: it is not a bundle or measurement archive; "
                              f"{_PACK_HINT}")
        manifest = _read_meta(f, members[MANIFEST])
        signature = _read_meta(f, members[SIGNATURE]) if SIGNATURE in members else None
        files, label = files_of(manifest)
        _check_entries(files)
        signed_by: tuple[str, ...] = ()
        if keys is not None:
            if signature is None:
                raise SignatureError(f"{label} is not signed (the archive has no {SIGNATURE}) and this device "
                                     "needs its bundles keys' signatures; sign it with the bundles role's keys")
            signed_by = keys.verify(manifest, _signatures(signature), label)
        for name in members:
            if name not in files and name not in (MANIFEST, SIGNATURE):
                raise BundleError(f"archive member {name!r} is not listed in the signed manifest of {label}; "
                                  f"refusing the archive: {_PACK_HINT}")
        for name, entry in files.items():
            if name not in members:
                raise BundleError(f"the manifest of {label} lists {name!r} but the archive has no such member; "
                                  f"{_PACK_HINT}")
            if members[name].size != entry.size:
                raise SignatureError(f"archive member {name!r} is {members[name].size} bytes in its header but "
                                     f"{entry.size} in the signed manifest of {label}; refusing it unwritten")
        # Each member lies inside the archive, so what is written adds up to less than the archive: the bound
        # the storage guard counts on (edgesdk.agent.store.space_needed).
        assert sum(e.size for e in files.values()) <= os.fstat(f.fileno()).st_size
        created = not target.exists()
        target.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        try:
            for name, entry in sorted(files.items()):
                written.append(target / name)
                _write_member(f, members[name], entry, target / name)
            if keep_meta:
                for name, data in ((MANIFEST, manifest), (SIGNATURE, signature)):
                    if data is not None:
                        written.append(target / name)
                        _write_new(target / name, data)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            if created:
                target.rmdir()
            raise
    return Unpacked(manifest, files, signed_by)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BundleError(f"the archive's {MANIFEST} is not valid JSON ({exc}); it is corrupt: {_PACK_HINT}") from exc


def _bundle_files(data: bytes) -> tuple[Mapping[str, FileEntry], str]:
    manifest = Manifest.from_dict(_json(data))
    return manifest.files, f"{manifest.name} {manifest.version}"


def unpack_bundle(archive: str | os.PathLike[str], target: str | os.PathLike[str], keys: Any = None) -> Manifest:
    """Verify a bundle archive's manifest (with ``keys``: their threshold of signatures), then unpack it into
    ``target``; returns the manifest. See :func:`unpack_signed` for what is refused."""
    unpacked = unpack_signed(archive, target, _bundle_files, keys)
    return Manifest.from_dict(_json(unpacked.manifest))
