"""What a signed command may act on, and until when: the device it is bound to, its group, its expiry.

A command's manifest is signed once per stage (it can be large: every chunk's hash). The server binds it
to each device it sends it to with a second, small signature over ``{"device", "manifest_sha256"}``
(:class:`Binder`), spliced into the envelope as ``binding`` and ``binding_signature``. A device
(:func:`edgesdk.fleet.protocol.parse_command` with ``to``) verifies that signature with the same keys,
checks the hash against the manifest it carries, and refuses a command bound to another device; one
that names no device (a server of an earlier release) must at least name the device's own group. A
device holding a root of trust (``strict``) refuses commands that name no device or carry no
``expires_at``: every server of this release sends both. Agents of earlier releases ignore the binding
and read the envelope as before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from edgesdk.errors import SignatureError, TransferError, TrustError

__all__ = ["CommandTargetError", "Recipient", "Binder", "read_binding", "check_target", "check_expiry"]

log = logging.getLogger(__name__)


class CommandTargetError(TransferError):
    """A verified command is for another device or group than the one it reached (a replay from elsewhere?), or,
    on a device that holds a root of trust, names no device at all."""


class Recipient(Protocol):
    """The device a command reached (an :class:`edgesdk.agent.config.AgentConfig` is one)."""

    @property
    def device_id(self) -> str:
        """This device's id."""
        ...

    @property
    def group(self) -> str:
        """The group this device was configured in."""
        ...


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data)


class Binder:
    """Binds one sealed command envelope to each device it goes to: ~65 µs a device, whatever the manifest's size.

    ``private_key`` must be the key that sealed ``envelope`` (the device verifies the binding with the envelope's
    ``key_id``). Ed25519 is deterministic, so binding the same envelope to the same device gives the same bytes.
    """

    def __init__(self, private_key: Any, envelope: bytes) -> None:
        outer = json.loads(envelope)
        self.key, self.envelope = private_key, envelope
        self._digest = hashlib.sha256(base64.b64decode(outer["manifest"])).hexdigest().encode()
        head = envelope.rstrip()
        if "binding" in outer or not head.endswith(b"}"):
            raise TransferError("a command envelope can be bound to a device once; bind the unbound envelope")
        self._head = head[:-1]

    def bind(self, device: str) -> bytes:
        """The envelope bound to ``device`` (a safe id, checked by the caller): ready to publish on its topic."""
        from edgesdk.runtime.signing import sign

        body = b'{"device":%s,"manifest_sha256":"%s"}' % (json.dumps(device).encode(), self._digest)
        return b"".join((self._head, b',"binding":"', _b64(body), b'","binding_signature":"',
                         _b64(sign(self.key, body)), b'"}'))


def read_binding(outer: dict[str, Any], body: bytes, verify: Callable[[bytes, bytes, str], None]) -> str | None:
    """The device an envelope is bound to (None: it names none), its binding signature checked with ``verify``
    (data, signature, what) and its hash against the manifest ``body``.

    A bad signature raises SignatureError; a binding for another manifest, or malformed, raises SignatureError too
    (someone spliced it).
    """
    if "binding" not in outer:
        return None
    try:
        raw = base64.b64decode(outer["binding"], validate=True)
        verify(raw, base64.b64decode(outer.get("binding_signature") or "", validate=True), "OTA command binding")
        binding = json.loads(raw)
        device, digest = binding["device"], binding["manifest_sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"command binding {outer.get('binding')!r:.100} is malformed ({exc}); ignored") from exc
    if not isinstance(device, str) or digest != hashlib.sha256(body).hexdigest():
        raise SignatureError(f"command binding names manifest {digest!r:.70}, not the one it came with; it was spliced "
                             "from another command: ignored")
    return device


def check_target(manifest: dict[str, Any], bound: str | None, to: Recipient, strict: bool) -> None:
    """Raise CommandTargetError unless the command may act on ``to``: bound to it, or (unbound, and not ``strict``)
    naming its group. A command bound to this device for another group is followed, with a warning: the server
    moved the device (``OTAServer.provision``) before its agent was told."""
    what = manifest.get("deployment_id") or manifest.get("measurement_id")
    group = manifest.get("group")
    for_group = f" of group {group!r}" if group is not None else ""
    if bound is None and strict:
        raise CommandTargetError(f"command {what}{for_group} names no device, and {to.device_id!r} (group "
                                 f"{to.group!r}) holds a root of trust: it takes only commands bound to it. Upgrade "
                                 "the server, which binds every command it sends")
    if bound is None and group is not None and group != to.group:
        raise CommandTargetError(f"command {what} is for group {group!r} and reached {to.device_id!r} of group "
                                 f"{to.group!r}; refused (a replay from another group?). If the device moved, "
                                 "restart its agent with --group " + group)
    if bound is not None and bound != to.device_id:
        raise CommandTargetError(f"command {what} is for device {bound!r}{for_group} and reached {to.device_id!r} "
                                 f"of group {to.group!r}; refused (a replay from another device?)")
    if bound is not None and group is not None and group != to.group:
        log.warning("%s: command %s is for group %r, this agent's --group is %r: following the server, which moved "
                    "this device; restart the agent with --group %s", to.device_id, what, group, to.group, group)


def _when(seconds: Any) -> str:
    """``seconds`` since the epoch as ISO 8601 UTC, or as given when it is no time at all (a hostile field)."""
    try:
        return datetime.fromtimestamp(float(seconds), timezone.utc).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return repr(seconds)[:40]


def check_expiry(manifest: dict[str, Any], now: float, required: bool = False) -> None:
    """Refuse a command past its ``expires_at``; one without it only when ``required`` (servers of earlier releases
    sent none; a device holding a root of trust requires it). A manifest that is not a JSON object raises TransferError."""
    if not isinstance(manifest, dict):
        raise TransferError(f"command manifest {manifest!r:.100} is not a JSON object; the server sent a broken command")
    expires = manifest.get("expires_at")
    what = manifest.get("deployment_id") or manifest.get("measurement_id")
    if expires is None:
        if required:
            raise TrustError(f"command {what} carries no expires_at; a device holding a root of trust refuses a "
                             "command that never expires (it could be withheld and replayed at will). Upgrade the "
                             "server, which sets expires_at on every command")
        return
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) or not math.isfinite(expires):
        # NaN or Infinity (json reads both) would compare as never expired
        raise TransferError(f"command expires_at {expires!r:.40} is not a finite time")
    if now >= expires:
        raise TrustError(f"command {what} issued {_when(manifest.get('issued_at'))} expired {now - expires:.0f} s "
                         "ago; an expired command is refused (was it withheld and replayed?). The server re-sends "
                         "current ones; check this device's clock if every command is refused")
