"""Fault tests, each against a real mosquitto with real agents (some in their own processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edgesdk.agent.managed import ManagedRuntime
from edgesdk.agent.store import ModelStore
from edgesdk.errors import BrokerError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics, archive_info, sign_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.server import OTAServer
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.signing import generate_keypair, load_private_key
from tests.ota.conftest import make_bundle, wait_for

FAST = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)


def _rollout(server, version, group="cams", policy=FAST, timeout=60):
    rollout = server.start_rollout("digits", version, group, policy)
    wait_for(lambda: server.status(rollout).state != "running", timeout=timeout, what=f"rollout {version}")
    return server.status(rollout)


def _setup(broker, make_server, make_agent, bundles, n=1, versions=("1.0.0",)):
    server = make_server(broker.url)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(n)]
    wait_for(lambda: len([d for d in server.db.devices("cams") if d.status == "online"]) == n, what="devices")
    for version in versions:
        server.upload(pack_bundle(bundles[version]))
    return server, agents


def _target(server, rollout_id, device):
    (target,) = [t for t in server.status(rollout_id).targets if t.device_id == device]
    return target


def _push_and_kill_mid_transfer(tmp_path, broker, keys, server, policy):
    """Start cam0's agent in its own process, push digits 1.0.0, and see it die after 5 chunks; the rollout id."""
    first = _agent_process(tmp_path, broker, keys, "cam0", failpoint="after_chunks:5")
    wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
    rollout = server.start_rollout("digits", "1.0.0", "cams", policy)
    try:
        assert first.wait(timeout=60) == 70, "the agent did not stop at its failpoint"
    finally:
        first.kill()
    return rollout


def _agent_process(tmp_path, broker, keys, device, failpoint=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if failpoint:
        env["EDGESDK_AGENT_FAILPOINT"] = failpoint
    log_path = tmp_path / f"agent-{device}-{failpoint or 'plain'}.log"
    with open(log_path, "ab") as log:  # Popen keeps its own copy of the descriptor
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "edgesdk"), "agent", "--device-id", device, "--group", "cams",
             "--broker", broker.url, "--store", str(tmp_path / "devices" / device),
             "--server-key", str(keys["dir"] / "server.pub"), "--profile", "generic-x86_64"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)


def _big_bundles_in(folder, keys):
    """Bundles large enough (a few MB, tens of chunks) to interrupt mid-transfer."""
    return {"1.0.0": make_bundle(folder / "v1", "1.0.0", keys, seed=1, width=16384),
            "2.0.0": make_bundle(folder / "v2", "2.0.0", keys, seed=2, width=16384)}


@pytest.fixture
def big_bundles(tmp_path_factory, keys):
    """Bundles large enough (a few MB, tens of chunks) to interrupt mid-transfer."""
    return _big_bundles_in(tmp_path_factory.mktemp("big"), keys)


def test_agent_killed_mid_transfer_resumes_without_refetching_finished_chunks(tmp_path, broker, make_server, keys,
                                                                              big_bundles):
    server = make_server(broker.url, broadcast_wait_s=0.3)
    server.upload(pack_bundle(big_bundles["1.0.0"]))
    rollout = _push_and_kill_mid_transfer(tmp_path, broker, keys, server, FAST)
    incoming = tmp_path / "devices" / "cam0" / "incoming"
    (have_file,) = incoming.glob("*.have")
    had = {i for i, b in enumerate(have_file.read_bytes()) if b}
    total = len(have_file.read_bytes())
    assert 5 <= len(had) < total, (len(had), total)
    server.resent.clear()
    second = _agent_process(tmp_path, broker, keys, "cam0")
    try:
        # Killed mid-transfer, the device went offline: its target may have been deferred and the rollout gone on
        # without it; back, it finishes the download it began and commits (late, if it was deferred).
        wait_for(lambda: _target(server, rollout, "cam0").status == "committed", timeout=60, what="commit")
        wait_for(lambda: server.status(rollout).state == "completed", what="the rollout's end")
        refetched = {i for (device, _), chunks in server.resent.items() if device == "cam0" for i in chunks}
        assert refetched, "the restarted agent fetched nothing (the test did not interrupt the transfer)"
        assert not refetched & had, f"chunks finished before the kill were fetched again: {sorted(refetched & had)}"
        store = ModelStore(tmp_path / "devices" / "cam0")
        assert store.pointer("current") == "digits-1.0.0"
        accepted = [e for e in server.db.events(rollout) if e.type == "accepted"]
        assert accepted[-1].payload["resumed_chunks"] == len(had)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)


class CorruptingServer(OTAServer):
    """A server whose first copy of chunk 1 is damaged on the way (as a broken link would)."""

    corrupted = 0

    def _publish(self, topic, payload, retain=False):
        if "/chunks/" in topic and topic.endswith("/1") and not self.corrupted:
            self.corrupted += 1
            payload = payload[:-1] + bytes([payload[-1] ^ 0xFF])
        super()._publish(topic, payload, retain)


def test_corrupted_chunk_is_rejected_and_fetched_again(broker, make_server, make_agent, bundles):
    server = make_server(broker.url, server_class=CorruptingServer, chunk_size=4096, broadcast_wait_s=0.3)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.device("cam0"), what="device")
    server.upload(pack_bundle(bundles["1.0.0"]))
    r = _rollout(server, "1.0.0")
    assert r.state == "completed" and server.corrupted == 1
    committed = next(e for e in agent.events if e["event"] == "committed")
    assert committed["rejected_chunks"] == 1
    assert 1 in server.resent[("cam0", f"{r.id}-w0.generic-x86_64")]
    assert agent.current_version() == ("digits", "1.0.0")


def test_broker_restarted_mid_rollout_and_the_rollout_completes(broker, make_server, make_agent, big_bundles):
    server = make_server(broker.url, resend_s=1.0)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(3)]
    wait_for(lambda: len(server.db.devices("cams")) == 3, what="devices")
    server.upload(pack_bundle(big_bundles["1.0.0"]))
    policy = RolloutPolicy(analysis=False, canary=0.34, waves=(1.0,), health_window_s=1.0, max_failure_rate=0.0)
    rollout = server.start_rollout("digits", "1.0.0", "cams", policy)
    wait_for(lambda: server.status(rollout).stage >= 0, what="first stage sent")
    broker.restart(down_s=1.0)
    wait_for(lambda: server.status(rollout).state != "running", timeout=90, what="rollout after restart")
    r = server.status(rollout)
    assert r.state == "completed", r
    # A device the broker's restart left offline when its stage was sent is deferred, not failed, and the reconciler
    # sends it the release once it reports again: the rollout may complete before that device has installed.
    wait_for(lambda: all(a.current_version() == ("digits", "1.0.0") for a in agents), timeout=60,
             what="every agent on 1.0.0")
    assert all(a.transport.connects >= 2 for a in agents), "agents did not reconnect"


def test_forged_command_is_rejected_and_the_server_is_told_why(broker, make_server, make_agent, bundles, tmp_path):
    server, (agent,) = _setup(broker, make_server, make_agent, bundles)
    assert _rollout(server, "1.0.0").state == "completed"
    generate_keypair(tmp_path / "attacker")
    forged = sign_command(load_private_key(tmp_path / "attacker" / "edgesdk.key"), type="rollback",
                          deployment_id="evil", transfer_id="evil", name="digits", version="0.0.1", group="cams",
                          rollback=True)
    server.transport.publish(Topics.cmd("cam0"), forged)
    wait_for(lambda: any(e.type == "rejected" for e in server.db.events(device_id="cam0")), what="rejection")
    rejection = next(e for e in server.db.events(device_id="cam0") if e.type == "rejected")
    assert "signature does not verify" in rejection.payload["reason"]
    assert agent.current_version() == ("digits", "1.0.0")


class TamperingServer(OTAServer):
    """A compromised repository copy: the model inside the archive changed, the chunk hashes re-signed to match."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks = self.sender.chunks = self.requests.chunks = ChunkDistributor(self._tampered_archive, self._publish)

    def _tampered_archive(self, name, version, artifact=None):
        import io
        import tarfile

        data, _ = self.repo.archive(name, version, artifact)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            start = tar.getmember("model.onnx").offset_data
        at = start + 200  # inside the weights
        tampered = data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1:]
        return tampered, archive_info(tampered)


def test_tampered_model_is_rejected_device_stays_on_old_version(broker, make_server, make_agent, bundles):
    honest = make_server(broker.url, broadcast_wait_s=0.3)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: honest.db.device("cam0"), what="device")
    honest.upload(pack_bundle(bundles["1.0.0"]))
    honest.upload(pack_bundle(bundles["2.0.0"]))
    assert _rollout(honest, "1.0.0").state == "completed"
    honest.stop()
    evil = make_server(broker.url, server_class=TamperingServer, broadcast_wait_s=0.3)  # same repository and fleet DB
    r = _rollout(evil, "2.0.0")
    assert r.state == "aborted"
    (target,) = r.targets
    assert target.status == "failed" and "does not match the manifest" in target.reason
    assert agent.current_version() == ("digits", "1.0.0")


def test_bundle_changed_on_server_disk_is_refused_by_the_server(broker, make_server, make_agent, bundles):
    server, (agent,) = _setup(broker, make_server, make_agent, bundles, versions=("1.0.0", "2.0.0"))
    assert _rollout(server, "1.0.0").state == "completed"
    model = server.repo.path("digits", "2.0.0") / "model.onnx"
    model.write_bytes(model.read_bytes()[:-4] + b"XXXX")
    r = _rollout(server, "2.0.0")
    assert r.state == "aborted" and "does not match the manifest" in r.reason
    assert agent.current_version() == ("digits", "1.0.0")


def test_replayed_old_command_is_refused(broker, make_server, make_agent, bundles):
    server, (agent,) = _setup(broker, make_server, make_agent, bundles, versions=("1.0.0", "2.0.0"))
    captured: list[bytes] = []
    spy = MqttTransport(broker.url, client_id="spy")
    spy.subscribe(Topics.cmd("cam0"), lambda topic, payload: captured.append(payload))
    try:
        wait_for(lambda: spy.connected, what="spy")
        assert _rollout(server, "1.0.0").state == "completed"
        assert _rollout(server, "2.0.0").state == "completed"
        old = captured[0]
        spy.publish(Topics.cmd("cam0"), old)
        wait_for(lambda: any("replayed" in (e.get("reason") or "") for e in agent.events), what="replay refusal")
        assert agent.current_version() == ("digits", "2.0.0")
    finally:
        spy.close()


def test_downgrade_without_the_rollback_flag_is_refused(broker, make_server, make_agent, bundles, keys):
    server, (agent,) = _setup(broker, make_server, make_agent, bundles, versions=("1.0.0", "2.0.0"))
    assert _rollout(server, "2.0.0").state == "completed"
    _, info = server.repo.archive("digits", "1.0.0")
    downgrade = sign_command(keys["server"], type="deploy", deployment_id="d-old", transfer_id="t-old", name="digits",
                             version="1.0.0", group="cams", rollback=False, archive=info)
    server.transport.publish(Topics.cmd("cam0"), downgrade)
    wait_for(lambda: any("refused downgrade" in (e.get("reason") or "") for e in agent.events), what="refusal")
    assert agent.current_version() == ("digits", "2.0.0")


def test_rollback_to_a_version_in_the_store_needs_no_download(broker, make_server, make_agent, bundles):
    server, agents = _setup(broker, make_server, make_agent, bundles, n=2, versions=("1.0.0", "2.0.0"))
    assert _rollout(server, "1.0.0").state == "completed"
    v2 = _rollout(server, "2.0.0")
    assert v2.state == "completed"
    wait_for(lambda: all("digits-1.0.0" in d.slots for d in server.db.devices("cams")), what="slots reported")
    before = server.bytes_published
    back = server.rollback(v2.id)
    wait_for(lambda: server.status(back).state != "running", what="rollback")
    assert server.status(back).state == "completed"
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    assert server.bytes_published - before < 10_000, "the rollback downloaded the bundle again"


def test_agent_killed_between_write_and_switch_restarts_consistent(tmp_path, broker, make_server, keys, bundles):
    server = make_server(broker.url, broadcast_wait_s=0.3)
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    first = _agent_process(tmp_path, broker, keys, "cam0")
    wait_for(lambda: server.db.device("cam0"), what="agent")
    assert _rollout(server, "1.0.0").state == "completed"
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=20)
    crashing = _agent_process(tmp_path, broker, keys, "cam0", failpoint="before_switch")
    wait_for(lambda: server.db.device("cam0").status == "online", what="agent back")
    rollout = server.start_rollout("digits", "2.0.0", "cams", FAST)
    assert crashing.wait(timeout=60) == 70
    store = ModelStore(tmp_path / "devices" / "cam0")
    # At the crash: the new slot is complete and verified, current still names the old one, and both load.
    assert store.pointer("current") == "digits-1.0.0"
    assert store.load_state().pending.slot == "digits-2.0.0"
    read_bundle(store.current_path())
    store.verify_slot("digits-2.0.0")
    restarted = _agent_process(tmp_path, broker, keys, "cam0")
    try:
        wait_for(lambda: _target(server, rollout, "cam0").status == "committed", timeout=60, what="commit")
        wait_for(lambda: server.status(rollout).state == "completed", what="the rollout's end")
        assert store.pointer("current") == "digits-2.0.0" and store.load_state().pending is None
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=20)


def test_failed_health_check_rolls_the_device_back_and_aborts_the_canary(broker, make_server, make_agent, bundles):
    server, agents = _setup(broker, make_server, make_agent, bundles, n=4, versions=("1.0.0", "3.0.0-bad"))
    assert _rollout(server, "1.0.0").state == "completed"
    r = _rollout(server, "3.0.0", policy=RolloutPolicy(analysis=False, canary=0.25, waves=(1.0,), health_window_s=0.5,
                                                       max_failure_rate=0.05))
    assert r.state == "aborted" and "1/1 devices failed" in r.reason
    (canary,) = [t for t in r.targets if t.stage == 0]
    assert canary.status == "rolled_back" and "health check" in canary.reason
    assert all(t.status == "skipped" for t in r.targets if t.stage == 1), "the rollout went past the canary"
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)


def test_device_cannot_read_another_devices_topics(tmp_path, make_server, keys, bundles):
    from edgesdk.ota_server.broker import LocalMosquitto, free_port
    from edgesdk.ota_server.mosquitto import write_mosquitto_config

    port = free_port()
    config = write_mosquitto_config(tmp_path / "broker", {"cam-a": "cams", "cam-b": "cams"}, port=port)
    broker = LocalMosquitto(tmp_path / "broker", conf_lines=config.conf.read_text().splitlines(), port=port)
    try:
        creds = {d: json.loads(p.read_text()) for d, p in config.credentials.items()}
        server = make_server(broker.url, username=config.server_username, password=config.server_password)
        received: list[str] = []
        a = MqttTransport(broker.url, client_id="cam-a", username="cam-a", password=creds["cam-a"]["password"])
        a.subscribe(Topics.cmd("cam-b"), lambda t, p: received.append(t))
        a.subscribe(Topics.device_chunks("cam-b", "+") + "/+", lambda t, p: received.append(t))
        a.subscribe(Topics.cmd("cam-a"), lambda t, p: received.append(t))
        a.confirm_access()  # the broker acknowledged the SUBSCRIBEs (mosquitto grants them, then filters)
        # MQTT keeps one publisher's QoS 1 messages in order: if b's were allowed through, they would arrive first.
        server.transport.publish(Topics.cmd("cam-b"), b"for b only")
        server.transport.publish(Topics.device_chunks("cam-b", "t1") + "/0", b"b's chunk")
        server.transport.publish(Topics.cmd("cam-a"), b"for a")
        wait_for(lambda: received, what="a's own command")
        assert received == [Topics.cmd("cam-a")]
        # Writing as another device is dropped too: the server hears a's own event, never the forged one.
        a.publish(Topics.events("cam-b"), json.dumps({"event": "committed", "deployment_id": "forged"}).encode())
        a.publish(Topics.events("cam-a"), json.dumps({"event": "progress"}).encode())
        wait_for(lambda: server.db.events(device_id="cam-a"), what="a's own event")
        assert server.db.events(device_id="cam-b") == []
        assert a.refusal is not None and Topics.events("cam-b") in str(a.refusal)  # MQTT 5 says it was refused
        with pytest.raises(BrokerError, match="refused 'intruder'"):
            MqttTransport(broker.url, client_id="intruder", username="cam-a", password="wrong", connect_timeout=2)
        a.close()
    finally:
        broker.stop()


def test_hot_swap_under_load_fails_no_request(broker, make_server, make_agent, bundles):
    runtime = ManagedRuntime(profile="generic-x86_64", swap_order="load-first")
    server = make_server(broker.url)
    make_agent("cam0", broker.url, runtime=runtime)
    wait_for(lambda: server.db.device("cam0"), what="device")
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    assert _rollout(server, "1.0.0").state == "completed"
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    v1_out = runtime.predict(x)
    failures, outputs, stop = [], [], threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                outputs.append(runtime.predict(x))
            except Exception as exc:  # counted: the goal is zero
                failures.append(exc)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        assert _rollout(server, "2.0.0").state == "completed"
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert failures == []
    assert len(outputs) > 100 and runtime.swaps == 2
    assert not np.allclose(runtime.predict(x), v1_out), "the new model is not the one serving"
    runtime.close()


def test_a_cut_links_will_names_the_connection_it_ends_and_the_reconnects_state_the_next(broker, make_agent):
    """The server orders a will against states written late by another replica by these numbers
    (FleetDB.upsert_devices): a state sent before a connection dropped must not list the device online again."""
    import socket

    seen: list[dict] = []
    observer = MqttTransport(broker.url, client_id="observer")
    observer.subscribe(Topics.state("cam0"), lambda topic, payload: seen.append(json.loads(payload)))
    try:
        agent = make_agent("cam0", broker.url)
        for connection in (1, 2):
            wait_for(lambda c=connection: any(s["status"] == "online" and s.get("connection") == c for s in seen),
                     what=f"the state of connection {connection}")
            agent.transport._client.socket().shutdown(socket.SHUT_RDWR)  # the link dies: no DISCONNECT is sent
            wait_for(lambda c=connection: any(s["status"] == "offline" and s.get("connection") == c for s in seen),
                     what=f"the will of connection {connection}")
        wait_for(lambda: any(s["status"] == "online" and s.get("connection") == 3 for s in seen), what="connection 3")
        assert {s["session"] for s in seen} == {agent.session}
    finally:
        observer.close()


def test_a_state_published_while_the_link_is_down_names_the_reconnects_connection(broker, make_agent):
    """paho sends what is published during an outage after the reconnect, so it must carry that connection's number
    (the one its will will name), not the dropped one's."""
    agent = make_agent("cam0", broker.url)
    assert agent.state()["connection"] == 1
    broker.stop()
    wait_for(lambda: not agent.transport.connected, what="the agent noticing the broker is gone")
    assert agent.state()["connection"] == 2
    broker.start()
    wait_for(lambda: agent.transport.connected, timeout=30, what="the reconnect")
    assert agent.state()["connection"] == 2
