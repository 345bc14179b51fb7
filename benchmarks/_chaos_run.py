"""One chaos run: two `edgesdk server` replicas on PostgreSQL, a real mosquitto, a simulated fleet, a sequence of
rollouts, and faults on a seeded schedule; the history it records goes to the checker (benchmarks/_chaos_checker.py).

The rollouts, in order: 2.0.0 (good), 3.0.0 (every device fails its health check: the canary
aborts it), 4.0.0 (good), a signed rollback of the group to 2.0.0, 5.0.0 aborted by the operator
once its second stage is out, and 6.0.0 (good).

The faults (:data:`FAULT_KINDS`), drawn by ``random.Random(seed)`` with their times and targets:
kill -9 of a replica (restarted a moment later under the same name), a broker restart, a
PostgreSQL restart, a share of the devices cut off, crashing mid-install, receiving corrupted
chunks or handling commands late, and a replica restarted with its wall clock set wrong
(benchmarks/_planted_server.py --skew).
The schedule is a function of the seed alone: the same seed injects the same faults at the same
offsets into the same devices.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks._chaos_checker import History, Violation, check, minimal_history
from benchmarks._common import log
from benchmarks._fleet_servers import ServerProcess
from benchmarks.fleet_sim import SimulatedFleet
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.protocol import pack_bundle
from edgesdk.fleet.records import RolloutPolicy, RolloutState
from edgesdk.ota_server.broker import LocalMosquitto
from edgesdk.ota_server.postgres import LocalPostgres
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.runtime.signing import generate_keypair

__all__ = ["ChaosConfig", "ChaosResult", "FAULT_KINDS", "run_chaos", "schedule"]

FAULT_KINDS = ("kill_replica", "broker_restart", "pg_restart", "partition", "crash", "corrupt", "slow", "clock_skew")
MODEL, GROUP, INITIAL = "chaos", "chaos", "1.0.0"
BAD_VERSION = "3.0.0"
#: (what, version): ``deploy`` a version, ``rollback`` the group to one, ``abort`` one once its second stage is out.
SEQUENCE = (("deploy", "2.0.0"), ("deploy", BAD_VERSION), ("deploy", "4.0.0"), ("rollback", "2.0.0"),
            ("abort", "5.0.0"), ("deploy", "6.0.0"))
POLICY = RolloutPolicy(canary=0.05, waves=(0.3, 1.0), health_window_s=1.0, max_failure_rate=0.05,
                       deploy_timeout_s=30.0)


def policy_for(devices: int) -> RolloutPolicy:
    """:data:`POLICY`, with a deploy timeout that grows with the fleet: a stage of thousands of devices takes
    this 2-core host longer to send, fetch and report than 30 s (12 ms per device, 30 s at least)."""
    return replace(POLICY, deploy_timeout_s=max(POLICY.deploy_timeout_s, 0.012 * devices))


@dataclass(frozen=True)
class ChaosConfig:
    """The size of a run, its seed, and its timings."""

    devices: int = 1000
    seed: int = 1
    faults: int = 24
    #: The faults fall within this many seconds of the first rollout's start.
    horizon_s: float = 60.0
    lease_s: float = 3.0
    processes: int = 2
    #: A bug planted in both replicas (benchmarks/_planted_server.py), or None.
    plant: str | None = None
    #: After the last rollout: how long to wait for the server's view to settle on the devices'.
    settle_s: float = 60.0


@dataclass
class ChaosResult:
    """What a run did and what the checker found."""

    seed: int
    devices: int
    wall_s: float
    faults: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]
    violations: list[Violation]
    minimal: list[list[str]] = field(default_factory=list)
    #: The whole history (not printed: look into it when a violation needs more than the minimal history).
    history: History | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as the benchmark prints it (the first 20 violations, the minimal history of the first 5)."""
        return {"seed": self.seed, "devices": self.devices, "wall_s": round(self.wall_s, 1),
                "faults": len(self.faults), "fault_kinds": sorted({f["kind"] for f in self.faults}),
                "rollouts": self.rollouts, "checker_passed": not self.violations,
                "violations": len(self.violations),
                "violations_by_invariant": dict(Counter(v.invariant for v in self.violations)),
                "first_violations": [str(v) for v in self.violations[:20]],
                "minimal_history": self.minimal[:5], "schedule": self.faults}


def schedule(config: ChaosConfig, device_ids: list[str]) -> list[dict[str, Any]]:
    """The seeded fault schedule: every kind once (when there are enough), the rest drawn; sorted by time."""
    rng = random.Random(config.seed)
    kinds = list(FAULT_KINDS[:config.faults]) + [rng.choice(FAULT_KINDS) for _ in range(config.faults - len(FAULT_KINDS))]
    faults = []
    for kind in kinds:
        fault: dict[str, Any] = {"kind": kind, "at_s": round(rng.uniform(1.0, config.horizon_s), 2)}
        if kind in ("kill_replica", "clock_skew"):
            fault["replica"] = rng.randrange(2)
            fault["down_s"] = round(rng.uniform(0.5, 2.0), 2)
            if kind == "clock_skew":
                fault["skew_s"] = round(rng.choice((-1, 1)) * rng.uniform(2, 5) * config.lease_s, 1)
        elif kind in ("broker_restart", "pg_restart"):
            fault["down_s"] = round(rng.uniform(0.5, 2.0), 2)
        else:
            share = rng.uniform(0.02, 0.06)
            fault["ids"] = sorted(rng.sample(device_ids, max(1, int(share * len(device_ids)))))
            fault["params"] = {"partition": lambda: {"seconds": round(rng.uniform(2, 8), 1)},
                               "crash": lambda: {"seconds": round(rng.uniform(1, 4), 1)},
                               "corrupt": lambda: {"chunks": rng.randint(1, 3)},
                               "slow": lambda: {"seconds": round(rng.uniform(5, 15), 1),
                                                "delay_s": round(rng.uniform(0.5, 2), 1)}}[kind]()
        faults.append(fault)
    return sorted(faults, key=lambda f: f["at_s"])


class _Replicas:
    """The two server replicas: killed, restarted (the same name), and restarted with a skewed clock."""

    def __init__(self, work: Path, broker_url: str, db: str, lease_s: float, plant: str | None) -> None:
        self._args = (work, broker_url, db, work / "keys")
        self._lease, self._lock, self._plant = f"{lease_s}s", threading.Lock(), plant
        self._skew = [0.0, 0.0]
        self.servers = [self._start(i) for i in range(2)]

    def _start(self, i: int) -> ServerProcess:
        import sys

        options = [*(["--bug", self._plant] if self._plant else []), *(["--skew", str(self._skew[i])]
                                                                       if self._skew[i] else [])]
        program = (sys.executable, str(Path(__file__).with_name("_planted_server.py")), *options) if options else None
        return ServerProcess(*self._args, f"chaos-r{i}", replica=True, lease=self._lease, program=program)

    def restart(self, i: int, down_s: float, kill: bool = True, skew_s: float | None = None) -> None:
        with self._lock:
            if kill:
                self.servers[i].kill()
            time.sleep(down_s)
            if skew_s is not None:  # its host's clock is wrong from now on, across restarts
                self._skew[i] = skew_s
            self.servers[i] = self._start(i)

    def client(self) -> Any:
        """The admin API of a replica that is up."""
        with self._lock:
            for server in self.servers:
                if server.process.poll() is None:
                    return server.client
        raise EdgeSDKError("no replica is up")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class _Recorder(threading.Thread):
    """Polls the database for each started rollout's targets and keeps every status change."""

    def __init__(self, db: FleetDB, history: History) -> None:
        super().__init__(name="chaos-recorder", daemon=True)
        self.db, self.history, self.done = db, history, threading.Event()

    def poll(self) -> None:
        for rollout_id in list(self.history.started):
            try:
                r = self.db.rollout(rollout_id)
            except Exception:  # the database is restarting: the next poll reads it
                return
            if r is None:
                continue
            self.history.planned_targets.setdefault(rollout_id, len(r.targets))
            for t in r.targets:
                seen = self.history.target_statuses.setdefault((rollout_id, t.device_id), [])
                if not seen or seen[-1] != t.status.value:
                    seen.append(t.status.value)

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.poll()


def _bundles(work: Path) -> dict[str, bytes]:
    import numpy as np

    from edgesdk.runtime.bundle import BundleSpec, HealthCheck
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.runtime.signing import load_private_key
    from edgesdk.testing import random_mlp, write_mlp_onnx

    key = load_private_key(work / "keys" / "converter.key")
    archives = {}
    for seed, version in enumerate(sorted({v for _, v in SEQUENCE} | {INITIAL})):
        model = write_mlp_onnx(random_mlp([32, 16, 4], seed=seed), work / f"m{seed}.onnx")
        spec = BundleSpec(MODEL, version, "onnx-fp32", "generic-x86_64", "latency",
                          health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
        x = np.random.default_rng(seed).standard_normal((1, 32)).astype(np.float32)
        bundle_from_model(work / f"bundle-{version}", model, spec, {"input": x}, private_key=key)
        archives[version] = pack_bundle(work / f"bundle-{version}")
    return archives


def run_chaos(config: ChaosConfig, work: Path) -> ChaosResult:
    """Run the sequence under the seed's faults in ``work``; the history checked."""
    generate_keypair(work / "keys", "server")
    generate_keypair(work / "keys", "converter")
    archives = _bundles(work)
    pg = LocalPostgres(work / "postgres", durable=True, settings={"max_connections": "100"})
    broker = LocalMosquitto(work / "broker", max_open_files=config.devices + 4096)
    db_url = pg.create_database("fleet")
    replicas = _Replicas(work, broker.url, db_url, config.lease_s, config.plant)
    fleet = SimulatedFleet(broker.url, work / "keys" / "server.pub", config.devices, group=GROUP, id_prefix="c",
                           processes=config.processes, model=MODEL, version=INITIAL, broadcast_wait_s=1.0,
                           retry_interval_s=1.0, bad_versions=(BAD_VERSION,))
    history = History(initial_version=INITIAL)
    faults = schedule(config, fleet.device_ids)
    history.faults = faults
    db = FleetDB(db_url)
    recorder = _Recorder(db, history)
    rollouts: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        fleet.start(timeout=120)
        _wait(lambda: replicas.client().device_page(GROUP, status="online", limit=1).total == config.devices, 120,
              "every device online")
        for version, archive in archives.items():
            if version != INITIAL:
                replicas.client().upload(archive)
        injector = threading.Thread(target=_inject, args=(faults, replicas, broker, pg, fleet), daemon=True,
                                    name="chaos-faults")
        recorder.start()
        injector.start()
        for step in SEQUENCE:
            rollouts.append(_run_step(step, replicas, history, rollouts, policy_for(config.devices)))
        injector.join(config.horizon_s + 60)
        _settle(db, fleet, config.settle_s)
        recorder.poll()
        _collect(db, history, fleet)
    finally:
        recorder.done.set()
        fleet.stop()
        replicas.stop()
        broker.stop()
        db.close()
        pg.stop()
    violations = check(history)
    return ChaosResult(config.seed, config.devices, time.monotonic() - started, faults, rollouts, violations,
                       [minimal_history(history, v) for v in violations[:5]], history)


def _run_step(step: tuple[str, str], replicas: _Replicas, history: History, done: list[dict[str, Any]],
              policy: RolloutPolicy) -> dict[str, Any]:
    what, version = step
    began = time.monotonic()
    if what == "rollback":
        last = next((r["id"] for r in reversed(done) if r["state"] == "completed"), done[-1]["id"])
        rollout_id = _retry(lambda: replicas.client().act(last, "rollback", version))
    else:
        rollout_id = _retry(lambda: replicas.client().start_rollout(MODEL, version, GROUP, policy))
    history.started.append(rollout_id)
    aborted = False
    while True:
        r = _retry(lambda: replicas.client().rollout(rollout_id, limit=0))
        # Each stage may take its deploy timeout and health window; 120 s more for the faults on top.
        history.deadline_s.setdefault(rollout_id, r.stage_count * (r.policy.deploy_timeout_s
                                                                   + r.policy.health_window_s) + 120)
        if what == "abort" and not aborted and r.state == RolloutState.RUNNING and r.stage >= 1:
            _retry(lambda: replicas.client().act(rollout_id, "abort"))
            aborted = True
        if r.state != RolloutState.RUNNING:
            break
        if time.monotonic() - began > history.deadline_s[rollout_id] + 60:
            break  # the checker reports it stuck
        time.sleep(0.2)
    log(f"  {what} {version}: {rollout_id} {r.state.value} in {time.monotonic() - began:.1f} s "
        f"{ {k.value: v for k, v in r.counts.items()} }")
    return {"id": rollout_id, "what": what, "version": version, "state": r.state.value,
            "seconds": round(time.monotonic() - began, 1), "counts": {k.value: v for k, v in r.counts.items()}}


def _inject(faults: list[dict[str, Any]], replicas: _Replicas, broker: LocalMosquitto, pg: LocalPostgres,
            fleet: SimulatedFleet) -> None:
    start = time.monotonic()
    for fault in faults:
        time.sleep(max(0.0, start + fault["at_s"] - time.monotonic()))
        kind = fault["kind"]
        try:
            if kind == "kill_replica":
                replicas.restart(fault["replica"], fault["down_s"])
            elif kind == "clock_skew":
                replicas.restart(fault["replica"], fault["down_s"], skew_s=fault["skew_s"])
            elif kind == "broker_restart":
                broker.restart(down_s=fault["down_s"])
            elif kind == "pg_restart":
                pg.restart(down_s=fault["down_s"])
            else:
                fault["reached"] = fleet.fault(kind, fault["ids"], **fault["params"])
            fault["done_s"] = round(time.monotonic() - start, 2)
        except Exception as exc:  # a fault that could not be applied is reported, and the run goes on
            fault["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  fault at {fault['at_s']:.1f} s: {kind} {fault.get('error', '')}")


def _settle(db: FleetDB, fleet: SimulatedFleet, timeout: float) -> None:
    """Wait until the server lists as many devices online on each version as the devices say they run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            listed = Counter(d.version for d in db.devices(GROUP, status="online"))
            if listed == Counter({v: n for v, n in fleet.versions().items() if n}):
                return
        except Exception:  # the database restarting
            pass
        time.sleep(1.0)


def _collect(db: FleetDB, history: History, fleet: SimulatedFleet) -> None:
    """The database's rollouts, events and devices, and the devices' own logs (the fleet stops here)."""
    for rollout_id in history.started:
        r = _retry(lambda rid=rollout_id: db.rollout(rid))
        if r is not None:
            history.rollouts[rollout_id] = r
    history.events = [{"ts": e.ts, "type": e.type, "rollout_id": e.rollout_id, "device_id": e.device_id,
                       "payload": e.payload} for e in db.events()]
    history.server_view = {d.id: (d.status, d.version) for d in db.devices(GROUP)}
    report = fleet.stop()
    history.install_log, history.final = report.install_log, report.final
    for r in history.rollouts.values():  # targets never polled (a rollout that ended between polls)
        for t in r.targets:
            history.target_statuses.setdefault((r.id, t.device_id), [t.status.value])


def _retry(call: Any, attempts: int = 60) -> Any:
    """``call()``, tried again while a replica or the database restarts."""
    for attempt in range(attempts):
        try:
            return call()
        except (EdgeSDKError, OSError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise EdgeSDKError(f"chaos run: no {what} after {timeout:g} s")
        time.sleep(0.2)
