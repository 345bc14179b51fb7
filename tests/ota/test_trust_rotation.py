"""A device on the fleet's root of trust, over a real mosquitto: commands checked by the commands role, a
compromised server key recovered by rotation, and a rollback of the root refused (issue 23, part 1)."""

from __future__ import annotations

import json
import shutil
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.fleet import key_ceremony
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import ArchiveInfo, Topics, archive_info, sign_command
from edgesdk.fleet.transport import MqttTransport
from edgesdk.fleet.trust import ROLES, new_root, new_timestamp, parse_root, sign_metadata
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.server import OTAServer
from edgesdk.runtime.bundle import sign_bundle
from edgesdk.runtime.signing import generate_keypair, key_id, load_private_key, load_public_key
from tests.ota.conftest import make_bundle, publish_retained, read_retained, rollout_to, wait_for


def _rejections(agent):
    return [e["reason"] for e in agent.events if e["event"] == "rejected"]


def test_a_stolen_server_key_is_revoked_by_rotation_and_a_rolled_back_root_is_refused(
        tmp_path, broker, make_server, make_agent, bundles):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"root": 2}, {"root": 2})
    root_keys = [load_private_key(p) for p in private["root"]]
    stolen = load_private_key(private["commands"][0])
    signer = load_private_key(private["bundles"][0])  # the device checks models against the bundles role too
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path)
    assert agent.state()["trust"]["root_version"] == 1

    # The server signs with the commands role's key: the device takes its rollout.
    server = make_server(broker.url, signing_key=stolen)
    wait_for(lambda: server.db.device("cam0"), what="device")
    server.upload(pack_bundle(_signed_copy(bundles["1.0.0"], tmp_path / "v1", signer)))
    assert rollout_to(server, "1.0.0").state == "completed"
    server.stop()

    # The key leaks. The root holders rotate the commands role to a new key and publish root v2, retained.
    generate_keypair(tmp_path / "new", "commands-2")
    replacement = load_private_key(tmp_path / "new" / "commands-2.key")
    v2 = key_ceremony.rotate(root_path.read_bytes(), "commands", root_keys,
                             add=[load_public_key(tmp_path / "new" / "commands-2.pub")],
                             remove=[key_id(stolen.public_key())])
    assert not v2.missing
    publish_retained(broker.url, Topics.root(2), v2.document)
    wait_for(lambda: agent.trust.root.version == 2, what="the device on root v2")
    assert json.loads((agent.store.root / "trust" / "root.1.json").read_bytes())["signed"]["version"] == 1

    # A server with the new key carries on; the thief's commands, signed with the old one, are refused.
    server = make_server(broker.url, signing_key=replacement)
    wait_for(lambda: server.db.device("cam0"), what="device")
    server.upload(pack_bundle(_signed_copy(bundles["2.0.0"], tmp_path / "v2", signer)))
    assert rollout_to(server, "2.0.0").state == "completed"

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
    forged_v1 = sign_metadata(new_root(1, time.time() + 86400, {
        role: ([k.public_key() for k in attacker], 2 if role == "root" else 1) for role in ROLES}), attacker)
    assert parse_root(forged_v1)[0].version == 1
    publish_retained(broker.url, Topics.root(1), forged_v1)
    wait_for(lambda: any("rollback or forgery of the root of trust is refused" in r for r in _rejections(agent)),
             what="root rollback refusal")
    assert agent.trust.root.version == 2 and agent.state()["trust"]["root_version"] == 2


def _signed_copy(source, out, *signers):
    shutil.copytree(source, out)
    for key in signers:
        sign_bundle(out, key)
    return out


def test_bundles_need_the_bundles_role_threshold_and_a_revoked_key_no_longer_counts(
        tmp_path, broker, make_server, make_agent, bundles, keys):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"bundles": 2}, {"bundles": 2})
    root_keys = [load_private_key(p) for p in private["root"]]
    ci, release = (load_private_key(p) for p in private["bundles"])
    server = make_server(broker.url, signing_key=load_private_key(private["commands"][0]))
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path)
    wait_for(lambda: server.db.device("cam0"), what="device")

    # Signed by CI and the release manager (threshold 2): installed.
    server.upload(pack_bundle(_signed_copy(bundles["1.0.0"], tmp_path / "v1", ci, release)))
    assert rollout_to(server, "1.0.0").state == "completed" and agent.current_version() == ("digits", "1.0.0")

    # Signed by CI only: below the threshold, refused before it is unpacked into a slot.
    server.upload(pack_bundle(_signed_copy(bundles["2.0.0"], tmp_path / "v2", ci)))
    refused = rollout_to(server, "2.0.0")
    assert refused.state == "aborted"
    (target,) = refused.targets
    assert "bundle rejected: digits 2.0.0: 1 valid signature of the 2 required" in target.reason
    assert not (agent.store.slots / "digits-2.0.0").exists() and agent.current_version() == ("digits", "1.0.0")

    # CI's key is revoked and a new CI key added (root v2). 3.0.0, signed by the new CI key and the release
    # manager, installs; going back to 1.0.0, whose slot the device holds but which only the revoked key and
    # one other signed, is refused from the moment the device holds root v2.
    generate_keypair(tmp_path / "new", "bundles-3")
    ci2 = load_private_key(tmp_path / "new" / "bundles-3.key")
    v2 = key_ceremony.rotate(root_path.read_bytes(), "bundles", root_keys,
                             add=[load_public_key(tmp_path / "new" / "bundles-3.pub")], remove=[key_id(ci.public_key())])
    publish_retained(broker.url, Topics.root(2), v2.document)
    wait_for(lambda: agent.trust.root.version == 2, what="root v2")
    v3 = make_bundle(tmp_path / "v3", "3.0.0", keys, seed=3)
    sign_bundle(v3, ci2)
    sign_bundle(v3, release)
    server.upload(pack_bundle(v3))
    third = rollout_to(server, "3.0.0")
    assert third.state == "completed" and agent.current_version() == ("digits", "3.0.0")
    back = server.rollback(third.id, to_version="1.0.0")
    wait_for(lambda: server.status(back).state != "running", timeout=60, what="rollback to 1.0.0")
    (target,) = server.status(back).targets
    assert target.status == "failed" and "1 valid signature of the 2 required" in target.reason, target
    assert agent.current_version() == ("digits", "3.0.0")


def test_a_device_reports_stale_when_timestamps_stop_and_an_expired_one_replayed_changes_nothing(
        tmp_path, broker, make_server, make_agent, bundles):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {}, {})
    server = make_server(broker.url, signing_key=load_private_key(private["commands"][0]),
                         root=root_path.read_bytes(), timestamp_key=load_private_key(private["timestamp"][0]),
                         timestamp_every_s=0.2, timestamp_expires_s=1.5)
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path)
    wait_for(lambda: agent.state()["trust"]["stale"] is False, what="a fresh timestamp")
    wait_for(lambda: (server.db.device("cam0") or None) is not None, what="device")
    first = agent.trust.timestamp
    assert first is not None and first.root_version == 1

    # The timestamps stop (the server is gone, or someone withholds them): the device goes stale by itself
    # once its newest one expires, says so in its state and its log, and keeps running.
    server.stop()
    wait_for(lambda: agent.state()["trust"]["stale"] is True, timeout=1.5 + 0.2 + 10, what="stale")
    newest = agent.trust.timestamp  # read once stale: one published just before the stop may land after it
    # An expired timestamp replayed by whoever controls the broker does not make it fresh.
    publish_retained(broker.url, Topics.TIMESTAMP, first.raw)
    time.sleep(0.5)
    assert agent.trust.stale() and agent.trust.timestamp.version == newest.version
    state = json.loads(read_retained(broker.url, Topics.state("cam0")))
    assert state["trust"]["stale"] is True and state["status"] == "online"
    # A server (here one that signs no timestamps) shows the stale device in its metrics.
    watcher = make_server(broker.url, signing_key=load_private_key(private["commands"][0]))
    wait_for(lambda: b"edgesdk_ota_devices_stale 1.0" in watcher.metrics.render()[0], what="the stale gauge")
    assert b'edgesdk_ota_devices_by_root_version{root_version="1"} 1.0' in watcher.metrics.render()[0]


class MixingServer(OTAServer):
    """A compromised server: it holds the commands key (not the bundles keys) and serves a validly signed bundle of
    release 1.0.0 as the archive of release 2.0.0, signing the command for it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks = self.sender.chunks = self.requests.chunks = ChunkDistributor(self._mixed_archive, self._publish)

    def _mixed_archive(self, name, version, artifact=None):
        data, _ = self.repo.archive(name, "1.0.0" if version == "2.0.0" else version, artifact)
        return data, archive_info(data)


def _on_release_1(tmp_path, broker, make_server, make_agent, bundles, **agent_config):
    """A fleet root, a device on it running 1.0.0 (installed by an honest server, which then stops, leaving 2.0.0 in
    the repository); the commands key and the agent."""
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {}, {})
    signer = load_private_key(private["bundles"][0])
    commands_key = load_private_key(private["commands"][0])
    honest = make_server(broker.url, signing_key=commands_key)
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path, **agent_config)
    wait_for(lambda: honest.db.device("cam0"), what="device")
    honest.upload(pack_bundle(_signed_copy(bundles["1.0.0"], tmp_path / "v1", signer)))
    honest.upload(pack_bundle(_signed_copy(bundles["2.0.0"], tmp_path / "v2", signer)))
    assert rollout_to(honest, "1.0.0").state == "completed"
    honest.stop()
    return commands_key, agent


def test_a_compromised_server_mixing_one_release_into_another_is_refused(
        tmp_path, broker, make_server, make_agent, bundles):
    commands_key, agent = _on_release_1(tmp_path, broker, make_server, make_agent, bundles)

    evil = make_server(broker.url, signing_key=commands_key, server_class=MixingServer)
    mixed = rollout_to(evil, "2.0.0")
    assert mixed.state == "aborted"
    (target,) = mixed.targets
    assert "holds digits 1.0.0: a bundle of another release under this one's name is refused (mix-and-match)" in \
        target.reason
    assert not (agent.store.slots / "digits-2.0.0").exists() and agent.current_version() == ("digits", "1.0.0")


class WithholdingChunks(ChunkDistributor):
    """Whoever sits between the server and the device lets one requested chunk through, then nothing (a slow
    retrieval); nothing goes to the group."""

    trickled = False

    def serve(self, device, transfer_id, indices):
        if not self.trickled and self.is_open(transfer_id):
            self.trickled = True
            return super().serve(device, transfer_id, indices[:1])
        return self.is_open(transfer_id)  # answered, and nothing sent

    def broadcast(self, group, transfer_id):
        return None


class TricklingServer(OTAServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks = self.sender.chunks = self.requests.chunks = WithholdingChunks(self.repo.archive, self._publish)


def test_a_trickle_of_chunks_hits_the_transfer_deadline_and_the_device_stays_on_its_version(
        tmp_path, broker, make_server, make_agent, bundles):
    commands_key, agent = _on_release_1(tmp_path, broker, make_server, make_agent, bundles,
                                        transfer_timeout_s=2.0)

    slow = make_server(broker.url, signing_key=commands_key, server_class=TricklingServer)
    received_before = agent.bytes_received
    trickled = rollout_to(slow, "2.0.0")
    assert slow.chunks.trickled and agent.bytes_received > received_before  # one chunk came, then nothing
    assert trickled.state == "aborted"
    (target,) = trickled.targets
    assert "the archive did not arrive within 2 s of its command (a trickle, or chunks withheld)" in target.reason
    assert not (agent.store.slots / "digits-2.0.0").exists() and agent.current_version() == ("digits", "1.0.0")
    assert not list(agent.store.incoming.iterdir())  # the partial transfer's files are gone


def test_an_attackers_own_broker_gets_nothing_past_the_device(tmp_path, broker, make_server, make_agent, bundles):
    """The device is pointed at a broker the attacker runs (a second mosquitto): the attacker can publish anything
    there but holds no fleet key. Its command, its root and its timestamp are all refused; the model stays."""
    from edgesdk.ota_server.broker import LocalMosquitto

    _, agent = _on_release_1(tmp_path, broker, make_server, make_agent, bundles)
    agent.stop()
    store = agent.store.root

    evil_broker = LocalMosquitto(tmp_path / "evil-broker")
    try:
        attacker = Ed25519PrivateKey.generate()
        evil = make_agent("cam0", evil_broker.url, server_key=None, root=None)  # the same store: it holds the root
        assert evil.store.root == store and evil.trust is not None and evil.trust.root.version == 1
        forged_root = sign_metadata(new_root(2, time.time() + 86400, {
            role: ([attacker.public_key()], 1) for role in ROLES}), [attacker])
        forged_stamp = sign_metadata(new_timestamp(10**15, time.time() + 86400, 1, {}), [attacker])
        command = sign_command(attacker, type="rollback", deployment_id="evil-2", transfer_id="evil-2", name="digits",
                               version="1.0.0", group="cams", rollback=True)
        publish_retained(evil_broker.url, Topics.root(2), forged_root)
        publish_retained(evil_broker.url, Topics.TIMESTAMP, forged_stamp)
        publish_retained(evil_broker.url, Topics.cmd("cam0"), command)
        wait_for(lambda: len(_rejections(evil)) >= 3, what="three refusals")
        reasons = " | ".join(_rejections(evil))
        assert "root metadata v2 (by the root keys of v1): 0 valid signatures" in reasons
        assert "timestamp v1000000000000000: 0 valid signatures" in reasons
        assert "OTA command: 0 valid signatures" in reasons
        assert evil.trust.root.version == 1 and evil.trust.stale() and evil.current_version() == ("digits", "1.0.0")
    finally:
        evil_broker.stop()
