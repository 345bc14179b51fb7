"""Which devices of a group a rollout sends to, and which board's artifact each gets."""

from __future__ import annotations

from collections.abc import Sequence

from edgesdk.errors import ConflictError
from edgesdk.fleet.records import DeviceRecord
from edgesdk.runtime.boards import artifact_for
from edgesdk.runtime.bundle import parse_version

__all__ = ["needs_release", "boards_served"]


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
