"""Late devices (desired state per group): fleets whose devices are not all there when a release is pushed.

Three scenarios for benchmarks/fleet/fleet.py, each on a fresh mosquitto, a fresh fleet database and
`edgesdk server` as its own process (with the server's default ``max_catch_up`` of 500), against
simulated devices (benchmarks/shared/fleet_sim.py) that speak the real protocol:

- :func:`late_devices`: a share of the fleet is cut off before the push and comes back at random
  over a window after the online devices are done, and more devices join the group then; how long
  each takes from its return to its commit, and what each costs the server and the database
  against a device that was online at the push.
- :func:`duty_cycled`: devices awake a short while every few minutes, out of step, and a big
  incompressible bundle; in how many wakes each converges, and the chunk bytes each received
  against the archive (a download that resumes after a sleep, not from scratch).
- :func:`reconnect_storm`: a release set while the whole group is offline, then a broker restart
  and every device back within seconds; every commit made and recorded, the server's outbox
  against its limit, and the time until all converged.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fleet.fleet_servers import STALL_S, FleetStack
from benchmarks.shared.common import log
from benchmarks.shared.fleet_sim import FleetReport, SimulatedFleet
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy, TargetStatus
from edgesdk.ota_server.devices.chunks import MAX_OUTBOX
from edgesdk.ota_server.postgres import LocalPostgres
from edgesdk.ota_server.rollouts import stage_sender
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.signing import load_private_key
from edgesdk.testing import random_mlp, write_mlp_onnx

__all__ = ["LATE_POLICY", "late_devices", "duty_cycled", "reconnect_storm", "big_bundle", "late_goals"]

#: The fleet benchmark's policy: canary 1%, waves 10%/100%, no health window; its simulated devices run no app, so
#: there is nothing to judge and the canary analysis is off (as ``push --no-analysis``).
LATE_POLICY = RolloutPolicy(analysis=False, canary=0.01, waves=(0.1, 1.0), health_window_s=0.0, max_failure_rate=0.05,
                            deploy_timeout_s=600.0)
#: A partition that lasts until a ``heal`` ends it.
_UNTIL_HEALED_S = 24 * 3600.0


def big_bundle(work: Path, keys: Path, model: str, version: str, size_bytes: int, seed: int = 20) -> Path:
    """A signed bundle of an MLP with ``size_bytes`` of random float32 weights: zstd saves ~7% of such bytes, under
    the chunk service's 10% bar, so every chunk goes as it is."""
    hidden = int((-74 + (74 ** 2 + 4 * size_bytes / 4) ** 0.5) / 2)  # 64*h + h*h + 10*h floats
    onnx_path = write_mlp_onnx(random_mlp([64, hidden, hidden, 10], seed=seed), work / f"big-{version}.onnx")
    x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    spec = BundleSpec(model, version, "onnx-fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(atol=1e-3, rtol=1e-3, max_latency_ms=5000.0))
    out = work / f"big-bundle-{version}"
    bundle_from_model(out, onnx_path, spec, {"input": x}, private_key=load_private_key(keys / "converter.key"))
    return out


def _in_background(fleet: SimulatedFleet, timeout: float) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``fleet`` on a thread (its start() returns once every device connected: with a connect rate, later)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fleet.start(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)

    thread = threading.Thread(target=run, name="late-fleet-start", daemon=True)
    thread.start()
    return thread, errors


def _commit_times(report: FleetReport, rollout_id: str) -> dict[str, float]:
    """Device -> when its own install log says it committed ``rollout_id`` (the first time)."""
    found: dict[str, float] = {}
    for device, entries in report.install_log.items():
        for at, deployment, _, outcome, _ in entries:
            if deployment == rollout_id and outcome == "committed":
                found.setdefault(device, at)
    return found


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    a = np.asarray(values)
    return {"n": len(values), "p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3), "min": round(float(a.min()), 3)}


def _target_statuses(db: str, rollout_id: str) -> dict[str, TargetStatus]:
    store = FleetDB(db)
    try:
        return {t.device_id: t.status for t in store.targets(rollout_id)}
    finally:
        store.close()


def _traces(db: str, rollout_id: str, returned: dict[str, float]) -> dict[str, Any]:
    """For a few devices: when (s after its return) the server sent its late command and logged its events."""
    store = FleetDB(db)
    try:
        targets = store.targets_of(rollout_id, list(returned))
        found = {}
        for device, back in returned.items():
            t = targets.get(device)
            found[device] = {"status": t.status.value if t else None,
                             "sent_s": round(t.sent - back, 2) if t is not None and t.sent else None,
                             "events": [(round(e.ts - back, 2), e.type) for e in store.events(device_id=device)][-6:]}
        return found
    finally:
        store.close()


def _release(db: str, group: str) -> Any:
    store = FleetDB(db)
    try:
        return store.release(group)
    finally:
        store.close()


def _mark(stack: FleetStack, fleets: list[SimulatedFleet]) -> dict[str, Any]:
    """What the server, the database and the devices have done so far (a phase is the difference of two)."""
    server, parts = stack.server.cpu_seconds(), stack.db_cpu_parts()
    counts: Counter[str] = Counter()
    for fleet in fleets:
        counts.update(fleet.snapshot()["counts"])
    return {"t": time.monotonic(), "server": server, "db": sum(parts.values()), "db_parts": parts, "counts": counts,
            "counters": stack.gauges()}


def _idle(stack: FleetStack, seconds: float) -> tuple[tuple[float, float], dict[str, float]]:
    """CPU seconds per second of the server and of the database while nobody asks anything of them, and the
    database's by part (:func:`benchmarks.fleet.fleet_servers.tree_cpu_parts`)."""
    start = _mark(stack, [])
    time.sleep(seconds)
    end = _mark(stack, [])
    wall = end["t"] - start["t"]
    return (((end["server"] - start["server"]) / wall, (end["db"] - start["db"]) / wall),
            {k: round((v - start["db_parts"].get(k, 0.0)) / wall, 4) for k, v in end["db_parts"].items()})


def _phase(start: dict[str, Any], end: dict[str, Any], idle: tuple[float, float], devices: int) -> dict[str, Any]:
    """CPU and messages of one phase, per device of it (CPU less the idle rate over the phase's wall time)."""
    wall, n = end["t"] - start["t"], max(devices, 1)
    server, db = end["server"] - start["server"], end["db"] - start["db"]
    work = server + db - (idle[0] + idle[1]) * wall
    counts = {k: end["counts"].get(k, 0) - start["counts"].get(k, 0) for k in
              ("messages_out", "messages_in", "need_requests", "duplicate_commands")}
    counters = {k.replace("_total", ""): end["counters"].get(k, 0) - start["counters"].get(k, 0)
                for k in end["counters"] if "_total" in k}
    return {"wall_s": round(wall, 2), "devices": devices, "server_cpu_s": round(server, 3), "db_cpu_s": round(db, 3),
            "idle_server_cpu_per_s": round(idle[0], 4), "idle_db_cpu_per_s": round(idle[1], 4),
            "db_cpu_s_by_part": {k: round(v - start["db_parts"].get(k, 0.0), 3) for k, v in end["db_parts"].items()},
            "ms_per_device": round(work / n * 1e3, 3), "raw_ms_per_device": round((server + db) / n * 1e3, 3),
            "server_ms_per_device": round((server - idle[0] * wall) / n * 1e3, 3),
            "db_ms_per_device": round((db - idle[1] * wall) / n * 1e3, 3),
            "per_device": {**{f"device_{k}": round(v / n, 2) for k, v in counts.items()},
                           **{k: round(v / n, 2) for k, v in counters.items()}}}


def late_devices(work: Path, db: str, keys: Path, bundle: Path, model: str, *, devices: int, new_devices: int,
                 window_s: float, offline_share: float = 0.3, pg: LocalPostgres | None = None, idle_s: float = 10.0,
                 seed: int = 35, processes: int = 2, settle_s: float = 300.0,
                 server_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """``devices`` connect; ``offline_share`` of them are cut off and the release is pushed to the group. Once the
    online ones committed (the rollout completed), the cut-off ones return at uniformly random times over
    ``window_s`` and ``new_devices`` more join the group at an even pace over the same window. CPU: see ``cpu`` in
    the result."""
    log(f"late devices: {devices} devices, {offline_share:.0%} offline at the push, {new_devices} join later, "
        f"returns over {window_s:g} s")
    n_off = round(devices * offline_share)
    rng, load_start = random.Random(seed), os.getloadavg()
    stack = FleetStack(work, "late", devices + new_devices, db, keys, pg, server_args)
    try:
        fleet = stack.fleet(devices, "late", "d", model, processes=processes)
        fleet.start(timeout=300)
        stack.wait_devices("late", "online", devices, 300)
        version = stack.upload(bundle)
        offline = sorted(rng.sample(fleet.device_ids, n_off))
        fleet.fault("partition", offline, seconds=_UNTIL_HEALED_S)
        stack.wait_devices("late", "online", devices - n_off, 120)
        idle_before, idle_before_parts = _idle(stack, idle_s)
        pushed = _mark(stack, [fleet])
        rollout_id = stack.client.start_rollout(model, version, "late", LATE_POLICY)
        r = stack.wait_rollout(rollout_id, 900)
        # the phase's tail (re-sends still queued, their answers, the reconciler's look at their new states) is theirs
        quiet_s = stack.wait_quiet()
        stack.clean_up()  # the online phase's dead rows and dirty pages are its own, not the late window's
        online_done = _mark(stack, [fleet])
        online_committed = r.count(TargetStatus.COMMITTED)
        log(f"  online devices done in {online_done['t'] - pushed['t']:.1f} s ({r.state.value}: {r.reason}); the "
            "others return now")
        # the release set and the late devices away: the window's own idle
        idle_serving, idle_serving_parts = _idle(stack, idle_s)
        late_start = _mark(stack, [fleet])
        returns = {d: rng.uniform(0, window_s) for d in offline}
        heal_at = time.time()
        fleet.fault("heal", offline, seconds=returns)
        newcomers = stack.fleet(new_devices, "late", "n", model, processes=1, connect_rate=new_devices / window_s)
        starter, errors = _in_background(newcomers, window_s + 300)
        deadline, window_end = time.monotonic() + window_s + settle_s, time.monotonic() + window_s
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline and not errors:
            now_on = fleet.versions().get(version, 0) + (0 if starter.is_alive() else
                                                        newcomers.versions().get(version, 0))
            if now_on == devices + new_devices:
                break
            if now_on != seen:
                seen, since = now_on, time.monotonic()
            elif time.monotonic() > window_end and time.monotonic() - since > STALL_S:
                log(f"  {now_on} of {devices + new_devices} on {version}, none more in {STALL_S:g} s: "
                    f"{stack.gauges()}")
                break
            time.sleep(1.0)
        if errors:
            raise RuntimeError(f"the devices joining later did not connect: {errors[0]}")
        final = stack.wait_late_committed(rollout_id, n_off + new_devices, 60)
        stack.wait_quiet()
        stack.clean_up()
        late_done = _mark(stack, [fleet, newcomers])
        idle_after, idle_after_parts = _idle(stack, idle_s)
        warnings, gauges = stack.warnings(), stack.gauges()
    finally:
        reports = stack.close()
    statuses = _target_statuses(db, rollout_id)
    old, new = reports[0], reports[1] if len(reports) > 1 else None
    commits = _commit_times(old, rollout_id) | (_commit_times(new, rollout_id) if new else {})
    returned: dict[str, float] = {}
    for d in offline:
        back = [t for t in old.connect_log.get(d, []) if t >= heal_at]
        if back:
            returned[d] = back[0]
    if new is not None:
        returned |= {d: times[0] for d, times in new.connect_log.items() if times}
    late = offline + (sorted(new.final) if new else [])
    latency = {d: commits[d] - returned[d] for d in late if d in commits and d in returned}
    scheduled = [commits[d] - (heal_at + returns[d]) for d in offline if d in commits]
    finals = {**old.final, **(new.final if new else {})}
    online_phase = _phase(pushed, online_done, idle_before, online_committed)
    # The smaller reading of each process: the first can still hold work of the online phase (a mean of the two
    # subtracted it as if it were idle).
    idle_late = tuple(min(a, b) for a, b in zip(idle_serving, idle_after))
    late_phase = _phase(late_start, late_done, idle_late, len(late))  # type: ignore[arg-type]
    online_per, late_per = online_phase["ms_per_device"], late_phase["ms_per_device"]
    result = {
        "devices": devices, "offline_at_push": n_off, "joined_later": new_devices, "window_s": window_s,
        "rollout": {"state": r.state.value, "reason": r.reason, "online_committed": online_committed,
                    "late_counts": {k.value: v for k, v in final.late_counts.items()},
                    "counts": {k.value: v for k, v in final.counts.items()}},
        "reached_release": sum(1 for v in finals.values() if v == version),
        "late_reached": sum(1 for d in late if finals.get(d) == version),
        "late_committed_on_server": sum(1 for d in late if statuses.get(d) == TargetStatus.COMMITTED),
        "late_returned": len(returned), "late_committed_by_log": sum(1 for d in late if d in commits),
        "return_to_commit_s": _spread(list(latency.values())),
        "return_to_commit_s_offline": _spread([latency[d] for d in offline if d in latency]),
        "return_to_commit_s_joined": _spread([v for d, v in latency.items() if d not in returns]),
        "partition_end_to_commit_s": _spread(scheduled),
        "slowest": sorted(((round(v, 2), d) for d, v in latency.items()), reverse=True)[:5],
        "slowest_traces": _traces(db, rollout_id, {d: returned[d] for d in
                                                   sorted(latency, key=latency.__getitem__, reverse=True)[:3]}),
        "updated_twice": old.updated_twice + (new.updated_twice if new else 0),
        "cpu": {"how": "server + PostgreSQL CPU (from /proc) less the idle rate measured over "
                       f"{idle_s:g} s with nobody asking (before the push for the online phase; for the late phase "
                       "the smaller of two, for the server and the database each, both with the release set: once the "
                       "online devices were done and before the others returned, and after every device converged) "
                       "times the phase's wall time; each "
                       "phase ends with a VACUUM (ANALYZE) and a CHECKPOINT of the store, inside its CPU, so that "
                       "autovacuum and the checkpointer do not clean up after the online phase during the late window; "
                       "the online phase "
                       "(push to rollout completed and the server quiet: outbox and report queue empty, no device waiting "
                       "for the reconciler; planning the "
                       "deferred targets included) divided by the devices online at the push that committed, the late "
                       "phase (the first return to every late target committed on the server, and quiet) by the late "
                       "devices (returned and joined). Messages: what the "
                       "simulated devices sent (the server hears each) and received, per device of the phase",
                "online": {**online_phase, "quiet_after_completion_s": round(quiet_s, 2),
                           "idle_db_cpu_per_s_by_part": idle_before_parts},
                "late": {**late_phase, "idle_before_cpu_per_s": [round(x, 4) for x in idle_serving],
                         "idle_after_cpu_per_s": [round(x, 4) for x in idle_after],
                         "idle_db_cpu_per_s_by_part": {"before": idle_serving_parts, "after": idle_after_parts}},
                "late_over_online": round(late_per / online_per, 3) if online_per > 0 else None},
        "server_gauges_at_end": gauges, "server_warnings": warnings}
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    log(f"  {_brief(result)}")
    return result


def duty_cycled(work: Path, db: str, keys: Path, bundle: Path, model: str, *, devices: int, awake_s: float,
                sleep_s: float, wakes: int = 4, pg: LocalPostgres | None = None, seed: int = 36,
                processes: int = 1) -> dict[str, Any]:
    """``devices`` on a duty cycle (awake ``awake_s``, then asleep ``sleep_s``), each starting at a random point of
    it; the release (``bundle``) is pushed ``awake_s`` after the cycles began. Waits until all converged, or until
    ``wakes`` whole periods (and one more wake) passed."""
    period = awake_s + sleep_s
    archive_size = len(pack_bundle(bundle))
    log(f"duty cycle: {devices} devices awake {awake_s:g} s every {period:g} s, a {archive_size / 1e6:.1f} MB bundle")
    rng, load_start = random.Random(seed), os.getloadavg()
    stack = FleetStack(work, "duty", devices, db, keys, pg)
    try:
        fleet = stack.fleet(devices, "duty", "s", model, processes=processes)
        fleet.start(timeout=120)
        stack.wait_devices("duty", "online", devices, 120)
        version = stack.upload(bundle)
        offsets = {d: rng.uniform(0, period) for d in fleet.device_ids}
        duty_at = time.time()
        fleet.fault("duty", fleet.device_ids, awake_s=awake_s, sleep_s=sleep_s, cycles=wakes + 3, offset_s=offsets)
        time.sleep(awake_s)
        push_at = time.time()
        rollout_id = stack.client.start_rollout(model, version, "duty", LATE_POLICY)
        deadline = time.monotonic() + wakes * period + awake_s + 10
        while time.monotonic() < deadline and fleet.versions().get(version, 0) < devices:
            time.sleep(1.0)
        converged_s = time.time() - push_at
        r = stack.client.rollout(rollout_id, limit=0)
        counters = stack.server.counters()
        warnings, gauges = stack.warnings(), stack.gauges()
    finally:
        reports = stack.close()
    report = reports[0]
    commits = _commit_times(report, rollout_id)
    # Wakes a device needed: the awake spells that began after push - awake_s (the one it was in at the push counts)
    # up to the one its commit fell in.
    needed = {d: sum(1 for t in report.connect_log.get(d, []) if push_at - awake_s < t <= at) for d, at in commits.items()}
    per_device = [report.device_chunk_bytes.get(d, 0) / archive_size for d in fleet.device_ids]
    result = {
        "devices": devices, "awake_s": awake_s, "sleep_s": sleep_s, "archive_bytes": archive_size,
        "awake_at_push": sum(1 for o in offsets.values() if o < push_at - duty_at),
        "rollout": {"state": r.state.value, "reason": r.reason, "counts": {k.value: v for k, v in r.counts.items()},
                    "late_counts": {k.value: v for k, v in r.late_counts.items()}},
        "converged": len(commits), "converged_s": round(converged_s, 1),
        "wakes_needed": {str(k): n for k, n in sorted(Counter(needed.values()).items())},
        "max_wakes": max(needed.values(), default=None),
        "chunk_bytes_over_archive_mean": round(report.counts["chunk_bytes"] / (devices * archive_size), 4),
        "chunk_bytes_over_archive_max": round(max(per_device), 4),
        "devices_over_1_1x": sum(1 for x in per_device if x > 1.1),
        "device_bytes_in_over_archive": round(report.bytes_in / (devices * archive_size), 4),
        "server_chunk_bytes": {k: v for k, v in counters.items() if k.startswith("chunk_bytes")},
        "need_requests": report.counts["need_requests"], "updated_twice": report.updated_twice,
        "sleeps_per_device": round(sum(len(t) for t in report.connect_log.values()) / devices, 1),
        "server_gauges_at_end": gauges, "server_warnings": warnings}
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    log(f"  {_brief(result)}")
    return result


def reconnect_storm(work: Path, db: str, keys: Path, bundle: Path, model: str, *, devices: int, spread_s: float = 10.0,
                    pg: LocalPostgres | None = None, seed: int = 37, processes: int = 2, idle_s: float = 10.0,
                    settle_s: float = 300.0) -> dict[str, Any]:
    """``devices`` connect, then all are cut off; the release is pushed to the all-offline group (every target
    deferred: the rollout completes and sets the group's release at once). The broker restarts, and every device
    comes back at a uniformly random time within ``spread_s``. /metrics is read every 0.5 s meanwhile."""
    log(f"reconnect storm: {devices} devices back within {spread_s:g} s of a broker restart, a release pending")
    rng, load_start = random.Random(seed), os.getloadavg()
    stack = FleetStack(work, "storm", devices, db, keys, pg)
    samples: list[dict[str, Any]] = []
    try:
        fleet = stack.fleet(devices, "storm", "t", model, processes=processes)
        fleet.start(timeout=300)
        stack.wait_devices("storm", "online", devices, 300)
        version = stack.upload(bundle)
        fleet.fault("partition", fleet.device_ids, seconds=_UNTIL_HEALED_S)
        stack.wait_devices("storm", "offline", devices, 300)
        rollout_id = stack.client.start_rollout(model, version, "storm", LATE_POLICY)
        pushed = stack.wait_rollout(rollout_id, 120, interval=0.2)
        release = _release(db, "storm")
        log(f"  pushed to the offline group: {pushed.state.value} ({pushed.reason}); release "
            f"{release.rollout_id if release else None}; restarting the broker")
        idle, _ = _idle(stack, idle_s)  # a release set, every device away
        before = _mark(stack, [fleet])
        stack.broker.restart(down_s=1.0)
        restarted_at = time.time()
        fleet.fault("heal", fleet.device_ids, seconds={d: rng.uniform(0, spread_s) for d in fleet.device_ids})
        deadline, next_look, on_release = time.monotonic() + spread_s + settle_s, 0.0, 0
        while time.monotonic() < deadline and on_release < devices:
            try:
                samples.append({"t": round(time.time() - restarted_at, 2), **stack.server.scrape()})
            except OSError as exc:  # the server is busy; say so in the samples rather than stop
                samples.append({"t": round(time.time() - restarted_at, 2), "error": str(exc)[:100]})
            if time.monotonic() >= next_look:
                on_release, next_look = fleet.versions().get(version, 0), time.monotonic() + 2.0
            time.sleep(0.5)
        final = stack.wait_late_committed(rollout_id, devices, 60)
        server_done_s = time.time() - restarted_at
        cpu = _phase(before, _mark(stack, [fleet]), idle, devices)
        warnings, gauges = stack.warnings(), stack.gauges()
    finally:
        reports = stack.close()
    report = reports[0]
    statuses = _target_statuses(db, rollout_id)
    commits = _commit_times(report, rollout_id)
    back = [min((t for t in times if t >= restarted_at), default=None) for times in report.connect_log.values()]
    returned = [t - restarted_at for t in back if t is not None]
    unrecorded = sorted(d for d in commits if statuses.get(d) != TargetStatus.COMMITTED)
    uncommitted = sorted(d for d in fleet.device_ids if d not in commits)
    outbox = [s["outbox_messages"] for s in samples if "outbox_messages" in s]
    in_flight = [s["catch_up_in_flight"] for s in samples if "catch_up_in_flight" in s]
    busy_bar = getattr(stage_sender, "_RESEND_OUTBOX", None)
    result = {
        "devices": devices, "spread_s": spread_s,
        "push": {"state": pushed.state.value, "reason": pushed.reason,
                 "release": release.rollout_id if release else None},
        "returned": len(returned), "returned_within_s": round(max(returned), 2) if returned else None,
        "committed_by_log": len(commits), "committed_on_server": sum(1 for s in statuses.values()
                                                                     if s == TargetStatus.COMMITTED),
        "lost": len(unrecorded) + len(uncommitted) + report.updated_twice,
        "lost_how": "devices whose own install log has no commit of the release, plus devices whose log has it and "
                    "whose target on the server is not committed (a report lost), plus devices that installed one "
                    "version twice",
        "not_committed_devices": uncommitted[:10], "commit_not_recorded_devices": unrecorded[:10],
        "updated_twice": report.updated_twice,
        "converged_s": round(max(commits.values()) - restarted_at, 2) if commits else None,
        "server_recorded_all_s": round(server_done_s, 2),
        "late_counts": {k.value: v for k, v in final.late_counts.items()},
        "outbox_max": max(outbox, default=None), "outbox_limit": MAX_OUTBOX,
        "outbox_limit_is": "MAX_OUTBOX of ota_server/devices/chunks.py: above it the chunk service drops devices' "
                           "chunk requests (they ask again); the re-send bar _RESEND_OUTBOX "
                           f"({busy_bar}) of stage_sender.py only makes re-sends wait, its share of samples above "
                           "is outbox_over_resend_bar",
        "outbox_over_resend_bar": round(sum(1 for x in outbox if busy_bar and x > busy_bar) / max(len(outbox), 1), 3),
        "outbox_samples": len(outbox),
        "catch_up_in_flight_max": max(in_flight, default=None),
        "catch_up_limit": next((s["catch_up_limit"] for s in samples if "catch_up_limit" in s), None),
        "ingest_pending_max": max((s.get("ingest_pending", 0) for s in samples), default=None),
        "cpu": {"how": "server + PostgreSQL CPU from just before the broker restart until every target committed on the "
                       f"server, less the idle rate (measured over {idle_s:g} s with the release set and every device "
                       "away) times that wall time, per device; /metrics was read every 0.5 s meanwhile (counted)",
                **cpu},
        "server_gauges_at_end": gauges, "server_warnings": warnings}
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    log(f"  {_brief(result)}")
    return result


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    """What the progress log shows of a result."""
    return {k: v for k, v in result.items() if k not in ("server_warnings", "cpu", "lost_how", "outbox_limit_is")}


def _goal(name: str, target: str, measured: float | None, met: bool) -> dict[str, Any]:
    """A goal; ``measured`` None when the run produced no figure (then it is not met)."""
    return {"name": name, "target": target, "measured": None if measured is None else round(float(measured), 4),
            "met": bool(met) and measured is not None}


def late_goals(returning: dict[str, Any] | None = None, duty: dict[str, Any] | None = None,
               storm: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The late-device goals (issue 35's targets, unchanged) of the scenarios that ran."""
    goals = []
    if returning is not None:
        late = returning
        everyone = late["devices"] + late["joined_later"]
        goals.append(_goal(f"late devices: share of {everyone} devices ({late['offline_at_push']} offline at the push, "
                           f"{late['joined_later']} joined later) on the new release, %", "100",
                           100.0 * late["reached_release"] / everyone, late["reached_release"] == everyone))
        spread = late["return_to_commit_s"]
        complete = spread["n"] == late["offline_at_push"] + late["joined_later"]
        goals.append(_goal("late devices: return (its connection accepted after the partition, or its first) to "
                           "commit, p50 s (every late device counted)", "<= 10", spread.get("p50"),
                           complete and spread.get("p50", 1e9) <= 10))
        goals.append(_goal("late devices: return to commit, p99 s", "<= 60", spread.get("p99"),
                           complete and spread.get("p99", 1e9) <= 60))
        ratio = late["cpu"]["late_over_online"]
        goals.append(_goal("late devices: server + database CPU per late device / per device online at the push "
                           "(idle rate subtracted; see results.late_devices.returning.cpu.how)", "<= 1.5", ratio,
                           ratio is not None and ratio <= 1.5))
    if duty is not None:
        most = duty["max_wakes"]
        goals.append(_goal(f"duty-cycled: all {duty['devices']} devices converged; the most wake cycles one needed",
                           "<= 4", most, duty["converged"] == duty["devices"] and most is not None and most <= 4))
        goals.append(_goal("duty-cycled: chunk bytes the devices received / (devices x archive)", "<= 1.1",
                           duty["chunk_bytes_over_archive_mean"], duty["chunk_bytes_over_archive_mean"] <= 1.1))
    if storm is not None:
        goals.append(_goal(f"reconnect storm: {storm['devices']} devices, messages lost (see "
                           "results.late_devices.storm.lost_how)", "0", storm["lost"], storm["lost"] == 0))
        outbox, limit = storm["outbox_max"], storm["outbox_limit"]
        goals.append(_goal(f"reconnect storm: the server's outbox at its highest (read every 0.5 s) / its limit "
                           f"({limit})", "< 1", None if outbox is None else outbox / limit,
                           outbox is not None and outbox < limit))
        converged = storm["converged_s"]
        goals.append(_goal("reconnect storm: every device converged, s from the broker restart", "<= 120", converged,
                           storm["committed_by_log"] == storm["devices"] and converged is not None
                           and converged <= 120))
    return goals
