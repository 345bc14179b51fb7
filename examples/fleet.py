"""Fleet part of the demo: a real broker, the OTA server, 20 device agents, canary rollouts from the CLI.

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
    app = ManagedRuntime(profile="generic-x86_64", swap_order="load-first")  # device 00 also serves an app
    # The agents stand in for RK3588 boards (the bundle was converted for one): a device is sent only bundles of its
    # own board, and a real board detects its profile; this x86 host would report generic-x86_64.
    agents = [DeviceAgent(AgentConfig(f"cam{i:02d}", "cams", broker.url, out / "devices" / f"cam{i:02d}",
                                      server_key=server_key, profile="rk3588"), runtime=app if i == 0 else None).start()
              for i in range(N_DEVICES)]
    while len(server.db.devices("cams")) < N_DEVICES:
        time.sleep(0.1)
    print(f"   {N_DEVICES} agents online; admin API on {url}")

    served, failed, stop = [0], [0], threading.Event()
    sample, _ = read_bundle(bundle_dir).health_sample()

    def traffic() -> None:
        while not stop.is_set():
            try:
                app.predict(sample)
                served[0] += 1
            except Exception:  # the app's view: any exception is a failed request
                failed[0] += 1

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
        first = cli("push", str(bundle_dir), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                    "--health-window", "1s", "--wait", "180")
        ok &= "completed" in first
        worker = threading.Thread(target=traffic, daemon=True)
        worker.start()  # from here on, the app on cam00 answers requests through every update
        name = read_bundle(bundle_dir).manifest.name
        good = release(bundle_dir, out / "bundle-1.0.1", keys, "1.0.1")
        ok &= "completed" in cli("push", str(good), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                                 "--health-window", "1s", "--wait", "180")
        bad = release(bundle_dir, out / "bundle-1.1.0", keys, "1.1.0", broken=True)
        ok &= "aborted" in cli("push", str(bad), "--group", "cams", "--canary", "10%", "--waves", "50,100",
                               "--health-window", "1s", "--max-failure-rate", "5%", "--wait", "180")
        stop.set()
        worker.join()
        versions = {a.current_version() for a in agents}
        print(f"   after the aborted canary every device runs {sorted(versions)}; the app on cam00 swapped models "
              f"{app.swaps - 1} time(s) under load and served {served[0]} requests with {failed[0]} failures")
        ok &= versions == {(name, "1.0.1")} and failed[0] == 0 and served[0] > 0 and app.swaps == 2
    finally:
        stop.set()
        for agent in agents:
            agent.stop()
        app.close()
        running.stop()
        broker.stop()
    return ok


if __name__ == "__main__":
    sys.exit(0 if run(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])) else 1)
