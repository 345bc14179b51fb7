"""The agent and the app as separate processes: the app follows what the agent commits, never a
failing version, and hands its traffic per version to the agent through the store (also as another
user)."""

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

from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy

from .conftest import wait_for

#: Installs only: this test is about following the store (verdicts on traffic are tested elsewhere).
FAST = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0,
                     analysis=False)

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
#: Parts of the interpreter's installation the app does not need (the copy stays about 75 MB).
_NOT_COPIED = shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter", "turtledemo", "lib2to3",
                                     "ensurepip", "__pycache__")


def _python_for(user: int, where: Path) -> tuple[list[str], dict[str, str]]:
    """A command that runs this environment's Python as ``user``: this interpreter copied under ``where``.

    The interpreter may live where another user cannot read it (pyenv under /root): its binary,
    libpython and standard library are copied to a world-readable place, and a ``.pth`` line
    adds this venv's site-packages (with its own ``.pth`` files, so the editable edgesdk too).
    A copy the user still cannot run fails the test with the reason; it never falls back to
    running the app as the agent's user.
    """
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    copy = where / "python"
    (copy / "bin").mkdir(parents=True)
    (copy / "lib").mkdir()
    shutil.copy2(Path(sys._base_executable).resolve(), copy / "bin" / version)  # type: ignore[attr-defined]
    for lib in (base / "lib").glob("libpython*.so*"):
        shutil.copy2(lib, copy / "lib" / lib.name)
    shutil.copytree(base / "lib" / version, copy / "lib" / version, ignore=_NOT_COPIED, dirs_exist_ok=True)
    site = copy / "lib" / version / "site-packages"
    site.mkdir()
    venv_site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "edgesdk-venv.pth").write_text(f"import site; site.addsitedir({venv_site!r})\n")
    for path in [where, *where.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() or os.access(path, os.X_OK)
                                                          else 0))
    command = [str(copy / "bin" / version)]
    env = {**os.environ, "LD_LIBRARY_PATH": str(copy / "lib")}
    probe = subprocess.run([*command, "-c", "import edgesdk, numpy, onnxruntime"], user=user, env=env,
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.fail(f"cannot run this environment's Python as uid {user} from a world-readable copy: "
                    f"{probe.stderr.strip()[-400:]}")
    return command, env


def _traffic(server, version: str) -> dict:
    """The figures on ``version`` of cam0's last state, as the server keeps them."""
    traffic = (server.db.details(["cam0"]).get("cam0") or {}).get("traffic") or {}
    return traffic.get("versions", {}).get(version) or {}


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
        # As root, the app runs as nobody for real; as another user, it runs as that user (not the agent's).
        app_user = NOBODY if os.geteuid() == 0 else None
        python, env = _python_for(app_user, root / "interpreter") if app_user is not None else (
            [sys.executable], dict(os.environ))
        with open(root / "app.err", "wb") as app_err:
            app = subprocess.Popen([*python, str(script), str(store), str(app_log), str(stop)], stderr=app_err,
                                   user=app_user, env=env)
        served = lambda: [json.loads(line) for line in app_log.read_text().splitlines()]  # noqa: E731
        wait_for(lambda: any(r.get("ok") == "1.0.0" for r in served()), timeout=60, what="the app on v1")
        assert _rollout(server, "2.0.0").state == "completed"
        wait_for(lambda: served()[-1].get("ok") == "2.0.0", timeout=30, what="the app on v2")
        handed = store / "apps" / f"app-{app.pid}.json"  # the script's name, its pid
        wait_for(lambda: handed.exists() and "2.0.0" in json.loads(handed.read_text())["versions"],
                 timeout=30, what="the app's file with its swap to v2")
        failed = _rollout(server, "3.0.0")
        assert failed.state in ("aborted", "failed"), failed
        count = len(served())
        wait_for(lambda: len(served()) > count + 20, timeout=30, what="requests after the failed v3")
        on_v1 = sum(1 for r in served() if r.get("ok") == "1.0.0")
        # The state the agent published on rolling v3 back has what the app handed over at its swap.
        wait_for(lambda: abs(_traffic(server, "1.0.0").get("calls", -9) - on_v1) <= 2, timeout=30,
                 what=f"the app's {on_v1} calls on v1 in the device's traffic")
        assert _traffic(server, "2.0.0")["starts"] == 1 and _traffic(server, "1.0.0")["errors"] == 0
        app_file = handed.stat()
    finally:
        stop.touch()
        if app is not None:
            app.wait(timeout=30)
        agent.terminate()
        agent.wait(timeout=30)
    records = served()
    state_mode = stat.S_IMODE(os.stat(store / "state.json").st_mode)
    apps_mode = os.stat(store / "apps").st_mode
    shutil.rmtree(root, ignore_errors=True)
    errors = [r for r in records if "error" in r]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}\n{(root / 'app.err').read_text()}"
    versions = [r["ok"] for r in records]
    assert "3.0.0" not in versions, "the app ran the version that failed its health check on the device"
    assert versions[-1] == "2.0.0" and versions.index("2.0.0") > 0 and "1.0.0" in versions
    assert records[-1]["watch"] in ("inotify", "poll")
    assert records[-1]["uid"] == (app_user if app_user is not None else os.getuid())
    assert app_user is None or app_user != os.getuid(), "as root, the app must run as another user than the agent"
    assert state_mode & stat.S_IROTH and not state_mode & stat.S_IWOTH
    assert stat.S_IMODE(apps_mode) == 0o1777
    assert app_file.st_uid == (app_user if app_user is not None else os.getuid())
