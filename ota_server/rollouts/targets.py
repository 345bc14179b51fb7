"""Which devices of a group a rollout sends to, which board's artifact each gets, and the stages
they form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import DeviceRecord, RolloutPolicy
from edgesdk.ota_server.rollouts.stages import board_balanced_order, stage_sizes
from edgesdk.ota_server.store.release_history import majority_version
from edgesdk.runtime.boards import artifact_for
from edgesdk.runtime.bundle import parse_version

__all__ = ["needs_release", "boards_served", "RolloutPlan", "plan_rollout"]


@dataclass(frozen=True)
class RolloutPlan:
    """A rollout's targets by stage, as :meth:`FleetDB.add_rollout` takes them, and what its start
    reports."""

    #: Each stage's new devices: (device id, the version it runs now, the artifact it gets).
    stages: list[list[tuple[str, str | None, str | None]]]
    #: Cumulative devices per stage.
    sizes: list[int]
    #: Devices whose board the release has no artifact for: (device id, the version it runs), and
    #: their boards in words.
    unserved: list[tuple[str, str | None]]
    unserved_boards: str
    #: Planned devices offline now (deferred when their stage is sent), and of those, provisioned
    #: ones that never reported (their board, version and artifact come with their first report).
    offline: int
    provisioned: int
    #: The version most of the group runs of the model now (its release history starts with it).
    before: str | None


def plan_rollout(name: str, version: str, group: str, devices: list[DeviceRecord],
                 provisioned: Sequence[str], policy: RolloutPolicy, stored: Sequence[str] | None,
                 rollback: bool) -> RolloutPlan:
    """The stages of a rollout of ``name`` ``version`` to ``group``: its reported ``devices`` that
    need the version, online ones first so the canary runs on devices that can answer now; with no
    device reported, its ``provisioned`` ones (all offline: the first to report are canaried,
    :mod:`.reconciler`). ``stored``: the release's artifacts (None: one bundle for every device).
    Refusals as :func:`needs_release` and :func:`boards_served` say."""
    targets = needs_release(name, version, group, devices, rollback)
    artifact_of, unserved = boards_served(stored, name, version, group, targets)
    version_of = {d.id: d.version if d.model == name else None for d in targets}
    online = [d.id for d in targets if d.status == "online" and d.id in artifact_of]
    offline = [d.id for d in targets if d.status != "online" and d.id in artifact_of]
    if not devices:
        offline = list(provisioned)
        artifact_of = version_of = dict.fromkeys(offline)
    board_of = {d.id: d.profile for d in targets}  # the boards in turn: every board's share in every stage
    order = (board_balanced_order(group, {d: board_of.get(d) for d in online})
             + board_balanced_order(group, {d: board_of.get(d) for d in offline}))
    sizes = stage_sizes(len(order), policy)
    stages = [[(d, version_of[d], artifact_of[d]) for d in order[begin:end]]
              for begin, end in zip([0, *sizes], sizes)]
    before = majority_version([d.version for d in devices if d.model == name])
    boards = ", ".join(sorted({d.profile or "unknown" for d in unserved}))
    return RolloutPlan(stages, sizes, [(d.id, version_of[d.id]) for d in unserved], boards,
                       len(offline), 0 if devices else len(offline), before)


def needs_release(name: str, version: str, group: str, devices: list[DeviceRecord],
                  rollback: bool) -> list[DeviceRecord]:
    """The devices that need ``version``; refuses a version the group runs already, or a downgrade."""
    wanted = parse_version(version)
    targets = [d for d in devices if not (d.model == name and d.version == version)]
    if devices and not targets:  # a group of devices only provisioned has nothing to plan and nothing to refuse
        raise ConflictError(f"{name} {version} is already installed on all {len(devices)} devices of group "
                            f"{group!r}; nothing to send")
    newer = sorted({d.version for d in targets if d.model == name and d.version
                    and parse_version(d.version) > wanted}, key=parse_version)
    if newer and not rollback:
        raise ConflictError(f"group {group!r} runs {name} {newer[-1]}, newer than {version}: devices refuse a "
                            f"downgrade; use `edgesdk rollout rollback ID --to {version}`")
    return targets


def boards_served(stored: Sequence[str] | None, name: str, version: str, group: str, devices: list[DeviceRecord]
                  ) -> tuple[dict[str, str | None], list[DeviceRecord]]:
    """The artifact each device gets (by id), and the devices whose board the release has none for (they are
    reported and left on their version). ``stored``: the release's artifacts (None: one bundle for every device).
    A ConflictError when no device can take any artifact: nothing would be sent."""
    if stored is None:
        return dict.fromkeys((d.id for d in devices), None), []
    served = {d.id: artifact_for(stored, d.profile, d.arch) for d in devices}
    unserved = [d for d in devices if served[d.id] is None]
    if devices and len(unserved) == len(devices):
        boards = ", ".join(sorted({d.profile or "unknown" for d in devices}))
        raise ConflictError(f"{name} {version} has artifacts for {', '.join(stored) or 'no board'}, and no device "
                            f"of group {group!r} that needs it runs on one of those boards ({boards}); push a bundle "
                            "converted with --profile for their board (or a generic-<arch> one)")
    return {d: a for d, a in served.items() if a is not None}, unserved
