"""The agent's storage guard: whether an incoming archive fits on the device's disk, pruning old slots to make room.

An update needs room for its archive and its unpacked slot (:func:`~edgesdk.agent.store.space_needed`) on top
of the bytes the device keeps free for everything else (``min_free_bytes``). When that room is missing, the
guard prunes every slot that is not in use or pinned and looks again; when it is still missing, the answer
carries a :class:`~edgesdk.errors.StorageError` with the figures and the fix, and the partial files of a
resumed transfer are deleted. It never publishes: the agent reports what the guard decided.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edgesdk.agent.store import ModelStore, space_needed
from edgesdk.errors import StorageError
from edgesdk.fleet.protocol import ArchiveInfo

__all__ = ["Room", "StorageGuard"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Room:
    """The guard's answer for one archive."""

    fits: bool
    #: Slots deleted to make room (the device's reported slot list changed).
    pruned: tuple[str, ...] = ()
    needed_bytes: int = 0
    free_bytes: int = 0
    reserved_bytes: int = 0
    #: Why it does not fit, with the figures and the fix; None when it fits.
    error: StorageError | None = field(default=None, compare=False)

    def report(self) -> dict[str, object]:
        """What a refusal event says: the reason, the error type and the figures."""
        return {"reason": str(self.error), "error_type": type(self.error).__name__, "needed_bytes": self.needed_bytes,
                "free_bytes": self.free_bytes, "reserved_bytes": self.reserved_bytes}


class StorageGuard:
    """Keeps a :class:`ModelStore` within its disk: prunes old slots and refuses what cannot fit."""

    def __init__(self, store: ModelStore, min_free_bytes: int = 0, pinned: tuple[str, ...] = (),
                 label: str = "agent") -> None:
        self.store = store
        self.min_free_bytes = min_free_bytes
        self.pinned = pinned
        self._label = label  # who the log lines are about (the device id)

    def prune(self, keep_newest: int) -> tuple[str, ...]:
        """Delete slots beyond the ``keep_newest`` newest (the store keeps those in use, pending or pinned).

        A slot that cannot be deleted now is logged and left: pruning must never stop the agent reporting.
        """
        try:
            removed = self.store.prune(keep_newest, self.pinned)
        except OSError as exc:
            log.warning("%s: pruning old slots failed: %s", self._label, exc)
            return ()
        if removed:
            log.info("%s: pruned %d old slot%s: %s", self._label, len(removed), "" if len(removed) == 1 else "s",
                     ", ".join(removed))
        return tuple(removed)

    def room(self) -> int:
        """Bytes an update may still use: the disk's free bytes less the reserve."""
        return self.store.disk_usage()["free_bytes"] - self.min_free_bytes

    def make_room(self, archive: ArchiveInfo | None, what: str, transfer_id: str) -> Room:
        """Whether ``archive`` (of the update or measurement called ``what``) fits, pruning down to the protected
        slots if that makes room. When it cannot fit, the partial files of ``transfer_id`` are deleted."""
        if archive is None:
            return Room(fits=True)
        needed = space_needed(archive)
        if self.room() >= needed:
            return Room(fits=True, needed_bytes=needed)
        pruned = self.prune(0)
        if self.room() >= needed:
            return Room(fits=True, pruned=pruned, needed_bytes=needed)
        free, reserve = self.store.disk_usage()["free_bytes"], self.min_free_bytes
        error = StorageError(
            f"no room for {what}: it needs {needed} bytes (archive and unpacked slot), the store's disk has {free} "
            f"bytes free and {reserve} of them are reserved (min_free_bytes), after pruning every slot not in use or "
            "pinned; free space on the device or lower min_free_bytes")
        for leftover in self.store.incoming.glob(f"{transfer_id}.*"):  # a resumed transfer's partial files
            leftover.unlink(missing_ok=True)
        return Room(False, pruned, needed, free, reserve, error)
