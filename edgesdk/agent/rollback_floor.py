"""The rollback floor of each model on this device: the lowest version it may run, as signed releases set it.

A release's manifest may carry ``rollback_floor`` (:mod:`edgesdk.runtime.bundle`), covered by the
``bundles`` role's signatures: the commands key alone cannot forge or lower it. Once a release is
committed on this device (verified into a slot, installed, health-checked), its floor holds for
that model for good: ``store/rollback_floors.json`` keeps the highest floor per model with the
release that set it, written atomically and never lowered, so a restart keeps it and a later
release without a floor does not clear it. The agent reads the committed slot's manifest before
it weighs each command (:func:`edgesdk.agent.admission.admit`) and as it reports its state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.agent.store import ModelStore
from edgesdk.errors import BundleError
from edgesdk.files import write_atomic
from edgesdk.runtime.bundle import MANIFEST, Manifest, parse_version

__all__ = ["Floor", "RollbackFloors", "FLOORS_FILE"]

log = logging.getLogger(__name__)

FLOORS_FILE = "rollback_floors.json"


@dataclass(frozen=True)
class Floor:
    """A model's floor and the signed release that set it."""

    version: str
    #: The version of the release whose manifest carried the floor.
    set_by: str

    def refuses(self, version: str) -> bool:
        """Whether ``version`` is below the floor."""
        return parse_version(version) < parse_version(self.version)


class RollbackFloors:
    """The floors kept in a store's ``rollback_floors.json`` (``{model: {"floor", "set_by"}}``)."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.path = Path(store.root) / FLOORS_FILE
        self.floors: dict[str, Floor] = self._load()

    def _load(self) -> dict[str, Floor]:
        try:
            data = json.loads(self.path.read_bytes())
            return {str(model): Floor(str(f["floor"]), str(f["set_by"])) for model, f in data.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # Only the agent writes it, atomically; a damaged file must not lift every floor silently.
            raise BundleError(f"{self.path} is damaged ({exc}); restore it from a backup, or delete it to lift every "
                              "rollback floor until the next release that sets one") from exc

    def get(self, model: str) -> Floor | None:
        """The floor of ``model``, or None."""
        return self.floors.get(model)

    def observe(self) -> dict[str, Floor]:
        """Raise a floor from the committed slot's manifest (that slot was verified when it was created and again
        if it was installed from the store) and persist it; every floor, by model."""
        committed = self.store.load_state().committed
        if committed is None or not self.store.has_slot(committed):
            return self.floors
        try:
            manifest = Manifest.from_dict(json.loads((self.store.slots / committed / MANIFEST).read_bytes()))
        except (OSError, ValueError) as exc:  # BundleError included
            return self._unread(committed, exc)
        floor = manifest.rollback_floor
        held = self.floors.get(manifest.name)
        if floor is not None and (held is None or parse_version(floor) > parse_version(held.version)):
            self.floors[manifest.name] = Floor(floor, manifest.version)
            write_atomic(self.path, json.dumps(self._as_json(), indent=1, sort_keys=True).encode())
            log.info("rollback floor of %s raised to %s by release %s", manifest.name, floor, manifest.version)
        return self.floors

    def _unread(self, committed: str, exc: Exception) -> dict[str, Floor]:
        """The floors when the committed slot's manifest cannot be read: the floor that release carries is unknown,
        so its own version holds for its model (fail closed: nothing below what the device committed runs), in
        memory only, until the manifest can be read again."""
        name, _, version = committed.rpartition("-")
        log.warning("rollback floor: cannot read the manifest of %s (%s); nothing below %s runs until it can",
                    committed, exc, committed)
        try:
            parse_version(version)
        except BundleError:
            return self.floors
        held = self.floors.get(name)
        if held is not None and not held.refuses(version):
            return self.floors  # the held floor is as high already
        unknown = Floor(version, f"{version} (its manifest cannot be read, so the floor it carries is unknown and its "
                                 "own version holds)")
        return {**self.floors, name: unknown}

    def _as_json(self) -> dict[str, Any]:
        return {model: {"floor": f.version, "set_by": f.set_by} for model, f in sorted(self.floors.items())}

    def report(self) -> dict[str, Any]:
        """What the device's state says of its floors: ``{model: {"floor", "set_by"}}``."""
        return self._as_json()
