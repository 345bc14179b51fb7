"""Canary analysis with real agents serving real load: the traffic their ManagedRuntimes report judges each stage.

The apps here serve on the agent's own ManagedRuntime (in its process); the recommended deployment, an app in its
own process following the store, is ``test_rollout_on_app_traffic.py``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk.agent.managed import ManagedRuntime
from edgesdk.cli import cli
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy
from tests.ota.conftest import make_bundle, rollout_to, wait_for

TOKEN = "canary-token"
DEVICES = 4
#: Two canary devices, then the rest; 5 s of figures (reports every 0.3 s) per stage, a device counting from 50 calls:
#: under a loaded CI host the slow release's canaries made fewer than 100 calls in 3 s, passed with "no figures", and
#: the regression was caught only at stage 2.
POLICY = RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=5.0, max_failure_rate=0.0, deploy_timeout_s=60,
                       min_calls=50)
#: For the tests of the mechanics (a healthy release is judged on live figures and passes, manual promotion waits):
#: the p99 check runs and records its figures, but no scheduling noise can fail it. The same model's p99 of about
#: 0.3 ms, on four agents sharing this 2-core host with the rest of the suite, measured 1.7x and 3.4x between stages
#: under CI load, which is timing, not behaviour. Whether a ratio fails is judged on given figures in
#: tests/unit/test_canary.py, a real regression aborts below, and benchmarks/fleet/rollout_safety.py measures false
#: aborts at 1.5x.
MECHANICS_ONLY = replace(POLICY, max_p99_ratio=1000.0)


@pytest.fixture
def fleet(broker, start_server, make_agent, bundles) -> Iterator[tuple]:
    """A server with its admin API and 4 agents serving load on ManagedRuntimes, all on digits 1.0.0 (width 32)."""
    running = start_server(broker.url, token=TOKEN)
    runtimes = [ManagedRuntime(profile="generic-x86_64", threads=1) for _ in range(DEVICES)]
    agents = [make_agent(f"cam{i}", broker.url, runtime=m, state_interval_s=0.3) for i, m in enumerate(runtimes)]
    wait_for(lambda: running.ota.db.device_total(status="online") == DEVICES, what="the devices online")
    running.ota.upload(pack_bundle(bundles["1.0.0"]))
    assert rollout_to(running.ota, "1.0.0").state == "completed"
    stop = threading.Event()

    def serve(managed: ManagedRuntime) -> None:  # an app's steady trickle of requests, on whichever model is active
        x = np.ones((1, 64), np.float32)
        while not stop.is_set():
            managed.predict(x)
            time.sleep(0.003)

    threads = [threading.Thread(target=serve, args=(m,), daemon=True) for m in runtimes]
    for t in threads:
        t.start()
    def calls_on_1() -> list[int]:
        details = running.ota.db.details(f"cam{i}" for i in range(DEVICES)).values()
        return [((d.get("traffic") or {}).get("versions", {}).get("1.0.0") or {}).get("calls", 0) for d in details]

    wait_for(lambda: len(calls_on_1()) == DEVICES and min(calls_on_1()) >= 150, 30,
             what="every device's traffic on 1.0.0")
    try:
        yield running, agents
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for m in runtimes:
            m.close()


def test_a_p99_regression_aborts_the_canary_with_its_figures(fleet, tmp_path, keys):
    running, agents = fleet
    # ~40x the work of each call: at 10x, a CI run under load saw the baseline's p99 (OS scheduling, not the model)
    # within 1.5x of the slow release's, and the canary passed.
    slow = make_bundle(tmp_path / "slow", "2.0.0", keys, seed=2, width=65536)
    running.ota.upload(pack_bundle(slow))
    # 10 s of figures: in one CI run the slow canaries had too few calls after 5 s and passed with "no figures".
    r = rollout_to(running.ota, "2.0.0", policy=replace(POLICY, health_window_s=10.0))
    assert r.state == "aborted" and "failed its canary analysis: on generic-x86_64, 2 of 2 devices failed" in \
        r.reason, r.reason
    assert "x the live baseline's" in r.reason and "(> 1.5x; at least" in r.reason
    verdict = r.to_json()["verdict"]
    assert (verdict["outcome"], verdict["stage"], verdict["canary"]["devices"]) == ("failed", 1, 2)
    assert verdict["baseline"]["source"] == "live" and verdict["baseline"]["devices"] == 2
    assert verdict["canary"]["p99_ms"] > 1.5 * verdict["baseline"]["p99_ms"]
    wait_for(lambda: all(a.current_version() == ("digits", "1.0.0") for a in agents), 60, what="the canary reverted")


def test_a_healthy_release_passes_its_canary_and_completes(fleet, bundles):
    running, agents = fleet
    running.ota.upload(pack_bundle(bundles["2.0.0"]))
    r = rollout_to(running.ota, "2.0.0", policy=MECHANICS_ONLY)
    assert r.state == "completed", r.reason
    assert r.verdict["outcome"] == "passed" and r.verdict["stage"] == 2 and r.phase == "completed"
    stages = [e.payload for e in running.ota.db.events(r.id) if e.type == "stage_verdict"]
    assert [v["stage"] for v in stages] == [1, 2] and stages[0]["canary"]["passed"] == 2, stages
    # The canary is judged against the live devices still on 1.0.0; the last stage against what the canary's
    # stage kept of them (no device is left on 1.0.0 then).
    assert stages[0]["boards"][0]["baseline"]["source"] == "live", stages[0]
    assert stages[1]["boards"][0]["baseline"]["source"] == "snapshot", stages[1]
    assert all(b["p99_ms"] > 0 and b["baseline"]["p99_ms"] > 0 for v in stages for b in v["boards"]), stages
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)


def test_push_manual_waits_for_promote_and_promote_waits_for_its_stage(fleet, bundles):
    running, agents = fleet
    auth = ["--server", running.url, "--token", TOKEN]
    pushed = CliRunner().invoke(cli, ["push", str(bundles["2.0.0"]), "--group", "cams", "--canary", "50%", "--waves",
                                      "100", "--health-window", "3s", "--manual",
                                      "--max-p99-ratio", f"{MECHANICS_ONLY.max_p99_ratio:g}", "--wait", "60", *auth])
    assert pushed.exit_code == 0, pushed.output
    assert "waits for `edgesdk rollout promote" in pushed.stderr and "waiting for promote" in pushed.stdout
    rollout_id = pushed.stdout.split()[1].rstrip(":")
    shown = json.loads(CliRunner().invoke(cli, ["rollout", "status", rollout_id, "--json", *auth]).stdout)
    assert shown["phase"] == "waiting_for_promote" and shown["state"] == "running" and shown["verdict"]["passed"]
    assert sum(a.current_version() == ("digits", "2.0.0") for a in agents) == 2
    promoted = CliRunner().invoke(cli, ["rollout", "promote", rollout_id, "--wait", "60", *auth])
    assert promoted.exit_code == 0, promoted.output
    assert "completed" in promoted.stdout and "canary analysis, stage 2: passed" in promoted.stdout
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)
