"""The device's model store: verified bundle slots, an atomic ``current`` pointer, and state.

Layout::

    store/slots/<name>-<version>/   verified bundle directories (never modified once named)
    store/current, store/previous   symlinks into slots/, replaced atomically (os.replace)
    store/state.json                {"committed", "pending", "seen", "installed"}, written tmp + fsync + rename
    store/incoming/<transfer>.*     a transfer in progress (see edgesdk.agent.transfer)
    store/scratch/<measurement>/    a candidate model being measured (never a slot; removed afterwards)
    store/offload/<slot>.json       the cloud endpoint the server named for that version (offload), if any
    store/layouts/<slot>.json       where that version's chunks sit in its slot (chunk reuse), if recorded
    store/apps/<app>-<pid>.json     what each app process served, per version (app_stats)
    store/apps/cadence.json         how often apps write while the device is judged (the agent's)

Retention (:meth:`ModelStore.prune`): slots are removed oldest first by install order
(``installed`` in ``state.json``), never the one ``current``, ``previous``, ``committed`` or
a pending install names, nor a pinned version. A slot is removed by renaming it to a hidden
name under ``slots/`` (gone at once; a crash leaves a hidden leftover that the next start
removes) and then deleting it with its sidecar files (:data:`SLOT_SIDECARS`).

Slots, pointers and ``state.json`` are readable by every user and writable only by the
agent's, so an app in another process (and as another user) can follow the committed model
(:mod:`edgesdk.agent.follow`); ``incoming/`` stays private to the agent. ``apps/`` is sticky and
writable by all (mode 1777, made by the agent: :mod:`edgesdk.agent.app_traffic`), so an app of any
user hands its traffic to the agent in a file of its own that no other user can touch.

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
from typing import TYPE_CHECKING, Any

from edgesdk.errors import BundleError, StorageError
from edgesdk.files import atomic_dir, fsync_dir, write_atomic
from edgesdk.fleet.archive import unpack_bundle
from edgesdk.runtime.bundle import Bundle, Manifest, read_bundle

if TYPE_CHECKING:
    from edgesdk.fleet.protocol import ArchiveInfo

__all__ = ["ModelStore", "StoreState", "PendingInstall", "committed_slot", "offload_endpoint", "SLOT_SIDECARS",
           "space_needed"]

#: How many handled deployment ids the state file keeps for refusing replays.
_SEEN_KEPT = 200

#: Directories under the store root that hold one ``<slot>.json`` per slot; pruning a slot deletes its files there.
SLOT_SIDECARS: tuple[str, ...] = ("offload", "layouts")


def space_needed(archive: ArchiveInfo) -> int:
    """Bytes of disk an update with this archive takes while it installs: the archive as it arrives plus the
    slot it is unpacked into.

    A bound, not a guess: a slot holds only the files the archive's signed manifest lists, each written at its
    signed size, and those sizes add up to less than the archive (:func:`edgesdk.fleet.archive.unpack_signed`
    refuses sparse members, and any member larger than its signed size, before writing).
    """
    return 2 * archive.size


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
    #: The command's ``judge_s``: once committed, the device is judged on its traffic that long
    #: (:mod:`edgesdk.agent.report_cadence`), also when the commit follows a restart.
    judge_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingInstall:
        """Read the record as :meth:`to_json` (and the agent before it had this class) wrote it."""
        judge_s = data.get("judge_s")
        return cls(slot=str(data["slot"]), previous=data.get("previous"), deployment_id=data.get("deployment_id"),
                   name=data.get("name"), version=data.get("version"),
                   judge_s=float(judge_s) if isinstance(judge_s, (int, float)) else None)

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
    #: Slot names in the order they were added, oldest first (pruning removes from the front).
    installed: list[str] = field(default_factory=list)


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


#: The group the server moved the device to (:meth:`ModelStore.assign_group`).
GROUP_FILE = "group.json"


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
                          list(data.get("seen", [])), list(data.get("installed", [])))

    def save_state(self, state: StoreState) -> None:
        """Replace ``state.json`` durably (tmp + fsync + rename), keeping the newest handled deployments."""
        _write_json_atomic(self._state_path, {"committed": state.committed,
                                              "pending": state.pending.to_json() if state.pending else None,
                                              "seen": state.seen[-_SEEN_KEPT:], "installed": state.installed})

    def save_offload_endpoint(self, slot: str, endpoint: Mapping[str, str] | None) -> None:
        """Record (or, with None, forget) the offload endpoint the server named for ``slot``."""
        path = self.root / "offload" / f"{slot}.json"
        if endpoint is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(exist_ok=True)
        _write_json_atomic(path, dict(endpoint))

    def assigned_group(self) -> str | None:
        """The group the server moved this device to, as a command bound to it said (None: never moved)."""
        path = self.root / GROUP_FILE
        try:
            group = json.loads(path.read_text()).get("group")
        except FileNotFoundError:
            return None
        except (ValueError, AttributeError):  # written atomically by the agent alone: a damaged file names none
            return None
        return group if isinstance(group, str) else None

    def assign_group(self, group: str) -> None:
        """Record the group a command bound to this device moved it to (kept across restarts)."""
        _write_json_atomic(self.root / GROUP_FILE, {"group": group})

    def remember(self, deployment_id: str) -> None:
        """Record a deployment as handled: the replay guard (:mod:`edgesdk.agent.admission`) refuses it again."""
        state = self.load_state()
        if deployment_id not in state.seen:
            state.seen.append(deployment_id)
            self.save_state(state)

    def current_model(self) -> tuple[str, str] | None:
        """The name and version of the model ``current`` points at, or None before the first install."""
        slot = self.pointer("current")
        if slot is None:
            return None
        manifest = read_bundle(self.slots / slot).manifest
        return manifest.name, manifest.version

    # slots -------------------------------------------------------------------------------
    @staticmethod
    def slot_name(name: str, version: str) -> str:
        """The slot directory name of a model version, e.g. ``digits-1.2.0``."""
        return f"{name}-{version}"

    def holds_transfer(self, transfer_id: str) -> bool:
        """Whether an unfinished transfer's command is kept in ``incoming``: one this device began and will take up
        again, even under a newer signing of it (the kept one may have expired while the device slept)."""
        return (self.incoming / f"{transfer_id}.cmd").is_file()

    def has_slot(self, slot: str) -> bool:
        """Whether ``slots/<slot>`` exists as a named (hence complete and once verified) bundle."""
        return (self.slots / slot / "manifest.json").is_file()

    def verify_slot(self, slot: str, public_key: Any = None) -> Bundle:
        """Read the slot's bundle, checking every file's hash and, when keys are given (a public key or a
        :class:`~edgesdk.runtime.signing.KeySet`), its signatures: then an unsigned bundle is refused too."""
        return read_bundle(self.slots / slot, public_key=public_key, require_signature=public_key is not None)

    def add_slot(self, slot: str, fill: Callable[[Path], object], public_key: Any = None) -> Path:
        """Create ``slots/<slot>`` atomically: ``fill(tmp_dir)`` writes it, it is verified (hashes, the signatures
        when keys are given as :meth:`verify_slot`, and that its manifest names this slot's model and version), then
        renamed; a refused one never appears."""
        def check(staging: Path) -> Manifest:
            fill(staging)
            return read_bundle(staging, public_key=public_key, require_signature=public_key is not None).manifest

        return self._new_slot(slot, check)

    def unpack_slot(self, slot: str, archive: Path, public_key: Any = None) -> Path:
        """Create ``slots/<slot>`` from a bundle archive: verify, then unpack (:func:`edgesdk.fleet.archive.unpack_bundle`).

        The manifest's signatures (when keys are given: a public key or a KeySet's threshold) are checked before a
        byte of the bundle is written, then only the files it lists, each at its signed size and hash; the slot is
        renamed into place only if its manifest names this slot's model and version.
        """
        return self._new_slot(slot, lambda staging: unpack_bundle(archive, staging, public_key))

    def _new_slot(self, slot: str, fill: Callable[[Path], Manifest]) -> Path:
        final = self.slots / slot
        if not final.exists():
            with atomic_dir(final) as staging:
                manifest = fill(staging)
                if self.slot_name(manifest.name, manifest.version) != slot:
                    # A validly signed bundle of another release under this one's name: mix-and-match.
                    raise BundleError(f"the archive for {slot} holds {manifest.name} {manifest.version}: a bundle of "
                                      "another release under this one's name is refused (mix-and-match)")
        self._record_installed(slot)  # also for a slot named before a crash could record it
        return final

    def _record_installed(self, slot: str) -> None:
        state = self.load_state()
        if slot not in state.installed:
            state.installed.append(slot)
            self.save_state(state)

    # retention ---------------------------------------------------------------------------
    def slot_names(self) -> list[str]:
        """Every named slot, oldest install first; slots no install record names (a store an older agent wrote)
        come first, ordered by their directories' modification times."""
        present = {p.name: p for p in self.slots.iterdir() if not p.name.startswith(".") and p.is_dir()}
        recorded = [s for s in self.load_state().installed if s in present]
        unrecorded = sorted(set(present) - set(recorded), key=lambda s: (present[s].stat().st_mtime, s))
        return unrecorded + recorded

    def protected_slots(self, pinned: tuple[str, ...] | list[str] = ()) -> set[str]:
        """Slots pruning never removes: those ``current``, ``previous``, ``committed`` and a pending install
        (its slot and the one it replaces) name, and every slot a pin matches (see :meth:`matches_pin`)."""
        state = self.load_state()
        named = {self.pointer("current"), self.pointer("previous"), state.committed}
        if state.pending is not None:
            named |= {state.pending.slot, state.pending.previous}
        named |= {slot for slot in self.slot_names() if any(self.matches_pin(slot, pin) for pin in pinned)}
        return {slot for slot in named if slot}

    def matches_pin(self, slot: str, pin: str) -> bool:
        """Whether ``pin`` names ``slot``: its full name (``digits-1.2.0``) or its version alone (``1.2.0``)."""
        if slot == pin:
            return True
        try:
            version = json.loads((self.slots / slot / "manifest.json").read_text()).get("version")
        except (OSError, ValueError, AttributeError):
            version = None
        return version == pin if isinstance(version, str) else slot.endswith(f"-{pin}")

    def prune(self, keep_newest: int = 3, pinned: tuple[str, ...] | list[str] = ()) -> list[str]:
        """Delete every slot but the protected ones (:meth:`protected_slots`) and the ``keep_newest`` newest by
        install order; return the deleted slot names, oldest first.

        Each slot goes atomically: it is renamed to a hidden name under ``slots/`` (so it is never seen
        half-deleted, and a crash leaves only a leftover the next start removes), then deleted with its
        sidecar files.
        """
        if not isinstance(keep_newest, int) or keep_newest < 0:
            raise StorageError(f"keep_newest={keep_newest!r} is not a count of slots; pass 0 or more (the slots in "
                               "use, pending or pinned are kept whatever it is)")
        order = self.slot_names()
        keep = self.protected_slots(pinned) | set(order[len(order) - keep_newest:] if keep_newest else ())
        doomed = [slot for slot in order if slot not in keep]
        for slot in doomed:
            self._delete_slot(slot)
        if doomed:
            state = self.load_state()
            state.installed = [s for s in state.installed if s not in doomed]
            self.save_state(state)
        return doomed

    def _delete_slot(self, slot: str) -> None:
        hidden = self.slots / f".pruned-{slot}"
        shutil.rmtree(hidden, ignore_errors=True)  # a leftover of an earlier crash under the same name
        os.replace(self.slots / slot, hidden)
        fsync_dir(self.slots)
        for sidecar in SLOT_SIDECARS:
            (self.root / sidecar / f"{slot}.json").unlink(missing_ok=True)
        shutil.rmtree(hidden, ignore_errors=True)

    def disk_usage(self) -> dict[str, int]:
        """``free_bytes`` on the store's file system (for this user) and ``store_bytes``, the bytes of the files
        under ``slots/`` and ``incoming/``."""
        store_bytes = 0
        for top in (self.slots, self.incoming):
            for folder, _, files in os.walk(top):
                for name in files:
                    try:
                        store_bytes += os.lstat(os.path.join(folder, name)).st_size
                    except FileNotFoundError:  # removed while walking (a transfer finishing, a prune)
                        pass
        return {"free_bytes": shutil.disk_usage(self.root).free, "store_bytes": store_bytes}

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
