"""The operator's side of the root of trust: making a fleet's first root, rotating a role's keys, revoking a key.

Each function returns the new root document; :mod:`edgesdk.fleet.trust` is what devices run to
accept it. A rotation or revocation writes version N+1 signed by the root keys at hand and then
checks it the way a device will (:func:`~edgesdk.fleet.trust.update_root`). When the signatures
at hand are fewer than the old and the new root role's thresholds, the document is still
returned with a :class:`CeremonyResult` that says which holders must add theirs
(``edgesdk keys sign-root``) before it is published.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgesdk.errors import TrustError
from edgesdk.fleet.trust import ROLES, Root, add_signatures, new_root, parse_root, sign_metadata, update_root
from edgesdk.runtime.signing import generate_keypair, key_id, load_private_key, load_public_key

__all__ = ["CeremonyResult", "init_fleet", "rotate", "revoke", "sign_more", "describe", "DEFAULT_EXPIRY_S"]

#: A root's validity unless told otherwise: a year, as TUF suggests for root metadata.
DEFAULT_EXPIRY_S = 365 * 86400.0


@dataclass(frozen=True)
class CeremonyResult:
    """A root document and whether it already carries every signature a device requires."""

    document: bytes
    version: int
    #: Empty when devices will accept it; else what is missing, e.g. "1 more signature by the root keys of v3".
    missing: tuple[str, ...] = ()


def init_fleet(out_dir: str | os.PathLike[str], key_counts: Mapping[str, int], thresholds: Mapping[str, int],
               expires_in_s: float = DEFAULT_EXPIRY_S) -> tuple[Path, dict[str, list[Path]]]:
    """Make ``out_dir/keys/<role>-<i>.key|.pub`` for every role and ``out_dir/root.json`` (version 1, signed by
    every root key); the root's path and the private key files by role. Keys default to one per role, thresholds
    to 1; existing files are never overwritten."""
    out = Path(out_dir)
    unknown = sorted((set(key_counts) | set(thresholds)) - set(ROLES))
    if unknown:
        raise TrustError(f"unknown role(s) {unknown}; the roles are {', '.join(ROLES)}")
    if (out / "root.json").exists():
        raise TrustError(f"{out / 'root.json'} already exists; a fleet's root is made once, then rotated "
                         "(`edgesdk keys rotate`)")
    private: dict[str, list[Path]] = {}
    public: dict[str, list[Ed25519PublicKey]] = {}
    for role in ROLES:
        count = key_counts.get(role, 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise TrustError(f"{role} needs 1 or more keys, not {count!r}")
        paths = [generate_keypair(out / "keys", f"{role}-{i + 1}") for i in range(count)]
        private[role] = [key for key, _ in paths]
        public[role] = [load_public_key(pub) for _, pub in paths]
    signed = new_root(1, time.time() + expires_in_s, {r: (public[r], thresholds.get(r, 1)) for r in ROLES})
    document = sign_metadata(signed, [load_private_key(p) for p in private["root"]])
    root_path = out / "root.json"
    root_path.write_bytes(document)
    return root_path, private


def _roles(root: Root) -> dict[str, tuple[list[Ed25519PublicKey], int]]:
    """Each role's public keys and threshold, as new_root takes them."""
    return {role: ([root.keys[k] for k in spec.keyids], spec.threshold) for role, spec in root.roles.items()}


def _next(old: Root, roles: Mapping[str, tuple[Sequence[Ed25519PublicKey], int]], signers: Iterable[Ed25519PrivateKey],
          expires_in_s: float) -> CeremonyResult:
    signed = new_root(old.version + 1, time.time() + expires_in_s, roles)
    document = sign_metadata(signed, list(signers))
    new, signatures = parse_root(document)
    missing = []
    signed_by = {kid for kid, _ in signatures}
    for label, keyset in ((f"the root keys of v{old.version}", old.keyset("root")),
                          (f"the root keys of v{new.version}", new.keyset("root"))):
        have = len(signed_by & set(keyset.keys))
        if have < keyset.threshold:
            missing.append(f"{keyset.threshold - have} more signature(s) by {label} "
                           f"(any of {', '.join(sorted(set(keyset.keys) - signed_by))})")
    if not missing:
        update_root(old, document)  # exactly what a device will check
    return CeremonyResult(document, new.version, tuple(missing))


def rotate(document: bytes, role: str, signers: Iterable[Ed25519PrivateKey], add: Iterable[Ed25519PublicKey] = (),
           remove: Iterable[str] = (), threshold: int | None = None,
           expires_in_s: float = DEFAULT_EXPIRY_S) -> CeremonyResult:
    """The next root after ``document``: ``role`` with the keys ``add``-ed and the key ids ``remove``-d, and its
    ``threshold`` (unchanged when None), signed by ``signers``."""
    old, _ = parse_root(document)
    if role not in ROLES:
        raise TrustError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
    roles = _roles(old)
    keys, current = roles[role]
    removed = set(remove)
    absent = sorted(removed - {key_id(k) for k in keys})
    if absent:
        raise TrustError(f"role {role} of v{old.version} has no key {', '.join(absent)}; its keys: "
                         f"{', '.join(old.roles[role].keyids)}")
    kept = [k for k in keys if key_id(k) not in removed]
    new_keys = kept + [k for k in add if key_id(k) not in {key_id(x) for x in kept}]
    wanted = current if threshold is None else threshold
    if not 1 <= wanted <= len(new_keys):
        raise TrustError(f"role {role} would have {len(new_keys)} key(s) and threshold {wanted}; the threshold must "
                         "be 1 to the number of keys: add keys (--add) or change --threshold")
    roles[role] = (new_keys, wanted)
    return _next(old, roles, signers, expires_in_s)


def revoke(document: bytes, revoked: str, signers: Iterable[Ed25519PrivateKey],
           expires_in_s: float = DEFAULT_EXPIRY_S) -> CeremonyResult:
    """The next root after ``document`` without the key ``revoked`` in any role, signed by ``signers``. A role
    left with fewer keys than its threshold is refused: rotate a replacement key in first."""
    old, _ = parse_root(document)
    if revoked not in old.keys:
        raise TrustError(f"v{old.version} has no key {revoked}; its keys: {', '.join(sorted(old.keys))}")
    roles = _roles(old)
    for role, (keys, threshold) in roles.items():
        kept = [k for k in keys if key_id(k) != revoked]
        if len(kept) < threshold:
            raise TrustError(f"revoking {revoked} leaves role {role} {len(kept)} key(s) for its threshold of "
                             f"{threshold}; add a replacement first (`edgesdk keys rotate --role {role} --add NEW.pub`)")
        roles[role] = (kept, threshold)
    return _next(old, roles, signers, expires_in_s)


def sign_more(document: bytes, key_files: Iterable[str | os.PathLike[str]]) -> bytes:
    """``document`` with the signatures of the private keys in ``key_files`` added (a ceremony's next holder)."""
    return add_signatures(document, [load_private_key(p) for p in key_files])


def describe(document: bytes) -> dict[str, object]:
    """A root's version, expiry, roles (key ids, threshold) and who signed it, as JSON-ready data."""
    root, signatures = parse_root(document)
    return {"version": root.version, "expires": root.expires_iso, "expired": root.expired(),
            "roles": {r: {"keyids": list(s.keyids), "threshold": s.threshold} for r, s in root.roles.items()},
            "signed_by": sorted({kid for kid, _ in signatures})}
