"""Orphaned late targets (issue 60): a push supersedes a release whose late targets are still in
flight; are they closed once the deploy timeout has passed, and does the engine go idle?

    python benchmarks/fleet/superseded_late.py [--quick] [--devices N] [--held N] [--timeout-s S]

One real mosquitto, one OTA server in this process and one simulated fleet (group ``orph``, 200
devices; quick 40) speaking the real protocol (the harness of
:mod:`benchmarks.fleet.catch_up_fairness`). Steps:

1. Every device is cut off and recorded offline; R1 (2.0.0) is pushed with a short deploy timeout
   (60 s; quick 20 s): every target deferred, the rollout completes, R1 is the group's release.
2. ``held`` devices (40; quick 10) are put under the ``slow`` fault: every command reaching them
   meanwhile is handled an hour late (never, within the run). Everyone returns: the others catch up
   to R1 and commit; the held ones take their R1 late command and sit on it (in flight).
3. Once every held target of R1 is in flight, the slow window ends (new commands are handled at
   once) and R2 (3.0.0, long deploy timeout) is pushed; right after, half the held devices are cut
   off. R2 goes out to the devices online at its push, the cut-off ones' R2 targets are deferred,
   R2 completes and supersedes R1. Nothing chases R1 any more: its held targets are orphans (the
   online half answered R2, never R1; the cut-off half is away).
4. Goal 1: R1's late targets in flight (``FleetDB.late_in_flight(R1)``) are 0 at the *check time*:
   the latest R1 send to a held device + R1's deploy timeout + one ``reconcile_s`` (the superseded
   release's targets are closed by a pass over the releases, which runs every ``reconcile_s`` while
   anything is in flight) + 1 s. Before issue 60 they stayed in flight for good.
5. The cut-off half returns and catches up to R2 (R2's own late targets). Goal 2: the engine idles:
   no late target in flight anywhere, nothing queued (``FleetDB.work().releases_idle``), and the
   engine's ``idle``, held over two ``reconcile_s`` in a row, within 60 s of those devices'
   return.

Reported: the R1 held targets in flight when R2 completed (the orphans the scenario made: if 0,
the scenario did not test anything and says so), their statuses at the check (``timeout`` for the
online ones, ``deferred`` for the away ones), when R1's in-flight count reached 0 relative to the
check time, the in-flight series, R2's rollout and late counts, and every device's final version.

Measured (quick, 2-core x86_64 shared with other work): 10 R1 targets in flight when R2 completed
(2.3 s after its push); the 5 away ones deferred at the first pass after R2 completed (7.8 s after
the push), the 5 online ones timed out 22.9 s after the push, before the check at 24.2 s: 0 in
flight at the check. The away devices caught up to R2 once back and the engine was idle 8.2 s
after their return (then held idle for 10 s).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.fleet.catch_up_fairness import POLICY, UNTIL_HEALED_S, FleetHarness  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from benchmarks.shared.polling import wait_until  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy  # noqa: E402

__all__ = ["run"]

GROUP = "orph"
#: How late a held device handles a command that reached it in its slow window: past the run.
HOLD_S = 3600.0


def _policy(timeout_s: float) -> RolloutPolicy:
    return RolloutPolicy(
        analysis=False,
        canary=1.0,
        waves=(1.0,),
        health_window_s=0.0,
        max_failure_rate=0.05,
        deploy_timeout_s=timeout_s,
    )


def _held_sends(h: FleetHarness, r1: str, held: list[str]) -> list[float]:
    found = h.server.db.targets_of(r1, held)
    return [t.sent for t in found.values() if t.sent is not None]


def _to_r1(h: FleetHarness, fleet: Any, held: list[str], timeout_s: float) -> str:
    """Steps 1 and 2: R1 pushed to the away group, everyone back, the held devices' R1 in flight."""
    fleet.fault("partition", fleet.device_ids, seconds=UNTIL_HEALED_S)
    h.wait_status(GROUP, "offline", len(fleet.device_ids), 120)
    r1 = h.push("2.0.0", GROUP, _policy(timeout_s))
    fleet.fault("slow", held, seconds=UNTIL_HEALED_S, delay_s=HOLD_S)
    fleet.fault("heal", fleet.device_ids, seconds=0.0)
    others = len(fleet.device_ids) - len(held)
    db = h.server.db
    wait_until(
        lambda: db.late_in_flight(r1) >= len(held) and h.late(r1).get("committed", 0) >= others,
        120,
        "R1 committed by the others and in flight to the held devices",
        0.2,
    )
    return r1


def _supersede(
    h: FleetHarness, fleet: Any, r1: str, held: list[str], away: list[str]
) -> dict[str, Any]:
    """Step 3: the slow window ends, R2 pushed, half the held devices cut off; R2 completes."""
    fleet.fault("slow", held, seconds=0.0, delay_s=0.0)  # commands from now on: handled at once
    pushed = time.time()
    r2 = h.server.start_rollout("digits", "3.0.0", GROUP, POLICY)
    fleet.fault("partition", away, seconds=UNTIL_HEALED_S)
    wait_until(lambda: h.server.status(r2).state.value != "running", 300, "R2's end", 0.1)
    done = time.time()
    return {
        "r2": r2,
        "pushed": pushed,
        "r2_completed_s": round(done - pushed, 2),
        "r2_state": h.server.status(r2).state.value,
        "r1_held_in_flight_at_r2_end": h.server.db.late_in_flight(r1),
        "r1_late_at_r2_end": h.late(r1),
    }


def _watch_r1(h: FleetHarness, r1: str, check_at: float, start: float) -> list[dict[str, Any]]:
    """R1's late targets in flight every 0.5 s until the check time (and until 0, at most 30 s
    past it)."""
    series = []
    while True:
        n = h.server.db.late_in_flight(r1)
        now = time.time()
        series.append({"t": round(now - start, 2), "r1_in_flight": n})
        if now >= check_at and (n == 0 or now > check_at + 30):
            return series
        time.sleep(0.5)


def _idle_for(h: FleetHarness, hold_s: float, timeout: float) -> float | None:
    """Seconds until the engine was idle (nothing in flight or queued, ``engine.idle``) for
    ``hold_s`` in a row; None if not within ``timeout``."""
    start = time.monotonic()
    since = None
    while time.monotonic() - start < timeout:
        work = h.server.db.work()
        idle = work.releases_idle and work.late_in_flight == 0 and h.server.engine.idle
        now = time.monotonic()
        if not idle:
            since = None
        elif since is None:
            since = now
        elif now - since >= hold_s:
            return round(since - start, 2)
        time.sleep(0.2)
    return None


def measure(work: Path, devices: int, n_held: int, timeout_s: float) -> dict[str, Any]:
    """The scenario on one harness: what it measured."""
    h = FleetHarness(work, ["2.0.0", "3.0.0"])
    try:
        fleet = h.add_fleet(GROUP, "o", devices, processes=1)
        held = fleet.device_ids[:n_held]
        away = held[: n_held // 2]
        log(
            f"orphans: {devices} devices, {n_held} held on R1 ({len(away)} then cut off), "
            f"R1 deploy timeout {timeout_s:g} s"
        )
        r1 = _to_r1(h, fleet, held, timeout_s)
        sup = _supersede(h, fleet, r1, held, away)
        reconcile_s = h.server.engine.reconcile_s
        check_at = max(_held_sends(h, r1, held)) + timeout_s + reconcile_s + 1.0
        log(
            f"orphans: R2 {sup['r2_state']} in {sup['r2_completed_s']} s; R1 in flight "
            f"{sup['r1_held_in_flight_at_r2_end']}; checking in {check_at - time.time():.1f} s"
        )
        series = _watch_r1(h, r1, check_at, sup["pushed"])
        at_check = next(s for s in series if s["t"] >= check_at - sup["pushed"])
        zero = next((s["t"] for s in series if s["r1_in_flight"] == 0), None)
        statuses = {d: t.status.value for d, t in h.server.db.targets_of(r1, held).items()}
        r1_late = h.late(r1)
        log(
            f"orphans: R1 in flight at the check {at_check['r1_in_flight']}; cut-off devices return"
        )
        fleet.fault("heal", away, seconds=0.0)
        returned = time.time()
        idle_after = _idle_for(h, 2 * reconcile_s, 60.0)
        r2_late = h.late(sup["r2"])
        work_end = h.server.db.work()
        versions = fleet.versions()
    finally:
        h.close()
    return {
        "devices": devices,
        "held": n_held,
        "held_cut_off": len(away),
        "deploy_timeout_s": timeout_s,
        "reconcile_s": reconcile_s,
        "r1": r1,
        **{k: v for k, v in sup.items() if k != "pushed"},
        "check_after_r2_push_s": round(check_at - sup["pushed"], 2),
        "r1_in_flight_at_check": at_check["r1_in_flight"],
        "r1_in_flight_zero_at_s": zero,
        "r1_held_statuses": _count(statuses.values()),
        "r1_late_after_check": r1_late,
        "r2_late": r2_late,
        "idle_s_after_return": idle_after,
        "return_to_idle_wall_s": round(time.time() - returned, 2),
        "work_at_end": {
            "late_in_flight": work_end.late_in_flight,
            "queued": work_end.queued,
            "late_superseded": work_end.late_superseded,
        },
        "versions_at_end": versions,
        "r1_series": series[:: max(1, len(series) // 30)],
    }


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def run(
    quick: bool, devices: int | None = None, held: int | None = None, timeout_s: float | None = None
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Params, results and goals of one run."""
    params: dict[str, Any] = {
        "devices": devices or (40 if quick else 200),
        "held": held or (10 if quick else 40),
        "r1_deploy_timeout_s": timeout_s or (20.0 if quick else 60.0),
    }
    work = Path(tempfile.mkdtemp(prefix="bench-orphans-"))
    try:
        m = measure(work, params["devices"], params["held"], params["r1_deploy_timeout_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    made = m["r1_held_in_flight_at_r2_end"]
    goals = [
        goal(
            "orphans: R1 late targets in flight when R2 completed (the scenario made orphans)",
            "> 0",
            made,
            made > 0,
        ),
        goal(
            "orphans: R1 late targets in flight once its deploy timeout passed (the check time)",
            "0",
            m["r1_in_flight_at_check"],
            m["r1_in_flight_at_check"] == 0 and made > 0,
        ),
        goal(
            "orphans: the engine idles (nothing in flight or queued, engine idle for 2 "
            "reconcile_s) "
            "after the cut-off devices caught up to R2, s after their return (-1: not)",
            "within 60 s",
            m["idle_s_after_return"] if m["idle_s_after_return"] is not None else -1,
            m["idle_s_after_return"] is not None,
        ),
    ]
    return params, m, goals


def main() -> None:
    """Parse the arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 devices, 10 held, R1 timeout 20 s")
    parser.add_argument("--devices", type=int, help="devices of the group (default 200; quick 40)")
    parser.add_argument("--held", type=int, help="devices held on R1 (default 40; quick 10)")
    parser.add_argument(
        "--timeout-s", type=float, help="R1's deploy timeout (default 60; quick 20)"
    )
    args = parser.parse_args()
    params, results, goals = run(args.quick, args.devices, args.held, args.timeout_s)
    emit("superseded_late", params, results, goals)


if __name__ == "__main__":
    main()
