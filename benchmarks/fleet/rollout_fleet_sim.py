"""Simulated devices of benchmarks/fleet/rollout_safety.py: apps serving calls, the agent's
traffic reports, its cadence.

Each :class:`SimDevice` is one board running one app (one app name; a crash-looping app is one
process after another under that name) and its agent:

- **Calls.** The app serves a Poisson stream of calls at the device's own rate. Each successful
  call's latency is drawn from a recording of a real :class:`edgesdk.Runtime` on this host
  (:func:`record_latencies`), times the board's base speed, times the device's own speed factor,
  times the release's latency factor on the new version. A call fails with the fleet's base error
  probability (bad inputs), plus the release's extra errors on the new version. Calls are kept per
  version in 60 s slots (``SLOT_S``) for ``HORIZON_S``, as the app's traffic ledger keeps them.
- **The app's file.** The app writes its ledger every 60 s (at its own phase), every 10 s while
  the agent's ``cadence.json`` says the device is judged, and once at each activation; the agent
  reports what the app last wrote, so the figures lag the calls as they do on a device.
- **The agent's traffic.** :meth:`SimDevice.traffic` builds exactly the object of spec section 3
  (:mod:`edgesdk.fleet.traffic`): per version ``from``, ``to``, ``calls``, ``errors``,
  ``p50/p95/p99_ms`` (numpy's percentiles of the successful calls in the window; the agent's come
  from 12.5%-wide histogram buckets), ``local``/``cloud`` (0: the app uses no offload), ``apps``,
  ``starts``, ``restarts``.
- **The cadence.** A device sent the release (a stage, or late) commits 2 to 6 s later, reports
  its new state at once, then every 10 s until its commit + ``judge_s`` (deploy timeout + health
  window + evidence grace, what the server's command carries), then every 300 s; every other
  device reports every 300 s at its own phase. An offline device reports nothing until it returns
  (its app kept serving: a network outage), then reports at once.
- **Behaviours.** The release may slow calls, add errors, make the app crash in a loop (each
  process serves 1 to 4 s and is restarted 10 s after it died: ``restarts`` grows and calls are
  few), or silence the device after its commit (no state at all). A liar reports, for every
  version, either the most calls its window allows with no error (``hide``) or awful figures
  (half of at least 1,000 calls failing, p99 1 s: ``abort``), within the format's rules.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.ota_server.store.fleet_db import DeviceState

__all__ = ["BOARDS", "GROUP", "MODEL", "OLD", "NEW", "Release", "SimDevice", "record_latencies",
           "make_fleet", "lie", "HORIZON_S", "SLOT_S", "TRAFFIC_EVERY_S", "STATE_EVERY_S",
           "BASE_ERRORS"]

#: The boards of the fleet and their base speed: a multiple of this host's latencies.
BOARDS: tuple[tuple[str, float], ...] = (("raspberry-pi-5", 4.0), ("raspberry-pi-4", 9.0),
                                         ("jetson-orin-nano", 2.0), ("rk3588", 5.0))
GROUP, MODEL, OLD, NEW = "cams", "digits", "1.0.0", "2.0.0"
#: The app's ledger: slots of this many seconds, kept this long (spec section 2).
SLOT_S, HORIZON_S = 60.0, 900.0
#: The agent's cadence: while judged (``traffic_every_s``) and otherwise (``state_interval_s``).
TRAFFIC_EVERY_S, STATE_EVERY_S = 10.0, 300.0
#: How often the app writes its file: while judged (cadence.json) and otherwise (``SLOW_EVERY_S``).
APP_FAST_EVERY_S, APP_SLOW_EVERY_S = 10.0, 60.0
#: Share of calls that fail on any version (bad inputs): the baseline's error rate.
BASE_ERRORS = 0.001
#: A crash-looping app: each process serves this many seconds (uniform) and is restarted this
#: long after it died.
CRASH_ALIVE_S, CRASH_BACKOFF_S = (1.0, 4.0), 10.0
#: How long a crash loop's processes are drawn for (longer than any run lasts after a commit).
CRASH_LOOP_FOR_S = 3600.0
#: A device's speed factor within its board (lognormal sigma): boards of one model differ.
SPEED_SIGMA = 0.15


def record_latencies(calls: int = 20_000) -> np.ndarray:
    """Per-call latencies (ms) of the digits MLP in a real Runtime on this host, its first (cold)
    call left out (the bundle's health check makes it, and its calls are not counted). 20,000
    calls: the p99 rule is decided by the calls above the p99, 200 of them here (a 3,000-call
    recording has 30, and its tail shape varies from one recording to the next)."""
    from edgesdk.runtime.runtime import Runtime
    from edgesdk.testing import random_mlp, write_mlp_onnx

    with tempfile.TemporaryDirectory() as folder:
        model = write_mlp_onnx(random_mlp([64, 32, 10], seed=1), Path(folder) / "digits.onnx")
        runtime = Runtime(model, profile="generic-x86_64")
        x = np.ones((1, 64), np.float32)
        latencies = np.empty(calls + 1)
        for i in range(calls + 1):
            started = time.perf_counter_ns()
            runtime.predict(x)
            latencies[i] = (time.perf_counter_ns() - started) / 1e6
        runtime.close()
    return latencies[1:]


@dataclass(frozen=True)
class Release:
    """What version 2.0.0 does on the devices it reaches (``boards``: the boards it does it on;
    None: all)."""

    latency: float = 1.0
    errors: float = 0.0
    crash_loop: bool = False
    silent: bool = False
    boards: frozenset[str] | None = None


@dataclass
class Session:
    """One app process: when it started and died (None: alive), the versions it activated."""

    start: float
    end: float | None
    activations: list[tuple[float, str]] = field(default_factory=list)

    def version_at(self, t: float) -> str | None:
        """The version this process serves at ``t`` (None before its first activation)."""
        current = None
        for at, version in self.activations:
            if at <= t:
                current = version
        return current


@dataclass
class Slot:
    """One version's calls in one slot: counts and the successful calls' latencies."""

    calls: int = 0
    errors: int = 0
    latencies: list[np.ndarray] = field(default_factory=list)


class SimDevice:
    """One simulated device (see the module doc); time is the benchmark's fake clock."""

    def __init__(self, device_id: str, board: str, speed: float, rate: float,
                 rng: np.random.Generator, recorded: np.ndarray, release: Release,
                 started: float) -> None:
        self.id, self.board, self.speed, self.rate, self.rng = device_id, board, speed, rate, rng
        self.recorded, self.release = recorded, release
        self.version = OLD
        self.sessions = [Session(started, None, [(started, OLD)])]
        self.slots: dict[str, dict[float, Slot]] = {}
        self.generated = started  # calls are drawn up to here
        self.app_phase_slow = float(rng.uniform(0, APP_SLOW_EVERY_S))
        self.app_phase_fast = float(rng.uniform(0, APP_FAST_EVERY_S))
        self.next_report = math.inf
        self.commit_at: float | None = None
        self.committed: float | None = None
        self.judge_until = -math.inf
        self.online = True
        self.returns_at: float | None = None
        self.lie: str | None = None
        #: Every call drawn, when a list (a check's, not the benchmark's): arrays of (times,
        #: version, failed, latencies).
        self.journal: list[tuple[np.ndarray, str, np.ndarray, np.ndarray]] | None = None

    # the release ---------------------------------------------------------------------------------
    def _hit(self) -> bool:
        return self.release.boards is None or self.board in self.release.boards

    def _factor(self, version: str) -> float:
        return self.release.latency if version == NEW and self._hit() else 1.0

    def _error_p(self, version: str) -> float:
        return BASE_ERRORS + (self.release.errors if version == NEW and self._hit() else 0.0)

    # the app's calls -----------------------------------------------------------------------------
    def _serve(self, a: float, b: float, version: str) -> None:
        """Draw the calls the app serves on ``version`` in (a, b], into their slots."""
        n = int(self.rng.poisson(self.rate * (b - a)))
        if n == 0:
            return
        times = self.rng.uniform(a, b, n)
        failed = self.rng.random(n) < self._error_p(version)
        latencies = self.rng.choice(self.recorded, n) * self.speed * self._factor(version)
        if self.journal is not None:
            self.journal.append((times, version, failed, latencies))
        keys = np.floor(times / SLOT_S) * SLOT_S
        slots = self.slots.setdefault(version, {})
        for key in np.unique(keys):
            mine = keys == key
            slot = slots.setdefault(float(key), Slot())
            slot.calls += int(mine.sum())
            slot.errors += int((mine & failed).sum())
            slot.latencies.append(latencies[mine & ~failed])

    def advance(self, until: float) -> None:
        """Draw the calls served up to ``until`` (each process, each version it served); drop the
        slots past the horizon."""
        if until <= self.generated:
            return
        for s in self.sessions:
            a = max(self.generated, s.start)
            b = min(until, s.end if s.end is not None else until)
            if b <= a:
                continue
            cuts = sorted({a, b, *(at for at, _ in s.activations if a < at < b)})
            for lo, hi in zip(cuts, cuts[1:]):
                version = s.version_at(lo)
                if version is not None:
                    self._serve(lo, hi, version)
        self.generated = until
        for slots in self.slots.values():
            for key in [k for k in slots if k < until - HORIZON_S - SLOT_S]:
                del slots[key]

    # the app's file and the agent's traffic ------------------------------------------------------
    def app_written(self, now: float) -> float:
        """When the app last wrote its file, at or before ``now``."""
        slow = self.app_phase_slow + _floor(now - self.app_phase_slow, APP_SLOW_EVERY_S)
        written = [slow, *(at for s in self.sessions for at, _ in s.activations if at <= now)]
        if self.committed is not None and self.committed <= now:
            fast_from = self.committed + self.app_phase_fast
            if fast_from <= now:
                last = min(now, self.judge_until)
                written.append(fast_from + _floor(last - fast_from, APP_FAST_EVERY_S))
        return max(w for w in written if w <= now)

    def _sessions_of(self, version: str, lo: float, to: float) -> tuple[int, int, int]:
        """(apps, starts, restarts) of ``version`` in the window [lo, to] (spec section 3)."""
        apps = starts = restarts = 0
        alive = [s for s in self.sessions
                 if s.start <= to and (s.end is None or s.end >= lo)]
        for s in alive:
            mine = [at for at, v in s.activations if v == version and at <= to]
            if not mine:
                continue
            apps += 1
            starts += sum(lo <= at <= to for at in mine)
            if lo <= s.start and any(o.start < s.start for o in alive):
                restarts += 1
        return apps, starts, restarts

    def _entry(self, version: str, lo: float, to: float) -> dict[str, Any] | None:
        """One version's figures over the window [lo, to], or None when it has neither calls nor
        a process in it."""
        slots = [(k, s) for k, s in self.slots.get(version, {}).items() if k >= lo and s.calls]
        apps, starts, restarts = self._sessions_of(version, lo, to)
        if not slots and not apps:
            return None
        activated = min((at for s in self.sessions for at, v in s.activations
                         if v == version and at <= to), default=lo)
        first = min((k for k, _ in slots), default=activated)
        start = min(max(first, activated, lo), to)
        calls, errors = sum(s.calls for _, s in slots), sum(s.errors for _, s in slots)
        good = np.concatenate([a for _, s in slots for a in s.latencies] or [np.empty(0)])
        p50 = p95 = p99 = None
        if good.size:
            p50, p95, p99 = (float(v) for v in np.percentile(good, [50, 95, 99]))
        return {"from": start, "to": to, "calls": calls, "errors": errors, "p50_ms": p50,
                "p95_ms": p95, "p99_ms": p99, "local": 0, "cloud": 0, "apps": apps,
                "starts": starts, "restarts": restarts, "hist": histogram(good)}

    def traffic(self, now: float) -> dict[str, Any]:
        """The agent's ``traffic`` object at ``now``: what the app last wrote, over the horizon
        (or a liar's lie)."""
        to = self.app_written(now)
        self.advance(to)
        lo = to - HORIZON_S  # the slots that start inside the horizon
        versions = {v: e for v in (OLD, NEW) if (e := self._entry(v, lo, to)) is not None}
        if self.lie is not None:
            versions = {v: lie(e, self.lie) for v, e in versions.items()}
        return {"format": 1, "at": now, "horizon_s": HORIZON_S, "versions": versions}

    def state(self, now: float) -> DeviceState:
        """The device's state as the server's ingest writes it (``seen`` and ``reported``: the
        fake clock)."""
        details = json.dumps({"traffic": self.traffic(now)})
        return DeviceState(self.id, GROUP, "online", MODEL, self.version,
                           (f"{MODEL}-{self.version}",), now, reported=now, details=details,
                           profile=self.board, arch="aarch64")

    def will(self, now: float) -> DeviceState:
        """The device's last will (it went offline): no report time, no details."""
        return DeviceState(self.id, GROUP, "offline", None, None, (), now)

    # the agent -----------------------------------------------------------------------------------
    def told(self, now: float, judge_s: float) -> None:
        """The server sent this device the release (a stage, or late): it commits 2 to 6 s later
        (a command to an offline device is lost; one it already has is ignored)."""
        if self.online and self.commit_at is None and self.committed is None:
            self.commit_at = now + float(self.rng.uniform(2, 6))
            self.judge_until = self.commit_at + judge_s

    def _commit(self, now: float) -> None:
        self.advance(now)
        self.commit_at, self.committed, self.version = None, now, NEW
        main = self.sessions[-1]
        main.activations.append((now, NEW))
        if self.release.crash_loop and self._hit():
            main.end = now + float(self.rng.uniform(*CRASH_ALIVE_S))
            while main.end is not None and main.end < now + CRASH_LOOP_FOR_S:
                start = main.end + CRASH_BACKOFF_S
                end = start + float(self.rng.uniform(*CRASH_ALIVE_S))
                main = Session(start, end, [(start, NEW)])
                self.sessions.append(main)

    def step(self, now: float) -> tuple[bool, DeviceState | None]:
        """One second of the agent: (whether it committed now, the state it publishes or None)."""
        committed = False
        if not self.online:
            if self.returns_at is None or now < self.returns_at:
                return False, None
            self.online, self.next_report = True, now  # back: it reports at once
        if self.commit_at is not None and now >= self.commit_at:
            self._commit(now)
            committed, self.next_report = True, now  # the agent reports its new state on the change
        if now < self.next_report:
            return committed, None
        if self.committed is not None and self.release.silent and self._hit():
            self.next_report = math.inf  # hung after its commit: no state any more
            return committed, None
        every = TRAFFIC_EVERY_S if now < self.judge_until else STATE_EVERY_S
        self.next_report = now + every
        return committed, self.state(now)


def histogram(latencies_ms: np.ndarray) -> list[list[int]]:
    """The agent's sparse latency histogram of ``latencies_ms`` (:mod:`edgesdk.runtime.latency_histogram`'s
    buckets, computed for the whole array at once)."""
    from edgesdk.runtime.latency_histogram import N_BUCKETS

    ns = np.maximum(np.rint(latencies_ms * 1e6).astype(np.int64), 0)
    bits = np.zeros(ns.shape, np.int64)
    big = ns >= 8
    bits[big] = np.floor(np.log2(ns[big])).astype(np.int64) + 1  # int.bit_length()
    index = np.where(big, (bits - 3) * 8 + ((ns >> np.maximum(bits - 4, 0)) & 7), ns)
    used, counts = np.unique(np.minimum(index, N_BUCKETS - 1), return_counts=True)
    return [[int(i), int(c)] for i, c in zip(used, counts)]


def lie(entry: dict[str, Any], how: str) -> dict[str, Any]:
    """A liar's figures for one version, within the format's rules: ``hide`` claims the most
    calls its window allows and no error; ``abort`` half of at least 1,000 calls failed and a 1 s
    p99."""
    from edgesdk.fleet.traffic import MAX_CALLS_PER_S

    most = int((entry["to"] - entry["from"] + 1) * MAX_CALLS_PER_S)
    if how == "hide":
        timed = {k: entry[k] if entry[k] is not None else 1.0
                 for k in ("p50_ms", "p95_ms", "p99_ms")}
        return {**entry, "calls": most, "errors": 0, **timed, "hist": None}
    calls = min(most, max(entry["calls"], 1000))
    return {**entry, "calls": calls, "errors": calls // 2, "p50_ms": 250.0, "p95_ms": 900.0,
            "p99_ms": 1000.0, "hist": None}


def _floor(t: float, every: float) -> float:
    """``t`` rounded down to a multiple of ``every``."""
    return math.floor(t / every) * every


def make_fleet(seed: int, devices: int, recorded: np.ndarray, release: Release,
               rates: tuple[float, float], started: float) -> list[SimDevice]:
    """``devices`` devices over :data:`BOARDS` (equal shares, shuffled by ``seed``), each with its
    speed and its call rate (lognormal: ``rates`` is the median calls/s and sigma), serving since
    ``started``; the same devices for every scenario of a seed."""
    rng = np.random.default_rng(seed)
    boards = rng.permutation(np.arange(devices) % len(BOARDS))
    median, sigma = rates
    fleet = []
    for i, index in enumerate(boards):
        board, base = BOARDS[int(index)]
        speed = base * float(rng.lognormal(0, SPEED_SIGMA))
        rate = float(rng.lognormal(math.log(median), sigma))
        fleet.append(SimDevice(f"cam{i:03d}", board, speed, rate,
                               np.random.default_rng([seed, i]), recorded, release, started))
    return fleet
