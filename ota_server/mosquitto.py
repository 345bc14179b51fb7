"""Broker configuration for a fleet: per-device credentials and an ACL.

``write_mosquitto_config`` writes a mosquitto password file (PBKDF2-SHA512, the ``$7$``
format ``mosquitto_passwd`` produces), an ACL where each device may read only its own
command/chunk topics, its group's broadcast chunks and the fleet's root of trust
(``edgesdk/trust/#``), and write only its own
state/events/requests/measurement results, one credentials file per device, and a
``mosquitto.conf`` with absolute paths (it works from any directory).

Started as root, mosquitto 2 drops to the ``mosquitto`` user before it reads the password
and ACL files, so when this runs as root they are given to that user (mode 0600, the
owner mosquitto checks for); otherwise they belong to whoever runs this, who then starts
mosquitto. Device and server credentials stay 0600 for their writer only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgesdk.fleet.measurement import MAX_RESULT_BYTES
from edgesdk.fleet.protocol import PREFIX, check_id

__all__ = ["MAX_PACKET_BYTES", "MosquittoConfig", "write_mosquitto_config", "password_hash"]

_ITERATIONS = 101  # mosquitto_passwd's default for $7$
_BROKER_USER = "mosquitto"  # the user mosquitto 2 drops to when started as root

#: The broker's ``max_packet_size``. The largest legitimate message is a measurement result
#: (device -> server, at most MAX_RESULT_BYTES = 32 MiB of JSON); the next largest are a
#: deploy command for a 2 GiB archive (every chunk's sha256, about 0.75 MiB) and a chunk
#: (256 KiB by default). mosquitto's limit is one for all topics, so it cannot be tighter
#: than the result; 64 KiB on top covers the MQTT headers and topic. A device still cannot
#: publish (or retain) hundreds of MiB, and the server caps state and event payloads itself.
MAX_PACKET_BYTES = MAX_RESULT_BYTES + 64 * 1024


#: Messages mosquitto queues for one client beyond those in flight (its default, 1,000, drops QoS 1 messages
#: to the server when thousands of devices report at once; the devices connect with clean sessions, so an
#: offline device queues nothing).
MAX_QUEUED_MESSAGES = 1_000_000


def password_hash(password: str, salt: bytes | None = None) -> str:
    """A mosquitto password-file hash of ``password`` (``$7$``, PBKDF2-SHA512); a random 12-byte salt when None."""
    salt = salt or secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _ITERATIONS)
    return f"$7${_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


@dataclass(frozen=True)
class MosquittoConfig:
    """What :func:`write_mosquitto_config` wrote (absolute paths) and how to start the broker."""

    conf: Path
    password_file: Path
    acl_file: Path
    #: Device id -> its credentials JSON (device_id, group, username, password), mode 0600.
    credentials: Mapping[str, Path]
    server_username: str
    #: The server's password in clear; also in ``credentials/server.json``.
    server_password: str
    #: Problems mosquitto would hit reading these files (e.g. a directory it cannot enter), with the fix.
    warnings: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The exact command that starts mosquitto with this configuration."""
        return f"mosquitto -c {self.conf}"


def _write_private(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> None:
    """Write ``text`` readable by its owner only; ``owner`` (when root) is who gets the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        if owner is not None:
            os.fchown(f.fileno(), owner.pw_uid, owner.pw_gid)


def _broker_user() -> pwd.struct_passwd | None:
    """The user a root-started mosquitto reads its files as; None when not root (it runs as us)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_BROKER_USER)
    except KeyError:
        return None


def _unreachable(directory: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory on the way to ``directory`` that ``user`` may not enter, if any."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))  # mosquitto calls initgroups() as it drops
    for parent in (*reversed(directory.parents), directory):
        mode = parent.stat()
        if user.pw_uid == mode.st_uid:
            allowed = mode.st_mode & stat.S_IXUSR
        elif mode.st_gid in groups:
            allowed = mode.st_mode & stat.S_IXGRP
        else:
            allowed = mode.st_mode & stat.S_IXOTH
        if not allowed:
            return parent
    return None


def write_mosquitto_config(out_dir: str | os.PathLike[str], devices: Mapping[str, str], port: int = 1883,
                           bind: str = "127.0.0.1", server_username: str = "edgesdk-server",
                           certfile: str | None = None, keyfile: str | None = None) -> MosquittoConfig:
    """Write the broker files for a fleet whose ``devices`` map device id -> group, and say what was written.

    The files go to ``out_dir`` (``mosquitto.conf``, ``passwd``, ``acl``, ``credentials/``); the
    configuration names them by absolute path and caps packets at :data:`MAX_PACKET_BYTES`. TLS is
    enabled when both ``certfile`` and ``keyfile`` are given. Every run makes new passwords for all
    devices and the server. A bad device id or group raises TransferError.
    """
    out = Path(out_dir).resolve()
    (out / "credentials").mkdir(parents=True, exist_ok=True)
    passwords = {server_username: secrets.token_urlsafe(24)}
    for device, group in devices.items():
        check_id(device, "device id")
        check_id(group, "group")
        passwords[device] = secrets.token_urlsafe(24)
    broker_user = _broker_user()
    _write_private(out / "passwd", "".join(f"{user}:{password_hash(pw)}\n" for user, pw in passwords.items()),
                   broker_user)
    write_acl(out, devices, server_username)
    credentials = {}
    for device, group in devices.items():
        path = out / "credentials" / f"{device}.json"
        _write_private(path, json.dumps({"device_id": device, "group": group, "username": device,
                                         "password": passwords[device]}))
        credentials[device] = path
    _write_private(out / "credentials" / "server.json",
                   json.dumps({"username": server_username, "password": passwords[server_username]}))
    tls = [f"certfile {Path(certfile).resolve()}", f"keyfile {Path(keyfile).resolve()}"] if certfile and keyfile else []
    warnings = _warnings(out, broker_user)
    # A root-started mosquitto that could not read its files as its own user would not start at all:
    # then it keeps running as root, and the warning says how to let it drop privileges.
    stay_root = ["user root"] if warnings else []
    conf = [f"listener {port} {bind}", "allow_anonymous false", f"password_file {out / 'passwd'}",
            f"acl_file {out / 'acl'}", f"max_packet_size {MAX_PACKET_BYTES}",
            f"max_queued_messages {MAX_QUEUED_MESSAGES}", "persistence false", *stay_root, *tls, ""]
    (out / "mosquitto.conf").write_text("\n".join(conf))
    return MosquittoConfig(out / "mosquitto.conf", out / "passwd", out / "acl", credentials, server_username,
                           passwords[server_username], warnings)


def write_acl(out_dir: str | os.PathLike[str], devices: Mapping[str, str],
              server_username: str = "edgesdk-server") -> Path:
    """Write only the ACL of ``out_dir`` (``acl``) for ``devices`` (device id -> group), leaving the passwords: after
    a device moved to another group, so it reads that group's broadcast chunks and no longer its old group's.
    Reload the broker afterwards (SIGHUP, or ``mosquitto_signal -a config-reload``). The path written."""
    out = Path(out_dir).resolve()
    acl = [f"user {server_username}", f"topic readwrite {PREFIX}/#", ""]
    for device, group in devices.items():
        check_id(device, "device id")
        check_id(group, "group")
        acl += [f"user {device}",
                f"topic read {PREFIX}/devices/{device}/cmd",
                f"topic read {PREFIX}/trust/#",
                f"topic read {PREFIX}/devices/{device}/chunks/#",
                f"topic read {PREFIX}/groups/{group}/chunks/#",
                f"topic readwrite {PREFIX}/devices/{device}/state",
                f"topic write {PREFIX}/devices/{device}/events",
                f"topic write {PREFIX}/devices/{device}/need",
                f"topic write {PREFIX}/devices/{device}/measurements", ""]
    _write_private(out / "acl", "\n".join(acl), _broker_user())
    return out / "acl"


def _warnings(out: Path, broker_user: pwd.struct_passwd | None) -> tuple[str, ...]:
    if os.geteuid() != 0:
        return ()
    if broker_user is None:
        return (f"there is no {_BROKER_USER!r} user for mosquitto to drop to when started as root, so "
                "mosquitto.conf keeps it running as root (`user root`); create that user (the mosquitto package "
                "does) and run this again to let it drop privileges",)
    blocked = _unreachable(out, broker_user)
    if blocked is None:
        return ()
    return (f"mosquitto started as root reads its files as user {_BROKER_USER}, who cannot enter {blocked} "
            f"(mode {stat.S_IMODE(blocked.stat().st_mode):o}), so mosquitto.conf keeps it running as root "
            "(`user root`); to let it drop privileges, write the configuration where that user can reach it (e.g. "
            f"--out /etc/mosquitto/edgesdk) or `chmod o+x {blocked}`",)
