"""Ed25519 keys and detached signatures for bundles.

Keys are PEM files: the private key PKCS#8 (written with mode 0600), the public key
SubjectPublicKeyInfo. A key id is the first 16 hex digits of the SHA-256 of the raw
public key, so a device can say which key it pins.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgesdk.errors import SignatureError

__all__ = ["generate_keypair", "load_private_key", "load_public_key", "key_id", "sign", "verify"]


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
