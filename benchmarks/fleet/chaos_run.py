"""One chaos run: two `edgesdk server` replicas on PostgreSQL, a real mosquitto, a simulated fleet, a sequence of
rollouts, and faults on a seeded schedule; the history it records goes to the checker (benchmarks/fleet/chaos_checker.py).

The rollouts, in order: 2.0.0 (good), 3.0.0 (every device fails its health check: the canary
aborts it), 4.0.0 (good), a signed rollback of the group to 2.0.0, 5.0.0 aborted by the operator
once its second stage is out, and 6.0.0 (good). The run records each step, and how its rollout
ended, by its own clock: the checker derives the group's release from that.

The faults (benchmarks/fleet/chaos_faults.py, :data:`FAULT_KINDS`), drawn by ``random.Random(seed)``
with their times, steps and targets: replica kills (of the lease holder of a running rollout), a
broker restart, a PostgreSQL restart, devices cut off, crashing mid-install, receiving corrupted
chunks, handling commands late, sleeping on a duty cycle, offline at a push, provisioned during
the run, or naming another group, and a replica restarted with its wall clock set wrong
(benchmarks/fleet/planted_server.py --skew). The schedule is a function of the seed alone.

After the last step the run waits until every device has been online ``converge_s`` seconds since
it last came back (or the fleet has converged), then stops the fleets and hands the history over.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.fleet.chaos_checker import History, Violation, check, fault_effects, minimal_history, releases
from benchmarks.fleet.chaos_faults import FAULT_KINDS, RECONNECT_S, Injector, schedule
from benchmarks.fleet.fleet_servers import ServerProcess
from benchmarks.shared.common import log
from benchmarks.shared.fleet_sim import SimulatedFleet
from benchmarks.shared.polling import wait_until
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.broker import LocalMosquitto
from edgesdk.ota_server.postgres import LocalPostgres
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.runtime.signing import generate_keypair

__all__ = ["ChaosConfig", "ChaosResult", "FAULT_KINDS", "Replicas", "run_chaos", "schedule"]

MODEL, GROUP, INITIAL = "chaos", "chaos", "1.0.0"
BAD_VERSION = "3.0.0"
#: (what, version): ``deploy`` a version, ``rollback`` the group to one, ``abort`` one once its second stage is out.
SEQUENCE = (("deploy", "2.0.0"), ("deploy", BAD_VERSION), ("deploy", "4.0.0"), ("rollback", "2.0.0"),
            ("abort", "5.0.0"), ("deploy", "6.0.0"))
#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
POLICY = RolloutPolicy(analysis=False, canary=0.05, waves=(0.3, 1.0), health_window_s=1.0, max_failure_rate=0.05,
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
    #: The timed faults fall within this many seconds of the first rollout's start.
    horizon_s: float = 60.0
    lease_s: float = 3.0
    processes: int = 2
    #: A bug planted in both replicas (benchmarks/fleet/planted_server.py), or None.
    plant: str | None = None
    #: After the last rollout: how long to wait, beyond the convergence time, for the server's view to settle.
    settle_s: float = 60.0
    #: A device online this long after the group's release changed must run it (the checker's ``convergence``).
    converge_s: float = 30.0
    #: Devices a ``join`` fault provisions into the group during the run (0: a tenth of ``devices``).
    join_devices: int = 0
    #: The fault kinds to draw from (None: all of FAULT_KINDS).
    kinds: tuple[str, ...] | None = None

    @property
    def join(self) -> int:
        """How many devices a ``join`` fault provisions."""
        return self.join_devices or max(5, self.devices // 10)


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
    #: Whether each fault took effect (benchmarks.fleet.chaos_checker.fault_effects).
    effects: list[dict[str, Any]] = field(default_factory=list)
    #: Stage moves and rollout ends the servers' compare-and-set refused (a second driver's, or a stale one's).
    refused_moves: int = 0
    plant: str | None = None
    #: Seconds of the run's phases: setup (servers, fleet, uploads), the steps, the wait for the fleet to settle.
    phases: dict[str, float] = field(default_factory=dict)
    #: The whole history (not printed: look into it when a violation needs more than the minimal history).
    history: History | None = None

    @property
    def ineffective(self) -> list[dict[str, Any]]:
        """The faults that were scheduled and had no effect."""
        return [e for e in self.effects if not e["effective"]]

    def to_json(self) -> dict[str, Any]:
        """The run as the benchmark prints it (the first 20 violations, the minimal history of the first 5)."""
        devices = len(self.history.final) if self.history is not None else self.devices
        return {"seed": self.seed, "devices": self.devices, "devices_at_end": devices, "plant": self.plant,
                "wall_s": round(self.wall_s, 1), "phases": self.phases, "faults": len(self.faults),
                "fault_kinds": sorted({f["kind"] for f in self.faults}),
                "faults_effective": sum(e["effective"] for e in self.effects),
                "faults_ineffective": self.ineffective, "refused_moves": self.refused_moves,
                "rollouts": self.rollouts, "checker_passed": not self.violations,
                "violations": len(self.violations),
                "violations_by_invariant": dict(Counter(v.invariant for v in self.violations)),
                "first_violations": [str(v) for v in self.violations[:20]],
                "stages_sent_twice": sum("sent more than once" in v.detail for v in self.violations),
                "minimal_history": self.minimal[:5], "effects": self.effects, "schedule": self.faults}


class Replicas:
    """The two server replicas: killed, restarted (the same name), and restarted with a skewed clock."""

    def __init__(self, work: Path, broker_url: str, db: str, lease_s: float, plant: str | None) -> None:
        self._args = (work, broker_url, db, work / "keys")
        self._lease, self._plant = f"{lease_s}s", plant
        #: One restart of a replica at a time (a timed kill and a step's kill may fall together).
        self._locks = [threading.Lock(), threading.Lock()]
        self._skew = [0.0, 0.0]
        with ThreadPoolExecutor(2) as pool:  # each start waits for its server to answer: side by side
            self.servers = list(pool.map(self._start, range(2)))

    def _start(self, i: int) -> ServerProcess:
        import sys

        options = [*(["--bug", self._plant] if self._plant else []), *(["--skew", str(self._skew[i])]
                                                                       if self._skew[i] else [])]
        program = (sys.executable, str(Path(__file__).with_name("planted_server.py")), *options) if options else None
        return ServerProcess(*self._args, f"chaos-r{i}", replica=True, lease=self._lease, program=program)

    def restart(self, i: int, down_s: float, kill: bool = True, skew_s: float | None = None) -> None:
        """Kill replica ``i`` (unless ``kill`` is False), and start it again after ``down_s`` (with its clock
        ``skew_s`` off from then on, if given)."""
        with self._locks[i]:
            if kill:
                self.servers[i].kill()
            time.sleep(down_s)
            if skew_s is not None:  # its host's clock is wrong from now on, across restarts
                self._skew[i] = skew_s
            self.servers[i] = self._start(i)

    def client(self) -> Any:
        """The admin API of a replica that is up (the other one's, while one restarts)."""
        for server in list(self.servers):
            if server.process.poll() is None:
                return server.client
        raise EdgeSDKError("no replica is up")

    def stop(self) -> None:
        """Stop both replicas."""
        for server in self.servers:
            server.stop()

    def counter(self, name: str) -> float:
        """A Prometheus counter summed over the replicas that are up (each counts since its last start)."""
        total = 0.0
        for server in self.servers:
            try:
                total += sum(v for k, v in server.counters().items() if k.split("{")[0] == name)
            except OSError:
                pass
        return total

    def refused_moves(self) -> int:
        """Stage moves and rollout ends the compare-and-set refused, over both replicas' whole logs."""
        found = 0
        for server in self.servers:
            try:
                text = server.log_path.read_text(errors="replace")
            except OSError:
                continue
            found += text.count("lease lapsed or the rollout moved on") + text.count("another server moved it on")
        return found


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
    started = time.monotonic()
    generate_keypair(work / "keys", "server")
    generate_keypair(work / "keys", "converter")
    broker = LocalMosquitto(work / "broker", max_open_files=config.devices + config.join + 4096)

    def servers() -> tuple[LocalPostgres, str, Replicas]:
        pg = LocalPostgres(work / "postgres", durable=True, settings={"max_connections": "100"})
        db_url = pg.create_database("fleet")
        return pg, db_url, Replicas(work, broker.url, db_url, config.lease_s, config.plant)

    fleet = SimulatedFleet(broker.url, work / "keys" / "server.pub", config.devices, group=GROUP, id_prefix="c",
                           processes=config.processes, model=MODEL, version=INITIAL, broadcast_wait_s=1.0,
                           retry_interval_s=1.0, bad_versions=(BAD_VERSION,))
    with ThreadPoolExecutor(1) as pool:  # the database and the servers start while the bundles build
        up = pool.submit(servers)
        try:
            archives = _bundles(work)
            fleet.start(timeout=120)
            pg, db_url, replicas = up.result()
        except BaseException:
            fleet.stop()
            broker.stop()
            raise
    fleet_args = {"broker_url": broker.url, "key": work / "keys" / "server.pub", "group": GROUP, "model": MODEL,
                  "version": INITIAL, "broadcast_wait_s": 1.0, "retry_interval_s": 1.0,
                  "bad_versions": (BAD_VERSION,), "sequence": SEQUENCE}
    history = History(initial_version=INITIAL, converge_s=config.converge_s, group=GROUP)
    faults = schedule(config, fleet.device_ids, SEQUENCE, BAD_VERSION)
    history.faults = faults
    db = FleetDB(db_url)
    recorder = _Recorder(db, history)
    injector = Injector(config, faults, history, replicas, broker, pg, fleet, db, work, fleet_args)
    rollouts: list[dict[str, Any]] = []
    refused, phases = 0, {}
    try:
        wait_until(lambda: replicas.client().device_page(GROUP, status="online", limit=1).total == config.devices, 120,
                   "every device online", interval=0.2)
        for version, archive in archives.items():
            if version != INITIAL:
                replicas.client().upload(archive)
        history.began = time.time()
        phases["setup_s"] = round(time.monotonic() - started, 1)
        recorder.start()
        injector.start()
        history.actions = rollouts
        for i, step in enumerate(SEQUENCE):
            injector.before(i)
            rollouts.append(_run_step(step, replicas, history, rollouts, policy_for(config.devices),
                                      lambda rid, i=i: injector.pushed(i, rid)))
            injector.ended(i)
        injector.join(config.horizon_s + 120)
        phases["steps_s"] = round(time.monotonic() - started - phases["setup_s"], 1)
        _settle(db, [fleet, *injector.joined], history, config)
        phases["settle_s"] = round(time.monotonic() - started - phases["setup_s"] - phases["steps_s"], 1)
        recorder.poll()
        refused = replicas.refused_moves()
        for fault in faults:
            if fault["kind"] == "claim_group":
                fault["refused_states"] = replicas.counter("states_refused_group_total")
        _collect(db, history, [fleet, *injector.joined])
    finally:
        recorder.done.set()
        with ThreadPoolExecutor(4) as pool:  # each waits on processes to end
            list(pool.map(lambda stop: stop(), [replicas.stop, *(sim.stop for sim in [fleet, *injector.joined])]))
        broker.stop()
        db.close()
        if pg.process is not None:  # its data goes with the run: an immediate shutdown, not a checkpoint
            pg.process.send_signal(signal.SIGQUIT)
            pg.process.wait(timeout=30)
        pg.stop()
    _crash_windows(history)
    violations = check(history)
    return ChaosResult(config.seed, config.devices, time.monotonic() - started, faults, rollouts, violations,
                       [minimal_history(history, v) for v in violations[:5]], fault_effects(history), refused,
                       config.plant, phases, history)


def _run_step(step: tuple[str, str], replicas: Replicas, history: History, done: list[dict[str, Any]],
              policy: RolloutPolicy, pushed: Any) -> dict[str, Any]:
    what, version = step
    began, started_at = time.monotonic(), time.time()
    if what == "rollback":
        last = next((r["id"] for r in reversed(done) if r["state"] == "completed"), done[-1]["id"])
        rollout_id = _retry(lambda: replicas.client().act(last, "rollback", version))
    else:
        rollout_id = _retry(lambda: replicas.client().start_rollout(MODEL, version, GROUP, policy))
    history.started.append(rollout_id)
    pushed(rollout_id)
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
            "seconds": round(time.monotonic() - began, 1), "counts": {k.value: v for k, v in r.counts.items()},
            "started_at": started_at, "ended_at": time.time()}


def _settle(db: FleetDB, fleets: list[SimulatedFleet], history: History, config: ChaosConfig) -> None:
    """Wait until every device has been back ``converge_s`` since the release changed and since its last offline
    window (or every device runs the release already and no revert is out), and the server lists each device online
    on the version the device says it runs (the devices claiming another group aside: the server refuses their
    reports). Judged device by device: counts per version let a claiming device that runs the release stand in for
    another that does not yet, and the run ended while that one was installing (seed 7, +48.5 s)."""
    since, release = releases(history)[-1]
    ends = [end for windows in history.offline.values() for _, end in windows]
    judge_at = max([since, *ends, *history.joined.values()]) + config.converge_s + 1.0
    deadline = judge_at + config.settle_s
    while time.time() < deadline:
        try:
            running: dict[str, str | None] = {}
            for fleet in fleets:
                running.update(fleet.device_versions())
            judged = {d: v for d, v in running.items() if d not in history.claims}
            listed = {d.id: d.version for d in db.devices(GROUP, status="online")}
            agree = all(d in listed and listed[d] == v for d, v in judged.items())  # None == None: no install yet
            reverting = any(db.targets(rid, status=TargetStatus.REVERTING) for rid in history.started)
            converged = all(v == release for v in judged.values()) and not reverting
            if agree and (converged or time.time() >= judge_at):
                return
        except Exception:  # the database restarting
            pass
        time.sleep(1.0)


def _collect(db: FleetDB, history: History, fleets: list[SimulatedFleet]) -> None:
    """The database's rollouts, events and devices, and the devices' own logs (the fleets stop here)."""
    for rollout_id in history.started:
        r = _retry(lambda rid=rollout_id: db.rollout(rid))
        if r is not None:
            history.rollouts[rollout_id] = r
    history.events = [{"ts": e.ts, "type": e.type, "rollout_id": e.rollout_id, "device_id": e.device_id,
                       "payload": e.payload} for e in db.events()]
    devices = db.devices()
    history.server_view = {d.id: (d.status, d.version) for d in devices}
    history.server_groups = {d.id: d.group for d in devices}
    history.ended = time.time()
    counts: Counter[str] = Counter()
    for fleet in fleets:
        report = fleet.stop()
        history.install_log.update(report.install_log)
        history.final.update(report.final)
        counts.update(report.counts)
    history.sim_counts = dict(counts)
    for r in history.rollouts.values():  # targets never polled (a rollout that ended between polls)
        for t in r.targets:
            history.target_statuses.setdefault((r.id, t.device_id), [t.status.value])


def _crash_windows(history: History) -> None:
    """A crashed device was down from when its crash was armed until it finished the install on its restart."""
    for fault in history.faults:
        if fault["kind"] != "crash" or "applied_at" not in fault:
            continue
        for device in fault["ids"]:
            after = [entry[0] for entry in history.install_log.get(device, ()) if entry[0] > fault["applied_at"]]
            if after:
                history.offline.setdefault(device, []).append((fault["applied_at"], after[0] + RECONNECT_S))


def _retry(call: Any, attempts: int = 60) -> Any:
    """``call()``, tried again while a replica or the database restarts."""
    for attempt in range(attempts):
        try:
            return call()
        except (EdgeSDKError, OSError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
