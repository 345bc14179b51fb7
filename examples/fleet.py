"""Fleet part of the demo: a real broker, the OTA server, 20 device agents, canary rollouts from the CLI.

Every device runs an app on a ManagedRuntime (in the agent's process here; on a board, its own process following
the store) whose traffic the agent reports, and each stage of a push is judged on it: the first release goes out
with --no-analysis (nothing to compare it with yet), the next one passes its canary analysis on the apps' calls,
and one whose health check fails is rolled back by its canaries and aborted.

Run by examples/quickstart.py (step 6) with the bundle it converted; on its own:
    python examples/fleet.py BUNDLE_DIR KEYS_DIR OUT_DIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgesdk import ManagedRuntime
from edgesdk.agent.agent import DeviceAgent
from edgesdk.agent.config import AgentConfig
from edgesdk.ota_server.app import ServerSetup, build_server
from edgesdk.ota_server.broker import free_port, start_local_broker
from edgesdk.ota_server.server import ServerConfig
from edgesdk.runtime.bundle import BundleSpec, HealthSample, read_bundle, write_bundle
from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key

N_DEVICES = 20


def release(good: Path, out: Path, keys: Path, version: str, broken: bool = False) -> Path:
    """The same model re-released as ``version``; ``broken`` gives it a health sample it does not reproduce."""
    bundle = read_bundle(good)
    inputs, expected = bundle.health_sample()
    m = bundle.manifest
    if broken:
        expected = {k: np.roll(v, 1, axis=-1) + 0.5 for k, v in expected.items()}
    write_bundle(out, bundle.read_model(), replace(BundleSpec.of(m), version=version),
                 HealthSample(m.inputs, m.outputs, inputs, expected), load_private_key(keys / "edgesdk.key"))
    return out


def run(bundle_dir: Path, keys: Path, out: Path) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    if not (keys / "server.key").exists():
        generate_keypair(keys, "server")
    broker = start_local_broker(out / "broker")
    print(f"   broker: {type(broker).__name__} on {broker.url}")
    token = os.urandom(16).hex()
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.1), repo=out / "repo", db=out / "fleet.db",
                                       signing_key=load_private_key(keys / "server.key"),
                                       bundle_key=load_public_key(keys / "edgesdk.pub"),
                                       http=f"127.0.0.1:{free_port()}", token=token))
    server, url = running.ota, running.url
    server_key = load_public_key(keys / "server.pub")
    apps = [ManagedRuntime(profile="generic-x86_64", swap_order="load-first") for _ in range(N_DEVICES)]
    # The agents stand in for RK3588 boards (the bundle was converted for one): a device is sent only bundles of its
    # own board, and a real board detects its profile; this x86 host would report generic-x86_64.
    # traffic_every_s=2: while judged, each agent reports its app's figures every 2 s instead of 10, so the demo's
    # stages get their evidence in seconds (a fleet keeps the default: 20,000 devices every 2 s is a lot of states).
    agents = [DeviceAgent(AgentConfig(f"cam{i:02d}", "cams", broker.url, out / "devices" / f"cam{i:02d}",
                                      server_key=server_key, profile="rk3588", traffic_every_s=2.0),
                          runtime=apps[i]).start()
              for i in range(N_DEVICES)]
    while len(server.db.devices("cams")) < N_DEVICES:
        time.sleep(0.1)
    print(f"   {N_DEVICES} agents online, each with an app; admin API on {url}")

    served, failed, stop = [0] * N_DEVICES, [0] * N_DEVICES, threading.Event()
    sample, _ = read_bundle(bundle_dir).health_sample()

    def traffic(i: int) -> None:  # an app's camera: about 100 frames a second
        while not stop.wait(0.01):
            try:
                apps[i].predict(sample)
                served[i] += 1
            except Exception:  # the app's view: any exception is a failed request
                failed[i] += 1

    env = {**os.environ, "EDGESDK_SERVER": url, "EDGESDK_TOKEN": token}
    edgesdk = str(Path(sys.executable).parent / "edgesdk")

    def cli(*args: str) -> str:
        print(f"   $ edgesdk {' '.join(args)}")
        done = subprocess.run([edgesdk, *args], env=env, capture_output=True, text=True)
        text = (done.stdout + done.stderr).strip()
        print("     " + text.replace("\n", "\n     "))
        return text

    ok = True
    try:
        # The first release: no app serves yet, and there is nothing to compare its figures with.
        first = cli("push", str(bundle_dir), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                    "--health-window", "1s", "--no-analysis", "--wait", "180")
        ok &= "completed" in first
        workers = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(N_DEVICES)]
        for worker in workers:
            worker.start()  # from here on, every app answers requests through every update
        while min(served) < 300:  # each device's figures on the running version: its canary's baseline
            time.sleep(0.1)
        name = read_bundle(bundle_dir).manifest.name
        good = release(bundle_dir, out / "bundle-1.0.1", keys, "1.0.1")
        judged = cli("push", str(good), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                     "--health-window", "2s", "--wait", "300")
        ok &= "completed" in judged and "canary analysis, stage 3: passed" in judged
        bad = release(bundle_dir, out / "bundle-1.1.0", keys, "1.1.0", broken=True)
        ok &= "aborted" in cli("push", str(bad), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                               "--health-window", "2s", "--max-failure-rate", "5%", "--wait", "180")
        stop.set()
        for worker in workers:
            worker.join()
        versions = {a.current_version() for a in agents}
        print(f"   after the aborted canary every device runs {sorted(versions)}; the apps swapped models under load "
              f"and served {sum(served)} requests with {sum(failed)} failures")
        ok &= versions == {(name, "1.0.1")} and sum(failed) == 0 and min(served) > 0 and apps[0].swaps == 2
    finally:
        stop.set()
        for agent in agents:
            agent.stop()
        for app in apps:
            app.close()
        running.stop()
        broker.stop()
    return ok


if __name__ == "__main__":
    sys.exit(0 if run(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])) else 1)
