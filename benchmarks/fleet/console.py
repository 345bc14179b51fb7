"""The operator console at fleet scale: page times at 10,000 devices, and how fast a stage change reaches an open page.

A real OTA server (``build_server`` with the console, mosquitto on a free loopback port, a
SQLite fleet store) holds 10,000 simulated devices in 4 groups. Their states are written through
the store's own upsert, as the server writes the reports it receives, each with the details a
real agent reports: runtime percentiles, offload paths and disk. A rollout to one 2,500-device
group is started with ``start_rollout``, so its commands really go out over MQTT; no agent
answers them.

1. **Page time.** A logged-in client on loopback GETs each page ``--requests`` times: the fleet's
   first page, one group, a later page, one device, the rollouts list, the 2,500-device rollout
   and the repository. The figure is wall time per request at the client, an upper bound on the
   server's time. Goal (issue 26): fleet pages p95 ≤ 100 ms.
2. **Live updates.** The rollout page's event stream is open while targets change status, written
   as the server writes device reports. The figure is the time from each write to the event
   that shows it. Goal: ≤ 2 s. The browser test prints the same path end to end, through a
   real promote and chromium: ``stage change shown ... s``.

    python benchmarks/fleet/console.py [--devices 10000] [--requests 30] [--changes 10]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy, TargetStatus  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto, free_port  # noqa: E402
from edgesdk.ota_server.console.session import COOKIE  # noqa: E402
from edgesdk.ota_server.server import ServerConfig  # noqa: E402
from edgesdk.ota_server.store.fleet_db import DeviceState  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, load_private_key  # noqa: E402
from tests.ota.conftest import make_bundle  # noqa: E402
from tests.ota.console_client import ConsoleClient  # noqa: E402

TOKEN = "console-bench"
GROUPS = ("cams", "doors", "lobby", "yard")


def details(i: int) -> str:
    """What an agent with a ManagedRuntime reports: percentiles, offload paths, disk."""
    return json.dumps({"runtime": {"count": 1000 + i, "errors": 0, "window": 1000, "p50_ms": 20 + i % 7,
                                   "p95_ms": 30 + i % 11, "p99_ms": 40 + i % 13, "mean_ms": 22.0,
                                   "paths": {"local": {"count": 900, "errors": 0, "p99_ms": 41.0},
                                             "cloud": {"count": 100 + i % 50, "errors": 0, "p99_ms": 80.0}},
                                   "refused": 0, "fallbacks": 0, "breaker": "closed"},
                       "disk": {"free_bytes": 2 << 30, "store_bytes": 40 << 20}, "previous": "digits-1.0.0"})


def populate(server: Any, devices: int) -> list[str]:
    now = time.time()
    ids = [f"dev{i:05d}" for i in range(devices)]
    for start in range(0, devices, 1000):
        server.db.upsert_devices([DeviceState(d, GROUPS[i % len(GROUPS)], "online" if i % 97 else "offline",
                                              "digits", "1.0.0", ("digits-1.0.0",), now - (i % 600), details=details(i))
                                  for i, d in enumerate(ids[start:start + 1000], start)])
    return ids


def timed(client: ConsoleClient, path: str, requests: int) -> dict[str, float]:
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        page = client.get(path)
        times.append(time.perf_counter() - started)
        assert page.status == 200, (path, page.status, page.html[:300])
    times.sort()
    return {"p50_ms": statistics.median(times) * 1e3, "p95_ms": times[int(0.95 * (len(times) - 1))] * 1e3,
            "max_ms": times[-1] * 1e3, "bytes": len(page.html)}


def live_latency(base: str, client: ConsoleClient, server: Any, rollout: str, changes: int) -> list[float]:
    """Seconds from a target's status write to the event stream's message that shows it."""
    cookie = client.cookie(COOKIE)
    assert cookie is not None
    request = urllib.request.Request(f"{base}/ui/rollouts/{rollout}/live", headers={"Cookie": f"{COOKIE}={cookie.value}"})
    targets = [t.device_id for t in server.db.targets(rollout, stage=0, limit=changes)]
    seen: list[dict[str, Any]] = []
    arrived = threading.Condition()

    def read(stream: Any) -> None:
        try:
            for raw in stream:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    with arrived:
                        seen.append({"at": time.monotonic(), **json.loads(line[6:])})
                        arrived.notify_all()
        except (OSError, AttributeError, ValueError):  # the stream closed under the reader at the end
            return

    latencies = []
    rng = random.Random(0)
    with urllib.request.urlopen(request, timeout=60) as stream:
        threading.Thread(target=read, args=(stream,), daemon=True).start()
        for n, device in enumerate(targets, 1):
            time.sleep(rng.uniform(0.2, 1.2))  # changes at random moments of the page's poll cycle
            written = time.monotonic()
            server.db.set_target(rollout, device, TargetStatus.COMMITTED)
            with arrived:
                shown = arrived.wait_for(lambda n=n: any(e["stages"][0]["done"] >= n for e in seen), timeout=10)
            if not shown:
                raise RuntimeError(f"change {n} did not reach the stream within 10 s")
            latencies.append(next(e["at"] for e in seen if e["stages"][0]["done"] >= n) - written)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate_keypair(work / "keys", "server")
        generate_keypair(work / "keys", "converter")
        broker = LocalMosquitto(work / "broker")
        running = build_server(ServerSetup(ServerConfig(broker.url), repo=work / "repo", db=work / "fleet.db",
                                           signing_key=load_private_key(work / "keys" / "server.key"),
                                           allow_unsigned=True, http=f"127.0.0.1:{free_port()}", token=TOKEN,
                                           console=True))
        try:
            server, base = running.ota, running.url
            keys = {"converter": load_private_key(work / "keys" / "converter.key")}
            from edgesdk.fleet.archive import pack_bundle

            for version, seed in (("1.0.0", 1), ("2.0.0", 2)):
                server.upload(pack_bundle(make_bundle(work / f"bundle-{version}", version, keys, seed=seed)))
            log(f"writing {args.devices} devices")
            ids = populate(server, args.devices)
            # Its devices are written to the store, not run: nothing to judge, so the canary analysis is off.
            policy = RolloutPolicy(analysis=False, canary=0.1, waves=(1.0,), health_window_s=3600)
            rollout = server.start_rollout("digits", "2.0.0", "cams", policy)
            client = ConsoleClient(base)
            assert client.login(TOKEN).status == 200
            pages = {"fleet first page": "/ui/", "fleet, one group": "/ui/?group=doors",
                     "fleet, a later page": f"/ui/?after={ids[len(ids) // 2]}", "device": f"/ui/devices/{ids[5]}",
                     "rollouts": "/ui/rollouts", f"rollout of {args.devices // len(GROUPS)} devices": f"/ui/rollouts/{rollout}",
                     "repository": "/ui/repository"}
            results: dict[str, Any] = {"devices": args.devices, "pages": {}}
            for name, path in pages.items():
                client.get(path)  # warm: templates compiled, statements prepared
                results["pages"][name] = timed(client, path, args.requests)
                log(f"{name}: p50 {results['pages'][name]['p50_ms']:.1f} ms, p95 {results['pages'][name]['p95_ms']:.1f}")
            latencies = live_latency(base, client, server, rollout, args.changes)
            results["live_update_s"] = {"median": statistics.median(latencies), "max": max(latencies),
                                        "all": [round(x, 3) for x in latencies]}
        finally:
            running.stop()
            broker.stop()
    fleet_p95 = max(results["pages"][k]["p95_ms"] for k in ("fleet first page", "fleet, one group",
                                                            "fleet, a later page"))
    live_max = results["live_update_s"]["max"]
    emit("console", vars(args), results, [
        goal(f"fleet pages at {args.devices} devices: worst p95 ms", "<= 100", fleet_p95, fleet_p95 <= 100),
        goal("a target's status change reaches the open rollout page: worst seconds", "<= 2", live_max, live_max <= 2),
    ])


if __name__ == "__main__":
    main()
