"""Whether a verified deploy or rollback command may go ahead: the agent's replay and downgrade rules.

A signature says who sent a command, not that it is new. A deployment this device has handled
before is a replay: it is refused, unless its transfer is still running (the server re-sent it:
nothing to do) or it is the version this device committed (its first report may have been lost,
so ``committed`` is reported again). A version at or below the installed one of the same model
is a downgrade, refused unless the command is a signed rollback. The revert of an aborted rollout applies only
while the device runs the version it undoes: one that arrives after a later rollout moved the device on is
refused, or it would take the device back two steps. The refusals are remembered,
so the same deployment is never weighed twice. A rollback brings no archive, so it needs the version in
this device's store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesdk.agent.store import ModelStore, StoreState
from edgesdk.errors import ConflictError
from edgesdk.fleet.protocol import Command
from edgesdk.fleet.records import AgentEvent
from edgesdk.runtime.bundle import parse_version

__all__ = ["Admission", "admit", "not_newer", "check_still_newer"]


@dataclass(frozen=True)
class Admission:
    """The verdict on one command."""

    proceed: bool
    #: What to report when the command does not go ahead (None: nothing to report).
    event: AgentEvent | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    #: Record the deployment as handled.
    remember: bool = False


def not_newer(command: Command, current: tuple[str, str] | None) -> bool:
    """True when ``command`` would not move the ``current`` (name, version) forward: a deploy at or below it, or
    the revert of a version this device no longer runs. Checked when the command arrives, and again when its
    download ends: another deployment may have installed meanwhile."""
    if not current or current[0] != command.name:
        return False
    if command.reverts is not None:
        return current[1] != command.reverts
    return not command.rollback and parse_version(current[1]) >= command.version_tuple


def check_still_newer(command: Command, current: tuple[str, str] | None) -> None:
    """Raise ConflictError when a finished download would no longer move ``current`` forward: a newer deployment
    installed while it downloaded (a straggler of an aborted rollout, say). A rollback is let through, unless it
    reverts a version the device has left."""
    if not_newer(command, current):
        assert current is not None
        raise ConflictError(f"superseded: {command.name} {current[1]} was installed while {command.version} "
                            "downloaded; not installing an older version")


def admit(command: Command, state: StoreState, current: tuple[str, str] | None, current_slot: str | None,
          in_flight: bool, resume: bool, held: bool = False) -> Admission:
    """The verdict on ``command`` for a store in ``state`` whose ``current`` model (name, version) is in
    ``current_slot``; ``in_flight``: its transfer is running; ``resume``: a restarted agent takes it up again;
    ``held``: the store holds the command's version (a rollback needs it: it brings no archive)."""
    if command.deployment_id in state.seen and not resume:
        slot = ModelStore.slot_name(command.name, command.version)
        if in_flight:
            return Admission(False)
        if current_slot == slot and state.pending is None and state.committed == slot:
            return Admission(False, AgentEvent.COMMITTED, {"repeated": True})
        return Admission(False, AgentEvent.REJECTED,
                         {"reason": f"replayed command: deployment {command.deployment_id} was already handled"})
    if not_newer(command, current):
        assert current is not None
        if command.reverts is not None:
            return Admission(False, AgentEvent.REJECTED, {
                "reason": f"superseded: this revert undoes {command.name} {command.reverts}, and the device runs "
                          f"{current[1]} (a later rollout moved it on)"}, remember=True)
        return Admission(False, AgentEvent.REJECTED, {
            "reason": f"refused downgrade: {command.name} {command.version} <= installed {current[1]}; only a signed "
                      "rollback may go back"}, remember=True)
    if command.type == "rollback" and not held:
        slot = ModelStore.slot_name(command.name, command.version)
        return Admission(False, AgentEvent.FAILED, {"reason": f"rollback target {slot} is not in this device's store"},
                         remember=True)
    return Admission(True, remember=True)
