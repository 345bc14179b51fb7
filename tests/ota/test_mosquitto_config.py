"""`edgesdk server mosquitto-config` output started by the real mosquitto, from another directory, as root."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.fleet.measurement import MAX_RESULT_BYTES
from edgesdk.fleet.protocol import Topics
from edgesdk.ota_server.broker import free_port, mosquitto_binary
from edgesdk.ota_server.mosquitto import MAX_PACKET_BYTES, write_mosquitto_config
from tests.ota.conftest import wait_for

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def reachable_dir():
    """A directory every user can enter (pytest's own tmp_path sits under a 0700 directory of root)."""
    folder = Path(tempfile.mkdtemp(prefix="edgesdk-mosquitto-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


class _Client:
    """A bare MQTT 3.1.1 client (no client-side size check: the broker's limit is what is tested)."""

    def __init__(self, port: int, credentials: Path) -> None:
        creds = json.loads(credentials.read_text())
        self.messages: list[tuple[str, bytes]] = []
        self.connected, self.disconnected = threading.Event(), threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"test-{creds['username']}",
                                  protocol=mqtt.MQTTv311)
        self.client.username_pw_set(creds["username"], creds["password"])
        self.client.on_connect = lambda c, u, f, reason, p: (not reason.is_failure) and self.connected.set()
        self.client.on_disconnect = lambda c, u, f, reason, p: self.disconnected.set()
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_for(self.connected.is_set, what=f"{creds['username']} connected")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_the_printed_command_starts_mosquitto_from_anywhere_and_oversized_messages_are_refused(reachable_dir,
                                                                                             monkeypatch):
    port = free_port()
    (reachable_dir / "devices.txt").write_text("cam01 cams\n")
    monkeypatch.chdir(reachable_dir)
    result = CliRunner().invoke(cli, ["server", "mosquitto-config", "--devices", "devices.txt", "--out", "broker",
                                      "--port", str(port)])
    assert result.exit_code == 0, result.output
    out = reachable_dir / "broker"
    assert f"start the broker with: mosquitto -c {out / 'mosquitto.conf'}" in result.output
    assert "warning" not in result.output
    conf = (out / "mosquitto.conf").read_text()
    assert f"password_file {out / 'passwd'}\n" in conf and f"acl_file {out / 'acl'}\n" in conf
    assert f"max_packet_size {MAX_PACKET_BYTES}\n" in conf

    expected_owner = pwd.getpwnam("mosquitto").pw_uid if AS_ROOT else os.geteuid()
    for name in ("passwd", "acl"):
        info = (out / name).stat()
        assert (info.st_uid, info.st_mode & 0o777) == (expected_owner, 0o600), name
    for name in ("cam01.json", "server.json"):
        info = (out / "credentials" / name).stat()
        assert (info.st_uid, info.st_mode & 0o777) == (os.geteuid(), 0o600), name

    command = shlex.split(result.output.split("start the broker with: ", 1)[1].splitlines()[0])
    command[0] = mosquitto_binary() or command[0]
    # From another directory, as this user (root here: mosquitto drops to its own user before reading the files).
    with open(reachable_dir / "mosquitto.log", "wb") as log:
        broker = subprocess.Popen(command, cwd="/", stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _listening(port) or broker.poll() is not None, what="mosquitto listening")
        assert broker.poll() is None, (reachable_dir / "mosquitto.log").read_text()

        server = _Client(port, out / "credentials" / "server.json")
        server.client.subscribe(Topics.state("cam01"), qos=1)
        device = _Client(port, out / "credentials" / "cam01.json")
        normal = json.dumps({"status": "idle"}).encode()
        device.client.publish(Topics.state("cam01"), normal, qos=1, retain=True)
        wait_for(lambda: (Topics.state("cam01"), normal) in server.messages, what="the normal state")

        device.client.publish(Topics.state("cam01"), b"x" * (MAX_PACKET_BYTES + 1), qos=1, retain=True)
        wait_for(device.disconnected.is_set, what="the broker dropping the oversized publisher")
        late = _Client(port, out / "credentials" / "server.json")  # reads the retained state afresh
        late.client.subscribe(Topics.state("cam01"), qos=1)
        wait_for(lambda: late.messages, what="the retained state")
        assert late.messages == [(Topics.state("cam01"), normal)]
        assert all(len(payload) <= MAX_PACKET_BYTES for _, payload in server.messages)
        for client in (server, device, late):
            client.close()
    finally:
        broker.terminate()
        broker.wait(timeout=10)


def test_the_cap_keeps_the_largest_legitimate_message():
    assert MAX_RESULT_BYTES < MAX_PACKET_BYTES < MAX_RESULT_BYTES + 1024**2


@pytest.mark.skipif(not AS_ROOT, reason="mosquitto only drops to its own user when started as root")
def test_a_directory_mosquitto_cannot_enter_is_reported(tmp_path):
    blocked = next(p for p in (*reversed(tmp_path.parents), tmp_path) if not p.stat().st_mode & 0o001)  # pytest's 0700
    config = write_mosquitto_config(tmp_path / "broker", {"cam01": "cams"})
    assert len(config.warnings) == 1 and f"cannot enter {blocked}" in config.warnings[0], config.warnings
    (tmp_path / "devices.txt").write_text("cam01 cams\n")
    result = CliRunner().invoke(cli, ["server", "mosquitto-config", "--devices", str(tmp_path / "devices.txt"),
                                      "--out", str(tmp_path / "broker")])
    assert result.exit_code == 0 and "warning: mosquitto started as root reads" in result.output
    assert "user root" in config.conf.read_text().splitlines()
    port = free_port()
    started = write_mosquitto_config(tmp_path / "broker2", {"cam01": "cams"}, port=port)
    broker = subprocess.Popen(["mosquitto", "-c", str(started.conf)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:  # it starts and serves, as root, instead of dying on files it cannot read
        wait_for(lambda: broker.poll() is not None or _listening(port), what="mosquitto to listen")
        assert broker.poll() is None, "mosquitto exited: it could not read its files"
    finally:
        broker.terminate()
        broker.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_after_a_move_the_rewritten_acl_lets_the_device_read_its_new_groups_chunks_only(reachable_dir):
    """Issue 60: a moved device kept its old group's broker ACL. `edgesdk server mosquitto-acl` rewrites the ACL
    alone (the passwords stay: the device reconnects with the same credentials) and a SIGHUP makes mosquitto read
    it: the same subscriptions now deliver the new group's broadcast chunks and not the old group's."""
    port = free_port()
    devices = reachable_dir / "devices.txt"
    devices.write_text("cam01 cams\n")
    out = reachable_dir / "broker"
    config = write_mosquitto_config(out, {"cam01": "cams"}, port=port)
    command = shlex.split(config.command)
    command[0] = mosquitto_binary() or command[0]
    with open(reachable_dir / "mosquitto.log", "wb") as log:
        broker = subprocess.Popen(command, cwd="/", stdout=log, stderr=subprocess.STDOUT)
    old, new = Topics.group_chunks("cams", "r1-w0") + "/0", Topics.group_chunks("lobby", "r2-w0") + "/0"
    try:
        wait_for(lambda: _listening(port) or broker.poll() is not None, what="mosquitto listening")
        server = _Client(port, out / "credentials" / "server.json")
        device = _Client(port, out / "credentials" / "cam01.json")
        for topic in (Topics.group_chunks("cams", "+") + "/+", Topics.group_chunks("lobby", "+") + "/+",
                      Topics.device_chunks("cam01", "+") + "/+"):
            device.client.subscribe(topic, qos=1)

        def delivered(marker: bytes) -> set[str]:
            """Which of the two group topics deliver ``marker`` to the device, the device's own chunk topic (always
            readable, published last, so delivered after the others) telling when it is done; published again
            until that arrives, as the subscriptions are acknowledged asynchronously."""
            own = Topics.device_chunks("cam01", "x") + "/0"

            def arrived() -> bool:
                if any(t == own and p == marker for t, p in device.messages):
                    return True
                for topic in (old, new, own):
                    server.client.publish(topic, marker, qos=1)
                return False

            wait_for(arrived, interval=0.3, what="the device's own chunk")
            return {t for t, p in device.messages if p == marker and t in (old, new)}

        rounds = iter(range(10**6))  # the subscriptions are acknowledged asynchronously: probe until they are on
        wait_for(lambda: delivered(f"before{next(rounds)}".encode()) == {old}, interval=0.3, what="the old ACL")
        assert delivered(b"before") == {old}
        password = (out / "passwd").read_bytes()
        devices.write_text("cam01 lobby\n")
        result = CliRunner().invoke(cli, ["server", "mosquitto-acl", "--devices", str(devices), "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "reload the broker" in result.output and (out / "passwd").read_bytes() == password
        broker.send_signal(1)  # SIGHUP: mosquitto reloads its configuration, the ACL included
        # Its subscription to lobby's chunks was refused under the old ACL: the agent subscribes to a group's chunk
        # topic when it accepts a command of that group, so it does so again here.
        probes = []

        def reloaded() -> bool:
            device.client.subscribe(Topics.group_chunks("lobby", "+") + "/+", qos=1)
            probes.append(delivered(f"probe{len(probes)}".encode()))
            return probes[-1] == {new}

        wait_for(reloaded, interval=0.5, what="the reloaded ACL")
        assert delivered(b"after") == {new}
        for client in (server, device):
            client.close()
    finally:
        broker.terminate()
        broker.wait(timeout=10)
