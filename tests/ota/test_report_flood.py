"""Endless data from a device (issue 23, part 4): a device holding its own broker credentials floods the server
with states, events and chunk requests, over a real mosquitto with the fleet's ACL, while a rollout runs."""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from edgesdk import ManagedRuntime
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from edgesdk.ota_server.devices.report_guard import ReportLimits
from edgesdk.ota_server.mosquitto import write_mosquitto_config
from tests.ota.conftest import wait_for

FAST = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)
FLOOD = 4000  # messages of each kind
LIMITS = ReportLimits(report_every_s=0.5)  # the default burst and rate; flood events every 0.5 s, not 60 s


def _refused(server, kind: str) -> float:
    text = server.metrics.render()[0].decode()
    (line,) = [x for x in text.splitlines()
               if x.startswith(f'edgesdk_ota_reports_refused_total{{kind="{kind}",reason="flood"}}')]
    return float(line.split()[-1])


def _flood(transport: MqttTransport, deadline: float) -> int:
    """States (each claiming a new version), events (each claiming a commit) and chunk requests, interleaved; the
    last message is a state naming the final version. Returns how many of each kind went out."""
    sent = 0
    for i in range(FLOOD):
        if time.monotonic() > deadline:
            break
        transport.publish(Topics.state("evil"), json.dumps({"group": "lab", "status": "running", "model": "digits",
                                                            "version": f"6.6.{i}", "slots": []}).encode())
        transport.publish(Topics.events("evil"), json.dumps({"event": "committed", "deployment_id": f"fake-{i}",
                                                             "name": "digits", "version": f"6.6.{i}"}).encode())
        transport.publish(Topics.need("evil"), json.dumps({"transfer_id": "fake", "chunks": [0]}).encode())
        sent += 1
    transport.publish(Topics.state("evil"), json.dumps({"group": "lab", "status": "running", "model": "digits",
                                                        "version": "6.6.99999", "slots": []}).encode())
    return sent


def test_a_device_flooding_the_server_is_held_to_its_limit_and_the_fleet_keeps_updating(
        tmp_path, make_server, make_agent, bundles):
    port = free_port()
    config = write_mosquitto_config(tmp_path / "broker", {"cam0": "cams", "evil": "lab"}, port=port)
    broker = LocalMosquitto(tmp_path / "broker", conf_lines=config.conf.read_text().splitlines(), port=port)
    try:
        creds = {d: json.loads(p.read_text()) for d, p in config.credentials.items()}
        server = make_server(broker.url, username=config.server_username, password=config.server_password,
                             report_limits=LIMITS)
        runtime = ManagedRuntime(profile="generic-x86_64")
        agent = make_agent("cam0", broker.url, runtime=runtime, username="cam0", password=creds["cam0"]["password"])
        wait_for(lambda: server.db.device("cam0"), what="device")
        for version in ("1.0.0", "2.0.0"):
            server.upload(pack_bundle(bundles[version]))
        first = server.start_rollout("digits", "1.0.0", "cams", FAST)
        wait_for(lambda: server.status(first).state == "completed", timeout=60, what="rollout 1.0.0")

        attacker = MqttTransport(broker.url, client_id="evil", username="evil", password=creds["evil"]["password"])
        started = time.monotonic()
        sent: list[int] = []
        flood = threading.Thread(target=lambda: sent.append(_flood(attacker, started + 30)))
        flood.start()
        second = server.start_rollout("digits", "2.0.0", "cams", FAST)  # while the flood runs
        flood.join()
        # The attacker's last word is a state; the server's view of it ends there (a waiting state is read
        # when the device's bucket refills, never dropped), and by then it has handled everything before it.
        wait_for(lambda: (server.db.device("evil") or None) and server.db.device("evil").version == "6.6.99999",
                 timeout=60, what="the attacker's last state")
        wait_for(lambda: server.status(second).state != "running", timeout=60, what="rollout 2.0.0")
        assert server.ingest.flush()
        elapsed = time.monotonic() - started
        attacker.close()

        # The fleet kept updating: cam0 installed 2.0.0 and answers.
        assert server.status(second).state == "completed"
        assert agent.current_version() == ("digits", "2.0.0")
        assert runtime.predict(np.zeros((1, 64), np.float32)).shape[0] == 1

        # The attacker was held to its bucket: what the server logged of its events is at most the burst plus the
        # rate over the whole run, of the sent[0] events and sent[0] chunk requests (one bucket for both).
        (n,) = sent
        assert n > LIMITS.event_burst + LIMITS.event_per_s * elapsed, f"the flood ({n}) did not exceed the limit"
        rows = server.db.events(device_id="evil")
        logged = [r for r in rows if r.type == "committed"]
        assert len(logged) <= LIMITS.event_burst + LIMITS.event_per_s * elapsed
        admitted_at_most = LIMITS.event_burst + LIMITS.event_per_s * elapsed
        assert _refused(server, "event") + _refused(server, "need") >= 2 * n - admitted_at_most
        assert _refused(server, "state") > 0  # waiting states replaced by newer ones

        # ... and the server said so: its event log holds "flood" events of that device that account for every
        # refused report the metrics counted.
        def logged_floods() -> dict[str, int]:
            floods = [r.payload for r in server.db.events(device_id="evil") if r.type == "flood"]
            assert all("evil sent more reports than its limit allows" in f["reason"] for f in floods)
            return {kind: sum(f["refused"].get(kind, 0) for f in floods) for kind in ("state", "event", "need")}

        counted = {kind: _refused(server, kind) for kind in ("state", "event", "need")}
        wait_for(lambda: logged_floods() == counted, timeout=10, what=f"flood events adding up to {counted}")
        # Its fake commits moved nothing: no rollout targets it, and cam0's rollout is the one that completed.
        assert all(t.device_id == "cam0" for t in server.status(second).targets)
    finally:
        broker.stop()
