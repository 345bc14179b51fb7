"""The group a device belongs to is the one an operator provisioned, never the one its report claims.

Groups are provisioned from the devices file that ``edgesdk server mosquitto-config`` reads
(``edgesdk devices provision --file``) or one by one through the admin API. A device that
reports another group is refused and logged; moving a device is an admin action, which puts the
device in the reconciler's queue for its new group's release and skips its targets of other groups'
rollouts. Until a command of the new group tells its agent (which then reports the new group), a
moved device's reports naming its old group are recorded under the new one (the claim is never
followed); any other group is refused. A device nobody provisioned is
refused when the server requires provisioning (``--require-provisioning``); otherwise its first
report fixes its group (trust on first use), and from then on the same rule holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

__all__ = ["GroupGuard"]

log = logging.getLogger("edgesdk.ota_server.server")

#: A refused device is logged at most once per this many seconds (it reports every state interval).
_LOG_EVERY_S = 60.0


class GroupGuard:
    """Filters device states by their provisioned group (called by the ingest writer, inside its transaction)."""

    def __init__(self, db: FleetDB, require_provisioning: bool = False,
                 on_refused: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.db, self.require_provisioning = db, require_provisioning
        self._on_refused, self._clock = on_refused, clock
        self._logged: dict[str, float] = {}
        #: States refused so far, for tests and benchmarks.
        self.refused = 0

    def admit(self, states: Sequence[DeviceState]) -> list[DeviceState]:
        """The states whose group is the device's provisioned one; a device seen for the first time is provisioned
        in the group it names, unless provisioning is required (then it is refused)."""
        if not states:
            return []
        moves = self.db.moves(s.device_id for s in states)
        first: dict[str, str] = {}
        kept = []
        for s in states:
            group, moved_from = moves.get(s.device_id, (None, None))
            group = group or first.get(s.device_id)
            if group is not None and s.group == moved_from and moved_from != group:
                # Moved by the operator, its agent not told yet (or its will, set before it was told): recorded
                # under the group it is in now. The claim is never followed, so it cannot move itself anywhere.
                self._moved(s, group)
                s = replace(s, group=group)
            if group is None and not self.require_provisioning:
                first[s.device_id] = group = s.group
            if group is None:
                self._refuse(s, "unprovisioned", f"device {s.device_id} is not provisioned; add it with `edgesdk "
                                                 f"devices provision {s.device_id} GROUP` (its report names group "
                                                 f"{s.group!r})")
            elif group != s.group:
                self._refuse(s, "wrong_group", f"device {s.device_id} reports group {s.group!r} but is provisioned in "
                                               f"{group!r}; its report is refused. Restart its agent with --group "
                                               f"{group}, or move it with `edgesdk devices provision {s.device_id} "
                                               f"{s.group}`")
            else:
                kept.append(s)
        if first:
            self.db.provision(first, "first report")
            log.info("provisioned %d devices in the group their first report named (e.g. %s in %s)", len(first),
                     *next(iter(first.items())))
        return kept

    def _moved(self, state: DeviceState, group: str) -> None:
        now = self._clock()
        if len(self._logged) > 10_000:
            self._logged.clear()
        if now - self._logged.get(state.device_id, float("-inf")) >= _LOG_EVERY_S:
            self._logged[state.device_id] = now
            log.info("device %s was moved to %r and still reports %r: recorded in %r until a command of its new "
                     "group tells its agent", state.device_id, group, state.group, group)

    def _refuse(self, state: DeviceState, reason: str, message: str) -> None:
        self.refused += 1
        if self._on_refused is not None:
            self._on_refused(reason)
        now = self._clock()
        if len(self._logged) > 10_000:  # many refused ids: forget the oldest marks rather than grow
            self._logged.clear()
        if now - self._logged.get(state.device_id, float("-inf")) >= _LOG_EVERY_S:
            self._logged[state.device_id] = now
            log.warning("%s", message)
