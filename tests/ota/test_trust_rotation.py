"""A device on the fleet's root of trust, over a real mosquitto: commands checked by the commands role, a
compromised server key recovered by rotation, and a rollback of the root refused (issue 23, part 1)."""

from __future__ import annotations

import json
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.fleet import key_ceremony
from edgesdk.fleet.protocol import ArchiveInfo, Topics, pack_bundle, sign_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.fleet.trust import ROLES, new_root, parse_root, sign_root
from edgesdk.runtime.signing import generate_keypair, key_id, load_private_key, load_public_key
from tests.ota.conftest import wait_for

FAST = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)


def _rollout(server, version):
    rollout = server.start_rollout("digits", version, "cams", FAST)
    wait_for(lambda: server.status(rollout).state != "running", timeout=60, what=f"rollout {version}")
    return server.status(rollout)


def _publish_retained(broker_url: str, topic: str, payload: bytes) -> None:
    transport = MqttTransport(broker_url, client_id=f"operator-{time.monotonic_ns()}")
    try:
        transport.publish(topic, payload, retain=True)
        time.sleep(0.2)
    finally:
        transport.close()


def _rejections(agent):
    return [e["reason"] for e in agent.events if e["event"] == "rejected"]


def test_a_stolen_server_key_is_revoked_by_rotation_and_a_rolled_back_root_is_refused(
        tmp_path, broker, make_server, make_agent, bundles):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"root": 2}, {"root": 2})
    root_keys = [load_private_key(p) for p in private["root"]]
    stolen = load_private_key(private["commands"][0])
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path)
    assert agent.state()["trust"]["root_version"] == 1

    # The server signs with the commands role's key: the device takes its rollout.
    server = make_server(broker.url, signing_key=stolen)
    wait_for(lambda: server.db.device("cam0"), what="device")
    server.upload(pack_bundle(bundles["1.0.0"]))
    assert _rollout(server, "1.0.0").state == "completed"
    server.stop()

    # The key leaks. The root holders rotate the commands role to a new key and publish root v2, retained.
    generate_keypair(tmp_path / "new", "commands-2")
    replacement = load_private_key(tmp_path / "new" / "commands-2.key")
    v2 = key_ceremony.rotate(root_path.read_bytes(), "commands", root_keys,
                             add=[load_public_key(tmp_path / "new" / "commands-2.pub")],
                             remove=[key_id(stolen.public_key())])
    assert not v2.missing
    _publish_retained(broker.url, Topics.root(2), v2.document)
    wait_for(lambda: agent.trust.root.version == 2, what="the device on root v2")
    assert json.loads((agent.store.root / "trust" / "root.1.json").read_bytes())["signed"]["version"] == 1

    # A server with the new key carries on; the thief's commands, signed with the old one, are refused.
    server = make_server(broker.url, signing_key=replacement)
    wait_for(lambda: server.db.device("cam0"), what="device")
    server.upload(pack_bundle(bundles["2.0.0"]))
    assert _rollout(server, "2.0.0").state == "completed"

    # The thief's command (a version it picks) is refused, and the server hears why.
    attack = sign_command(stolen, type="deploy", deployment_id="evil-1", transfer_id="evil-1", name="digits",
                          version="9.0.0", group="cams", archive=ArchiveInfo.of(b"x" * 5000, chunk_size=4096))
    transport = MqttTransport(broker.url, client_id="thief")
    transport.publish(Topics.cmd("cam0"), attack)
    transport.close()
    wait_for(lambda: any("OTA command: 0 valid signatures" in r for r in _rejections(agent)), what="refusal")
    assert agent.current_version() == ("digits", "2.0.0")
    assert not (agent.store.slots / "digits-9.0.0").exists()

    wait_for(lambda: any(e.type == "rejected" and "0 valid signatures" in e.payload["reason"]
                         for e in server.db.events(device_id="cam0")), what="the server's record of the refusal")


    # An attacker who controls the broker puts a root v1 of its own making (its own keys in every role) where
    # devices look: the device holds v2, refuses it, and keeps v2.
    attacker = [Ed25519PrivateKey.generate() for _ in range(2)]
    forged_v1 = sign_root(new_root(1, time.time() + 86400, {
        role: ([k.public_key() for k in attacker], 2 if role == "root" else 1) for role in ROLES}), attacker)
    assert parse_root(forged_v1)[0].version == 1
    _publish_retained(broker.url, Topics.root(1), forged_v1)
    wait_for(lambda: any("rollback or forgery of the root of trust is refused" in r for r in _rejections(agent)),
             what="root rollback refusal")
    assert agent.trust.root.version == 2 and agent.state()["trust"]["root_version"] == 2
