"""The chaos run's faults: the seeded schedule, and the injector that applies each fault and records what it did.

Faults fall at a time (``at_s`` after the first rollout starts) or at a step of the rollout
sequence (``step``: ``before`` its push, or ``during`` it, ``delay_s`` after the push):

- ``kill_replica``: kill -9 of a replica, restarted a moment later under the same name. The kill
  goes to the lease holder of a running rollout when one runs; the first kill falls during a
  rollout that goes through all its stages and must hit its holder.
- ``clock_skew``: a replica restarted with its wall clock set wrong (benchmarks/fleet/planted_server.py).
- ``broker_restart``, ``pg_restart``: mosquitto, PostgreSQL down for ``down_s``.
- ``partition``, ``slow``: devices cut off, or handling commands late (benchmarks/shared/fleet_sim_faults.py).
- ``duty``: devices sleeping on a duty cycle from before a push, across the rollouts after it.
- ``crash``, ``corrupt``: armed on devices just before a push, so the push's install crashes them
  and its chunks reach them corrupted.
- ``offline_at_push``: devices cut off just before a push (the first: the last push; the others: a
  push whose rollout sends every stage) and kept off until its rollout has ended, back ``back_s``
  later: they are deferred, and only the reconciler brings them the release.
- ``join``: a second simulated fleet provisioned into the group during the last push.
- ``claim_group``: a device that reports another group from before the first push; the run then
  asks for a push to that group, which the server must refuse (the group has no device).

Every fault records when it was applied (``applied_at``, wall clock), what it reached, and the
windows its devices were offline in (``History.offline``): the checker needs them to tell which
devices were online long enough to be judged, and :func:`benchmarks.fleet.chaos_checker.fault_effects`
whether the fault took effect.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.fleet.chaos_checker import ALL, History
from benchmarks.shared.common import log
from benchmarks.shared.fleet_sim import SimulatedFleet
from edgesdk.errors import ConflictError, EdgeSDKError

if TYPE_CHECKING:
    from benchmarks.fleet.chaos_run import ChaosConfig, Replicas

__all__ = ["FAULT_KINDS", "Injector", "schedule"]

FAULT_KINDS = ("kill_replica", "broker_restart", "pg_restart", "partition", "crash", "corrupt", "slow", "clock_skew",
               "duty", "claim_group", "offline_at_push", "join")
#: Kinds drawn again for the faults beyond one of each.
REPEATABLE = tuple(k for k in FAULT_KINDS if k not in ("claim_group", "join"))
#: The group a ``claim_group`` device names instead of its own.
CLAIMED_GROUP = "chaos-other"
#: Seconds a device takes to reconnect after its cut ends (a broker restart: this plus one per 100 devices).
RECONNECT_S = 5.0


def schedule(config: ChaosConfig, device_ids: list[str], sequence: tuple[tuple[str, str], ...],
             bad_version: str) -> list[dict[str, Any]]:
    """The seeded fault schedule: every kind once (when there are enough), the rest drawn; a function of the seed.
    Timed faults come sorted by time, then the step-anchored ones."""
    rng = random.Random(config.seed)
    kinds = list(config.kinds or FAULT_KINDS)
    chosen = kinds[:config.faults] + [rng.choice([k for k in kinds if k in REPEATABLE] or kinds)
                                      for _ in range(config.faults - len(kinds))]
    good = [i for i, (what, version) in enumerate(sequence) if what == "deploy" and version != bad_version]
    #: Steps whose rollouts send every stage (the devices offline at a push are ordered last, into the last stage).
    complete = [i for i, (what, version) in enumerate(sequence) if what in ("deploy", "rollback")
                and version != bad_version]
    last = len(sequence) - 1
    claimant = rng.choice(device_ids)
    pool = [d for d in device_ids if d != claimant]
    seen: set[str] = set()

    def ids(low: float, high: float) -> list[str]:
        return sorted(rng.sample(pool, max(1, int(rng.uniform(low, high) * len(pool)))))

    faults = []
    for kind in chosen:
        first = kind not in seen
        seen.add(kind)
        fault: dict[str, Any] = {"kind": kind}
        if kind == "kill_replica" and first:
            fault.update(step=rng.choice(good), when="during", delay_s=round(rng.uniform(0.3, 1.5), 2),
                         must_hit_holder=True)
        elif kind in ("crash", "corrupt"):
            fault.update(step=rng.choice(good), when="before")
        elif kind == "offline_at_push":
            fault.update(step=last if first else rng.choice(complete), when="before")
        elif kind == "duty":  # asleep and awake across the rollouts after it
            fault.update(step=rng.randrange(len(sequence) - 1), when="before")
        elif kind == "join":
            fault.update(step=last, when="during", delay_s=round(rng.uniform(0.0, 3.0), 2), devices=config.join)
        elif kind == "claim_group":
            fault.update(step=0, when="before", ids=[claimant], params={"group": CLAIMED_GROUP})
        else:
            fault["at_s"] = round(rng.uniform(1.0, config.horizon_s), 2)
        if kind in ("kill_replica", "clock_skew"):
            fault["replica"] = rng.randrange(2)
            fault["down_s"] = round(rng.uniform(0.5, 2.0), 2)
            if kind == "clock_skew":
                fault["skew_s"] = round(rng.choice((-1, 1)) * rng.uniform(2, 5) * config.lease_s, 1)
        elif kind in ("broker_restart", "pg_restart"):
            fault["down_s"] = round(rng.uniform(0.5, 2.0), 2)
        elif kind in ("partition", "crash", "corrupt", "slow"):
            fault["ids"] = ids(0.02, 0.06)
            fault["params"] = {"partition": lambda: {"seconds": round(rng.uniform(2, 8), 1)},
                               "crash": lambda: {"seconds": round(rng.uniform(1, 4), 1)},
                               "corrupt": lambda: {"chunks": rng.randint(1, 3)},
                               "slow": lambda: {"seconds": round(rng.uniform(5, 15), 1),
                                                "delay_s": round(rng.uniform(0.5, 2), 1)}}[kind]()
        elif kind == "duty":
            fault["ids"] = ids(0.01, 0.03)
            fault["params"] = {"awake_s": round(rng.uniform(2, 4), 1), "sleep_s": round(rng.uniform(2, 4), 1),
                               "cycles": rng.randint(2, 3)}
        elif kind == "offline_at_push":
            fault["ids"] = ids(0.02, 0.05)
            fault["back_s"] = round(rng.uniform(1, 4), 1)
        faults.append(fault)
    return sorted(faults, key=lambda f: (f.get("at_s", float("inf")), f.get("step", 0)))


class Injector:
    """Applies the schedule: timed faults from a thread, step faults when the run reaches their step."""

    def __init__(self, config: ChaosConfig, faults: list[dict[str, Any]], history: History, replicas: Replicas,
                 broker: Any, pg: Any, fleet: SimulatedFleet, db: Any, work: Path, fleet_args: dict[str, Any]) -> None:
        self.config, self.faults, self.history = config, faults, history
        self.replicas, self.broker, self.pg, self.fleet, self.db = replicas, broker, pg, fleet, db
        self.work, self.fleet_args = work, fleet_args
        #: Fleets provisioned during the run (``join``).
        self.joined: list[SimulatedFleet] = []
        self._threads: list[threading.Thread] = []
        self._held: dict[int, list[tuple[dict[str, Any], threading.Event]]] = {}
        self._lock = threading.Lock()
        self._start = 0.0

    # when ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the timed faults' clock (the first rollout starts now)."""
        self._start = time.monotonic()
        self._spawn(self._timed, "chaos-faults")

    def before(self, step: int) -> None:
        """Apply the faults due before ``step``'s push."""
        for fault in self._at(step, "before"):
            if fault["kind"] == "offline_at_push":
                released = threading.Event()
                self._held.setdefault(step, []).append((fault, released))
                self._apply(fault, self._hold, fault, released)
            else:
                self._apply(fault, self._device_fault, fault)

    def pushed(self, step: int, rollout_id: str) -> None:
        """``step``'s rollout started: note it, and start the faults due during it."""
        for fault in self._at(step, None):
            fault["rollout_id"] = rollout_id
            if fault["when"] == "during":
                self._spawn(self._later, f"chaos-{fault['kind']}", fault)

    def ended(self, step: int) -> None:
        """``step``'s rollout ended: devices held off since its push may come back."""
        for _, released in self._held.pop(step, []):
            released.set()

    def join(self, timeout: float) -> None:
        """Wait for the faults still being applied (the held partitions are released first)."""
        for step in list(self._held):
            self.ended(step)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _at(self, step: int, when: str | None) -> list[dict[str, Any]]:
        return [f for f in self.faults if f.get("step") == step and (when is None or f["when"] == when)]

    def _timed(self) -> None:
        for fault in [f for f in self.faults if "at_s" in f]:
            time.sleep(max(0.0, self._start + fault["at_s"] - time.monotonic()))
            kind = fault["kind"]
            if kind in ("kill_replica", "clock_skew"):
                self._apply(fault, self._kill, fault)
            elif kind in ("broker_restart", "pg_restart"):
                self._apply(fault, self._restart, fault)
            else:
                self._apply(fault, self._device_fault, fault)

    def _later(self, fault: dict[str, Any]) -> None:
        time.sleep(fault["delay_s"])
        self._apply(fault, self._kill if fault["kind"] == "kill_replica" else self._join, fault)

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _apply(self, fault: dict[str, Any], action: Any, *args: Any) -> None:
        fault["applied_at"] = time.time()
        try:
            action(*args)
            fault["done_s"] = round(time.monotonic() - self._start, 2)
        except Exception as exc:  # a fault that could not be applied is reported, and the run goes on
            fault["error"] = f"{type(exc).__name__}: {exc}"
        where = f"at {fault['at_s']:.1f} s" if "at_s" in fault else f"{fault['when']} step {fault['step'] + 1}"
        log(f"  fault {where}: {fault['kind']} {fault.get('error', '')}")

    def _offline(self, key: str | list[str], begin: float, end: float) -> None:
        with self._lock:
            for device in [key] if isinstance(key, str) else key:
                self.history.offline.setdefault(device, []).append((begin, end))

    # what ---------------------------------------------------------------------------------------
    def _device_fault(self, fault: dict[str, Any]) -> None:
        kind, params = fault["kind"], fault.get("params", {})
        fault["reached"] = self.fleet.fault(kind, fault["ids"], **params)
        now = time.time()
        if kind == "partition":
            self._offline(fault["ids"], fault["applied_at"], now + params["seconds"] + RECONNECT_S)
        elif kind == "duty":
            span = params["cycles"] * (params["awake_s"] + params["sleep_s"])
            self._offline(fault["ids"], fault["applied_at"], now + span + RECONNECT_S)
        elif kind == "claim_group":
            self.history.claims.update(dict.fromkeys(fault["ids"], params["group"]))
            self._spawn(self._push_to, "chaos-claimed-push", fault)

    def _push_to(self, fault: dict[str, Any]) -> None:
        """Ask for a rollout to the group a device claimed (which has no device but the one claiming it, whose claim
        the server has had a second to read); note what the server said."""
        from benchmarks.fleet.chaos_run import MODEL, POLICY

        time.sleep(1.0)
        group, version = fault["params"]["group"], sorted(v for _, v in self.fleet_args["sequence"])[0]
        for _ in range(20):
            try:
                rollout_id = self.replicas.client().start_rollout(MODEL, version, group, POLICY)
            except ConflictError as exc:
                fault["push"] = f"refused: {exc}"
                return
            except (EdgeSDKError, OSError):  # no replica up just now
                time.sleep(0.5)
                continue
            r = self.replicas.client().rollout(rollout_id)
            self.history.other_rollouts[rollout_id] = r
            try:
                self.replicas.client().act(rollout_id, "abort")
            except EdgeSDKError:
                pass
            fault["push"] = f"started {rollout_id} with {len(r.targets)} targets"
            return

    def _hold(self, fault: dict[str, Any], released: threading.Event) -> None:
        """Cut the devices off, and keep them off until ``released``; they come back ``back_s`` after it."""
        fault["reached"] = self.fleet.fault("partition", fault["ids"], seconds=3.0)

        def keep() -> None:
            while not released.wait(1.0):
                self.fleet.fault("partition", fault["ids"], seconds=3.0)
            self.fleet.fault("partition", fault["ids"], seconds=fault["back_s"])
            fault["released_at"] = time.time()
            self._offline(fault["ids"], fault["applied_at"], fault["released_at"] + fault["back_s"] + RECONNECT_S)

        self._spawn(keep, "chaos-hold")

    def _restart(self, fault: dict[str, Any]) -> None:
        if fault["kind"] == "broker_restart":
            self.broker.restart(down_s=fault["down_s"])
            self._offline(ALL, fault["applied_at"], time.time() + RECONNECT_S * (2 + self.config.devices / 500))
        else:
            self.pg.restart(down_s=fault["down_s"])

    def _kill(self, fault: dict[str, Any]) -> None:
        """Kill the lease holder of a running rollout if one runs (a fault meant for it waits up to 3 s for one),
        else the scheduled replica; restart it after ``down_s``."""
        deadline = time.monotonic() + (3.0 if fault.get("must_hit_holder") else 0.0)
        holder = None
        while fault["kind"] == "kill_replica":  # a clock skew goes to the scheduled replica
            holder = self._holder()
            if holder is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        names = [s.name for s in self.replicas.servers]
        replica = names.index(holder[1]) if holder is not None and holder[1] in names else fault["replica"]
        fault["killed"] = names[replica]
        if fault["kind"] == "kill_replica":
            fault["hit_holder"] = holder[0] if holder is not None else None
        self.replicas.restart(replica, fault["down_s"], skew_s=fault.get("skew_s"))

    def _holder(self) -> tuple[str, str] | None:
        """(rollout, holder) of a running rollout whose lease is valid now, or None."""
        try:
            rows = self.db.sql.rows("SELECT id, lease_holder FROM rollouts WHERE state = 'running' AND lease_holder IS "
                                    "NOT NULL AND lease_expires >= ? ORDER BY id", (self.db.now(),))
        except Exception:  # the database restarting
            return None
        return (rows[0]["id"], rows[0]["lease_holder"]) if rows else None

    def _join(self, fault: dict[str, Any]) -> None:
        """Provision ``devices`` new devices into the group: a second fleet, started now."""
        args = {k: v for k, v in self.fleet_args.items() if k != "sequence"}
        fleet = SimulatedFleet(args.pop("broker_url"), args.pop("key"), fault["devices"], id_prefix="j",
                               processes=1, **args)
        self.joined.append(fleet)
        fleet.start(timeout=120)
        now = time.time()
        fault["ids"], fault["joined"] = list(fleet.device_ids), len(fleet.device_ids)
        with self._lock:
            self.history.joined.update(dict.fromkeys(fleet.device_ids, now))
