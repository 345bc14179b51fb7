"""Security benchmark part "a poisoned device" (issue 36): one client publishes malformed states and events on its
own device topics every 10 ms while rollouts run across a simulated fleet.

    python benchmarks/security/security_poison.py [--quick]

One real mosquitto, one OTA server (in this process) and one simulated fleet of N-1 devices
(``benchmarks/shared/fleet_sim.py``; N = 1,000 in all, 200 with ``--quick``) on digits 1.0.0, for the whole run. The
bundles (one version per phase) are built and uploaded up front; the connect storm and one warm-up rollout
(2.0.0, not measured) come before any lag is recorded. Then **clean** and **poisoned** phases alternate on that
same fleet and server, the order mirrored each round as BENCHMARKS.md asks (C P, P C, C P: 3 of each; quick:
C P P C, 2 of each), so both conditions see the same fleet, the same growing store and the same host drift.
Each phase is one rollout to the next version (3.0.0, 4.0.0, ...) and lasts at least
``60 s / poisoned phases`` (20 s; quick: 10 s / 2): after its rollout completed and every device's final state
is in the store, the phase holds until that time is up. During a poisoned phase a poisoner (its own process,
client ``edgesdk-agent-evil``) publishes a malformed state or event every 10 ms on its own topics
(``"model": {"x": 1}``, a root version of 2**70, ``NaN``, an event naming an object as its deployment, bytes
that are not JSON...), from a second before the rollout starts to the phase's end: >= 60 s of poison over the
full run. Before issue 36 the first such state reaching the store stopped every later write. Clean phases are
timed the same way without it.

The ingest lag is each device report's receipt (``Ingest.put``) to the commit of the batch holding it, as the
server's ingest observer times it, for the other devices' reports only (the poisoner's own ``flood`` events,
which the server logs by design, are counted apart). The simulated devices send no periodic states: a device
reports when a command makes it (accepted, committed, its new state), so the lag samples are the rollouts'
reports; in the hold after a rollout the fleet is quiet and only the poisoner publishes. The poison's parsing
cost lands on the server's MQTT thread before a report is stamped, so the lag shows it only through the
writer thread's share of the CPU (and the GIL); ``server_cpu_s`` per phase shows the server process's cost.

Reported: per phase its rollout, lag samples, p50/p99/max, ingest batches (``server.ingest.batches``/
``written``, mean and largest batch, seconds spent writing) and the server process's CPU; per condition the
pooled p50/p99 and the spread of the phases' p99s; the ratio of the pooled p99s (poisoned / clean), the ratio
of the median phase p99s, and the clean phases' own max/min p99 (the noise a ratio must be read against); how
many of the N-1 devices have their final state in the store after each poisoned phase; the refusals by kind and
reason; whether anything of the poisoner is in the device table. Goals: every other device's final state
recorded (the last poisoned phase's version), every rollout completed, pooled lag p99 at most 1.2 x clean.

Measured (2-core x86_64; full profile, otherwise idle host): all 999 recorded after each poisoned phase, 6/6
rollouts completed, 60.6 s of poison (6,063 messages, 2 of the poisoner's reports written: its flood events;
nothing in the device table); pooled p99 0.388 s poisoned vs 0.632 s clean, ratio 0.61 (p50 0.84). The phases'
p99s spread 1.6-1.9 x within one condition (clean 0.35-0.65 s), more than the 1.2 bound, so the pooled ratio is
the figure and a single phase pair says little. A phase's tail is the rollout burst: the whole fleet answers in
~2 s, the writer takes 500-1,100 reports per batch, and the lag p99 is ~1.6 x the slowest batch's write; the poison
costs the server ~1 s of CPU per 20 s phase (its MQTT thread parsing and refusing) and no ingest writes. With a
fuzz run sharing the host, batches stayed ~5-10 reports, p99 ~0.1 s, and the ratio was 1.05.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import goal, log  # noqa: E402
from benchmarks.shared.fleet_sim import SimulatedFleet  # noqa: E402
from benchmarks.shared.polling import wait_until  # noqa: E402
from edgesdk.fleet.archive import pack_bundle  # noqa: E402
from edgesdk.fleet.protocol import Topics  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy  # noqa: E402
from edgesdk.fleet.transport import MqttTransport  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.server import ServerConfig  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, load_private_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
FAST = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0,
                     deploy_timeout_s=120)
GROUP = "sec"
POISONER = "evil"
#: Seconds between two poison messages.
PERIOD_S = 0.01
#: What the poisoner sends, in turn: (topic kind, payload).
POISON: list[tuple[str, bytes]] = [
    ("state", json.dumps({"status": "online", "group": GROUP, "model": {"x": 1}, "version": "1.0.0"}).encode()),
    ("events", json.dumps({"event": "committed", "deployment_id": {"x": 1}}).encode()),
    ("state", json.dumps({"status": "online", "group": GROUP, "trust": {"root_version": 2**70}}).encode()),
    ("events", b'{"event": "failed", "time": NaN}'),
    ("state", b'{"status": "online", "updated": 1e999}'),
    ("events", b"\xff not json"),
    ("state", json.dumps({"status": "online", "group": GROUP, "slots": [{"x": 1}] * 10}).encode()),
]


def _p(seconds: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (NaN for no samples)."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else float("nan")


def _r(value: float, digits: int = 4) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)



def _poison(broker_url: str, max_s: float, period_s: float = PERIOD_S) -> None:
    """Publish the poison every ``period_s`` (in its own process, as a device would) until stdin closes or ``max_s``
    passed; prints ``started`` once the first message is out, then ``<messages sent> <seconds>``."""
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed our stdin (or died)
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    client = MqttTransport(broker_url, client_id=f"edgesdk-agent-{POISONER}")
    try:
        i = 0
        started = next_at = time.monotonic()
        end = started + max_s
        while not stop.is_set() and time.monotonic() < end:
            kind, payload = POISON[i % len(POISON)]
            client.publish(Topics.state(POISONER) if kind == "state" else Topics.events(POISONER), payload)
            i += 1
            if i == 1:
                print("started", flush=True)
            next_at += period_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        print(i, round(time.monotonic() - started, 3), flush=True)
    finally:
        client.close()


class _Poisoner:
    """The poisoner process: started, publishing, then stopped with its count and its own publishing time."""

    def __init__(self, broker_url: str, max_s: float) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--poisoner", broker_url, str(max_s)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()  # blocks until its first message is out (or it exited)
        if line != "started":
            self.kill()
            raise RuntimeError(f"the poisoner did not start (it said {line!r}, exit code {self.process.poll()})")

    def stop(self) -> tuple[int, float]:
        out, _ = self.process.communicate(timeout=60)  # closes its stdin: it stops and prints its figures
        sent, seconds = out.split()
        return int(sent), float(seconds)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class _LagRecorder:
    """The server's ingest observer, wrapped: each written report's receipt-to-commit seconds, by whose it was.

    ``Ingest`` calls its observer once per written report, in the order of the list its ``_write_isolating``
    returned for the batch; the wrapper of that method (at the top level only: it recurses on a refused batch's
    halves) queues the reports' device ids in the same order, so each observed lag is matched to its device.
    It also keeps each batch's size and write seconds. The server's own observer (its histogram) still runs.
    """

    def __init__(self, ingest: Any) -> None:
        self.ingest = ingest
        self._forward = ingest._observe
        self._isolate = ingest._write_isolating
        self._tags: collections.deque[str] = collections.deque()
        self._depth = 0
        #: The current phase's lags of the other devices' reports, and its batches as (size, write seconds);
        #: None between phases (nothing recorded).
        self.lags: list[float] | None = None
        self.batches: list[tuple[int, float]] | None = None
        #: Reports of the poisoner that were written (its ``flood`` events), all run long.
        self.poisoner_reports = 0
        ingest._write_isolating = self._write_isolating
        ingest._observe = self._observe

    def _write_isolating(self, batch: list[Any]) -> list[Any]:
        if self._depth:  # a half of a batch the store refused part of: the top-level call accounts for it
            return self._isolate(batch)
        self._depth += 1
        started = time.monotonic()
        try:
            written = self._isolate(batch)
        finally:
            self._depth -= 1
        batches = self.batches
        if batches is not None:
            batches.append((len(batch), time.monotonic() - started))
        self._tags.extend(report.device_id if hasattr(report, "device_id") else str(report.row.device_id)
                          for _, report in written)
        return written

    def _observe(self, kind: str, seconds: float) -> None:
        device = self._tags.popleft() if self._tags else None
        if device == POISONER:
            self.poisoner_reports += 1
        else:
            lags = self.lags
            if lags is not None:
                lags.append(seconds)
        if self._forward is not None:
            self._forward(kind, seconds)

    def begin(self) -> None:
        self.lags, self.batches = [], []

    def end(self) -> tuple[list[float], list[tuple[int, float]]]:
        lags, batches = self.lags or [], self.batches or []
        self.lags = self.batches = None
        return lags, batches


def _order(rounds: int) -> list[str]:
    """C P, P C, C P, ...: interleaved, with which condition goes first alternating by round."""
    order: list[str] = []
    for r in range(rounds):
        order += ["clean", "poisoned"] if r % 2 == 0 else ["poisoned", "clean"]
    return order


def _count_on(server, device_ids: list[str], version: str) -> int:
    wanted = set(device_ids)
    return sum(1 for d in server.db.devices(GROUP) if d.id in wanted and d.version == version)


def _phase(server, fleet: SimulatedFleet, recorder: _LagRecorder, broker_url: str, version: str, condition: str,
           min_s: float) -> dict[str, Any]:
    """One rollout to ``version``, poisoned or not, held to ``min_s``; its figures."""
    ingest = server.ingest
    batches0, written0 = ingest.batches, ingest.written
    cpu0 = time.process_time()
    poisoner: _Poisoner | None = None
    sent, poison_s = 0, 0.0
    recorder.begin()
    try:
        started = time.monotonic()
        if condition == "poisoned":
            poisoner = _Poisoner(broker_url, min_s + 600)
            started = time.monotonic()  # the phase's time is the poison's
        time.sleep(1.0)  # both conditions: the poison is flowing when the rollout starts
        rollout_started = time.monotonic()
        rollout = server.start_rollout("digits", version, GROUP, FAST)
        wait_until(lambda: server.status(rollout).state != "running", 600, f"the end of the rollout of {version}")
        rollout_s = time.monotonic() - rollout_started
        state = server.status(rollout).state.value
        try:
            wait_until(lambda: _count_on(server, fleet.device_ids, version) == len(fleet.device_ids), 60,
                       f"every device's final state on {version}")
        except RuntimeError:
            pass
        recorded = _count_on(server, fleet.device_ids, version)
        hold = min_s + 0.2 - (time.monotonic() - started)
        if hold > 0:
            time.sleep(hold)  # the poisoner keeps going; the fleet is quiet (no periodic states)
        if poisoner is not None:
            sent, poison_s = poisoner.stop()
            poisoner = None
        phase_s = time.monotonic() - started
        flushed = ingest.flush(timeout=60)
    finally:
        if poisoner is not None:
            poisoner.kill()
        lags, batches = recorder.end()
    sizes = [n for n, _ in batches]
    return {"condition": condition, "version": version, "rollout_state": state, "rollout_s": round(rollout_s, 2),
            "phase_s": round(phase_s, 2), "devices_with_final_state": recorded, "ingest_flushed": flushed,
            "lag_samples": len(lags), "lag_p50_s": _r(_p(lags, 0.5)), "lag_p99_s": _r(_p(lags, 0.99)),
            "lag_max_s": _r(max(lags) if lags else float("nan")),
            "ingest_batches": ingest.batches - batches0, "ingest_written": ingest.written - written0,
            "batch_mean": _r(statistics.fmean(sizes), 1) if sizes else None, "batch_max": max(sizes, default=0),
            "write_s": round(sum(s for _, s in batches), 3),
            "write_p99_s": _r(_p([s for _, s in batches], 0.99)),
            "server_cpu_s": round(time.process_time() - cpu0, 2),
            "poison_sent": sent, "poison_s": poison_s, "_lags": lags}


def _pooled(phases: list[dict[str, Any]]) -> dict[str, Any]:
    lags = [s for p in phases for s in p["_lags"]]
    p99s = [p["lag_p99_s"] for p in phases if p["lag_p99_s"] is not None]
    return {"phases": len(phases), "lag_samples": len(lags), "lag_p50_s": _r(_p(lags, 0.5)),
            "lag_p99_s": _r(_p(lags, 0.99)), "lag_max_s": _r(max(lags) if lags else float("nan")),
            "phase_p99_s": {"min": min(p99s, default=None), "median": _r(statistics.median(p99s)) if p99s else None,
                            "max": max(p99s, default=None)},
            "phase_p99_max_over_min": _r(max(p99s) / min(p99s), 3) if p99s and min(p99s) > 0 else None,
            "server_cpu_s": round(sum(p["server_cpu_s"] for p in phases), 2),
            "write_s": round(sum(p["write_s"] for p in phases), 3)}


def _flood_counts(server) -> dict[str, float]:
    text = server.metrics.render()[0].decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("edgesdk_ota_reports_refused_total{") and 'reason="flood"' in line:
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = float(line.split()[-1])
    return counts


def _measure(work: Path, devices: int, rounds: int, min_s: float) -> dict[str, Any]:
    order = _order(rounds)
    versions = [f"{i}.0.0" for i in range(2, len(order) + 3)]  # the warm-up's, then one per phase
    generate_keypair(work, "server")
    model = write_mlp_onnx(random_mlp([16, 8, 4], seed=2), work / "m.onnx")
    import numpy as np

    archives = []
    for version in versions:
        log(f"poison: building digits {version}")
        spec = BundleSpec("digits", version, "onnx-fp32", "generic-x86_64", "latency")
        archives.append(pack_bundle(bundle_from_model(work / f"bundle-{version}", model, spec,
                                                      {"input": np.zeros((1, 16), np.float32)}).path))
    broker = LocalMosquitto(work / "broker", max_open_files=devices + 4096)
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.1), repo=work / "repo", db=work / "fleet.db",
                                       signing_key=load_private_key(work / "server.key"), allow_unsigned=True,
                                       keep_latest=len(versions) + 1))  # every bundle uploaded up front stays
    server = running.ota
    recorder = _LagRecorder(server.ingest)
    fleet = SimulatedFleet(broker.url, work / "server.pub", devices, group=GROUP, id_prefix="s", fetch=False,
                           max_runtime_s=1800)
    try:
        for archive in archives:
            server.upload(archive)
        log(f"poison: connecting {devices} devices")
        fleet.start(timeout=300)
        wait_until(lambda: len(server.db.devices(GROUP)) >= devices, 120, f"{devices} devices in the store")
        server.ingest.flush(timeout=60)  # the connect storm is not measured
        log(f"poison: warm-up rollout of {versions[0]} (not measured)")
        warm = server.start_rollout("digits", versions[0], GROUP, FAST)
        wait_until(lambda: server.status(warm).state != "running", 600, "the end of the warm-up rollout")
        wait_until(lambda: _count_on(server, fleet.device_ids, versions[0]) == devices, 60, "the warm-up's final states")
        server.ingest.flush(timeout=60)
        phases = []
        for i, (condition, version) in enumerate(zip(order, versions[1:])):
            log(f"poison: phase {i + 1}/{len(order)}: {condition}, rollout of {version}, >= {min_s:g} s")
            phase = _phase(server, fleet, recorder, broker.url, version, condition, min_s)
            log(f"poison:   {phase['rollout_state']} in {phase['rollout_s']} s; {phase['lag_samples']} lags, p50 "
                f"{phase['lag_p50_s']} s, p99 {phase['lag_p99_s']} s; {phase['ingest_batches']} batches "
                f"(mean {phase['batch_mean']}); final states {phase['devices_with_final_state']}/{devices}")
            phases.append(phase)
        refused = {f"{kind}/{reason}": n for (kind, reason), n in sorted(server.reports.refused.items())}
        return {"phases": phases, "refused_malformed": refused, "refused_flood": dict(_flood_counts(server)),
                "ingest_dropped": server.ingest.dropped, "poisoner_in_store": server.db.device(POISONER) is not None,
                "poisoner_reports_written": recorder.poisoner_reports, "ingest_batches_total": server.ingest.batches,
                "ingest_written_total": server.ingest.written}
    finally:
        if fleet.start_s is not None:  # a fleet that failed to start closed its workers already
            fleet.stop()
        running.stop()
        broker.stop()


def run(quick: bool) -> dict[str, Any]:
    """Clean and poisoned phases interleaved on one fleet, one server, one broker: results and goals."""
    devices = 200 if quick else 1000
    rounds = 2 if quick else 3
    poison_total_s = 10.0 if quick else 60.0
    min_s = poison_total_s / rounds
    others = devices - 1
    work = Path(tempfile.mkdtemp(prefix="bench-poison-"))
    try:
        measured = _measure(work, others, rounds, min_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    phases = measured.pop("phases")
    clean = [p for p in phases if p["condition"] == "clean"]
    poisoned = [p for p in phases if p["condition"] == "poisoned"]
    pooled = {"clean": _pooled(clean), "poisoned": _pooled(poisoned)}
    for p in phases:
        del p["_lags"]
    c99, p99 = pooled["clean"]["lag_p99_s"], pooled["poisoned"]["lag_p99_s"]
    ratio = p99 / c99 if c99 else float("inf")
    c_med, p_med = pooled["clean"]["phase_p99_s"]["median"], pooled["poisoned"]["phase_p99_s"]["median"]
    last = poisoned[-1]
    completed = sum(p["rollout_state"] == "completed" for p in phases)
    goals = {
        "other_devices_recorded": goal("other_devices_recorded", f"all {others}", last["devices_with_final_state"],
                                       last["devices_with_final_state"] == others),
        "rollout_completed": goal("rollout_completed", f"all {len(phases)} completed", completed,
                                  completed == len(phases)),
        "ingest_lag_p99_ratio": goal("ingest_lag_p99_ratio", "<= 1.2 x clean (pooled p99s)", ratio, ratio <= 1.2),
    }
    results = {"devices": devices, "others": others, "poison_period_s": PERIOD_S, "phase_min_s": min_s,
               "order": [p["condition"] for p in phases],
               "poison_s": round(sum(p["poison_s"] for p in poisoned), 2),
               "poison_sent": sum(p["poison_sent"] for p in poisoned),
               "clean": pooled["clean"], "poisoned": pooled["poisoned"],
               "lag_p99_ratio": _r(ratio, 3), "lag_p50_ratio": _r(pooled["poisoned"]["lag_p50_s"]
                                                                    / pooled["clean"]["lag_p50_s"], 3)
               if pooled["clean"]["lag_p50_s"] else None,
               "phase_median_p99_ratio": _r(p_med / c_med, 3) if c_med else None,
               "others_recorded_after_poisoned_phases": [p["devices_with_final_state"] for p in poisoned],
               "rollouts_completed": f"{completed}/{len(phases)}",
               "phases": phases, **measured}
    return {"results": results, "goals": goals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 devices, 2 phases of each, 10 s of poison")
    parser.add_argument("--poisoner", nargs=2, metavar=("BROKER", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poisoner:
        _poison(args.poisoner[0], float(args.poisoner[1]))
        return
    print(json.dumps(run(args.quick), indent=2))


if __name__ == "__main__":
    main()
