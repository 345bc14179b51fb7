"""Apps in other processes hand their traffic to a real agent, which publishes it per version.

Two app processes follow the agent's store (as ``ManagedRuntime.follow`` is meant to be used) and
serve a known number of calls on each version they run; the agent (a DeviceAgent on a real
mosquitto) is judged (a signed command with ``judge_s``), so it reports every half second and the
apps write as often. The server's stored figures must count exactly the apps' calls under each
version, add the second app's, show a crashed and restarted app in ``restarts``, and leave out the
health checks the apps ran when they swapped to the new version.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from edgesdk.agent.app_file import APPS_DIR, CADENCE_FILE
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics, archive_info, sign_command
from edgesdk.fleet.transport import MqttTransport

from .conftest import FAST, rollout_to, wait_for

#: Installs only: this test checks the figures that reach the server, not a verdict on them.
INSTALL = replace(FAST, analysis=False)

#: Serves ``limit`` calls on each version it runs, then idles until ``stop`` exists; a line a call.
APP = """
import json, os, sys, time
import numpy as np
from edgesdk import ManagedRuntime
store, log_path, stop, name, limit = sys.argv[1:6]
app = ManagedRuntime.follow(store, profile="generic-x86_64", poll_s=0.2, app=name)
x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
served = {}
with open(log_path, "a") as log:
    while not os.path.exists(stop):
        before = app.bundle.manifest.version
        if served.get(before, 0) >= int(limit):
            time.sleep(0.02)
            continue
        app.predict(x)
        after = app.bundle.manifest.version
        served[before] = served.get(before, 0) + 1
        log.write(json.dumps({"v": before, "sure": before == after}) + "\\n")
        log.flush()
app.close()
"""


class AppProcess:
    """One app process and what it logged."""

    def __init__(self, root: Path, store: Path, name: str, limit: int, stop: Path) -> None:
        self.log = root / f"{name}-{time.monotonic_ns()}.jsonl"
        self.log.touch()
        command = [sys.executable, str(root / "app.py"), str(store), str(self.log), str(stop), name,
                   str(limit)]
        with open(root / f"{name}.err", "ab") as errors:  # Popen keeps its own copy of it
            self.process = subprocess.Popen(command, stderr=errors)

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def _traffic(server) -> dict:
    return (server.db.details(["cam0"]).get("cam0") or {}).get("traffic") or {}


def _version(server, version: str) -> dict:
    return _traffic(server).get("versions", {}).get(version) or {}


def _judge(broker_url: str, keys: dict, bundle: Path) -> None:
    """A signed deploy of the version cam0 runs, with judge_s: it commits at once and is judged."""
    envelope = sign_command(keys["server"], type="deploy", deployment_id="judge-1",
                            transfer_id="judge-1", name="digits", version="1.0.0", group="cams",
                            archive=archive_info(pack_bundle(bundle)), judge_s=600.0)
    sender = MqttTransport(broker_url, client_id=f"operator-{time.monotonic_ns()}")
    try:
        sender.publish(Topics.cmd("cam0"), envelope)
        sender.confirm_access()
    finally:
        sender.close()


def _expect(server, version: str, what: str, **figures: int) -> dict:
    def matches() -> bool:
        entry = _version(server, version)
        return all(entry.get(key) == value for key, value in figures.items())

    try:
        wait_for(matches, timeout=60, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: the server has {_version(server, version)}") from None
    return _version(server, version)


@pytest.mark.timeout(300)
def test_apps_in_other_processes_hand_their_traffic_per_version_to_the_agent(
        broker, make_server, make_agent, keys, bundles, tmp_path):
    server = make_server(broker.url)
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    agent = make_agent("cam0", broker.url, traffic_every_s=0.5)
    assert agent.config.state_interval_s == 300.0  # the default: fast only while judged
    wait_for(lambda: server.db.device("cam0") is not None, what="the agent's first state")
    assert rollout_to(server, "1.0.0", policy=INSTALL).state == "completed"
    _judge(broker.url, keys, bundles["1.0.0"])
    wait_for(lambda: agent.reporter.cadence.judged_until > time.time() + 500,
             what="the agent judged")
    store = agent.store.root
    assert json.loads((store / APPS_DIR / CADENCE_FILE).read_text())["every_s"] == 0.5
    (tmp_path / "app.py").write_text(APP)
    stop = tmp_path / "stop"
    apps: list[AppProcess] = []
    try:
        apps.append(camera := AppProcess(tmp_path, store, "camera", 200, stop))
        first = _expect(server, "1.0.0", "one app's 200 calls", calls=200, errors=0, apps=1,
                        starts=1, restarts=0)
        assert first["p50_ms"] is not None
        assert 0 < first["p50_ms"] <= first["p95_ms"] <= first["p99_ms"]
        assert first["from"] <= first["to"] and first["local"] == first["cloud"] == 0

        apps.append(AppProcess(tmp_path, store, "counter", 150, stop))
        _expect(server, "1.0.0", "a second app's calls added", calls=350, apps=2, starts=2,
                restarts=0)

        wait_for(lambda: len(camera.calls()) == 200, what="the camera app done")
        camera.process.send_signal(signal.SIGKILL)  # a crash: its file stays, its figures count
        camera.process.wait(timeout=30)
        apps.append(AppProcess(tmp_path, store, "camera", 100, stop))
        _expect(server, "1.0.0", "the restarted app", calls=450, apps=3, starts=3, restarts=1)

        # The live apps swap to 2.0.0, each after a health check whose calls must not count.
        assert rollout_to(server, "2.0.0", policy=INSTALL).state == "completed"
        new = _expect(server, "2.0.0", "the apps' calls on 2.0.0", calls=250, apps=2, starts=2)
        assert new["errors"] == 0 and new["restarts"] == 1 and new["p99_ms"] is not None
        assert _version(server, "1.0.0")["calls"] == 450  # the old version's figures are its own
    finally:
        stop.touch()
        for app in apps:
            if app.process.poll() is None:
                app.process.wait(timeout=60)
    logged = Counter(call["v"] for app in apps for call in app.calls())
    assert logged == {"1.0.0": 450, "2.0.0": 250}, logged
    assert all(call["sure"] for app in apps for call in app.calls()), "a call ran across a swap"
    assert not any(app.process.returncode for app in apps[1:]), [a.process.returncode for a in apps]
