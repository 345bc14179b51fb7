"""Commands bound to their targets (issue 36), against a real mosquitto, a real server and real agents: a command
recorded for one device or group is refused by any other, also when an attacker's broker replays it; a device
holding a root of trust refuses a command without expires_at; only a transfer's targets get its chunks."""

from __future__ import annotations

import base64
import json
import threading
import time

import numpy as np

from edgesdk.fleet import key_ceremony
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.command_scope import Binder
from edgesdk.fleet.measurement import pack_measurement
from edgesdk.fleet.protocol import Topics, _seal, archive_info
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.fleet.trust import new_timestamp, sign_metadata
from edgesdk.ota_server.broker import LocalMosquitto
from edgesdk.runtime.signing import load_private_key
from edgesdk.testing import random_mlp, write_mlp_onnx
from tests.ota.conftest import FAST, wait_for

#: Sends to one of two devices and holds there (no promotion).
HELD = RolloutPolicy(analysis=False, canary=0.5, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0, auto_promote=False)
#: What a device reports when it takes a command up (a deploy, a rollback, or a measurement).
ADMITTED = {"accepted", "downloaded", "committed", "rolled_back", "failed"}


def _rollout(server, version, group, policy=FAST, rollback=False):
    rollout = server.start_rollout("digits", version, group, policy, rollback=rollback)
    wait_for(lambda: server.status(rollout).state != "running", timeout=60, what=f"{group} on {version}")
    assert server.status(rollout).state == "completed"
    return rollout


def _online(server, *devices):
    wait_for(lambda: all(getattr(server.db.device(d), "status", None) == "online" for d in devices), what="online")


def _rejections(agent):
    return [e["reason"] for e in agent.events if e["event"] == "rejected"]


class Recorder:
    """A client of the broker (its operator, or an attacker who controls it) that records every command and can
    publish anything anywhere."""

    def __init__(self, url: str) -> None:
        self.commands: list[tuple[str, bytes]] = []
        self.transport = MqttTransport(url, client_id=f"recorder-{time.monotonic_ns()}")
        self.transport.subscribe("edgesdk/devices/+/cmd", lambda t, p: self.commands.append((Topics.device_of(t), p)))
        self.transport.confirm_access()

    def sent_to(self, device: str) -> list[bytes]:
        return [p for d, p in self.commands if d == device]

    def close(self) -> None:
        self.transport.close()


def test_a_rollback_signed_for_the_canary_group_is_refused_by_a_prod_device(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    canary, prod = make_agent("c1", broker.url, group="canary"), make_agent("p1", broker.url, group="prod")
    _online(server, "c1", "p1")
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    recorder = Recorder(broker.url)
    try:
        for version in ("1.0.0", "2.0.0"):
            for group in ("canary", "prod"):
                _rollout(server, version, group)
        _rollout(server, "1.0.0", "canary", rollback=True)
        assert canary.current_version() == ("digits", "1.0.0")
        rollback = recorder.sent_to("c1")[-1]
        assert json.loads(rollback)["binding"]
        recorder.transport.publish(Topics.cmd("p1"), rollback)
        wait_for(lambda: _rejections(prod), what="the prod device's refusal")
    finally:
        recorder.close()
    (reason,) = _rejections(prod)
    assert "is for device 'c1' of group 'canary' and reached 'p1' of group 'prod'" in reason
    assert prod.current_version() == ("digits", "2.0.0")
    wait_for(lambda: any(e.type == "rejected" for e in server.db.events(device_id="p1")), what="the server told")


def test_a_command_for_one_device_is_refused_by_another_of_its_group(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    agents = {d: make_agent(d, broker.url) for d in ("cam01", "cam02")}
    _online(server, *agents)
    server.upload(pack_bundle(bundles["1.0.0"]))
    recorder = Recorder(broker.url)
    try:
        server.start_rollout("digits", "1.0.0", "cams", HELD)  # one of the two is the canary; the rollout holds
        wait_for(lambda: any(a.current_version() for a in agents.values()), what="the canary's install")
        (target,) = {d for d, _ in recorder.commands}
        (other,) = set(agents) - {target}
        recorder.transport.publish(Topics.cmd(other), recorder.sent_to(target)[0])
        wait_for(lambda: _rejections(agents[other]), what="the other device's refusal")
    finally:
        recorder.close()
    (reason,) = _rejections(agents[other])
    assert f"is for device {target!r} of group 'cams' and reached {other!r} of group 'cams'" in reason
    assert agents[other].current_version() is None and not list(agents[other].store.incoming.glob("*.cmd"))


def test_an_attackers_broker_replaying_recorded_commands_to_other_devices_gets_none_admitted(
        tmp_path, broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    make_agent("cam01", broker.url)
    make_agent("c1", broker.url, group="canary")
    _online(server, "cam01", "c1")
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    model = write_mlp_onnx(random_mlp([64, 16, 10], seed=7), tmp_path / "candidate.onnx")
    recorder = Recorder(broker.url)
    try:
        for version in ("1.0.0", "2.0.0"):
            _rollout(server, version, "cams")
            _rollout(server, version, "canary")
        _rollout(server, "1.0.0", "canary", rollback=True)
        mid = server.request_measurement("cam01", pack_measurement(model, {"input": np.zeros((2, 64), np.float32)}),
                                         "latency", 3)
        wait_for(lambda: server.measurements.status(mid)["status"] in ("done", "failed"), timeout=60, what="measured")
    finally:
        recorder.close()
    recorded = list(dict.fromkeys(p for _, p in recorder.commands))  # re-sends repeat the same bytes
    kinds = {json.loads(base64.b64decode(json.loads(p)["manifest"]))["type"] for p in recorded}
    assert kinds == {"deploy", "rollback", "measure"} and len(recorded) >= 5

    evil = LocalMosquitto(tmp_path / "evil-broker")
    try:
        # Devices that never saw these deployments: every one would be theirs to take, were it not bound to another.
        victims = [make_agent("cam02", evil.url), make_agent("p1", evil.url, group="prod")]
        attacker = MqttTransport(evil.url, client_id="attacker")
        attacker.confirm_access()
        for victim in victims:
            for envelope in recorded:
                attacker.publish(Topics.cmd(victim.config.device_id), envelope)
        time.sleep(0.5)
        attacker.close()
        wait_for(lambda: all(len(_rejections(v)) == len(recorded) for v in victims), what="every replay refused")
        time.sleep(0.5)  # anything admitted would have reported by now
        admitted = [e for v in victims for e in v.events if e["event"] in ADMITTED]
        assert admitted == [] and all(v.current_version() is None for v in victims)
        assert all(list(v.store.incoming.iterdir()) == [] for v in victims), "nothing written"
    finally:
        evil.stop()


def test_a_device_holding_a_root_refuses_a_command_without_expiry_and_a_pinned_key_device_takes_it(
        tmp_path, broker, make_agent, bundles, keys):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"root": 1}, {"root": 1})
    commands_key = load_private_key(private["commands"][0])
    rooted = make_agent("cam0", broker.url, server_key=None, root=root_path)
    pinned = make_agent("cam1", broker.url)

    info = archive_info(pack_bundle(bundles["1.0.0"]))
    manifest = {"type": "deploy", "deployment_id": "d-old", "transfer_id": "t-old", "name": "digits",
                "version": "1.0.0", "group": "cams", "rollback": False, "issued_at": time.time(),
                "archive": info.to_json()}  # as a server of an earlier release signed it: no expires_at, no binding
    sender = MqttTransport(broker.url, client_id="sender")
    try:
        sender.publish(Topics.cmd("cam0"), Binder(commands_key, _seal(commands_key, manifest)).bind("cam0"))
        sender.publish(Topics.cmd("cam0"), _seal(commands_key, {**manifest, "deployment_id": "d-unbound",
                                                                "expires_at": time.time() + 60}))
        sender.publish(Topics.cmd("cam1"), _seal(keys["server"], manifest))
        wait_for(lambda: len(_rejections(rooted)) == 2, what="the rooted device's refusals")
        wait_for(lambda: any(e["event"] == "accepted" for e in pinned.events), what="the pinned-key device's accept")
    finally:
        sender.close()
    no_expiry, unbound = _rejections(rooted)
    assert "command d-old carries no expires_at; a device holding a root of trust refuses" in no_expiry
    assert "command d-unbound of group 'cams' names no device, and 'cam0' (group 'cams') holds a root" in unbound
    assert not [e for e in rooted.events if e["event"] in ADMITTED]


def test_only_a_transfers_targets_get_its_chunks(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    agents = {d: make_agent(d, broker.url) for d in ("cam01", "cam02")}
    make_agent("p1", broker.url, group="prod")
    _online(server, "cam01", "cam02", "p1")
    server.upload(pack_bundle(bundles["1.0.0"]))
    rollout = server.start_rollout("digits", "1.0.0", "cams", HELD)
    wait_for(lambda: any(a.current_version() for a in agents.values()), what="the canary's install")
    (target,) = [d for d, a in agents.items() if a.current_version()]
    (bystander,) = set(agents) - {target}
    transfer = f"{rollout}-w0.generic-x86_64"  # stage 1, its generic-x86_64 artifact
    got: dict[str, list[str]] = {d: [] for d in (target, bystander, "p1")}
    lock = threading.Lock()

    def asker(device: str) -> MqttTransport:
        t = MqttTransport(broker.url, client_id=f"asker-{device}")
        t.subscribe(f"{Topics.device_chunks(device, transfer)}/+", lambda topic, p: (lock.acquire(), got[device].append(
            topic), lock.release()))
        t.confirm_access()
        return t

    clients = {d: asker(d) for d in got}
    try:
        time.sleep(1.5)  # a request within a second of the group broadcast is not answered (the chunks just went)
        refused = server.chunks.refused
        for device, client in clients.items():  # as each device (the broker lets any client publish there)
            client.publish(Topics.need(device), json.dumps({"transfer_id": transfer, "chunks": [0, 1]}).encode())
        wait_for(lambda: len(got[target]) == 2, what="the target's chunks")
        wait_for(lambda: server.chunks.refused >= refused + 2, what="the two refusals")
        time.sleep(0.5)
        assert got[bystander] == [] and got["p1"] == []
        # Closed here (as after a restart or a take-over) and opened again on request: the store names its targets.
        server.chunks.close(transfer)
        for device, client in clients.items():
            client.publish(Topics.need(device), json.dumps({"transfer_id": transfer, "chunks": [2]}).encode())
        wait_for(lambda: len(got[target]) == 3, what="the target's chunk from the reopened transfer")
        wait_for(lambda: server.chunks.refused >= refused + 4, what="the refusals by the store's targets")
        time.sleep(0.5)
        assert got[bystander] == [] and got["p1"] == [] and server.chunks.is_open(transfer)
        metrics = server.metrics.render()[0].decode()
        assert 'edgesdk_ota_reports_refused_total{kind="need",reason="not_target"} 4.0' in metrics
        # Closed again: a non-target naming it, stages that never were, or another board's artifact is refused
        # before any work (no archive loaded, nothing opened); the target's next request opens it once.
        server.chunks.close(transfer)
        loads, refused = server.chunks.loads, server.chunks.refused
        hostile = [transfer, *(f"{rollout}-w{n}" for n in range(1, 9)), f"{rollout}-w0.rpi5-aarch64",
                   f"{rollout}-w0.no-such-board"]
        for asked in hostile:
            clients[bystander].publish(Topics.need(bystander), json.dumps({"transfer_id": asked,
                                                                            "chunks": [0]}).encode())
        wait_for(lambda: server.chunks.refused == refused + len(hostile), what="every hostile request refused")
        # Ids nothing serves (no rollout of that name here) cost a counter too, and nothing else (issue 60).
        made_up = ["r19700101000000-abcdef-w0", "no-such-transfer", "m-12345"]
        for asked in made_up:
            clients[bystander].publish(Topics.need(bystander), json.dumps({"transfer_id": asked,
                                                                            "chunks": [0]}).encode())
        wait_for(lambda: 'reason="unknown"} 3.0' in server.metrics.render()[0].decode(), what="the unknown ids counted")
        assert server.chunks.loads == loads and not any(server.chunks.is_open(t) for t in made_up)
        assert server.chunks.loads == loads and not server.chunks.is_open(transfer)
        assert not any(server.chunks.is_open(t) for t in hostile)
        clients[target].publish(Topics.need(target), json.dumps({"transfer_id": transfer, "chunks": [3]}).encode())
        wait_for(lambda: len(got[target]) == 4, what="the target's chunk, the transfer opened again")
        assert server.chunks.loads == loads + 1 and server.chunks.refused == refused + len(hostile)
    finally:
        for client in clients.values():
            client.close()


def test_a_device_without_a_clock_refuses_commands_until_a_signed_timestamp_tells_the_time(
        tmp_path, broker, make_agent, bundles):
    """Issue 60: a board without a real-time clock boots in 1970, where every old command looks unexpired, so a
    replay was taken. Now its clock is known to be unset: commands wait for a signed timestamp, and by the time
    the timestamp tells, the replayed one has expired and is refused; a current one is taken."""
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"root": 1}, {"root": 1})
    commands_key = load_private_key(private["commands"][0])
    stamp_key = load_private_key(private["timestamp"][0])
    device = make_agent("cam0", broker.url, server_key=None, root=root_path, wall_clock=lambda: 86_400.0)
    info = archive_info(pack_bundle(bundles["1.0.0"]))
    now = float(int(time.time()))  # whole seconds: a timestamp's issued time is written to the second

    def command(deployment: str, issued: float) -> bytes:
        manifest = {"type": "deploy", "deployment_id": deployment, "transfer_id": f"t-{deployment}", "name": "digits",
                    "version": "1.0.0", "group": "cams", "rollback": False, "issued_at": issued,
                    "expires_at": issued + 3600, "archive": info.to_json()}
        return Binder(commands_key, _seal(commands_key, manifest)).bind("cam0")

    replayed = command("d-old", now - 2 * 86_400)  # recorded two days ago, expired a day and 23 h ago
    sender = MqttTransport(broker.url, client_id="sender")
    try:
        sender.publish(Topics.cmd("cam0"), replayed)
        wait_for(lambda: len(_rejections(device)) == 1, what="the refusal while the clock is unset")
        assert "clock reads 1970-01-02T00:00:00Z" in _rejections(device)[0]
        assert "no signed timestamp has told the time yet" in _rejections(device)[0]
        stamp = sign_metadata(new_timestamp(1, now + 300, 1, {}, issued=now), [stamp_key])
        sender.publish(Topics.TIMESTAMP, stamp, retain=True)
        wait_for(lambda: device.trust.timestamp is not None, what="the timestamp held")
        sender.publish(Topics.cmd("cam0"), replayed)
        wait_for(lambda: len(_rejections(device)) == 2, what="the replay's refusal by the timestamp's time")
        assert "command d-old" in _rejections(device)[1] and "expired 169200 s ago" in _rejections(device)[1]
        sender.publish(Topics.cmd("cam0"), command("d-new", now))
        wait_for(lambda: any(e["event"] == "accepted" for e in device.events), what="the current command taken")
    finally:
        sender.publish(Topics.TIMESTAMP, b"", retain=True)
        sender.close()
    assert not [e for e in device.events if e["event"] in ADMITTED and e.get("deployment_id") == "d-old"]
