"""Fleet figures: rollouts to 100, 1,000 and 10,000 simulated devices on one host, SQLite and PostgreSQL,
one replica and two, and a replica killed while it drives a rollout.

Every run starts a fresh mosquitto (file limits raised for 10,000 clients), a fresh fleet database
and `edgesdk server` as its own process (the CLI an operator runs), then connects the simulated fleet
(benchmarks/shared/fleet_sim.py: real protocol, real Ed25519 verification, chunks hashed) and pushes a small
bundle with canary 1%, waves 10%/100%, no health window. Measured per run: wall time from the push
to the rollout's completion, the CPU seconds over that time (from /proc) of the server and of the
database (PostgreSQL's postmaster and every backend, exited ones included; SQLite runs inside the
server) and their sum per device, the database's size, the server's peak RSS, and what the devices
saw: committed, and updated twice by their own install logs (one version committed twice).

Then the late devices (benchmarks/fleet/fleet_late.py): 30% of 10,000 devices offline at the push and
back at random over 10 minutes, with 500 more joining the group then (return to commit, CPU per
late device against one online at the push); 100 duty-cycled devices awake 30 s every 5 minutes
and a 20 MB bundle (wakes to converge, bytes per device); and 10,000 devices back within 10 s of a
broker restart while a release is pending (nothing lost, the outbox, time to converge).

    python benchmarks/fleet/fleet.py [--quick] [--part all|scale|late|returning|duty|storm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.fleet.fleet_late import big_bundle, duty_cycled, late_devices, late_goals, reconnect_storm  # noqa: E402
from benchmarks.fleet.fleet_servers import ServerProcess, tree_cpu_seconds  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from benchmarks.shared.fleet_sim import SimulatedFleet  # noqa: E402
from edgesdk.fleet.archive import pack_bundle  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState, TargetStatus  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.postgres import LocalPostgres  # noqa: E402
from edgesdk.ota_server.store.fleet_db import FleetDB  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec, HealthCheck  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, load_private_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
POLICY = RolloutPolicy(analysis=False, canary=0.01, waves=(0.1, 1.0), health_window_s=0.0, max_failure_rate=0.05,
                       deploy_timeout_s=600.0)
MODEL = "fleetbench"


def make_bundles(work: Path) -> dict[str, Path]:
    """Two versions of a small signed bundle (an MLP of a few KB): the fleet runs 1.0.0, the rollout sends 2.0.0."""
    key = load_private_key(work / "keys" / "converter.key")
    bundles = {}
    for seed, version in enumerate(("1.0.0", "2.0.0")):
        model = write_mlp_onnx(random_mlp([64, 32, 10], seed=seed), work / f"m{seed}.onnx")
        x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
        spec = BundleSpec(MODEL, version, "onnx-fp32", "generic-x86_64", "latency",
                          health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
        bundle_from_model(work / f"bundle-{version}", model, spec, {"input": x}, private_key=key)
        bundles[version] = work / f"bundle-{version}"
    return bundles


class Run:
    """One measured rollout: a broker, server process(es) on one database, a simulated fleet."""

    def __init__(self, work: Path, name: str, devices: int, db: str, replicas: int = 1, lease: str = "10s") -> None:
        self.work, self.name, self.devices, self.db = work / name, name, devices, db
        self.broker = LocalMosquitto(self.work / "broker", max_open_files=devices + 4096)
        keys = work / "keys"
        self.servers = [ServerProcess(self.work, self.broker.url, db, keys, f"{name}-r{i}", replica=replicas > 1,
                                      lease=lease) for i in range(replicas)]
        self.fleet = SimulatedFleet(self.broker.url, keys / "server.pub", devices, group="bench", id_prefix="d",
                                    processes=2, model=MODEL, version="1.0.0", fetch=True)

    def connect(self, timeout: float = 300) -> float:
        """Start the fleet; seconds until the server lists every device online."""
        started = time.monotonic()
        self.fleet.start(timeout=timeout)
        client = self.servers[0].client
        deadline = time.monotonic() + timeout
        while client.device_page("bench", status="online", limit=1).total < self.devices:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the server saw {client.device_page('bench').total} of "
                                   f"{self.devices} devices")
            time.sleep(0.2)
        return time.monotonic() - started

    def push(self, bundle: Path) -> str:
        client = self.servers[0].client
        client.upload(pack_bundle(bundle))
        return client.start_rollout(MODEL, "2.0.0", "bench", POLICY)

    def wait(self, rollout_id: str, timeout: float, on_poll: Any = None) -> RolloutRecord:
        deadline = time.monotonic() + timeout
        while True:
            for server in self.servers:
                if server.process.poll() is None:
                    r = server.client.rollout(rollout_id, limit=0)
                    break
            if on_poll is not None:
                on_poll(r)
            if r.state != RolloutState.RUNNING or time.monotonic() > deadline:
                return r
            time.sleep(0.05)

    def close(self) -> dict[str, Any]:
        report = self.fleet.stop()
        for server in self.servers:
            server.stop()
        self.broker.stop()
        return report.to_json()


def measure(work: Path, name: str, devices: int, db: str, bundle: Path, replicas: int = 1,
            timeout: float = 600, pg: LocalPostgres | None = None) -> dict[str, Any]:
    """A rollout to ``devices`` devices; the figures of one run (``pg``: the cluster behind ``db``, whose CPU
    counts with the server's)."""
    log(f"{name}: {devices} devices, {replicas} server(s), {db.split('://')[0] if '://' in db else 'sqlite'}")
    run = Run(work, name, devices, db, replicas)
    try:
        connect_s = run.connect()
        cpu_before = [s.cpu_seconds() for s in run.servers]
        db_before = _db_cpu(pg)
        started = time.monotonic()
        rollout_id = run.push(bundle)
        r = run.wait(rollout_id, timeout)
        wall = time.monotonic() - started
        server_cpu = sum(s.cpu_seconds() for s in run.servers) - sum(cpu_before)
        db_cpu = _db_cpu(pg) - db_before
        cpu = server_cpu + db_cpu
        rss = max(s.peak_rss_mb() for s in run.servers)
        size = FleetDB(db).size_bytes()
        counters: dict[str, float] = {}
        for server in run.servers:
            for name, value in server.counters().items():
                counters[name] = counters.get(name, 0) + value
    finally:
        fleet = run.close()
    committed = r.count(TargetStatus.COMMITTED)
    result = {"devices": devices, "replicas": replicas, "connect_s": round(connect_s, 2), "wall_s": round(wall, 2),
              "state": r.state.value, "committed": committed, "server_cpu_s": round(server_cpu, 3),
              "db_cpu_s": round(db_cpu, 3), "cpu_ms_per_device": round(cpu / devices * 1e3, 4), "db_bytes": size,
              "peak_rss_mb": round(rss, 1),
              "updated_twice": fleet["updated_twice"], "device_cpu_s": round(fleet["cpu_s"], 2),
              "counts": {k.value: v for k, v in r.counts.items()}, "server_counters": counters,
              "device_counts": {k: fleet["counts"][k] for k in ("duplicate_commands", "repeated_commits",
                                                                 "need_requests", "chunk_bytes")}}
    log(f"  {result}")
    return result


def _db_cpu(pg: LocalPostgres | None) -> float:
    """CPU seconds of the PostgreSQL cluster so far (0 for SQLite, which the server's own CPU includes)."""
    return tree_cpu_seconds(pg.process.pid) if pg is not None and pg.process is not None else 0.0


def failover(work: Path, devices: int, db: str, bundle: Path, lease_s: float = 3.0,
             resend_s: float = 3.0) -> dict[str, Any]:
    """Two replicas; the one driving the rollout is SIGKILLed once it has sent the last stage, before every device
    has committed. ``takeover_s``: from the kill until the other replica drives the rollout."""
    log(f"failover: {devices} devices, 2 replicas, lease {lease_s:g} s")
    run = Run(work, "failover", devices, db, replicas=2, lease=f"{lease_s}s")
    killed: dict[str, Any] = {}

    def kill_the_driver(r: RolloutRecord) -> None:
        if killed or r.stage < r.stage_count - 1 or r.driver is None:
            return
        victim = next(s for s in run.servers if s.name == r.driver)
        victim.kill()
        killed.update({"name": victim.name, "at": time.monotonic(), "exit_code": victim.process.returncode,
                       "stage": r.stage, "counts_at_kill": {k.value: v for k, v in r.counts.items()}})
        log(f"  killed {victim.name} with the last stage sent: {killed['counts_at_kill']}")

    takeover: dict[str, float] = {}

    def watch(r: RolloutRecord) -> None:
        kill_the_driver(r)
        if killed and "s" not in takeover and r.driver and r.driver != killed["name"]:
            takeover["s"] = time.monotonic() - killed["at"]

    try:
        run.connect()
        started = time.monotonic()
        rollout_id = run.push(bundle)
        r = run.wait(rollout_id, 600, watch)
        wall = time.monotonic() - started
        survivor = next(s for s in run.servers if s.process.poll() is None)
        final = survivor.client.rollout(rollout_id, limit=0)
    finally:
        fleet = run.close()
    if killed:
        killed["after_push_s"] = round(killed.pop("at") - started, 2)
    committed_at_kill = killed.get("counts_at_kill", {}).get("committed", 0)
    result = {"devices": devices, "lease_s": lease_s, "resend_s": resend_s, "killed": killed or None,
              "killed_mid_stage": bool(killed) and killed["exit_code"] == -9 and committed_at_kill < devices,
              "takeover_s": round(takeover["s"], 2) if "s" in takeover else None,
              "takeover_bound_s": lease_s + resend_s + 2.0,
              "wall_s": round(wall, 2), "state": r.state.value, "driver_after": final.driver,
              "committed": final.count(TargetStatus.COMMITTED), "not_committed": devices - final.count(TargetStatus.COMMITTED),
              "updated_twice": fleet["updated_twice"], "duplicate_commands": fleet["counts"]["duplicate_commands"],
              "repeated_commits": fleet["counts"]["repeated_commits"], "fleet_versions": fleet["versions"],
              "counts": {k.value: v for k, v in final.counts.items()}}
    log(f"  {result}")
    return result


LATE_SCENARIOS = ("returning", "duty", "storm")
#: The late-device scenarios' sizes: the issue's, and --quick's (the duty cycle shortened 15x, its bundle 10x).
LATE_SIZES = {
    "full": {"returning": {"devices": 10000, "new_devices": 500, "window_s": 600.0, "idle_s": 30.0},
             "duty": {"devices": 100, "awake_s": 30.0, "sleep_s": 270.0, "bundle_bytes": 20_000_000},
             "storm": {"devices": 10000, "spread_s": 10.0}},
    "quick": {"returning": {"devices": 200, "new_devices": 20, "window_s": 8.0, "idle_s": 2.0},
              "duty": {"devices": 20, "awake_s": 2.0, "sleep_s": 18.0, "bundle_bytes": 2_000_000},
              "storm": {"devices": 300, "spread_s": 3.0, "idle_s": 1.0}},
}


def scale_runs(work: Path, pg: LocalPostgres, bundles: dict[str, Path], sizes: list[int], replica_devices: int,
               failover_devices: int) -> dict[str, Any]:
    """Rollouts at each size on SQLite and PostgreSQL, two replicas against one, and the fail-over."""
    results: dict[str, Any] = {"sqlite": [], "postgresql": []}
    for n in sizes:
        results["sqlite"].append(measure(work, f"sqlite-{n}", n, str(work / f"sqlite-{n}.db"), bundles["2.0.0"]))
        results["postgresql"].append(measure(work, f"pg-{n}", n, pg.create_database(f"fleet_{n}"), bundles["2.0.0"],
                                             pg=pg))
    two = measure(work, f"pg-2r-{replica_devices}", replica_devices,
                  pg.create_database(f"fleet_2r_{replica_devices}"), bundles["2.0.0"], replicas=2, pg=pg)
    one = next(r for r in results["postgresql"] if r["devices"] == replica_devices) \
        if replica_devices in sizes else measure(work, f"pg-1r-{replica_devices}", replica_devices,
                                                 pg.create_database("fleet_1r"), bundles["2.0.0"], pg=pg)
    results["replicas"] = {"one": one, "two": two, "wall_two_over_one": round(two["wall_s"] / one["wall_s"], 3),
                           "cpu_two_over_one": round(two["server_cpu_s"] / one["server_cpu_s"], 3)}
    results["failover"] = failover(work, failover_devices, pg.create_database("fleet_failover"), bundles["2.0.0"])
    return results


def scale_goals(results: dict[str, Any], sizes: list[int], failover_devices: int) -> list[dict[str, Any]]:
    biggest = max(sizes)
    goals = []
    for backend in ("sqlite", "postgresql"):
        big = next(r for r in results[backend] if r["devices"] == biggest)
        small = next(r for r in results[backend] if r["devices"] == min(sizes))
        goals.append(goal(f"{backend}: {biggest} devices, rollout completes with every device committed, wall s",
                          "<= 120", big["wall_s"],
                          big["state"] == "completed" and big["committed"] == biggest and big["wall_s"] <= 120))
        ratio = big["cpu_ms_per_device"] / small["cpu_ms_per_device"]
        goals.append(goal(f"{backend}: server + database CPU per device at {biggest} / at {min(sizes)}", "<= 1.5",
                          ratio, ratio <= 1.5))
    goals.append(goal("PostgreSQL, two replicas vs one: rollout wall time ratio", "report",
                      results["replicas"]["wall_two_over_one"], True))
    fo = results["failover"]
    goals.append(goal(f"two replicas, {failover_devices} devices, the driver killed mid-stage: every device committed "
                      "(s from the push)", "<= 150", fo["wall_s"],
                      fo["killed_mid_stage"] and fo["state"] == "completed" and fo["not_committed"] == 0
                      and fo["wall_s"] <= 150))
    goals.append(goal("the kill happened mid-stage, and the other replica took over (s from the kill; bound: lease + "
                      "re-send + 2 s)", f"<= {fo['takeover_bound_s']:g}", fo["takeover_s"],
                      fo["killed_mid_stage"] and fo["takeover_s"] is not None
                      and fo["takeover_s"] <= fo["takeover_bound_s"]))
    goals.append(goal("devices whose own install log shows one version installed twice", "0", fo["updated_twice"],
                      fo["killed_mid_stage"] and fo["updated_twice"] == 0))
    return goals


def late_runs(work: Path, pg: LocalPostgres, bundle: Path, sizes: dict[str, dict[str, Any]],
              scenarios: tuple[str, ...] = LATE_SCENARIOS, server_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """The late-device scenarios on PostgreSQL (benchmarks/fleet/fleet_late.py); ``server_args`` go to the returning
    scenario's server."""
    keys = work / "keys"
    results = {}
    if "returning" in scenarios:
        results["returning"] = late_devices(work, pg.create_database("fleet_late"), keys, bundle, MODEL, pg=pg,
                                            server_args=server_args, **sizes["returning"])
    if "duty" in scenarios:
        duty = dict(sizes["duty"])
        big = big_bundle(work, keys, "fleetbig", "2.0.0", duty.pop("bundle_bytes"))
        results["duty"] = duty_cycled(work, pg.create_database("fleet_duty"), keys, big, "fleetbig", pg=pg, **duty)
    if "storm" in scenarios:
        results["storm"] = reconnect_storm(work, pg.create_database("fleet_storm"), keys, bundle, MODEL, pg=pg,
                                           **sizes["storm"])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="CI smoke size (100 and 1,000 devices: a per-device cost that grows with the fleet shows; "
                             "the late-device scenarios at a few hundred devices, the duty cycle shortened)")
    parser.add_argument("--part", choices=("all", "scale", "late", *LATE_SCENARIOS), default="all",
                        help="scale: the rollouts by size, replicas and fail-over; late: the three late-device "
                             "scenarios; returning (offline at the push, or joining later), duty or storm: that one")
    parser.add_argument("--server-arg", action="append", default=[], metavar="OPTION",
                        help="an option for the returning scenario's edgesdk server, repeated for more: "
                             "--server-arg=--reconcile-every=10s --server-arg=--lease=20s measures longer waves")
    args = parser.parse_args()
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    replica_devices = 300 if args.quick else 10000
    failover_devices = 200 if args.quick else 10000
    late_sizes = LATE_SIZES["quick" if args.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    results: dict[str, Any] = {}
    goals: list[dict[str, Any]] = []
    try:
        generate_keypair(work / "keys", "server")
        generate_keypair(work / "keys", "converter")
        bundles = make_bundles(work)
        with LocalPostgres(work / "postgres", durable=True, settings={"max_connections": "100"}) as pg:
            if args.part in ("all", "scale"):
                results.update(scale_runs(work, pg, bundles, sizes, replica_devices, failover_devices))
                goals += scale_goals(results, sizes, failover_devices)
            if args.part not in ("scale",):
                scenarios = LATE_SCENARIOS if args.part in ("all", "late") else (args.part,)
                results["late_devices"] = late_runs(work, pg, bundles["2.0.0"], late_sizes, scenarios,
                                                    tuple(args.server_arg))
                goals += late_goals(**results["late_devices"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit("fleet", {"part": args.part, "load_average_at_end": os.getloadavg(),
                   "sizes": sizes, "policy": POLICY.to_dict(), "replica_devices": replica_devices,
                   "failover_devices": failover_devices, "sim_processes": 2, "late_devices": late_sizes,
                   "late_database": "postgresql", "max_catch_up": "500 (the server's default)",
                   "returning_server_args": args.server_arg}, results, goals)


if __name__ == "__main__":
    main()
