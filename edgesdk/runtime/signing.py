"""Ed25519 keys and detached signatures for bundles, and sets of keys with a signing threshold.

Keys are PEM files: the private key PKCS#8 (written with mode 0600), the public key
SubjectPublicKeyInfo. A key id is the first 16 hex digits of the SHA-256 of the raw
public key, so a device can say which key it pins. A :class:`KeySet` is what a role of the
root of trust holds (:mod:`edgesdk.fleet.trust`): its keys by id and how many of them must
sign, k of n, each key counted once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgesdk.errors import SignatureError

__all__ = ["generate_keypair", "load_private_key", "load_public_key", "key_id", "sign", "verify", "KeySet", "raw_public",
           "public_from_raw"]


def generate_keypair(directory: str | os.PathLike[str], name: str = "edgesdk") -> tuple[Path, Path]:
    """Write ``<name>.key`` (private, 0600) and ``<name>.pub`` into ``directory``; refuse to overwrite."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise SignatureError(f"{path} already exists; move it away or choose another --name")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SignatureError(f"cannot read {what} {path}: {exc.strerror}") from exc


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read an unencrypted PKCS#8 PEM Ed25519 private key; an unreadable, encrypted or other key raises SignatureError."""
    try:
        key = serialization.load_pem_private_key(_read(path, "private key"), password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"{path} is not an unencrypted PEM private key ({exc}); create one with "
                             "`edgesdk keys generate`") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path} holds a {type(key).__name__}; edgesdk signs with Ed25519 keys only")
    return key


def load_public_key(path_or_pem: str | os.PathLike[str] | bytes) -> Ed25519PublicKey:
    """Read an Ed25519 public key from a PEM file, or from PEM ``bytes``; anything else raises SignatureError."""
    pem = path_or_pem if isinstance(path_or_pem, bytes) else _read(path_or_pem, "public key")
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise SignatureError(f"not a PEM public key ({exc}); use the .pub file from `edgesdk keys generate`") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"public key is a {type(key).__name__}; edgesdk verifies Ed25519 keys only")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's id: the first 16 hex digits of the SHA-256 of its raw 32 bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(private_key: Ed25519PrivateKey, data: bytes) -> bytes:
    """The 64-byte detached Ed25519 signature of ``data``."""
    return private_key.sign(data)


def verify(public_key: Ed25519PublicKey, data: bytes, signature: bytes, what: str) -> None:
    """Raise SignatureError naming ``what`` unless ``signature`` signs ``data`` with ``public_key``."""
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        raise SignatureError(
            f"{what}: signature does not verify with key {key_id(public_key)}; the content was changed after "
            "signing or it was signed with another key: do not install it"
        ) from None


def raw_public(public_key: Ed25519PublicKey) -> bytes:
    """The key's raw 32 bytes (what root metadata records, hex-encoded)."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_from_raw(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its raw 32 bytes; anything else raises SignatureError."""
    if len(raw) != 32:
        raise SignatureError(f"an Ed25519 public key is 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class KeySet:
    """Public keys by key id and the threshold: how many distinct ones of them must sign."""

    keys: Mapping[str, Ed25519PublicKey]
    threshold: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise SignatureError(f"threshold {self.threshold!r} must be a whole number of 1 or more")
        if self.threshold > len(self.keys):
            raise SignatureError(f"threshold {self.threshold} is more than the {len(self.keys)} keys that could sign; "
                                 "add keys or lower the threshold")
        for kid, key in self.keys.items():
            if key_id(key) != kid:
                raise SignatureError(f"key id {kid!r} does not match its key ({key_id(key)})")

    @classmethod
    def of(cls, keys: Iterable[Ed25519PublicKey], threshold: int = 1) -> KeySet:
        """The set of ``keys`` (by their ids) with ``threshold``."""
        return cls({key_id(k): k for k in keys}, threshold)

    def verify(self, data: bytes, signatures: Iterable[tuple[str, bytes]], what: str) -> tuple[str, ...]:
        """The ids of the keys of this set whose signature over ``data`` verifies, each counted once.

        Raises SignatureError naming ``what`` when fewer than :attr:`threshold` of them do; a
        signature by a key outside the set, a second one by the same key, or one that does not
        verify counts for nothing.
        """
        valid: list[str] = []
        for kid, signature in signatures:
            key = self.keys.get(kid)
            if key is None or kid in valid:
                continue
            try:
                key.verify(signature, data)
            except InvalidSignature:
                continue
            valid.append(kid)
        if len(valid) < self.threshold:
            known = ", ".join(sorted(self.keys)) or "none"
            raise SignatureError(
                f"{what}: {len(valid)} valid signature{'s' if len(valid) != 1 else ''} of the {self.threshold} "
                f"required from the trusted keys ({known}); it was changed after signing, or signed by keys this "
                "device does not trust (revoked or never added): do not use it")
        return tuple(valid)
