"""``edgesdk`` with its host's clock set wrong, or with a bug planted on purpose, for the chaos run.

    python benchmarks/fleet/planted_server.py [--skew SECONDS] [--bug BUG] server ...   (the rest as for ``edgesdk``)

``--skew``: this process's wall clock (``time.time``) runs SECONDS ahead (or behind, when
negative), as on a host whose clock is wrong; its monotonic clock, which only measures
intervals, is left alone. (libfaketime would do this from outside, but it moves the monotonic
clock too, and then every timed wait in the process waits too long or not at all.)

Bugs, to show that the chaos run's checker catches them (or that the server's fencing makes them harmless):

- ``ignore-lease``: every replica drives every running rollout, whoever holds its lease. Stage
  moves and rollout ends are compare-and-set on the rollout's state and stage, so the second
  driver's moves are refused: the fence makes this harmless (the checker passes, and the replicas'
  logs count the refused moves).
- ``no-fence``: ``ignore-lease`` with the compare-and-set gone too (``FleetDB._fence`` adds no
  condition): two drivers move one stage, and the checker sees it sent twice.
- ``no-reconcile``: the reconciler does nothing: devices offline at a push, or provisioned later,
  never get the release.
- ``no-revert``: an aborted rollout leaves its committed devices on the aborted version.

Both lease bugs also make each driver stall :data:`STALL_S` between reading a rollout and moving
its stage (a GC pause, a slow database): two replicas ticking every 0.2 s then both decide on the
same move at nearly every stage, instead of once in a while.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

BUGS = ("ignore-lease", "no-fence", "no-reconcile", "no-revert")
#: How long a driver under a lease bug stalls before it moves a stage.
STALL_S = 0.3


def skew_clock(seconds: float) -> None:
    """Make this process's wall clock read ``seconds`` off."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]


def plant(bug: str) -> None:
    """Patch the server's code in this process with ``bug``."""
    from edgesdk.ota_server.rollouts.engine import RolloutEngine
    from edgesdk.ota_server.rollouts.reconciler import Reconciler
    from edgesdk.ota_server.rollouts.reverts import Reverts
    from edgesdk.ota_server.store.fleet_db import FleetDB

    if bug in ("ignore-lease", "no-fence"):
        real_hold, real_send = FleetDB.hold_lease, RolloutEngine._send_stage

        def hold_lease(self: FleetDB, rollout_id: str, holder: str, now: float, lease_s: float) -> bool:
            real_hold(self, rollout_id, holder, now, lease_s)
            return True

        def send_stage(self: RolloutEngine, r: Any, stage: int, fenced: bool = True) -> bool:
            time.sleep(STALL_S)
            return real_send(self, r, stage, fenced)

        FleetDB.hold_lease = hold_lease  # type: ignore[method-assign]
        RolloutEngine._send_stage = send_stage  # type: ignore[method-assign]
        if bug == "no-fence":
            FleetDB._fence = staticmethod(lambda stage, holder, lease_now: ("", ()))  # type: ignore[method-assign]
    elif bug == "no-reconcile":
        def run(self: Reconciler, r: Any, room: int, work: Any) -> int:
            return 0

        Reconciler.run = run  # type: ignore[method-assign]
    elif bug == "no-revert":
        def revert_committed(self: Reverts, r: Any, reason: str) -> None:
            return None

        Reverts.revert_committed = revert_committed  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/fleet/planted_server.py")
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
