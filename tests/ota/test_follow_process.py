"""The agent and the app as separate processes: the app follows what the agent commits, never a failing version."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from edgesdk.fleet_protocol import RolloutPolicy
from edgesdk.ota import pack_bundle

from .conftest import wait_for

FAST = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)

APP = """
import json, os, sys, time
import numpy as np
from edgesdk import ManagedRuntime
store, log_path, stop = sys.argv[1:4]
app = ManagedRuntime.follow(store, profile="generic-x86_64", poll_s=0.2)
x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
with open(log_path, "a") as log:
    while not os.path.exists(stop):
        try:
            app.predict(x)
            log.write(json.dumps({"ok": app.bundle.manifest.version, "watch": app.follower.mode, "uid": os.getuid()}) + "\\n")
        except Exception as exc:
            log.write(json.dumps({"error": repr(exc)}) + "\\n")
        log.flush()
        time.sleep(0.01)
app.close()
"""

NOBODY = 65534


def _as_another_user(python: str) -> int | None:
    """The uid to run the app as: nobody when this test is root and nobody can run this environment's Python."""
    if os.geteuid() != 0:
        return None
    try:
        probe = subprocess.run([python, "-c", "import edgesdk, numpy"], user=NOBODY, capture_output=True, timeout=120)
    except OSError:  # this checkout is not readable by nobody (e.g. under /root): run the app as this user
        return None
    return NOBODY if probe.returncode == 0 else None


def _rollout(server, version, policy=FAST):
    rollout = server.start_rollout("digits", version, "cams", policy)
    wait_for(lambda: server.status(rollout).state != "running", timeout=90, what=f"rollout of {version}")
    return server.status(rollout)


@pytest.mark.timeout(300)
def test_an_app_process_follows_the_agent_to_v2_and_never_runs_the_failing_v3(broker, make_server, keys, bundles):
    server = make_server(broker.url)
    for version in ("1.0.0", "2.0.0", "3.0.0-bad"):
        server.upload(pack_bundle(bundles[version]))
    # A world-traversable place, so that the app can run as another user than the agent.
    root = Path(tempfile.mkdtemp(prefix="edgesdk-follow-"))
    os.chmod(root, 0o755)
    store, app_log, stop = root / "store", root / "app.jsonl", root / "stop"
    app_log.touch(mode=0o666)
    os.chmod(app_log, 0o666)
    with open(root / "agent.log", "wb") as agent_log:  # Popen keeps its own copy of the descriptor
        agent = subprocess.Popen(
            [str(Path(sys.executable).parent / "edgesdk"), "agent", "--device-id", "cam0", "--group", "cams",
             "--broker", broker.url, "--store", str(store), "--server-key", str(keys["dir"] / "server.pub"),
             "--profile", "generic-x86_64"], stdout=subprocess.DEVNULL, stderr=agent_log)
    app, app_user = None, None
    try:
        wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
        assert _rollout(server, "1.0.0").state == "completed"
        script = root / "app.py"
        script.write_text(APP)
        app_user = _as_another_user(sys.executable)
        with open(root / "app.err", "wb") as app_err:
            app = subprocess.Popen([sys.executable, str(script), str(store), str(app_log), str(stop)], stderr=app_err,
                                   user=app_user)
        served = lambda: [json.loads(line) for line in app_log.read_text().splitlines()]  # noqa: E731
        wait_for(lambda: any(r.get("ok") == "1.0.0" for r in served()), timeout=60, what="the app on v1")
        assert _rollout(server, "2.0.0").state == "completed"
        wait_for(lambda: served()[-1].get("ok") == "2.0.0", timeout=30, what="the app on v2")
        failed = _rollout(server, "3.0.0")
        assert failed.state in ("aborted", "failed"), failed
        count = len(served())
        wait_for(lambda: len(served()) > count + 20, timeout=30, what="requests after the failed v3")
    finally:
        stop.touch()
        if app is not None:
            app.wait(timeout=30)
        agent.terminate()
        agent.wait(timeout=30)
    records = served()
    state_mode = stat.S_IMODE(os.stat(store / "state.json").st_mode)
    shutil.rmtree(root, ignore_errors=True)
    errors = [r for r in records if "error" in r]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}\n{(root / 'app.err').read_text()}"
    versions = [r["ok"] for r in records]
    assert "3.0.0" not in versions, "the app ran the version that failed its health check on the device"
    assert versions[-1] == "2.0.0" and versions.index("2.0.0") > 0 and "1.0.0" in versions
    assert records[-1]["watch"] in ("inotify", "poll")
    assert records[-1]["uid"] == (app_user if app_user is not None else os.getuid()), "the app ran as another user"
    assert state_mode & stat.S_IROTH and not state_mode & stat.S_IWOTH
