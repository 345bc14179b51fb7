"""``edgesdk`` with a bug planted on purpose, to show that the chaos run's checker catches it.

    python -m benchmarks._planted_server BUG server ...     (the rest as for ``edgesdk``)

Bugs:

- ``ignore-lease``: every replica drives every running rollout, whoever holds its lease.
- ``no-revert``: an aborted rollout leaves its committed devices on the aborted version.
"""

from __future__ import annotations

import sys
from typing import Any

BUGS = ("ignore-lease", "no-revert")


def plant(bug: str) -> None:
    """Patch the server's code in this process with ``bug``."""
    from edgesdk.ota_server.engine import RolloutEngine
    from edgesdk.ota_server.fleet import FleetDB

    if bug == "ignore-lease":
        real = FleetDB.hold_lease

        def hold_lease(self: FleetDB, rollout_id: str, holder: str, now: float, lease_s: float) -> bool:
            real(self, rollout_id, holder, now, lease_s)
            return True

        FleetDB.hold_lease = hold_lease  # type: ignore[method-assign]
    elif bug == "no-revert":
        def revert_committed(self: RolloutEngine, r: Any, reason: str) -> None:
            return None

        RolloutEngine._revert_committed = revert_committed  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown bug {bug!r}; one of {', '.join(BUGS)}")


def main() -> None:
    plant(sys.argv[1])
    from edgesdk.cli import main as edgesdk

    sys.argv = ["edgesdk", *sys.argv[2:]]
    edgesdk()


if __name__ == "__main__":
    main()
