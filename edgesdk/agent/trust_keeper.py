"""The device's root of trust, kept up to date: provisioned once, moved forward by the roots the fleet publishes.

The agent is provisioned with the fleet's ``root.json`` (``AgentConfig.root``); from then on its
store's ``trust/`` holds the newest root it has verified (:class:`~edgesdk.fleet.trust.TrustStore`).
Root versions arrive retained on ``edgesdk/trust/root/<N>`` in any order: each is kept until the
versions before it have come, then the chain is applied (:func:`~edgesdk.fleet.trust.update_chain`).
A root signed without the thresholds, malformed, or a different document under a version this
device already passed (a rollback or a forgery) is refused with the reason, and the trusted root
stays. Commands are verified with the trusted root's ``commands`` role from the moment it is stored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.errors import SignatureError, TrustError
from edgesdk.fleet.trust import Root, TrustStore, parse_root
from edgesdk.runtime.signing import KeySet

__all__ = ["TrustKeeper"]

log = logging.getLogger(__name__)


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

    def receive(self, document: bytes) -> str | None:
        """Take a root document off the wire; the reason it was refused (also given to ``on_refused``), or None
        (applied, then ``on_changed``; kept for later; or a copy of a version already held)."""
        before = self.root.version
        refusal = self._take(document)
        if refusal is not None:
            log.warning("%s: %s", self._label, refusal)
            self._on_refused(refusal)
        elif self.root.version != before:
            log.info("%s: root of trust v%d -> v%d (expires %s)", self._label, before, self.root.version,
                     self.root.expires_iso)
            self._on_changed()
        return refusal

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

    def _held(self, version: int) -> bytes | None:
        path = self.store.path if version == self.root.version else self.store.directory / f"root.{version}.json"
        return path.read_bytes() if path.exists() else None

    def state(self) -> dict[str, Any]:
        """What the device reports of its trust: the root version, its expiry and whether it passed."""
        return {"root_version": self.root.version, "root_expires": self.root.expires_iso,
                "root_expired": self.root.expired()}
