"""Canary verdicts on the apps' real traffic, in the deployment the docs recommend (issue 58's "done when").

Everything is its own process, as on a device: a real mosquitto, `edgesdk server`, two `edgesdk agent` processes
with their default options, and on each device an app that follows its agent's store (``ManagedRuntime.follow``)
and serves calls. The apps hand their statistics to their agent through the store (no broker connection of their
own); the agents publish them; the server judges each stage on them:

- a release with the same answers and about 3x the latency is aborted at the canary, and the verdict cites the
  device and its figures;
- a release where 5% of the calls fail is aborted;
- a healthy release completes;
- with the apps stopped, a push ends inconclusive and paused, never completed.

Latency ratios on this shared 2-core host are timing, so the slow release does about 3x the work of the healthy one
on every call (a middle layer widened with zero weights: the same answers), and the push allows a 2x ratio instead of
the default 1.5x: a healthy release measured side by side stays well under 2x, a 3x one well over it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.ota_server.broker import LocalMosquitto as Mosquitto
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import MLPWeights, random_mlp
from tests.ota.conftest import wait_for
from tests.ota.test_cli_fleet import start_server_process

DEVICES = ("camA", "camB")
#: The app: follows its agent's store, serves a batch of 32 camera frames' features about 60 times a second, and
#: writes how many calls it made to its ``served`` file every 100 calls (for the test to wait on, not for the agent).
APP = """
import os, sys, time
import numpy as np
from edgesdk import ManagedRuntime
store, stop, seed, served = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
app = ManagedRuntime.follow(store, profile="generic-x86_64", app="camera", threads=1, poll_s=0.2)
rng = np.random.default_rng(seed)
calls = 0
while not os.path.exists(stop):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    try:
        app.predict(x)
    except Exception:
        pass  # counted as a failed call by the runtime; the app goes on
    calls += 1
    if calls % 100 == 0:
        with open(served + ".tmp", "w") as f:
            f.write(str(calls))
        os.replace(served + ".tmp", served)
    time.sleep(1 / 60)
app.close()
"""


def _weights(pad: int) -> MLPWeights:
    """The camera model; ``pad`` zero columns in its middle layer add work and change no answer."""
    (w1, b1), (w2, b2), (w3, b3) = random_mlp([64, 1024, 1024, 10], seed=1).layers
    w2 = np.concatenate([w2, np.zeros((1024, pad), np.float32)], axis=1)
    b2 = np.concatenate([b2, np.zeros(pad, np.float32)])
    w3 = np.concatenate([w3, np.zeros((pad, 10), np.float32)], axis=0)
    return MLPWeights(((w1, b1), (w2, b2), (w3, b3)))


def _write_model(path: Path, pad: int, failing: bool) -> Path:
    """The model as ONNX; ``failing`` adds a lookup indexed by 100x the first feature of the first row into a table of
    196, which runs off the table (onnxruntime raises) for the 5% of standard-normal inputs beyond 1.96; its value is
    multiplied by 0, so no answer changes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.testing import write_mlp_onnx

    write_mlp_onnx(_weights(pad), path)
    if not failing:
        return path
    model = onnx.load(path)
    graph = model.graph
    output = graph.output[0].name
    graph.initializer.extend([numpy_helper.from_array(np.array(100.0, np.float32), "lookup_scale"),
                              numpy_helper.from_array(np.zeros(196, np.float32), "lookup_table"),
                              numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
                              numpy_helper.from_array(np.array([1, 1], np.int64), "ends"),
                              numpy_helper.from_array(np.array([0, 1], np.int64), "axes"),
                              numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    graph.node[-1].output[0] = "answer"
    graph.node.extend([
        helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["x0"]),  # the first row's first feature
        helper.make_node("Mul", ["x0", "lookup_scale"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["lookup_table", "index"], ["looked_up"]),
        helper.make_node("Mul", ["looked_up", "zero"], ["nothing"]),
        helper.make_node("Add", ["answer", "nothing"], [output])])
    onnx.save(model, path)
    return path


def _bundle(folder: Path, version: str, keys: dict, pad: int = 0, failing: bool = False) -> Path:
    model = _write_model(folder / f"model-{version}.onnx", pad, failing)
    sample = np.zeros((32, 64), np.float32)  # its first feature is 0: the lookup stays on its table
    spec = BundleSpec("camera", version, "onnx-fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=5000.0))
    return bundle_from_model(folder / f"bundle-{version}", model, spec, {"input": sample},
                             private_key=keys["converter"]).path


@dataclass
class Device:
    """One device: its agent process and its app process."""

    name: str
    store: Path
    agent: subprocess.Popen
    app: subprocess.Popen | None = None


def _edgesdk() -> str:
    return str(Path(sys.executable).parent / "edgesdk")


@pytest.fixture(scope="module")
def recommended(tmp_path_factory, keys) -> Iterator[tuple[list[str], list[Device], Path]]:
    """The server and two devices (agent + app processes) on camera 1.0.0; the CLI's auth options. One fleet for the
    module, its tests in order: each pushes a version above the last and leaves the group on a release its apps
    serve (the last one stops the apps)."""
    tmp_path = tmp_path_factory.mktemp("recommended")
    broker = Mosquitto(tmp_path / "broker")
    url, server = start_server_process(tmp_path, broker, keys)
    auth = ["--server", url, "--token", "s3cret"]
    devices = []
    for name in DEVICES:
        store = tmp_path / "devices" / name
        with open(tmp_path / f"agent-{name}.log", "ab") as log:  # the process keeps its own copy of the file
            agent = subprocess.Popen([_edgesdk(), "agent", "--device-id", name, "--group", "cams", "--broker",
                                      broker.url, "--store", str(store), "--server-key",
                                      str(keys["dir"] / "server.pub"), "--profile", "generic-x86_64"],
                                     stdout=log, stderr=log)
        devices.append(Device(name, store, agent))
    stop = tmp_path / "stop-apps"
    try:
        wait_for(lambda: json.loads(_cli("devices", "--group", "cams", "--json", *auth))["total"] == 2, 60,
                 what="both agents online")
        first = _bundle(tmp_path, "1.0.0", keys)
        pushed = CliRunner().invoke(cli, ["push", str(first), "--group", "cams", "--canary", "100%", "--health-window",
                                          "0s", "--no-analysis", "--wait", "120", *auth], catch_exceptions=False)
        assert pushed.exit_code == 0, pushed.output
        assert "not judged: canary analysis is off (--no-analysis)" in pushed.stderr, "push says what it did not judge"
        for i, device in enumerate(devices):
            with open(tmp_path / f"app-{device.name}.log", "ab") as log:
                device.app = subprocess.Popen([sys.executable, "-c", APP, str(device.store), str(stop), str(i),
                                               str(tmp_path / f"served-{device.name}")],
                                              stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        # 1,500 calls on 1.0.0 each (25 s): a device's own figures on the version it ran before are its canary's
        # baseline (the other device reports every 5 minutes), and over the first few hundred calls a process's
        # start-up (imports, the first inferences' allocations) still sits in the p99.
        wait_for(lambda: all(_served(tmp_path / f"served-{d.name}") >= 1500 for d in devices), 120,
                 what="both apps serving 1.0.0")
        yield auth, devices, stop
    finally:
        stop.touch()
        for device in devices:
            for process in (device.app, device.agent):
                if process is not None and process.poll() is None:
                    process.terminate()
                    process.wait(timeout=20)
        server.terminate()
        server.wait(timeout=20)
        broker.stop()


def _served(path: Path) -> int:
    """The calls an app says it made (0 before its first hundred)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _cli(*args: str, exit_code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    return result.stdout


def _push(bundle: Path, auth: list[str], *options: str, exit_code: int) -> dict:
    """Push with a 50% canary, a 10 s health window and a 2x latency limit; the rollout as the API shows it."""
    out = _cli("push", str(bundle), "--group", "cams", "--canary", "50%", "--waves", "100", "--health-window", "10s",
               "--max-p99-ratio", "2", *options, "--wait", "180", "--json", *auth, exit_code=exit_code)
    return json.loads(out)


def _versions(auth: list[str]) -> dict[str, str]:
    devices = json.loads(_cli("devices", "--group", "cams", "--json", *auth))["devices"]
    return {d["id"]: d["version"] for d in devices}


def test_a_release_3x_slower_is_aborted_at_the_canary_citing_the_device_and_its_figures(recommended, tmp_path,
                                                                                       keys):
    auth, devices, _ = recommended
    r = _push(_bundle(tmp_path, "2.0.0", keys, pad=3072), auth, exit_code=17)
    verdict = r["verdict"]
    assert (r["state"], verdict["stage"], verdict["outcome"]) == ("aborted", 1, "failed"), r["reason"]
    (canary,) = [d for d in verdict["devices"] if d["outcome"] == "fail"]
    assert canary["device"] in DEVICES and "p99" in canary["reason"] and canary["figures"]["calls"] >= 100
    assert canary["device"] in r["reason"] and "x the" in r["reason"]
    wait_for(lambda: set(_versions(auth).values()) == {"1.0.0"}, 60, what="the canary reverted to 1.0.0")


def test_a_release_failing_5_percent_of_calls_is_aborted(recommended, tmp_path, keys):
    auth, devices, _ = recommended
    r = _push(_bundle(tmp_path, "2.0.1", keys, failing=True), auth, exit_code=17)
    assert r["state"] == "aborted" and r["verdict"]["outcome"] == "failed", r["reason"]
    assert "error rate" in r["reason"] and "95% confidence" in r["reason"]
    wait_for(lambda: set(_versions(auth).values()) == {"1.0.0"}, 60, what="the canary reverted to 1.0.0")


def test_a_healthy_release_completes_and_then_with_the_apps_stopped_a_push_pauses_inconclusive(recommended, tmp_path,
                                                                                              keys):
    auth, devices, stop = recommended
    r = _push(_bundle(tmp_path, "2.0.2", keys), auth, exit_code=0)
    assert r["state"] == "completed" and r["verdict"]["outcome"] == "passed", r["verdict"]
    assert set(_versions(auth).values()) == {"2.0.2"}
    stop.touch()
    for device in devices:
        assert device.app is not None and device.app.wait(timeout=30) == 0
    paused = _push(_bundle(tmp_path, "3.0.0", keys), auth, "--evidence-grace", "10s", exit_code=31)
    assert (paused["state"], paused["phase"], paused["verdict"]["outcome"]) == ("running", "waiting_for_promote",
                                                                                "inconclusive")
    assert "devices have evidence" in paused["verdict"]["reason"]
