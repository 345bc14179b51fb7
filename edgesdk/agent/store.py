"""The device's model store: verified bundle slots, an atomic ``current`` pointer, and state.

Layout::

    store/slots/<name>-<version>/   verified bundle directories (never modified once named)
    store/current, store/previous   symlinks into slots/, replaced atomically (os.replace)
    store/state.json                {"committed", "pending", "seen"}, written tmp + fsync + rename
    store/incoming/<transfer>.*     a transfer in progress (see edgesdk.agent.transfer)
    store/scratch/<measurement>/    a candidate model being measured (never a slot; removed afterwards)

Only a slot that was fully written, fsynced and verified is ever named under ``slots/``,
and ``current`` only ever points at such a slot, so after a crash at any step the device
has an old or a new model, never neither.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.bundle import Bundle, read_bundle
from edgesdk.errors import BundleError
from edgesdk.files import atomic_dir, fsync_dir, write_atomic

__all__ = ["ModelStore", "StoreState"]


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode(), mode=0o600)


@dataclass
class StoreState:
    #: Slot the device runs and has health-checked.
    committed: str | None = None
    #: An install that switched ``current`` but has not passed its health check yet.
    pending: dict[str, Any] | None = None
    #: Deployment ids already acted on (a replayed command is refused).
    seen: list[str] = field(default_factory=list)


class ModelStore:
    """Slots on disk plus the ``current``/``previous`` pointers and the agent's state file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.slots = self.root / "slots"
        self.incoming = self.root / "incoming"
        self.scratch = self.root / "scratch"
        for d in (self.slots, self.incoming, self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        self._state_path = self.root / "state.json"
        # Half-extracted slots and measurements a crash interrupted.
        for leftover in [*self.slots.glob(".*"), *self.scratch.iterdir()]:
            shutil.rmtree(leftover, ignore_errors=True)

    # state -------------------------------------------------------------------------------
    def load_state(self) -> StoreState:
        if not self._state_path.exists():
            return StoreState()
        data = json.loads(self._state_path.read_text())
        return StoreState(data.get("committed"), data.get("pending"), list(data.get("seen", [])))

    def save_state(self, state: StoreState) -> None:
        write_json_atomic(self._state_path, {"committed": state.committed, "pending": state.pending,
                                             "seen": state.seen[-200:]})

    # slots -------------------------------------------------------------------------------
    @staticmethod
    def slot_name(name: str, version: str) -> str:
        return f"{name}-{version}"

    def has_slot(self, slot: str) -> bool:
        return (self.slots / slot / "manifest.json").is_file()

    def verify_slot(self, slot: str, public_key: Any = None) -> Bundle:
        return read_bundle(self.slots / slot, public_key=public_key)

    def add_slot(self, slot: str, fill: Any) -> Path:
        """Create ``slots/<slot>`` atomically: ``fill(tmp_dir)`` writes it, it is verified, then renamed."""
        final = self.slots / slot
        if final.exists():
            return final
        with atomic_dir(final) as staging:
            fill(staging)
            read_bundle(staging)  # hashes of every file against the bundle manifest
        return final

    # pointers ----------------------------------------------------------------------------
    def pointer(self, which: str) -> str | None:
        link = self.root / which
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def set_pointer(self, which: str, slot: str | None) -> None:
        link = self.root / which
        if slot is None:
            link.unlink(missing_ok=True)
            return
        if not self.has_slot(slot):
            raise BundleError(f"cannot point {which} at {slot!r}: no such verified slot in {self.slots}")
        tmp = self.root / f".{which}.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(f"slots/{slot}", tmp)
        os.replace(tmp, link)
        fsync_dir(self.root)

    def current_path(self) -> Path | None:
        slot = self.pointer("current")
        return self.slots / slot if slot else None
