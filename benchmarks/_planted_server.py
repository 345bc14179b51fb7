"""``edgesdk`` with its host's clock set wrong, or with a bug planted on purpose, for the chaos run.

    python benchmarks/_planted_server.py [--skew SECONDS] [--bug BUG] server ...   (the rest as for ``edgesdk``)

``--skew``: this process's wall clock (``time.time``) runs SECONDS ahead (or behind, when
negative), as on a host whose clock is wrong; its monotonic clock, which only measures
intervals, is left alone. (libfaketime would do this from outside, but it moves the monotonic
clock too, and then every timed wait in the process waits too long or not at all.)

Bugs, to show that the chaos run's checker catches them:

- ``ignore-lease``: every replica drives every running rollout, whoever holds its lease.
- ``no-revert``: an aborted rollout leaves its committed devices on the aborted version.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

BUGS = ("ignore-lease", "no-revert")


def skew_clock(seconds: float) -> None:
    """Make this process's wall clock read ``seconds`` off."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]


def plant(bug: str) -> None:
    """Patch the server's code in this process with ``bug``."""
    from edgesdk.ota_server.rollouts.engine import RolloutEngine
    from edgesdk.ota_server.store.fleet_db import FleetDB

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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/_planted_server.py")
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--bug", choices=BUGS, default=None)
    args, rest = parser.parse_known_args()
    if args.skew:
        skew_clock(args.skew)
    if args.bug:
        plant(args.bug)
    from edgesdk.cli import main as edgesdk

    sys.argv = ["edgesdk", *rest]
    edgesdk()


if __name__ == "__main__":
    main()
