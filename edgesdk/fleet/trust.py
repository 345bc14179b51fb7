"""The fleet's root of trust: signed root metadata naming each role's keys and threshold, rotated by its own keys.

A device is provisioned with a root metadata document instead of a bare public key (the TUF
and Uptane design). The document is JSON::

    {"signed": {"_type": "root", "spec_version": 1, "version": 3, "expires": "2027-11-24T00:00:00Z",
                "keys": {KEYID: {"keytype": "ed25519", "public": HEX of the raw 32 bytes}, ...},
                "roles": {"root":      {"keyids": [...], "threshold": 2},
                          "bundles":   {"keyids": [...], "threshold": 1},     # signs models
                          "commands":  {"keyids": [...], "threshold": 1},     # the OTA server
                          "timestamp": {"keyids": [...], "threshold": 1}}},   # freshness
     "signatures": [{"keyid": KEYID, "sig": HEX of the Ed25519 signature}, ...]}

Signatures are over the canonical JSON of ``signed`` (sorted keys, no spaces, UTF-8), so the
bytes signed never depend on how a document was pretty-printed or re-serialised.

**Rotation** (:func:`update_root`): root version N+1 is trusted only when a threshold of the
*old* root role's keys and a threshold of its *own* root role's keys signed it, and only as
the very next version: an older or equal version is a rollback, a skipped one must come
through its predecessors (:func:`update_chain`). So a stolen key of any role is revoked by
publishing the next root without it, and a stolen root key alone (below the threshold) can
sign nothing a device accepts. **Expiry**: a root past its ``expires`` is still the newest a
device knows, but it can no longer tell whether a key was revoked since: :meth:`Root.expired`
tells the agent to report it (``root_expired`` in its state) and refuse new deploys until the
next version arrives, while it keeps running its model. **Waiting versions** are bounded: a
device holds at most :data:`MAX_PENDING_ROOTS` later versions (each at most
:data:`MAX_PENDING_ROOT_BYTES`, signed by its own root threshold, as :func:`trust_root` checks)
and none more than :data:`MAX_ROOTS_AHEAD` beyond its own, so a flood of made-up versions costs
it a few hundred KiB at most.

**Freshness** (:func:`new_timestamp`, :func:`parse_timestamp`): the server publishes timestamp
metadata at an interval, signed by the ``timestamp`` role: a version that only grows, a short
expiry, the root version it was made under, and a digest of each group's current target. A device
that cannot tell "no update exists" from "updates are being withheld" (an indefinite freeze) now
can: when its newest timestamp has expired, nobody is vouching for what it runs. When a new root
changes the ``timestamp`` role's keys (:func:`role_changed`), the device drops the timestamp it
holds (TUF 5.3.11): a version pushed sky-high with a stolen timestamp key would otherwise make it
ignore every honest timestamp after the rotation.

:class:`TrustStore` keeps the trusted root on the device: ``root.json`` replaced atomically, and
every earlier version kept beside it as ``root.<N>.json``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgesdk.errors import SignatureError, TrustError
from edgesdk.files import write_atomic
from edgesdk.runtime.signing import KeySet, key_id, public_from_raw, raw_public

__all__ = ["ROLES", "Root", "RoleKeys", "canonical", "new_root", "sign_metadata", "add_signatures", "parse_root",
           "trust_root", "update_root", "update_chain", "TrustStore", "Timestamp", "new_timestamp",
           "parse_timestamp", "targets_digest", "role_changed", "MAX_PENDING_ROOTS",
           "MAX_ROOTS_AHEAD", "MAX_PENDING_ROOT_BYTES"]

#: The roles a root names, each with its own keys and threshold.
ROLES = ("root", "bundles", "commands", "timestamp")
SPEC_VERSION = 1
#: The largest root document either side reads (a hostile one must not make a device allocate more).
MAX_ROOT_BYTES = 256 * 1024
#: Highest root or timestamp version: it fits a signed 64-bit integer, as every int the fleet stores does.
MAX_VERSION = 2**63 - 1
#: A device keeps at most this many root versions waiting for the ones before them...
MAX_PENDING_ROOTS = 8
#: ... none more than this many versions ahead of the root it holds ...
MAX_ROOTS_AHEAD = 16
#: ... and none larger than this (a root naming a few dozen keys is a few KiB).
MAX_PENDING_ROOT_BYTES = 64 * 1024
_HEX = re.compile(r"^[0-9a-f]+$")


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of ``value``: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: Any) -> float:
    if not isinstance(text, str):
        raise ValueError(f"expires must be an ISO 8601 UTC time, got {text!r}")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


@dataclass(frozen=True)
class RoleKeys:
    """One role's key ids and threshold."""

    keyids: tuple[str, ...]
    threshold: int


@dataclass(frozen=True)
class Root:
    """A parsed root metadata document (trusted only once :func:`trust_root` or :func:`update_root` said so)."""

    version: int
    expires: float
    keys: Mapping[str, Ed25519PublicKey]
    roles: Mapping[str, RoleKeys]
    #: The whole signed document as written (what a device stores and passes on).
    raw: bytes

    def keyset(self, role: str) -> KeySet:
        """The keys and threshold of ``role``."""
        if role not in self.roles:
            raise TrustError(f"root metadata v{self.version} has no role {role!r}; roles: {', '.join(ROLES)}")
        spec = self.roles[role]
        return KeySet({kid: self.keys[kid] for kid in spec.keyids}, spec.threshold)

    def expired(self, now: float | None = None) -> bool:
        """Whether ``expires`` has passed (at ``now``, default the current time)."""
        return (time.time() if now is None else now) >= self.expires

    @property
    def expires_iso(self) -> str:
        """``expires`` as written in the document (ISO 8601 UTC)."""
        return _iso(self.expires)


def new_root(version: int, expires: float, roles: Mapping[str, tuple[Iterable[Ed25519PublicKey], int]]) -> dict[str, Any]:
    """The ``signed`` part of a root: ``roles`` maps each of :data:`ROLES` to (its public keys, its threshold)."""
    missing = [r for r in ROLES if r not in roles]
    unknown = [r for r in roles if r not in ROLES]
    if missing or unknown:
        raise TrustError(f"a root names exactly the roles {', '.join(ROLES)}; missing {missing}, unknown {unknown}")
    keys: dict[str, dict[str, str]] = {}
    role_specs: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        public_keys, threshold = roles[role]
        keyset = KeySet.of(public_keys, threshold)  # checks the threshold against the keys
        for kid, key in keyset.keys.items():
            keys[kid] = {"keytype": "ed25519", "public": raw_public(key).hex()}
        role_specs[role] = {"keyids": sorted(keyset.keys), "threshold": threshold}
    return {"_type": "root", "spec_version": SPEC_VERSION, "version": version, "expires": _iso(expires),
            "keys": keys, "roles": role_specs}


def sign_metadata(signed: Mapping[str, Any], private_keys: Iterable[Ed25519PrivateKey]) -> bytes:
    """The metadata document of ``signed`` (a root or a timestamp), signed by each of ``private_keys``."""
    data = canonical(signed)
    signatures = [{"keyid": key_id(k.public_key()), "sig": k.sign(data).hex()} for k in private_keys]
    return json.dumps({"signed": signed, "signatures": signatures}, indent=1, sort_keys=True).encode()


def add_signatures(document: bytes, private_keys: Iterable[Ed25519PrivateKey]) -> bytes:
    """``document`` with the signatures of ``private_keys`` added (each key once): for a ceremony where each
    root key holder signs in turn."""
    envelope = _envelope(document)
    data = canonical(envelope["signed"])
    signatures = {s["keyid"]: s for s in envelope["signatures"]}
    for key in private_keys:
        signatures[key_id(key.public_key())] = {"keyid": key_id(key.public_key()), "sig": key.sign(data).hex()}
    return json.dumps({"signed": envelope["signed"], "signatures": list(signatures.values())}, indent=1,
                      sort_keys=True).encode()


def _envelope(document: bytes) -> dict[str, Any]:
    if len(document) > MAX_ROOT_BYTES:
        raise TrustError(f"root metadata of {len(document)} bytes is over the {MAX_ROOT_BYTES}-byte limit; refused")
    try:
        envelope = json.loads(document)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("signed"), dict) \
                or not isinstance(envelope.get("signatures"), list):
            raise ValueError("it needs a 'signed' object and a 'signatures' list")
        for sig in envelope["signatures"]:
            if not isinstance(sig, dict) or not isinstance(sig.get("keyid"), str) or not isinstance(sig.get("sig"), str):
                raise ValueError(f"signature entry {sig!r} needs 'keyid' and 'sig' strings")
    except ValueError as exc:
        raise TrustError(f"root metadata is malformed ({exc}); use a root.json written by `edgesdk keys`") from exc
    return envelope


def _signatures(envelope: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The (key id, signature) pairs of a checked envelope; an entry whose signature is not hex counts for nothing."""
    return [(s["keyid"], bytes.fromhex(s["sig"])) for s in envelope["signatures"] if _HEX.match(s["sig"])]


def parse_root(document: bytes) -> tuple[Root, list[tuple[str, bytes]]]:
    """The root in ``document`` and its signatures, checked for shape only (nothing is trusted here)."""
    envelope = _envelope(document)
    signed = envelope["signed"]
    try:
        if signed.get("_type") != "root" or signed.get("spec_version") != SPEC_VERSION:
            raise ValueError(f"_type {signed.get('_type')!r} / spec_version {signed.get('spec_version')!r} is not "
                             f"root / {SPEC_VERSION}")
        version = signed["version"]
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
            raise ValueError(f"version {version!r:.40} must be a whole number from 1 to {MAX_VERSION}")
        keys = {}
        for kid, spec in signed["keys"].items():
            if spec.get("keytype") != "ed25519" or not _HEX.match(spec.get("public", "")):
                raise ValueError(f"key {kid}: only ed25519 keys with a hex 'public' are accepted")
            key = public_from_raw(bytes.fromhex(spec["public"]))
            if key_id(key) != kid:
                raise ValueError(f"key id {kid} is not the id of its key ({key_id(key)})")
            keys[kid] = key
        roles = {}
        if sorted(signed["roles"]) != sorted(ROLES):
            raise ValueError(f"roles {sorted(signed['roles'])} are not exactly {list(ROLES)}")
        for role, spec in signed["roles"].items():
            keyids, threshold = tuple(spec["keyids"]), spec["threshold"]
            if any(k not in keys for k in keyids):
                raise ValueError(f"role {role} names a key the root does not list")
            KeySet({k: keys[k] for k in keyids}, threshold)  # threshold within 1..len(keyids)
            roles[role] = RoleKeys(keyids, threshold)
        expires = _seconds(signed["expires"])
        issued = None if signed.get("issued") is None else _seconds(signed["issued"])
        if issued is not None and issued > expires:
            raise ValueError(f"issued {signed['issued']} is after expires {signed['expires']}")
        signatures = _signatures(envelope)
    except (KeyError, TypeError, AttributeError, ValueError, SignatureError) as exc:
        raise TrustError(f"root metadata is malformed ({exc}); use a root.json written by `edgesdk keys`") from exc
    return Root(version, expires, keys, roles, document), signatures


def _signed_data(document: bytes) -> bytes:
    """The bytes a root's signatures are over (after parse_root accepted ``document``)."""
    return canonical(json.loads(document)["signed"])


def trust_root(document: bytes) -> Root:
    """The first root a device is provisioned with: it must carry a threshold of its own root keys' signatures
    (the device trusts it because whoever provisions it put it there, not because of a signature)."""
    root, signatures = parse_root(document)
    root.keyset("root").verify(_signed_data(document), signatures, f"root metadata v{root.version}")
    return root


def role_changed(old: Root, new: Root, role: str) -> bool:
    """Whether ``role``'s keys or threshold differ between two roots (a rotation of that role)."""
    a, b = old.roles[role], new.roles[role]
    return set(a.keyids) != set(b.keyids) or a.threshold != b.threshold


def update_root(trusted: Root, document: bytes) -> Root:
    """The next root, trusted only as version ``trusted.version + 1`` signed by a threshold of ``trusted``'s root
    keys and a threshold of its own. An older or equal version is a rollback (TrustError); a later one must come
    through the versions between (:func:`update_chain`)."""
    new, signatures = parse_root(document)
    if new.version <= trusted.version:
        raise TrustError(f"root metadata v{new.version} is not newer than the v{trusted.version} this device trusts: "
                         "a rollback of the root of trust is refused")
    if new.version != trusted.version + 1:
        raise TrustError(f"root metadata v{new.version} skips versions: this device trusts v{trusted.version} and "
                         f"takes v{trusted.version + 1} next; send every version between, in order")
    data = _signed_data(document)
    trusted.keyset("root").verify(data, signatures, f"root metadata v{new.version} (by the root keys of "
                                                   f"v{trusted.version})")
    new.keyset("root").verify(data, signatures, f"root metadata v{new.version} (by its own root keys)")
    return new


def update_chain(trusted: Root, documents: Iterable[bytes],
                 on_step: Callable[[Root, Root], None] | None = None) -> Root:
    """``trusted`` moved forward through ``documents`` (any order; versions already held are skipped), calling
    ``on_step(old, new)`` after each accepted version, before the next is checked."""
    pending = {}
    for document in documents:
        root, _ = parse_root(document)
        if root.version > trusted.version:
            pending[root.version] = document
    for version in sorted(pending):
        new = update_root(trusted, pending[version])
        if on_step is not None:
            on_step(trusted, new)
        trusted = new
    return trusted


@dataclass(frozen=True)
class Timestamp:
    """Verified timestamp metadata."""

    version: int
    expires: float
    #: The root version the server signed it under.
    root_version: int
    #: Group -> digest of the group's current target (:func:`targets_digest`).
    targets: Mapping[str, str]
    raw: bytes
    #: When the server signed it (None: a server of an earlier release did not say): a device whose own clock is
    #: not set tells the time by it (:meth:`edgesdk.agent.trust_keeper.TrustKeeper.command_time`).
    issued: float | None = None

    def expired(self, now: float | None = None) -> bool:
        """Whether ``expires`` has passed (at ``now``, default the current time)."""
        return (time.time() if now is None else now) >= self.expires

    @property
    def expires_iso(self) -> str:
        """``expires`` as written in the document (ISO 8601 UTC)."""
        return _iso(self.expires)


def targets_digest(target: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a group's target, e.g. ``{"model": "digits", "version": "1.2.0"}``, as canonical JSON."""
    import hashlib

    return hashlib.sha256(canonical(dict(target))).hexdigest()


def new_timestamp(version: int, expires: float, root_version: int, targets: Mapping[str, str],
                  issued: float | None = None) -> dict[str, Any]:
    """The ``signed`` part of timestamp metadata (sign it with the ``timestamp`` role's keys); ``issued``, when the
    server signs it, tells devices without a real-time clock what time it is."""
    signed = {"_type": "timestamp", "spec_version": SPEC_VERSION, "version": version, "expires": _iso(expires),
              "root_version": root_version, "targets": dict(targets)}
    if issued is not None:
        signed["issued"] = _iso(issued)
    return signed


def parse_timestamp(document: bytes, root: Root) -> Timestamp:
    """Timestamp metadata verified by ``root``'s ``timestamp`` role; TrustError when malformed, SignatureError when
    short of that role's threshold (a timestamp key this root does not name, e.g. a revoked one)."""
    envelope = _envelope(document)
    signed = envelope["signed"]
    try:
        if signed.get("_type") != "timestamp" or signed.get("spec_version") != SPEC_VERSION:
            raise ValueError(f"_type {signed.get('_type')!r} is not timestamp")
        version, root_version = signed["version"], signed["root_version"]
        for name, value in (("version", version), ("root_version", root_version)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
                raise ValueError(f"{name} {value!r:.40} must be a whole number from 1 to {MAX_VERSION}")
        targets = signed["targets"]
        if not isinstance(targets, dict) or not all(isinstance(k, str) and isinstance(v, str) and _HEX.match(v)
                                                    for k, v in targets.items()):
            raise ValueError("targets must map group names to hex digests")
        expires = _seconds(signed["expires"])
        issued = None if signed.get("issued") is None else _seconds(signed["issued"])
        if issued is not None and issued > expires:
            raise ValueError(f"issued {signed['issued']} is after expires {signed['expires']}")
        signatures = _signatures(envelope)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise TrustError(f"timestamp metadata is malformed ({exc}); ignore it") from exc
    root.keyset("timestamp").verify(canonical(signed), signatures, f"timestamp v{version}")
    return Timestamp(version, expires, root_version, targets, document, issued)


class TrustStore:
    """The trusted root on a device's disk: ``root.json`` (replaced atomically) and every earlier ``root.<N>.json``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "root.json"

    def provision(self, document: bytes) -> Root:
        """Install the first root (see :func:`trust_root`); a store that already trusts one refuses."""
        if self.path.exists():
            raise TrustError(f"{self.path} already holds root metadata; a newer root arrives as an update, signed "
                             "by the current root keys")
        root = trust_root(document)
        write_atomic(self.path, document)
        return root

    def load(self) -> Root:
        """The trusted root (it was verified when stored; its own root keys' signatures are checked again)."""
        try:
            document = self.path.read_bytes()
        except FileNotFoundError:
            raise TrustError(f"{self.path} does not exist: provision the device with the fleet's root.json "
                             "(`edgesdk keys init` writes it)") from None
        return trust_root(document)

    def update(self, documents: Iterable[bytes]) -> Root:
        """Move the trusted root forward through ``documents``; each step is stored before the next is checked,
        and the root it replaces is kept as ``root.<N>.json``. A refused step raises TrustError and leaves the
        newest root trusted so far in place."""
        return update_chain(self.load(), documents, self._store)

    def _store(self, old: Root, new: Root) -> None:
        write_atomic(self.directory / f"root.{old.version}.json", old.raw)
        write_atomic(self.path, new.raw)
