"""Security benchmark part "a poisoned device" (issue 36): one client publishes malformed states and events on its
own device topics every 10 ms while a rollout runs across a simulated fleet.

    python benchmarks/_security_poison.py [--quick]

A real mosquitto, an OTA server (in this process) and N-1 simulated devices (``benchmarks/fleet_sim.py``;
1,000 in all, 200 with ``--quick``) on digits 1.0.0. Each of two runs in this process starts all of it anew
and rolls 2.0.0 out to the fleet: the **clean** run as it is, the **poisoned** run with one extra client
publishing, every 10 ms for a minute (10 s with ``--quick``), a malformed state or event on its own topics
(``"model": {"x": 1}``, a root version of 2**70, ``NaN``, an event naming an object as its deployment, bytes
that are not JSON). Before issue 36 the first such state reaching the store stopped every later write.

Reported: how many of the N-1 devices have their final state (2.0.0) in the fleet store, whether the rollout
completed, the refusals by kind and reason, and the ingest lag (each device report's receipt to its commit, as
the server's ingest observer times it) p99 against the clean run's. Goals: every device's final state recorded,
the rollout completed, lag p99 at most 1.2 x the clean run's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import goal, log  # noqa: E402
from benchmarks.fleet_sim import SimulatedFleet  # noqa: E402
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

FAST = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0, deploy_timeout_s=120)
GROUP = "sec"
POISONER = "evil"
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


def _p99(seconds: list[float]) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else float("nan")


def _wait(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no {what} within {timeout:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _poison(broker_url: str, seconds: float, period_s: float = 0.01) -> int:
    """Publish the poison every ``period_s`` for ``seconds`` (in its own process, as a device would); how many."""
    client = MqttTransport(broker_url, client_id=f"edgesdk-agent-{POISONER}")
    try:
        i = 0
        next_at = time.monotonic()
        end = next_at + seconds
        while time.monotonic() < end:
            kind, payload = POISON[i % len(POISON)]
            client.publish(Topics.state(POISONER) if kind == "state" else Topics.events(POISONER), payload)
            i += 1
            next_at += period_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        return i
    finally:
        client.close()


def _one_run(work: Path, devices: int, poison_s: float | None) -> dict[str, Any]:
    """One fleet, one rollout of 2.0.0; with ``poison_s``, the poisoner publishes that long from just before it."""
    generate_keypair(work, "server")
    broker = LocalMosquitto(work / "broker", max_open_files=devices + 4096)
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.1), repo=work / "repo", db=work / "fleet.db",
                                       signing_key=load_private_key(work / "server.key"), allow_unsigned=True))
    server = running.ota
    lags: list[float] = []
    forward = server.ingest._observe  # the server's own observer (its handling histogram) stays in place

    def observe(kind: str, seconds: float) -> None:
        lags.append(seconds)
        if forward is not None:
            forward(kind, seconds)

    server.ingest._observe = observe
    fleet = SimulatedFleet(broker.url, work / "server.pub", devices, group=GROUP, id_prefix="s", fetch=False,
                           max_runtime_s=900)
    poisoner: subprocess.Popen[str] | None = None
    try:
        fleet.start(timeout=300)
        _wait(lambda: len(server.db.devices(GROUP)) >= devices, 120, f"{devices} devices in the store")
        model = write_mlp_onnx(random_mlp([16, 8, 4], seed=2), work / "m.onnx")
        import numpy as np

        bundle = bundle_from_model(work / "bundle", model, BundleSpec("digits", "2.0.0", "onnx-fp32", "generic-x86_64",
                                                                      "latency"),
                                   {"input": np.zeros((1, 16), np.float32)}).path
        server.upload(pack_bundle(bundle))
        lags.clear()  # the connect storm is not the rollout's
        started = time.monotonic()
        if poison_s is not None:
            poisoner = subprocess.Popen([sys.executable, __file__, "--poisoner", broker.url, str(poison_s)],
                                        stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)  # the poison is flowing when the rollout starts
        rollout = server.start_rollout("digits", "2.0.0", GROUP, FAST)
        _wait(lambda: server.status(rollout).state != "running", 600, "the rollout's end")
        state = server.status(rollout).state.value
        rollout_s = time.monotonic() - started
        sent = 0
        if poisoner is not None:
            out, _ = poisoner.communicate(timeout=poison_s + 60)
            sent = int(out.strip() or 0)
        recorded = _final_states(server, fleet.device_ids, 60)
        flushed = server.ingest.flush(timeout=60)
        refused = {f"{kind}/{reason}": n for (kind, reason), n in sorted(server.reports.refused.items())}
        return {"devices": devices, "rollout_state": state, "rollout_s": round(rollout_s, 2),
                "devices_with_final_state": recorded, "ingest_flushed": flushed, "ingest_dropped": server.ingest.dropped,
                "lag_samples": len(lags), "lag_p50_s": round(sorted(lags)[len(lags) // 2], 4) if lags else None,
                "lag_p99_s": round(_p99(lags), 4), "poison_sent": sent,
                "poisoner_in_store": server.db.device(POISONER) is not None,
                "refused_malformed": refused, "refused_flood": dict(_flood_counts(server))}
    finally:
        if poisoner is not None and poisoner.poll() is None:
            poisoner.kill()
        fleet.stop()
        running.stop()
        broker.stop()


def _final_states(server, device_ids: list[str], timeout: float) -> int:
    """How many of ``device_ids`` the store shows on 2.0.0 (waiting up to ``timeout`` for the last to land)."""
    wanted = set(device_ids)

    def count() -> int:
        return sum(1 for d in server.db.devices(GROUP) if d.id in wanted and d.version == "2.0.0")

    try:
        _wait(lambda: count() == len(wanted), timeout, "every device's final state")
    except RuntimeError:
        pass
    return count()


def _flood_counts(server) -> dict[str, float]:
    text = server.metrics.render()[0].decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("edgesdk_ota_reports_refused_total{") and 'reason="flood"' in line:
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = float(line.split()[-1])
    return counts


def run(quick: bool) -> dict[str, Any]:
    """The clean run, then the poisoned one, in this process: results and goals."""
    devices = 200 if quick else 1000
    poison_s = 10.0 if quick else 60.0
    work = Path(tempfile.mkdtemp(prefix="bench-poison-"))
    try:
        log(f"poison: clean run, {devices - 1} devices")
        clean = _one_run(work / "clean", devices - 1, None)
        log(f"poison: poisoned run, {devices - 1} devices + 1 poisoner every 10 ms for {poison_s:g} s")
        poisoned = _one_run(work / "poisoned", devices - 1, poison_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = poisoned["lag_p99_s"] / clean["lag_p99_s"] if clean["lag_p99_s"] else float("inf")
    goals = {
        "other_devices_recorded": goal("other_devices_recorded", f"all {devices - 1}",
                                       poisoned["devices_with_final_state"],
                                       poisoned["devices_with_final_state"] == devices - 1),
        "rollout_completed": goal("rollout_completed", "completed", float(poisoned["rollout_state"] == "completed"),
                                  poisoned["rollout_state"] == "completed"),
        "ingest_lag_p99_ratio": goal("ingest_lag_p99_ratio", "<= 1.2 x clean", ratio, ratio <= 1.2),
    }
    return {"results": {"poison_period_s": 0.01, "poison_s": poison_s, "clean": clean, "poisoned": poisoned,
                        "lag_p99_ratio": round(ratio, 3)},
            "goals": goals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 devices, 10 s of poison")
    parser.add_argument("--poisoner", nargs=2, metavar=("BROKER", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poisoner:
        print(_poison(args.poisoner[0], float(args.poisoner[1])))
        return
    print(json.dumps(run(args.quick), indent=2))


if __name__ == "__main__":
    main()
