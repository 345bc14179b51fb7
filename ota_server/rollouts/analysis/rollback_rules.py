"""Which version a group may be rolled back to, and how: one set of rules for API, CLI and console.

A rollback names a rollout (``edgesdk rollout rollback ID``; with ``--group G``, the group's
running rollout, else the one that set its release) and undoes it:

- **what it undoes**: a running rollout (aborted first), the group's release, or an aborted
  rollout some of whose devices are still on its version (a commit reported after the abort, a
  revert that failed). A completed rollout the group has moved on from, and an aborted one whose
  devices all went back, leave nothing to undo: the message says to roll the group back instead;
- **where it goes**: only to a version the group ran (its release history: every release a
  completed rollout set, and the version most of the group ran before its first), older than the
  version it undoes; without ``--to``, the most recent of those. Never to the version the group
  runs now, nor forward (a newer version is a push), nor to a version the repository no longer
  holds;
- **how**: staged with the policy of the rollout it undoes, canary analysis included;
  ``all_at_once`` (an emergency) sends it to every device in one stage with analysis off
  (:func:`all_at_once_policy`), still only to a version the group ran.

Each refusal is a :class:`~edgesdk.errors.ConflictError` whose message names the version and the
versions the group may go to. Pure functions over plain data: the engine (the API and the CLI go
through it) and the console's ``rollback_refusal`` read the store and call
:func:`plan_rollback`, so both refuse with the same words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from edgesdk.errors import BundleError, ConflictError
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetStatus
from edgesdk.runtime.bundle import parse_version

__all__ = ["GroupHistory", "RollbackPlan", "plan_rollback", "rollback_refusal",
           "all_at_once_policy", "may_go_to"]


@dataclass(frozen=True)
class GroupHistory:
    """What the rules read of a group: the versions of one model it ran, and its release now."""

    group: str
    model: str
    #: The versions of ``model`` the group ran, oldest first (a version run twice is listed twice).
    ran: tuple[str, ...] = ()
    #: The rollout that set the group's release, and that release (None: nothing completed yet).
    release_rollout: str | None = None
    release_version: str | None = None


@dataclass(frozen=True)
class RollbackPlan:
    """An allowed rollback: the version it sends, the policy it is staged with, and the version it
    undoes."""

    version: str
    policy: RolloutPolicy
    all_at_once: bool
    undoes: str


def all_at_once_policy(policy: RolloutPolicy) -> RolloutPolicy:
    """``policy`` as an emergency rollback takes it: every device in one stage, no health window,
    no analysis (its deploy timeout and failure rates are kept)."""
    return replace(policy, canary=1.0, waves=(1.0,), health_window_s=0.0, analysis=False)


def _older(version: str, than: str) -> bool:
    try:
        return parse_version(version) < parse_version(than)
    except BundleError:  # not a version (a typo, or a row not written here): never a choice
        return False


def may_go_to(history: GroupHistory, current: str | None,
              stored: Callable[[str], bool] | None = None) -> list[str]:
    """The versions a rollback undoing ``current`` may go to: those the group ran, older than
    ``current`` and still in the repository (``stored``; None: not asked), the most recent first."""
    if current is None:
        return []
    found = [v for v in dict.fromkeys(reversed(history.ran)) if _older(v, current)]
    return [v for v in found if stored is None or stored(v)]


def _choices(history: GroupHistory, versions: Sequence[str], current: str | None) -> str:
    if versions:
        return f"it may go to {history.model} {', '.join(versions)}"
    if current is None:
        return f"it has no release of {history.model} to go back from"
    return (f"it ran no version of {history.model} older than {current} that the repository "
            "holds, so there is nothing to go back to")


def _undoes(r: RolloutRecord, history: GroupHistory, stored: Callable[[str], bool] | None) -> str:
    """The version rolling ``r`` back undoes; a ConflictError when it would undo nothing of it."""
    if r.state == RolloutState.RUNNING:
        return r.version
    group, release = history.group, history.release_version
    instead = (f"to roll group {group!r} back, `edgesdk rollout rollback --group {group} --to "
               f"VERSION` ({_choices(history, may_go_to(history, release, stored), release)})")
    if r.state == RolloutState.COMPLETED:
        if history.release_rollout == r.id:
            return r.version
        raise ConflictError(f"rollout {r.id} ({r.model} {r.version}) is no longer group "
                            f"{group!r}'s release: the group moved on to {history.model} {release} "
                            f"(rollout {history.release_rollout}); roll that one back instead, or "
                            f"{instead}")
    if r.count(TargetStatus.COMMITTED, TargetStatus.REVERT_FAILED):
        return r.version
    raise ConflictError(f"rollout {r.id} ({r.model} {r.version}) was aborted and its updated "
                        f"devices were sent back to their previous version: nothing to undo; "
                        f"{instead}")


def plan_rollback(r: RolloutRecord, history: GroupHistory, to: str | None = None,
                  all_at_once: bool = False,
                  stored: Callable[[str], bool] | None = None) -> RollbackPlan:
    """Whether rolling ``r`` back (to version ``to``; None: the most recent version allowed) is
    allowed, and how (see the module doc); a ConflictError naming the version and the versions
    the group may go to when it is not. ``stored(version)``: whether the repository still holds
    it (None: not asked)."""
    current = _undoes(r, history, stored)
    choices = may_go_to(history, current, stored)
    where = _choices(history, choices, current)
    group, model = history.group, history.model
    if to is None:
        if not choices:
            raise ConflictError(f"no rollback of group {group!r} from {model} {current}: {where}")
        to = choices[0]
    elif to == current:
        raise ConflictError(f"{model} {to} is the version group {group!r} runs now (rollout "
                            f"{r.id}): a rollback goes to an older one; {where}")
    elif to not in history.ran:
        raise ConflictError(f"group {group!r} never ran {model} {to}: a rollback goes only to a "
                            f"version the group ran; {where}")
    elif not _older(to, current):
        raise ConflictError(f"{model} {to} is newer than {current}, the version group {group!r} "
                            f"runs now: a rollback never goes forward (push {to} with `edgesdk "
                            f"push` instead); {where}")
    elif stored is not None and not stored(to):
        raise ConflictError(f"{model} {to} is no longer in the repository (retention deleted it): "
                            f"upload it again to go back to it; {where}")
    policy = all_at_once_policy(r.policy) if all_at_once else r.policy
    return RollbackPlan(to, policy, all_at_once, current)


def rollback_refusal(r: RolloutRecord, history: GroupHistory, to: str | None = None,
                     stored: Callable[[str], bool] | None = None) -> str | None:
    """Why rolling ``r`` back (to ``to``) is refused, in the words :func:`plan_rollback` raises;
    None when it is allowed."""
    try:
        plan_rollback(r, history, to, stored=stored)
    except ConflictError as exc:
        return str(exc)
    return None
