"""Catch-up under a backlog (issue 60): a small group's late devices return while a big group's
backlog holds the fleet-wide catch-up cap; does the small group still get its share?

    python benchmarks/fleet/catch_up_fairness.py [--quick] [--big N] [--small N]
        [--max-catch-up N] [--rounds N]

One real mosquitto, one OTA server in this process (``build_server``, SQLite store, the server's
defaults but for ``max_catch_up``) and two simulated fleets speaking the real protocol
(``benchmarks/shared/fleet_sim.py``, chunks fetched and checked): group ``big`` (5,000 devices;
quick 180) and group ``small`` (50; quick 10), on digits 1.0.0. ``big`` sorts before ``small``: with
the cap spent in group order (before issue 60) the small group waited for the whole big backlog.

Each phase: every device is cut off (partition) and the server records it offline; the next version
is pushed to both groups (one stage, no analysis, the devices all away: every target deferred, each
rollout completes and sets its group's release); then devices return at once (``heal``), their late
targets go out under the cap:

- **A (alone)**: only the small group returns; the big group stays away (its targets deferred,
  nothing in flight).
- **B (backlog)**: the small group and the big group return at the same moment.

One unmeasured warm-up phase (B) first, then rounds of A B / B A (order mirrored each round, 3
rounds; quick 2), on the same fleets, server and store, so both conditions see the same host drift
and the same growing store.

Return-to-commit of a small-group device: its return (the broker accepted its first connection after
the heal, from the device's own connect log) to its late target committed on the server (the
target's ``updated`` when it read ``committed``). The reconciler runs a pass over the releases every
``reconcile_s`` (5 s) and a returning device waits for the next pass, a delay that has nothing to do
with the cap and differs phase by phase; so each round's heal comes a seeded random offset in [0,
reconcile_s) after an observed pass (``run_releases`` wrapped, an observer only), the same offset
for its A and its B phase. The cap is the server's ``max_catch_up`` (full: its default 500, ten
caps' worth of big devices, and the 50 small ones fit in a half share; quick: 20, nine caps' worth,
and the 10 small ones fit in a half share exactly). ``--control group-order`` runs the passes as
they were before issue 60 (the room offered whole to each release in group order) on the same
harness: it shows the benchmark tells the two apart (its goal is expected to be missed).

Reported: per phase the small group's return-to-commit p50/p99/max, the big group's (B) and its
throughput (late targets committed per second from the heal to its last commit), late targets in
flight per group sampled every 0.5 s (max, and a thinned series), how many passes ran; per condition
the pooled figures. Goals: every small-group late target committed in every phase; pooled p99 of B /
pooled p99 of A <= 2 (the issue's target).

Measured, full profile (2-core x86_64 shared with two converter benchmarks; 5,000 + 50 devices, cap
500, a warm-up and 3 mirrored rounds): small group p99 4.29 s alone, 7.02 s with the big backlog,
ratio 1.64 (goal <= 2, met); every late target committed in all 6 phases; the big group caught up at
177-187 devices per s with the full cap of 500 in flight. Quick profile (180 + 10, cap 20): ratio
1.005 (and 0.986), against 3.10 for the ``--control group-order`` pass (its goal missed: the small
group went out only once the big group's queue was empty). The quick runs also showed the first
share rule's flaw, since fixed in the reconciler: a group catching up alone was offered half the
room (its share beside an idle group) and the rest stayed unused until the next pass; what is left
now goes round again to the groups that used their whole share."""

from __future__ import annotations

import argparse
import functools
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import emit, goal, log  # noqa: E402
from benchmarks.shared.fleet_sim import FleetReport, SimulatedFleet  # noqa: E402
from benchmarks.shared.polling import wait_until  # noqa: E402
from edgesdk.fleet.archive import pack_bundle  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.server import ServerConfig  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, load_private_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

__all__ = ["FleetHarness", "POLICY", "UNTIL_HEALED_S", "quantile", "run"]

#: One stage, no analysis (the simulated devices run no app), a long deploy timeout: no target
#: times out here.
POLICY = RolloutPolicy(
    analysis=False,
    canary=1.0,
    waves=(1.0,),
    health_window_s=0.0,
    max_failure_rate=0.05,
    deploy_timeout_s=600.0,
)
#: A partition that lasts until a ``heal`` ends it.
UNTIL_HEALED_S = 24 * 3600.0
MODEL = "digits"


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (None for no values)."""
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else None
    )


def _spread(values: list[float]) -> dict[str, Any]:
    r = lambda v: None if v is None else round(v, 3)  # noqa: E731
    return {
        "n": len(values),
        "p50": r(quantile(values, 0.5)),
        "p99": r(quantile(values, 0.99)),
        "max": r(max(values, default=None)),
    }


class FleetHarness:
    """A real mosquitto, an OTA server in this process with bundles of ``versions`` uploaded, and
    simulated fleets added per group; :meth:`close` stops them all and returns the fleets'
    reports by group."""

    def __init__(self, work: Path, versions: list[str], **config: Any) -> None:
        generate_keypair(work, "server")
        onnx = write_mlp_onnx(random_mlp([16, 8, 4], seed=2), work / "m.onnx")
        archives = []
        for version in versions:
            spec = BundleSpec(MODEL, version, "onnx-fp32", "generic-x86_64", "latency")
            archives.append(
                pack_bundle(
                    bundle_from_model(
                        work / f"bundle-{version}",
                        onnx,
                        spec,
                        {"input": np.zeros((1, 16), np.float32)},
                    ).path
                )
            )
        self.work = work
        self.broker = LocalMosquitto(work / "broker", max_open_files=20000)
        self.running = build_server(
            ServerSetup(
                ServerConfig(self.broker.url, **config),
                repo=work / "repo",
                db=work / "fleet.db",
                signing_key=load_private_key(work / "server.key"),
                allow_unsigned=True,
                keep_latest=len(versions) + 1,
            )
        )
        self.server = self.running.ota
        self.fleets: dict[str, SimulatedFleet] = {}
        #: time.time() of each pass over the releases (the reconciler's ``run_releases``, observed).
        self.passes: list[float] = []
        #: What runs the passes instead of the reconciler's own (a control run), or None.
        self.control: Any = None
        reconciler = self.server.engine.reconciler
        forward = reconciler.run_releases

        def observed(*args: Any, **kwargs: Any) -> None:
            self.passes.append(time.time())
            (self.control or forward)(*args, **kwargs)

        reconciler.run_releases = observed  # type: ignore[method-assign]
        for archive in archives:
            self.server.upload(archive)

    def add_fleet(self, group: str, prefix: str, devices: int, processes: int) -> SimulatedFleet:
        """``devices`` simulated devices in ``group`` on 1.0.0, connected and recorded online."""
        fleet = SimulatedFleet(
            self.broker.url,
            self.work / "server.pub",
            devices,
            group=group,
            id_prefix=prefix,
            processes=processes,
            model=MODEL,
            max_runtime_s=7200,
        )
        self.fleets[group] = fleet
        fleet.start(timeout=600)
        self.wait_status(group, "online", devices, 300)
        return fleet

    def wait_status(self, group: str, status: str, count: int, timeout: float) -> None:
        """Until ``count`` devices of ``group`` are recorded ``status``."""
        db = self.server.db
        wait_until(
            lambda: len(db.devices(group, status=status)) >= count,
            timeout,
            f"{count} devices of {group} recorded {status}",
            interval=0.5,
        )

    def push(
        self, version: str, group: str, policy: RolloutPolicy = POLICY, timeout: float = 300
    ) -> str:
        """Push ``version`` to ``group`` and wait until the rollout is no longer running; its id."""
        rid = self.server.start_rollout(MODEL, version, group, policy)
        wait_until(
            lambda: self.server.status(rid).state != RolloutState.RUNNING,
            timeout,
            f"the end of the rollout of {version} to {group}",
            interval=0.1,
        )
        return rid

    def next_pass(self, after: float, timeout: float = 60) -> float:
        """time.time() of the first pass over the releases after ``after``."""
        wait_until(
            lambda: self.passes and self.passes[-1] > after,
            timeout,
            "a pass over the releases",
            0.02,
        )
        return next(t for t in self.passes if t > after)

    def late(self, rollout_id: str) -> dict[str, int]:
        """The rollout's late targets by status."""
        return {s.value: n for s, n in self.server.db.late_counts(rollout_id).items()}

    def close(self) -> dict[str, FleetReport]:
        """Stop the fleets, the server and the broker; the fleets' reports by group."""
        reports = {}
        try:
            for group, fleet in self.fleets.items():
                if fleet.start_s is not None:
                    reports[group] = fleet.stop()
        finally:
            self.running.stop()
            self.broker.stop()
        return reports


def _order(rounds: int) -> list[str]:
    """A B, B A, A B, ...: interleaved, which condition goes first alternating by round."""
    return [
        c
        for r in range(rounds)
        for c in (("alone", "backlog") if r % 2 == 0 else ("backlog", "alone"))
    ]


def _sample(
    h: FleetHarness,
    rids: dict[str, str],
    wanted: dict[str, int],
    healed: float,
    timeout: float,
) -> list[dict[str, Any]]:
    """Late targets in flight and committed per group every 0.5 s, until each group in ``wanted``
    has that many committed (or ``timeout``)."""
    db, samples = h.server.db, []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row: dict[str, Any] = {"t": round(time.time() - healed, 2)}
        done = True
        for group, rid in rids.items():
            row[f"{group}_in_flight"] = db.late_in_flight(rid)
            row[f"{group}_committed"] = n = db.late_counts(rid, (TargetStatus.COMMITTED,)).get(
                TargetStatus.COMMITTED, 0
            )
            done = done and n >= wanted.get(group, 0)
        samples.append(row)
        if done:
            break
        time.sleep(0.5)
    return samples


def _phase(
    h: FleetHarness, condition: str, version: str, offset_s: float, settle_s: float
) -> dict[str, Any]:
    """Everyone away, ``version`` pushed to both groups, then the small group (and with ``backlog``
    the big one) back at once, ``offset_s`` after a pass; held until their late targets
    committed."""
    for fleet in h.fleets.values():
        fleet.fault("partition", fleet.device_ids, seconds=UNTIL_HEALED_S)
    for group, fleet in h.fleets.items():
        h.wait_status(group, "offline", len(fleet.device_ids), 300)
    rids = {group: h.push(version, group) for group in h.fleets}
    pass_at = h.next_pass(time.time())
    time.sleep(max(0.0, pass_at + offset_s - time.time()))
    back = ["small", "big"] if condition == "backlog" else ["small"]
    healed = time.time()
    for group in back:
        h.fleets[group].fault("heal", h.fleets[group].device_ids, seconds=0.0)
    wanted = {g: len(h.fleets[g].device_ids) for g in back}
    samples = _sample(h, rids, wanted, healed, settle_s)
    passes = sum(1 for t in h.passes if t >= healed)
    commits = {
        g: {
            t.device_id: t.updated
            for t in h.server.db.targets(rids[g], status=TargetStatus.COMMITTED)
            if t.late
        }
        for g in back
    }
    return {
        "condition": condition,
        "version": version,
        "rollouts": rids,
        "healed_at": healed,
        "offset_after_pass_s": round(healed - pass_at, 3),
        "passes": passes,
        "late": {g: h.late(rid) for g, rid in rids.items()},
        "samples": samples,
        "_commits": commits,
    }


def _latencies(phase: dict[str, Any], report: FleetReport, group: str) -> dict[str, float]:
    """Device -> its return (first connect at or after the heal) to its late target committed on
    the server."""
    out = {}
    for device, at in phase["_commits"].get(group, {}).items():
        back = [t for t in report.connect_log.get(device, []) if t >= phase["healed_at"] - 0.5]
        if back:
            out[device] = at - back[0]
    return out


def _summarise(
    phase: dict[str, Any], reports: dict[str, FleetReport], small: int, big: int
) -> dict[str, Any]:
    samples = phase.pop("samples")
    lat = _latencies(phase, reports["small"], "small")
    result = {k: v for k, v in phase.items() if not k.startswith("_") and k != "healed_at"}
    result["small_return_to_commit_s"] = _spread(list(lat.values()))
    result["small_committed"] = len(phase["_commits"].get("small", {}))
    result["in_flight_max"] = {
        g: max((s[f"{g}_in_flight"] for s in samples), default=0) for g in ("small", "big")
    }
    step = max(1, len(samples) // 20)
    result["in_flight_samples"] = samples[::step]
    if phase["condition"] == "backlog":
        big_lat = _latencies(phase, reports["big"], "big")
        result["big_return_to_commit_s"] = _spread(list(big_lat.values()))
        ends = list(phase["_commits"].get("big", {}).values())
        span = max(ends) - phase["healed_at"] if ends else None
        result["big_committed"] = len(ends)
        result["big_throughput_per_s"] = round(len(ends) / span, 2) if span else None
        result["big_all_committed_s"] = round(span, 2) if span else None
    result["_lat"] = list(lat.values())
    result["complete"] = result["small_committed"] == small and (
        phase["condition"] == "alone" or result.get("big_committed") == big
    )
    return result


def _pooled(phases: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for p in phases for x in p["_lat"]]
    p99s = [
        p["small_return_to_commit_s"]["p99"]
        for p in phases
        if p["small_return_to_commit_s"]["p99"] is not None
    ]
    return {
        "phases": len(phases),
        "small_return_to_commit_s": _spread(lat),
        "phase_p99_s": {"min": min(p99s, default=None), "max": max(p99s, default=None)},
    }


def _spend_in_group_order(reconciler: Any, now: float, room: int, work: Any, holder: str,
                          lease_s: float) -> None:
    """Control only (``--control group-order``): the pass over the releases as it was before issue
    60, each release in group order offered all the room left (archives are never let go here)."""
    if work.queued:
        reconciler.db.drop_unreleased_from_queue()
    reconciler.backlog = False
    releases = set()
    for r in reconciler.db.lease_releases(holder, now, lease_s):
        releases.add(r.id)
        sent = reconciler.run(r, room, work)
        room -= sent
        if sent:
            reconciler.serving.add(r.id)
    reconciler.releases = releases


def measure(work: Path, params: dict[str, Any], seed: int = 60) -> dict[str, Any]:
    """The warm-up and the measured phases on one harness: per-phase results (reports folded in)."""
    big, small, rounds = params["big"], params["small"], params["rounds"]
    order = ["backlog"] * params["warm_up"] + _order(rounds)
    versions = [f"{i}.0.0" for i in range(2, len(order) + 2)]
    rng = random.Random(seed)
    h = FleetHarness(work, versions, max_catch_up=params["max_catch_up"])
    if params["control"] == "group-order":
        h.control = functools.partial(_spend_in_group_order, h.server.engine.reconciler)
    raw: list[dict[str, Any]] = []
    try:
        log(f"fairness: connecting {big} + {small} devices (cap {params['max_catch_up']})")
        h.add_fleet("big", "b", big, processes=2)
        h.add_fleet("small", "s", small, processes=1)
        reconcile_s = h.server.engine.reconcile_s
        offsets = [rng.uniform(0, reconcile_s) for _ in range(rounds + 1)]
        for i, (condition, version) in enumerate(zip(order, versions)):
            k = i - params["warm_up"]  # the measured phase's index (-1: the warm-up)
            offset = offsets[0] if k < 0 else offsets[1 + k // 2]
            log(f"fairness: phase {i}/{len(order) - 1} {'(warm-up) ' * (k < 0)}{condition}, "
                f"{version}, heal {offset:.2f} s after a pass")
            phase = _phase(h, condition, version, offset, params["settle_s"])
            log(f"fairness:   late {phase['late']}, {phase['passes']} passes, in flight last "
                f"{phase['samples'][-1]}")
            raw.append(phase)
    finally:
        reports = h.close()
    phases = [_summarise(p, reports, small, big) for p in raw]
    return {"phases": phases, "reconcile_s": reconcile_s,
            "updated_twice": sum(r.updated_twice for r in reports.values())}


def _goals(measured: list[dict[str, Any]], ratio: float) -> list[dict[str, Any]]:
    complete = sum(p["complete"] for p in measured)
    return [goal("fairness: phases whose late targets all committed (small group; big group too "
                 "with the backlog)", f"all {len(measured)}", complete, complete == len(measured)),
            goal("fairness: small group's return-to-commit p99 with the big backlog / alone "
                 "(pooled over phases)", "<= 2", ratio, ratio <= 2 and complete == len(measured))]


def run(quick: bool, big: int | None = None, small: int | None = None, cap: int | None = None,
        rounds: int | None = None, control: str | None = None, warm_up: bool = True,
        ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Params, results and goals of one run."""
    params: dict[str, Any] = {
        "big": big or (180 if quick else 5000), "small": small or (10 if quick else 50),
        "max_catch_up": cap or (20 if quick else 500), "rounds": rounds or (2 if quick else 3),
        "settle_s": 180.0 if quick else 900.0, "control": control, "warm_up": int(warm_up),
        "policy": "one stage, no analysis, deploy timeout 600 s"}
    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    try:
        m = measure(work, params)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm = m["phases"][0] if warm_up else None
    measured = m["phases"][params["warm_up"]:]
    alone = [p for p in measured if p["condition"] == "alone"]
    backlog = [p for p in measured if p["condition"] == "backlog"]
    pooled = {"alone": _pooled(alone), "backlog": _pooled(backlog)}
    for p in m["phases"]:
        del p["_lat"]
    a99, b99 = (pooled[c]["small_return_to_commit_s"]["p99"] for c in ("alone", "backlog"))
    ratio = b99 / a99 if a99 and b99 is not None else float("inf")
    results = {"order": [p["condition"] for p in measured], "reconcile_s": m["reconcile_s"],
               "catch_up_cap": params["max_catch_up"], **pooled,
               "small_p99_ratio_backlog_over_alone": round(ratio, 3),
               "big_throughput_per_s": [p.get("big_throughput_per_s") for p in backlog],
               "big_in_flight_max": [p["in_flight_max"]["big"] for p in backlog],
               "small_in_flight_max": [p["in_flight_max"]["small"] for p in backlog],
               "updated_twice": m["updated_twice"], "warm_up": warm, "phases": measured}
    return params, results, _goals(measured, ratio)


def main() -> None:
    """Parse the arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="180 + 10 devices, cap 20, 2 rounds")
    parser.add_argument("--big", type=int, help="big group's devices (default 5000; quick 180)")
    parser.add_argument("--small", type=int, help="small group's devices (default 50; quick 10)")
    parser.add_argument("--max-catch-up", type=int, help="the catch-up cap (default 500; quick 20)")
    parser.add_argument("--rounds", type=int, help="rounds of A B / B A (default 3; quick 2)")
    parser.add_argument("--control", choices=["group-order"],
                        help="a control run: the room spent in group order, as before issue 60 "
                             "(its goals are expected to be missed: the benchmark tells them "
                             "apart)")
    args = parser.parse_args()
    params, results, goals = run(args.quick, args.big, args.small, args.max_catch_up, args.rounds,
                                 args.control)
    emit("catch_up_fairness", params, results, goals)


if __name__ == "__main__":
    main()
