"""Broker configuration for a fleet: per-device credentials and an ACL.

``write_mosquitto_config`` writes a mosquitto password file (PBKDF2-SHA512, the ``$7$``
format ``mosquitto_passwd`` produces), an ACL where each device may read only its own
command/chunk topics and its group's broadcast chunks and write only its own
state/events/requests/measurement results, one credentials file per device, and a
``mosquitto.conf``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgesdk.ota import PREFIX, check_id

__all__ = ["MosquittoConfig", "write_mosquitto_config", "password_hash"]

_ITERATIONS = 101  # mosquitto_passwd's default for $7$


def password_hash(password: str, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _ITERATIONS)
    return f"$7${_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


@dataclass(frozen=True)
class MosquittoConfig:
    conf: Path
    password_file: Path
    acl_file: Path
    credentials: Mapping[str, Path]
    server_username: str
    server_password: str


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_mosquitto_config(out_dir: str | os.PathLike[str], devices: Mapping[str, str], port: int = 1883,
                           bind: str = "127.0.0.1", server_username: str = "edgesdk-server",
                           certfile: str | None = None, keyfile: str | None = None) -> MosquittoConfig:
    """``devices`` maps device id -> group. TLS is enabled when a certificate and key are given."""
    out = Path(out_dir)
    (out / "credentials").mkdir(parents=True, exist_ok=True)
    passwords = {server_username: secrets.token_urlsafe(24)}
    for device, group in devices.items():
        check_id(device, "device id")
        check_id(group, "group")
        passwords[device] = secrets.token_urlsafe(24)
    _write_private(out / "passwd", "".join(f"{user}:{password_hash(pw)}\n" for user, pw in passwords.items()))
    acl = [f"user {server_username}", f"topic readwrite {PREFIX}/#", ""]
    for device, group in devices.items():
        acl += [f"user {device}",
                f"topic read {PREFIX}/devices/{device}/cmd",
                f"topic read {PREFIX}/devices/{device}/chunks/#",
                f"topic read {PREFIX}/groups/{group}/chunks/#",
                f"topic readwrite {PREFIX}/devices/{device}/state",
                f"topic write {PREFIX}/devices/{device}/events",
                f"topic write {PREFIX}/devices/{device}/need",
                f"topic write {PREFIX}/devices/{device}/measurements", ""]
    (out / "acl").write_text("\n".join(acl))
    credentials = {}
    for device, group in devices.items():
        path = out / "credentials" / f"{device}.json"
        _write_private(path, json.dumps({"device_id": device, "group": group, "username": device,
                                         "password": passwords[device]}))
        credentials[device] = path
    _write_private(out / "credentials" / "server.json",
                   json.dumps({"username": server_username, "password": passwords[server_username]}))
    tls = [f"certfile {certfile}", f"keyfile {keyfile}"] if certfile and keyfile else []
    conf = [f"listener {port} {bind}", "allow_anonymous false", f"password_file {out / 'passwd'}",
            f"acl_file {out / 'acl'}", "persistence false", *tls, ""]
    (out / "mosquitto.conf").write_text("\n".join(conf))
    return MosquittoConfig(out / "mosquitto.conf", out / "passwd", out / "acl", credentials, server_username,
                           passwords[server_username])
