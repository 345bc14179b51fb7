"""The device's root of trust, kept up to date: provisioned once, moved forward by the roots the fleet publishes.

The agent is provisioned with the fleet's ``root.json`` (``AgentConfig.root``); from then on its
store's ``trust/`` holds the newest root it has verified (:class:`~edgesdk.fleet.trust.TrustStore`).
Root versions arrive retained on ``edgesdk/trust/root/<N>`` in any order: each is kept until the
versions before it have come, then the chain is applied (:func:`~edgesdk.fleet.trust.update_chain`).
Waiting versions are bounded (in memory only): at most ``MAX_PENDING_ROOTS`` of them, none more than
``MAX_ROOTS_AHEAD`` versions beyond the held root or over ``MAX_PENDING_ROOT_BYTES``, each signed by its
own root threshold; the nearest ones are kept (they are applied first) and the rest refused with the
reason. A refused later version comes again when the agent next subscribes (a reconnect or a restart).
A root signed without the thresholds, malformed, or a different document under a version this
device already passed (a rollback or a forgery) is refused with the reason, and the trusted root
stays. Commands are verified with the trusted root's ``commands`` role from the moment it is stored.

Freshness: the newest timestamp metadata the server published (``edgesdk/trust/timestamp``,
signed by the root's ``timestamp`` role) is kept in ``trust/timestamp.json``; an older version is
ignored, so a replayed one cannot make an expired view look fresh. A new root that rotates the
``timestamp`` role's keys drops the held timestamp (TUF 5.3.11), so one pushed to a huge version
with a stolen key stops shadowing the honest ones signed after the rotation.
A device whose newest timestamp has expired, or that has none, is **stale**: it says so in its
state and its log, and keeps running its model. A device whose root expired says so too
(``root_expired``, ``accepts_deploys: false``, a log line) and refuses new deploys
(:mod:`edgesdk.agent.admission`) until the next root version arrives.

**Time without a clock.** A board without a real-time clock boots in 1970 (or at its last shutdown)
until NTP sets it, and by that clock every old command looks unexpired: a replay would be taken. So a
command's expiry is judged at :meth:`TrustKeeper.command_time`: the later of the device's clock and
the ``issued`` time of the newest signed timestamp it holds (kept across restarts). A clock that reads
before :data:`CLOCK_SET_AFTER` is not set: with no timestamp to tell the time by, commands are refused
(the server sends them again) until one arrives.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.errors import SignatureError, TrustError
from edgesdk.files import write_atomic
from edgesdk.fleet.records import iso_time
from edgesdk.fleet.trust import (
    MAX_PENDING_ROOT_BYTES,
    MAX_PENDING_ROOTS,
    MAX_ROOTS_AHEAD,
    Root,
    Timestamp,
    TrustStore,
    parse_root,
    parse_timestamp,
    role_changed,
    trust_root,
)
from edgesdk.runtime.signing import KeySet

__all__ = ["TrustKeeper"]

log = logging.getLogger(__name__)

#: A device clock reading before this (2025-01-01 UTC, before this release was built) was never set.
CLOCK_SET_AFTER = 1735689600.0


class TrustKeeper:
    """The root of trust of one device's store."""

    def __init__(self, directory: Path, provision: str | os.PathLike[str] | None = None, label: str = "agent",
                 on_refused: Callable[[str], None] = lambda reason: None,
                 on_changed: Callable[[], None] = lambda: None) -> None:
        self.store = TrustStore(directory)
        self._label = label
        self._on_refused, self._on_changed = on_refused, on_changed  # the agent reports both
        if provision is not None and not self.store.path.exists():
            self.store.provision(Path(provision).read_bytes())
        self.root: Root = self.store.load()
        #: Root documents received but not applied yet (a later version came before an earlier one).
        self._pending: dict[int, bytes] = {}
        self._timestamp_path = self.store.directory / "timestamp.json"
        self.timestamp: Timestamp | None = self._stored_timestamp()
        self._reported_stale: bool | None = None
        self._reported_expired: bool | None = None

    @classmethod
    def open(cls, directory: Path, provision: str | os.PathLike[str] | None, label: str,
             on_refused: Callable[[str], None], on_changed: Callable[[], None]) -> TrustKeeper | None:
        """The keeper of a device that uses a root of trust (it was given one now, or its store holds one already),
        else None."""
        if provision is None and not (directory / "root.json").exists():
            return None
        return cls(directory, provision, label, on_refused, on_changed)

    def command_keys(self) -> KeySet:
        """The keys and threshold commands must be signed with."""
        return self.root.keyset("commands")

    def take(self, kind: str, document: bytes) -> str | None:
        """A ``root`` or ``timestamp`` document off the wire; the reason it was refused, or None."""
        return self.receive(document) if kind == "root" else self.receive_timestamp(document)

    def receive(self, document: bytes) -> str | None:
        """Take a root document off the wire; the reason it was refused (also given to ``on_refused``), or None
        (applied, then ``on_changed``; kept for later; or a copy of a version already held)."""
        before = self.root
        refusal = self._take(document)
        if self.root.version != before.version:
            log.info("%s: root of trust v%d -> v%d (expires %s)", self._label, before.version, self.root.version,
                     self.root.expires_iso)
            if role_changed(before, self.root, "timestamp"):
                self._drop_timestamp(before.version)
        if refusal is not None:
            log.warning("%s: %s", self._label, refusal)
            self._on_refused(refusal)
        if self.root.version != before.version:
            self._on_changed()
        return refusal

    def _drop_timestamp(self, before: int) -> None:
        """The timestamp role's keys changed: forget the timestamp signed under the old ones (TUF 5.3.11)."""
        if self.timestamp is not None:
            log.warning("%s: root v%d -> v%d rotated the timestamp keys: dropping timestamp v%d, the next one signed "
                        "by the new keys is taken whatever its version", self._label, before, self.root.version,
                        self.timestamp.version)
        self._timestamp_path.unlink(missing_ok=True)
        self.timestamp = None

    def _take(self, document: bytes) -> str | None:
        try:
            root, _ = parse_root(document)
        except TrustError as exc:
            return str(exc)
        if root.version <= self.root.version:
            if self._held(root.version) == document:
                return None  # the retained copy of a version this device went through
            return (f"root metadata v{root.version} differs from the v{root.version} this device went through and is "
                    f"not newer than its v{self.root.version}: a rollback or forgery of the root of trust is refused")
        if root.version > self.root.version + 1:
            try:
                self._make_room(root, document)
            except SignatureError as exc:  # TrustError included
                return str(exc)
        self._pending[root.version] = document
        run, version = [], self.root.version + 1
        while version in self._pending:  # the versions that follow the trusted one without a gap
            run.append(self._pending[version])
            version += 1
        if not run:
            return None  # an earlier version is still on its way
        try:
            self.root = self.store.update(run)
        except SignatureError as exc:  # TrustError included; the steps before the refused one are kept
            self.root = self.store.load()
            self._pending.pop(self.root.version + 1, None)  # the refused step; the ones after it wait for a good one
            self._pending = {v: d for v, d in self._pending.items() if v > self.root.version}
            return str(exc)
        self._pending = {v: d for v, d in self._pending.items() if v > self.root.version}
        return None

    def _make_room(self, root: Root, document: bytes) -> None:
        """Make room for a version that waits for earlier ones, dropping the farthest waiting version when a nearer
        one comes; TrustError (SignatureError when it lacks its own root threshold) when it is not held."""
        held, ahead = self.root.version, root.version - self.root.version
        if ahead > MAX_ROOTS_AHEAD:
            raise TrustError(f"root metadata v{root.version} is {ahead} versions ahead of the v{held} this device holds "
                             f"(at most {MAX_ROOTS_AHEAD} may wait for the versions between): refused; publish every "
                             "version between, it comes again when the device next subscribes")
        if len(document) > MAX_PENDING_ROOT_BYTES:
            raise TrustError(f"root metadata v{root.version} of {len(document)} bytes is over the "
                             f"{MAX_PENDING_ROOT_BYTES}-byte limit for a version waiting for earlier ones: refused; "
                             f"publish v{held + 1} first")
        trust_root(document)  # its own root threshold signed it: junk is not held
        if root.version not in self._pending and len(self._pending) >= MAX_PENDING_ROOTS:
            farthest = max(self._pending)
            if root.version > farthest:
                raise TrustError(f"root metadata v{root.version}: {len(self._pending)} later versions (the most a "
                                 f"device holds) already wait for v{held + 1}: refused; it comes again when the "
                                 "device next subscribes")
            del self._pending[farthest]

    def receive_timestamp(self, document: bytes) -> str | None:
        """Take timestamp metadata off the wire; the reason it was refused (also to ``on_refused``), or None."""
        try:
            timestamp = parse_timestamp(document, self.root)
        except SignatureError as exc:  # TrustError included
            refusal: str | None = str(exc)
        else:
            refusal = None
            # An older one (a replay, or a replica whose clock is behind) is ignored: the device keeps its newest,
            # and goes stale when that expires, whatever is replayed to it.
            if self.timestamp is None or timestamp.version > self.timestamp.version:
                write_atomic(self._timestamp_path, document)
                self.timestamp = timestamp
        if refusal is not None:
            log.warning("%s: %s", self._label, refusal)
            self._on_refused(refusal)
        self.check_freshness()
        return refusal

    def command_time(self, clock: float) -> float:
        """The time a command's expiry is judged at (module doc, "Time without a clock"): the later of ``clock`` (the
        device's) and the newest timestamp's ``issued``. TrustError when the clock is not set and no timestamp
        tells the time."""
        told = self.timestamp.issued if self.timestamp is not None else None
        if told is None and clock < CLOCK_SET_AFTER:
            raise TrustError(f"{self._label}: this device's clock reads {iso_time(clock)}, before {iso_time(CLOCK_SET_AFTER)}:"
                             " it is not set, and no signed timestamp has told the time yet, so no command's expiry "
                             "can be checked; commands are refused until a timestamp arrives (is the server "
                             "publishing them with --timestamp-key?) or the clock is set (NTP)")
        return clock if told is None else max(clock, told)

    def stale(self, now: float | None = None) -> bool:
        """No timestamp, or the newest one expired: nobody vouches that this device's view is current."""
        return self.timestamp is None or self.timestamp.expired(now)

    def check_freshness(self, now: float | None = None) -> None:
        """Log and report (``on_changed``) when the device becomes stale or fresh again, or its root expires."""
        expired = self.root.expired(now)
        if expired != self._reported_expired:
            if expired:
                log.warning("%s: root metadata v%d expired at %s: the model keeps running, new deploys are refused "
                            "until the fleet publishes the next root version", self._label, self.root.version,
                            self.root.expires_iso)
            self._reported_expired = expired
            if expired:
                self._on_changed()
        stale = self.stale(now)
        if stale == self._reported_stale:
            return
        if stale:
            since = f"its newest timestamp expired at {self.timestamp.expires_iso}" if self.timestamp else \
                "it has received no timestamp"
            log.warning("%s: stale: %s; is the server publishing, or are updates being withheld?", self._label, since)
        elif self._reported_stale is not None:
            log.info("%s: fresh again (timestamp v%d)", self._label, self.timestamp.version if self.timestamp else 0)
        self._reported_stale = stale
        self._on_changed()

    def _stored_timestamp(self) -> Timestamp | None:
        try:
            return parse_timestamp(self._timestamp_path.read_bytes(), self.root)
        except (OSError, SignatureError):  # none yet, or signed by a timestamp key the root no longer names
            return None

    def _held(self, version: int) -> bytes | None:
        path = self.store.path if version == self.root.version else self.store.directory / f"root.{version}.json"
        return path.read_bytes() if path.exists() else None

    def state(self) -> dict[str, Any]:
        """What the device reports of its trust: the root version and expiry, whether it is stale, its newest
        timestamp."""
        timestamp = self.timestamp
        expired = self.root.expired()
        return {"root_version": self.root.version, "root_expires": self.root.expires_iso,
                "root_expired": expired, "accepts_deploys": not expired, "stale": self.stale(),
                "timestamp_version": timestamp.version if timestamp else None,
                "timestamp_expires": timestamp.expires_iso if timestamp else None}
