"""Whether a verified deploy or rollback command may go ahead: the agent's replay and downgrade rules.

A signature says who sent a command, not that it is new. A deployment this device has handled
before is a replay: it is refused, unless its transfer is still running (the server re-sent it:
nothing to do) or it is the version this device committed (its first report may have been lost,
so ``committed`` is reported again). A deploy of exactly the version the device runs is answered
``committed`` with ``already_installed`` (another deployment of it got there first, on admission or
while this one downloaded): nothing to do, and not a failure. A version below the installed one of the
same model is a downgrade, refused unless the command is a signed rollback. The revert of an aborted rollout applies only
while the device runs the version it undoes: one that arrives after a later rollout moved the device on is
refused, or it would take the device back two steps. The refusals are remembered,
so the same deployment is never weighed twice. A rollback brings no archive, so it needs the version in
this device's store.

**Rollback floor** (Uptane's defence against a compromised director: the commands key may pick which
signed release a device runs, but not one the ``bundles`` role has ruled out). A signature on a rollback
says the commands key wants it, not that the old release is still safe to run: a thief of that key could
send devices back to a release with a known flaw. So a release's manifest may carry ``rollback_floor``,
covered by the ``bundles`` role's signatures (``edgesdk sign BUNDLE --key K --rollback-floor 1.2.0``). Once
this device has committed that release, every command that would run a version of the model below the
floor (a rollback, a revert, a deploy with ``rollback``) is refused with a REJECTED event naming the floor
and the signed release that set it; the floor is kept per model in the store, never lowered, across
restarts (:mod:`edgesdk.agent.rollback_floor`), and checked again when a download ends.

**Expired root**: a device whose root metadata has expired cannot tell whether a role's keys were revoked
since (a new root may be withheld from it). It keeps running its model and takes no new deploy, each refused
with a REJECTED event naming the expiry and the fix (publish the next root version). Going back to a slot it
holds (a rollback or a revert, at or above the rollback floor) still proceeds: it installs nothing the
device did not verify before, the slot is checked again against the held root's ``bundles`` role, and it is
how an operator undoes a bad release while the next root is being signed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesdk.agent.rollback_floor import RollbackFloors
from edgesdk.agent.store import ModelStore, StoreState
from edgesdk.agent.trust_keeper import TrustKeeper
from edgesdk.errors import BundleError, ConflictError, EdgeSDKError
from edgesdk.fleet.protocol import Command
from edgesdk.fleet.records import AgentEvent
from edgesdk.runtime.bundle import parse_version

__all__ = ["Admission", "admit", "not_newer", "already_installed", "check_still_newer", "refused_download", "below_floor",
           "root_expired", "AlreadyInstalled"]


@dataclass(frozen=True)
class Admission:
    """The verdict on one command."""

    proceed: bool
    #: What to report when the command does not go ahead (None: nothing to report).
    event: AgentEvent | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    #: Record the deployment as handled.
    remember: bool = False


class AlreadyInstalled(ConflictError):
    """A finished download's version is the one the device runs: another deployment of it installed meanwhile."""


def already_installed(command: Command, current: tuple[str, str] | None) -> bool:
    """True when ``command`` is a plain deploy of exactly the version the device runs: there is nothing to do, and
    nothing failed (Mender's *already-installed*). Two deployments of one version reach a device when it catches up
    on its group's release while the operator pushes that version again."""
    return command.reverts is None and not command.rollback and current == (command.name, command.version)


def not_newer(command: Command, current: tuple[str, str] | None) -> bool:
    """True when ``command`` would not move the ``current`` (name, version) forward: a deploy at or below it, or
    the revert of a version this device no longer runs. Checked when the command arrives, and again when its
    download ends: another deployment may have installed meanwhile."""
    if not current or current[0] != command.name:
        return False
    if command.reverts is not None:
        return current[1] != command.reverts
    return not command.rollback and parse_version(current[1]) >= command.version_tuple


def check_still_newer(command: Command, current: tuple[str, str] | None, store: ModelStore | None = None) -> None:
    """Raise ConflictError when a finished download would no longer move ``current`` forward: a newer deployment
    installed while it downloaded (a straggler of an aborted rollout, say). A rollback is let through, unless it
    reverts a version the device has left, or (with the ``store``) a release committed meanwhile set a rollback
    floor above it."""
    if already_installed(command, current):
        raise AlreadyInstalled(f"{command.name} {command.version} was installed by another deployment while it downloaded")
    if not_newer(command, current):
        assert current is not None
        raise ConflictError(f"superseded: {command.name} {current[1]} was installed while {command.version} "
                            "downloaded; not installing an older version")
    if store is not None and (refusal := below_floor(command, store)) is not None:
        raise ConflictError(refusal)


def refused_download(exc: EdgeSDKError) -> tuple[AgentEvent, dict[str, Any]]:
    """The event, and its details, for a finished download that :func:`check_still_newer` or the unpack refused."""
    if isinstance(exc, AlreadyInstalled):
        return AgentEvent.COMMITTED, {"already_installed": True}
    return AgentEvent.FAILED, {"reason": f"bundle rejected: {exc}"}


def below_floor(command: Command, store: ModelStore) -> str | None:
    """Why ``command`` would run a version below its model's rollback floor in ``store``, or None."""
    try:
        floor = RollbackFloors(store).observe().get(command.name)
    except BundleError as exc:  # a damaged floors file: refuse rather than lift the floors
        return str(exc)
    if floor is None or not floor.refuses(command.version):
        return None
    return (f"below the rollback floor: {command.name} {command.version} is below {floor.version}, the floor set by "
            f"the signed release {command.name} {floor.set_by} this device installed; only a release at or above "
            f"{floor.version} may run (publish one signed by the bundles role)")


def root_expired(command: Command, trust: TrustKeeper | None, held: bool) -> str | None:
    """Why ``command`` is refused under an expired root, or None (no root, a fresh one, or going back to a held
    slot: see the module doc)."""
    if trust is None or not trust.root.expired():
        return None
    if held and (command.type == "rollback" or command.rollback or command.reverts is not None):
        return None
    return (f"root metadata v{trust.root.version} expired at {trust.root.expires_iso}: this device keeps its model "
            f"and takes no new deploy ({command.name} {command.version}) until the fleet publishes the next root "
            f"version (`edgesdk keys rotate`/`sign-root`, then `edgesdk keys publish`)")


def admit(command: Command, state: StoreState, current: tuple[str, str] | None, current_slot: str | None,
          in_flight: bool, resume: bool, held: bool = False, store: ModelStore | None = None,
          trust: TrustKeeper | None = None) -> Admission:
    """The verdict on ``command`` for a store in ``state`` whose ``current`` model (name, version) is in
    ``current_slot``; ``in_flight``: its transfer is running; ``resume``: a restarted agent takes it up again;
    ``held``: the store holds the command's version (a rollback needs it: it brings no archive); ``store``: the
    model store whose rollback floors apply; ``trust``: the root of trust, whose expiry stops new deploys."""
    if command.deployment_id in state.seen and not resume:
        slot = ModelStore.slot_name(command.name, command.version)
        if in_flight:
            return Admission(False)
        if current_slot == slot and state.pending is None and state.committed == slot:
            return Admission(False, AgentEvent.COMMITTED, {"repeated": True})
        return Admission(False, AgentEvent.REJECTED,
                         {"reason": f"replayed command: deployment {command.deployment_id} was already handled"})
    if already_installed(command, current):
        return Admission(False, AgentEvent.COMMITTED, {"already_installed": True}, remember=True)
    if not_newer(command, current):
        assert current is not None
        if command.reverts is not None:
            return Admission(False, AgentEvent.REJECTED, {
                "reason": f"superseded: this revert undoes {command.name} {command.reverts}, and the device runs "
                          f"{current[1]} (a later rollout moved it on)"}, remember=True)
        return Admission(False, AgentEvent.REJECTED, {
            "reason": f"refused downgrade: {command.name} {command.version} <= installed {current[1]}; only a signed "
                      "rollback may go back"}, remember=True)
    if (refusal := root_expired(command, trust, held)) is not None:  # not remembered: a new root lifts it
        return Admission(False, AgentEvent.REJECTED, {"reason": refusal})
    if store is not None and (refusal := below_floor(command, store)) is not None:
        return Admission(False, AgentEvent.REJECTED, {"reason": refusal}, remember=True)
    if command.type == "rollback" and not held:
        slot = ModelStore.slot_name(command.name, command.version)
        return Admission(False, AgentEvent.FAILED, {"reason": f"rollback target {slot} is not in this device's store"},
                         remember=True)
    return Admission(True, remember=True)
