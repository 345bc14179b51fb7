"""The device's model store: verified bundle slots, an atomic ``current`` pointer, and state.

Layout::

    store/slots/<name>-<version>/   verified bundle directories (never modified once named)
    store/current, store/previous   symlinks into slots/, replaced atomically (os.replace)
    store/state.json                {"committed", "pending", "seen"}, written tmp + fsync + rename
    store/incoming/<transfer>.*     a transfer in progress (see edgesdk.agent.transfer)
    store/scratch/<measurement>/    a candidate model being measured (never a slot; removed afterwards)
    store/offload/<slot>.json       the cloud endpoint the server named for that version (offload), if any

Slots, pointers and ``state.json`` are readable by every user and writable only by the
agent's, so an app in another process (and as another user) can follow the committed model
(:mod:`edgesdk.agent.follow`); ``incoming/`` stays private to the agent.

Only a slot that was fully written, fsynced and verified is ever named under ``slots/``,
and ``current`` only ever points at such a slot, so after a crash at any step the device
has an old or a new model, never neither.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.bundle import Bundle, read_bundle
from edgesdk.errors import BundleError
from edgesdk.files import atomic_dir, fsync_dir, write_atomic

__all__ = ["ModelStore", "StoreState", "PendingInstall", "committed_slot", "offload_endpoint"]

#: How many handled deployment ids the state file keeps for refusing replays.
_SEEN_KEPT = 200


def _write_json_atomic(path: Path, data: Any) -> None:
    # Readable by all: an app running as another user follows the committed slot (edgesdk.agent.follow).
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode(), mode=0o644)


@dataclass(frozen=True)
class PendingInstall:
    """An install recorded before ``current`` is switched to it, until it is committed or pointed back.

    ``previous`` is the slot ``current`` named before (None on a first install); the
    deployment fields say which command the outcome is reported for, also after a restart.
    """

    slot: str
    previous: str | None
    deployment_id: str | None = None
    name: str | None = None
    version: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingInstall:
        """Read the record as :meth:`to_json` (and the agent before it had this class) wrote it."""
        return cls(slot=str(data["slot"]), previous=data.get("previous"), deployment_id=data.get("deployment_id"),
                   name=data.get("name"), version=data.get("version"))

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object for ``state.json``."""
        return asdict(self)


@dataclass
class StoreState:
    """What ``state.json`` holds: the committed slot, an install in flight, and the deployments handled."""

    #: Slot the device runs and has health-checked.
    committed: str | None = None
    #: An install recorded (and maybe switched to) that has not passed its health check yet.
    pending: PendingInstall | None = None
    #: Deployment ids already acted on (a replayed command is refused).
    seen: list[str] = field(default_factory=list)


STATE_FILE = "state.json"


def committed_slot(root: str | os.PathLike[str]) -> Path | None:
    """The slot directory the store at ``root`` has committed, read without changing anything; None before one.

    This is what an app in another process runs: a pending install (switched to but not yet
    health-checked) is never named here, and a rollback names the slot it went back to.
    """
    root = Path(root)
    try:
        committed = json.loads((root / STATE_FILE).read_text()).get("committed")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        raise BundleError(f"{root / STATE_FILE} cannot be read ({exc}); is {root} an edgesdk agent's store?") from exc
    return root / "slots" / committed if committed else None


def offload_endpoint(root: str | os.PathLike[str], slot: str) -> dict[str, str] | None:
    """The offload endpoint (``url``, ``model``, ``version``) the server named for ``slot``, or None."""
    try:
        data = json.loads((Path(root) / "offload" / f"{slot}.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BundleError(f"the offload endpoint of {slot} in {root} cannot be read ({exc})") from exc
    return {k: str(data[k]) for k in ("url", "model", "version")} if isinstance(data, dict) and "url" in data else None


class ModelStore:
    """Slots on disk plus the ``current``/``previous`` pointers and the agent's state file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.slots = self.root / "slots"
        self.incoming = self.root / "incoming"
        self.scratch = self.root / "scratch"
        for d in (self.slots, self.incoming, self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        self._state_path = self.root / STATE_FILE
        # Half-extracted slots and measurements a crash interrupted.
        for leftover in [*self.slots.glob(".*"), *self.scratch.iterdir()]:
            shutil.rmtree(leftover, ignore_errors=True)

    # state -------------------------------------------------------------------------------
    def load_state(self) -> StoreState:
        """The state as last saved; an empty state when none was saved yet."""
        if not self._state_path.exists():
            return StoreState()
        data = json.loads(self._state_path.read_text())
        pending = data.get("pending")
        return StoreState(data.get("committed"), PendingInstall.from_json(pending) if pending else None,
                          list(data.get("seen", [])))

    def save_state(self, state: StoreState) -> None:
        """Replace ``state.json`` durably (tmp + fsync + rename), keeping the newest handled deployments."""
        _write_json_atomic(self._state_path, {"committed": state.committed,
                                              "pending": state.pending.to_json() if state.pending else None,
                                              "seen": state.seen[-_SEEN_KEPT:]})

    def save_offload_endpoint(self, slot: str, endpoint: Mapping[str, str] | None) -> None:
        """Record (or, with None, forget) the offload endpoint the server named for ``slot``."""
        path = self.root / "offload" / f"{slot}.json"
        if endpoint is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(exist_ok=True)
        _write_json_atomic(path, dict(endpoint))

    # slots -------------------------------------------------------------------------------
    @staticmethod
    def slot_name(name: str, version: str) -> str:
        """The slot directory name of a model version, e.g. ``digits-1.2.0``."""
        return f"{name}-{version}"

    def has_slot(self, slot: str) -> bool:
        """Whether ``slots/<slot>`` exists as a named (hence complete and once verified) bundle."""
        return (self.slots / slot / "manifest.json").is_file()

    def verify_slot(self, slot: str, public_key: Any = None) -> Bundle:
        """Read the slot's bundle, checking every file's hash (and the signature when a key is given)."""
        return read_bundle(self.slots / slot, public_key=public_key)

    def add_slot(self, slot: str, fill: Callable[[Path], object]) -> Path:
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
        """The slot the ``current`` or ``previous`` pointer names, or None when it is not set."""
        link = self.root / which
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def set_pointer(self, which: str, slot: str | None) -> None:
        """Point ``which`` at a verified slot atomically and durably; None removes the pointer."""
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
        """The directory of the slot ``current`` names, or None before the first install."""
        slot = self.pointer("current")
        return self.slots / slot if slot else None
