"""The scenarios of benchmarks/fleet/rollout_safety.py, and one seeded run of one of them.

A run: the simulated fleet (:mod:`benchmarks.fleet.rollout_fleet_sim`) has served 1.0.0 for an
hour; each device's last state (every 300 s, at its own phase) is in a real :class:`FleetDB`
(SQLite in a temporary folder). 2.0.0 is pushed with a real :class:`RolloutEngine` (:data:`POLICY`),
a fake clock ticking each second, and a dispatcher that records whom it was asked to send to
(stages, late sends, re-sends). Devices commit 2 to 6 s after they were sent the release (their
``committed`` event through :meth:`RolloutEngine.on_event`, as the server's ingest does) and write
their states as the ingest writes them. A run ends when the rollout completed or aborted, when a
final inconclusive verdict paused it (``waiting_for_promote``), or after :data:`LIMIT_S` simulated
seconds (``running``: neither stopped nor promoted).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fleet.rollout_fleet_sim import (
    GROUP,
    MODEL,
    NEW,
    STATE_EVERY_S,
    Release,
    SimDevice,
    make_fleet,
)
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

__all__ = ["Scenario", "SCENARIOS", "POLICY", "JUDGE_S", "RATES", "THIN_RATES", "T0",
           "run_scenario"]

#: The policy of every run: the defaults (max p99 ratio 1.5, max error rate 1 point, min calls
#: 100, min evidence 50%, evidence grace 120 s, on_inconclusive pause, deploy timeout 300 s) with
#: a canary of 10%, waves 50,100 and a short health window.
POLICY = RolloutPolicy(canary=0.1, waves=(0.5, 1.0), health_window_s=60.0)
#: What the server's commands carry as ``judge_s`` (stage_sender): how long after its commit a
#: device reports at the fast cadence.
JUDGE_S = POLICY.deploy_timeout_s + POLICY.health_window_s + POLICY.evidence_grace_s
#: The apps' calls a second, lognormal per device (median, sigma); and in the thin scenarios.
RATES, THIN_RATES = (5.0, 0.6), (0.15, 0.5)
#: The fake clock at the push, and how long a run may last (simulated seconds).
T0, LIMIT_S = 1_000_000.0, 3600.0


@dataclass(frozen=True)
class Scenario:
    """One kind of release: ``kind`` is ``bad`` (must be stopped), ``healthy`` (must complete),
    ``thin`` (must end inconclusive) or ``control`` (reported, no goal of its own); ``liars``: a
    liar of each of these kinds in every stage; ``offline``: every device is offline at the push
    and returns within :data:`RETURN_S`."""

    name: str
    kind: str
    what: str
    release: Release = field(default_factory=Release)
    liars: tuple[str, ...] = ()
    offline: bool = False
    thin: bool = False
    #: The apps' call rates (median calls/s, sigma), when not :data:`RATES` (nor, ``thin``,
    #: :data:`THIN_RATES`).
    rates: tuple[float, float] | None = None

    @property
    def call_rates(self) -> tuple[float, float]:
        """The apps' call rates in this scenario: (median calls/s, lognormal sigma)."""
        return self.rates or (THIN_RATES if self.thin else RATES)


#: Devices of an all-offline group come back uniformly within this many seconds of the push.
RETURN_S = 600.0
_ORIN = frozenset({"jetson-orin-nano"})

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("p99_2x", "bad", "every call 2x slower (so its p99)", Release(latency=2.0)),
    Scenario("errors_2pt", "bad", "+2 points of failed calls", Release(errors=0.02)),
    Scenario("crash_loop", "bad", "the app crashes 1-4 s after each start and is restarted 10 s "
             "later", Release(crash_loop=True)),
    Scenario("one_board_2x", "bad", "2x slower on jetson-orin-nano only",
             Release(latency=2.0, boards=_ORIN)),
    Scenario("silent_canaries", "bad", "devices send no state after their commit",
             Release(silent=True)),
    Scenario("liar_hides_errors", "bad", "+2 points of errors; in each stage one device claims the "
             "most calls its window allows, none failed", Release(errors=0.02), liars=("hide",)),
    Scenario("liar_forces_abort", "healthy", "a healthy release; in each stage one device claims "
             "half its calls failed and a 1 s p99", liars=("abort",)),
    Scenario("offline_push", "bad", "every call 2x slower, pushed while every device is offline; "
             "they return within 10 minutes", Release(latency=2.0), offline=True),
    Scenario("healthy_with_liars", "healthy", "a healthy release with both liars in each stage",
             liars=("hide", "abort")),
    Scenario("thin_healthy", "thin", "a healthy release; apps serve ~0.15 calls/s", thin=True),
    Scenario("thin_bad", "thin", "every call 2x slower; apps serve ~0.15 calls/s",
             Release(latency=2.0), thin=True),
    Scenario("healthy", "control", "a healthy release, no liar"),
    Scenario("offline_healthy", "control", "a healthy release pushed while every device is offline",
             offline=True),
    Scenario("healthy_busy", "control", "a healthy release, no liar; apps serve ~20 calls/s "
             "(windows not thin)", rates=(20.0, 0.6)),
)


class Dispatcher:
    """The engine's dispatcher: records whom it was asked to send the release to (stages, late
    sends, re-sends)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.late = 0

    def send_stage(self, rollout: Any, stage: int, targets: list[Any]) -> None:
        self.sent.extend(t.device_id for t in targets)

    def resend(self, rollout: Any, stage: int, device_ids: list[str]) -> list[str]:
        self.sent.extend(device_ids)
        return device_ids

    def busy(self) -> bool:
        return False

    def send_revert(self, rollout: Any, target: Any) -> None:
        pass

    def finish(self, rollout_id: str) -> None:
        pass

    def send_late(self, rollout: Any, targets: list[Any]) -> None:
        self.sent.extend(t.device_id for t in targets)
        self.late += len(targets)


class Clock:
    """The fake clock the engine reads."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _before_push(fleet: list[SimDevice], rng: np.random.Generator,
                 offline: bool) -> list[DeviceState]:
    """Each device's last states before the push, and when it reports next (an offline one: when
    it returns)."""
    states = []
    for d in fleet:
        if offline:  # a network outage: a last report, then its will; its app keeps serving
            states.append(d.state(T0 - float(rng.uniform(300, 600))))
            states.append(d.will(T0 - float(rng.uniform(0, 300))))
            d.online, d.returns_at = False, T0 + float(rng.uniform(0, RETURN_S))
        else:
            last = T0 - float(rng.uniform(0, STATE_EVERY_S))
            states.append(d.state(last))
            d.next_report = last + STATE_EVERY_S
    return states


def _plant_liars(engine: RolloutEngine, rollout_id: str, by_id: dict[str, SimDevice],
                 kinds: tuple[str, ...], rng: np.random.Generator) -> dict[str, str]:
    """Make one device of each stage a liar of each kind (drawn by the seed); device -> kind.
    They lie from now on, about every version they report."""
    liars: dict[str, str] = {}
    stages: dict[int, list[str]] = {}
    for t in engine.status(rollout_id).targets:
        stages.setdefault(t.stage, []).append(t.device_id)
    for stage in sorted(stages):
        chosen = rng.choice(sorted(stages[stage]), size=len(kinds), replace=False)
        for device_id, kind in zip(chosen, kinds):
            by_id[str(device_id)].lie = kind
            liars[str(device_id)] = kind
    return liars


@dataclass
class Track:
    """What a run saw, tick by tick: when each stage was sent and settled, its final verdicts."""

    sent: dict[int, float] = field(default_factory=dict)
    settled: dict[int, float] = field(default_factory=dict)
    first_judged: dict[int, float] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    last: tuple[Any, ...] | None = None

    def see(self, r: RolloutRecord, judged_at: float, liars: dict[str, str]) -> bool:
        """Note what changed; True once the run is over (ended, or paused inconclusive)."""
        stage = r.stage + 1
        if r.stage >= 0:
            self.sent.setdefault(stage, judged_at)
        if r.stage_settled is not None:
            self.settled[stage] = r.stage_settled
        v = r.verdict or {}
        if v and (v["stage"], v.get("judged_at"), v["outcome"]) != self.last:
            self.last = (v["stage"], v.get("judged_at"), v["outcome"])
            self.first_judged.setdefault(v["stage"], judged_at)
            if v.get("final", True):
                self.verdicts.append(_stage_figures(v, judged_at, self, liars))
        paused = v.get("stage") == stage and v.get("outcome") == "inconclusive"
        return r.state != RolloutState.RUNNING or paused


def _board(b: dict[str, Any]) -> dict[str, Any]:
    """One board of a verdict as the benchmark reports it."""
    baseline = b.get("baseline") or {}
    return {**{k: b[k] for k in ("outcome", "devices", "passed", "failed", "thin", "p99_ms")},
            "baseline_p99_ms": baseline.get("p99_ms"), "baseline": baseline.get("source")}


def _stage_figures(v: dict[str, Any], judged_at: float, track: Track,
                   liars: dict[str, str]) -> dict[str, Any]:
    """A final verdict's figures as the benchmark reports them."""
    stage = v["stage"]
    settled = track.settled.get(stage)
    listed = {d["device"]: d for d in v.get("devices") or []}
    return {"stage": stage, "outcome": v["outcome"], "reason": v["reason"], "at_s": judged_at - T0,
            "after_settle_s": None if settled is None else judged_at - settled,
            "waited_s": judged_at - track.first_judged[stage], "canary": v.get("canary"),
            "boards": {b["board"]: _board(b) for b in v.get("boards") or []},
            "liars": {d: {"kind": kind, "outcome": listed[d]["outcome"],
                          "reason": listed[d]["reason"]}
                      for d, kind in liars.items() if d in listed},
            "failed_devices": [_failed(d) for d in listed.values() if d["outcome"] == "fail"]}


#: Why a device failed, by the start of its reason (:mod:`.analysis.devices` of the server).
_WHY = (("p99", "p99"), ("error rate", "errors"), ("its app restarted", "crash loop"),
        ("silent", "silent"), ("never reported", "silent"), ("went offline", "offline"),
        ("its install failed", "install"), ("offloads", "offload"))


def _failed(d: dict[str, Any]) -> dict[str, Any]:
    """A failed device as the benchmark reports it: its figures and the rule it failed."""
    figures = d.get("figures") or {}
    why = next((name for start, name in _WHY if d["reason"].startswith(start)),
               d["reason"][:40])
    return {"device": d["device"], "board": d["board"], "why": why,
            "calls": figures.get("calls"), "errors": figures.get("errors"),
            "p99_ms": figures.get("p99_ms")}


def _drive(engine: RolloutEngine, db: FleetDB, dispatcher: Dispatcher,
           by_id: dict[str, SimDevice], clock: Clock, rollout_id: str,
           liars: dict[str, str]) -> tuple[Track, RolloutRecord]:
    """Tick the engine and the devices each simulated second until the run is over (see the
    module doc)."""
    track, told = Track(), 0
    while clock.now - T0 < LIMIT_S:
        engine.tick()
        for device_id in dispatcher.sent[told:]:
            by_id[device_id].told(clock.now, JUDGE_S)
        told = len(dispatcher.sent)
        judged_at = clock.now
        clock.now += 1.0
        commits, states = [], []
        for d in by_id.values():
            committed, state = d.step(clock.now)
            if committed:
                commits.append(d.id)
            if state is not None:
                states.append(state)
        for device_id in commits:
            engine.on_event(device_id, "committed", rollout_id, None)
        if states:
            db.upsert_devices(states)
        r = engine.status(rollout_id, targets=False, counts=False)
        if track.see(r, judged_at, liars):
            break
    return track, engine.status(rollout_id, targets=False)


def run_scenario(scenario: Scenario, seed: int, devices: int,
                 recorded: np.ndarray) -> dict[str, Any]:
    """One seeded run of ``scenario`` over ``devices`` simulated devices (see the module doc); its
    figures."""
    started = time.perf_counter()
    fleet = make_fleet(seed, devices, recorded, scenario.release, scenario.call_rates,
                       T0 - 3600)
    by_id = {d.id: d for d in fleet}
    rng = np.random.default_rng([seed, 7])
    with tempfile.TemporaryDirectory(prefix="edgesdk-rollout-") as folder:
        db = FleetDB(Path(folder) / "fleet.db")
        try:
            db.upsert_devices(_before_push(fleet, rng, scenario.offline))
            clock, dispatcher = Clock(T0), Dispatcher()
            engine = RolloutEngine(db, dispatcher, clock, resend_s=3.0)
            rollout_id = engine.start(MODEL, NEW, GROUP, POLICY)
            liars = (_plant_liars(engine, rollout_id, by_id, scenario.liars, rng)
                     if scenario.liars else {})
            if liars:
                db.upsert_devices([by_id[d].state(T0) for d in liars])
            track, r = _drive(engine, db, dispatcher, by_id, clock, rollout_id, liars)
        finally:
            db.close()
    return _outcome(seed, r, track, clock.now - T0, time.perf_counter() - started,
                    dispatcher.late)


def _outcome(seed: int, r: RolloutRecord, track: Track, simulated: float, wall: float,
             late: int) -> dict[str, Any]:
    """A run's figures: how it ended, at which stage, the deciding verdict, its timing, every
    stage's final verdict."""
    decided = track.verdicts[-1] if track.verdicts else None
    paused = (r.state == RolloutState.RUNNING and decided is not None
              and decided["outcome"] == "inconclusive")
    state = "paused" if paused else r.state.value
    verdict = None if decided is None else {k: decided[k] for k in ("stage", "outcome", "reason")}
    return {"seed": seed, "state": state, "stopped": state in ("aborted", "paused"),
            "stage": r.stage + 1, "verdict": verdict,
            "push_to_verdict_s": None if decided is None else decided["at_s"],
            "settle_to_verdict_s": None if decided is None else decided["after_settle_s"],
            "passed_stages": sum(v["outcome"] == "passed" for v in track.verdicts),
            "reason": r.reason, "stages": track.verdicts,
            "stage_sent_s": {s: t - T0 for s, t in track.sent.items()},
            "targets": {status.value: n for status, n in sorted(r.counts.items())},
            "deferred": r.deferred, "late_sends": late, "simulated_s": simulated,
            "wall_s": round(wall, 2)}
