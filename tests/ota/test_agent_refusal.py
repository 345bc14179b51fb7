"""An agent the broker refuses says so and stops (exit 21) instead of saying "connected" and going deaf.

Every test runs a real mosquitto with the password file and ACL `edgesdk server mosquitto-config` writes.
mosquitto 2.0 grants an ACL-denied SUBSCRIBE and then drops the deliveries, so what gives away an agent
holding another device's credentials is its first (retained state) publish, refused in the MQTT 5 PUBACK.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.agent.agent import DeviceAgent
from edgesdk.agent.config import AgentConfig
from edgesdk.errors import BrokerError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import load_credentials
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from edgesdk.ota_server.mosquitto import MosquittoConfig, write_mosquitto_config
from tests.ota.conftest import wait_for

EDGESDK = str(Path(sys.executable).parent / "edgesdk")
STATE_REFUSED = "refused a publish of 'edgesdk-agent-cam02' (user 'cam01') to edgesdk/devices/cam02/state"


@pytest.fixture
def secured(tmp_path):
    """A real mosquitto with the password file and ACL of `edgesdk server mosquitto-config`."""
    port = free_port()
    config = write_mosquitto_config(tmp_path / "broker", {"cam01": "cams", "cam02": "cams"}, port=port)
    broker = LocalMosquitto(tmp_path / "run", conf_lines=config.conf.read_text().splitlines(), port=port)
    yield broker, config
    broker.stop()


def _agent(tmp_path, broker, keys, device: str, username: str, password: str) -> DeviceAgent:
    return DeviceAgent(AgentConfig(device, "cams", broker.url, tmp_path / device, server_key=keys["server_pub"],
                                   username=username, password=password))


def _impostor_credentials(tmp_path, config: MosquittoConfig) -> Path:
    """cam01's username and password in a file that does not say whose they are (so only the ACL can tell)."""
    creds = json.loads(config.credentials["cam01"].read_text())
    path = tmp_path / "unnamed.json"
    path.write_text(json.dumps({"username": creds["username"], "password": creds["password"]}))
    return path


def test_a_credentials_file_of_another_device_is_refused_before_connecting(secured):
    _, config = secured
    with pytest.raises(BrokerError, match="credentials of device 'cam01', not 'cam02'.*credentials/cam02.json"):
        load_credentials(config.credentials["cam01"], "cam02")
    assert load_credentials(config.credentials["cam01"], "cam01")[0] == "cam01"


@pytest.mark.parametrize("username", ["cam01", "nobody"])
def test_a_wrong_password_or_unknown_user_is_the_brokers_refusal_not_a_timeout(secured, tmp_path, keys, username):
    broker, _ = secured
    agent = _agent(tmp_path, broker, keys, "cam01", username, "wrong")
    # A timeout would be a TransferError ("no connection ... within"); the CONNACK's reason is a BrokerError.
    with pytest.raises(BrokerError, match=rf"refused 'edgesdk-agent-cam01' \(user '{username}'\): "
                                          r"(Not authorized|Bad user name or password).*check --credentials"):
        agent.start()


def test_the_credentials_of_another_device_are_shut_out_by_the_acl(secured, tmp_path, keys):
    broker, config = secured
    username, password = load_credentials(_impostor_credentials(tmp_path, config), "cam02")
    agent = _agent(tmp_path, broker, keys, "cam02", username, password)
    with pytest.raises(BrokerError, match=re.escape(STATE_REFUSED) + ": Not authorized.*mosquitto-config"):
        agent.start()
    assert not agent.transport.connected, "a refused agent does not stay connected"


def test_a_refusal_on_a_reconnect_lands_in_refusal_and_stops_the_retries(secured, tmp_path, keys):
    broker, config = secured
    agent = _agent(tmp_path, broker, keys, "cam01", *load_credentials(config.credentials["cam01"], "cam01")).start()
    try:
        assert agent.refusal is None
        passwd = config.password_file.read_text().splitlines()
        config.password_file.write_text("".join(f"{line}\n" for line in passwd if not line.startswith("cam01:")))
        broker.restart()
        wait_for(lambda: agent.refusal is not None, what="the refusal of the reconnect")
        assert "refused 'edgesdk-agent-cam01' (user 'cam01')" in str(agent.refusal)
        assert not agent.transport.connected and agent.transport.connects == 1
    finally:
        agent.stop()


def _agent_cli(broker, device: str, credentials: Path, keys, store: Path, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([EDGESDK, "agent", "--device-id", device, "--group", "cams", "--broker", broker.url,
                             "--store", str(store), "--server-key", str(keys["dir"] / "server.pub"),
                             "--credentials", str(credentials), "--profile", "generic-x86_64"],
                            stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def test_the_cli_agent_exits_21_with_one_error_line(secured, tmp_path, keys):
    broker, config = secured
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"device_id": "cam01", "username": "cam01", "password": "nope"}))
    cases = [("cam02", config.credentials["cam01"], "holds the credentials of device 'cam01', not 'cam02'"),
             ("cam01", wrong, "refused 'edgesdk-agent-cam01' (user 'cam01')"),
             ("cam02", _impostor_credentials(tmp_path, config), STATE_REFUSED)]
    for device, credentials, reason in cases:
        process = _agent_cli(broker, device, credentials, keys, tmp_path / device)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == BrokerError.exit_code, stderr
        (line,) = stderr.strip().splitlines()  # one line: no "connected", no traceback, no echo of the log
        assert line.startswith("error: ") and reason in line, stderr


def test_the_cli_agent_exits_21_when_the_acl_shuts_it_out_after_it_connected(secured, tmp_path, keys):
    broker, config = secured
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        process = _agent_cli(broker, "cam01", config.credentials["cam01"], keys, tmp_path / "cam01", stderr=log)
    try:
        wait_for(lambda: "connected" in log_path.read_text() or process.poll() is not None, what="agent connected")
        config.acl_file.write_text(config.acl_file.read_text().replace("user cam01\n", "user cam01-retired\n"))
        broker.restart()
        assert process.wait(timeout=60) == BrokerError.exit_code, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    last = log_path.read_text().strip().splitlines()[-1]
    assert last.startswith("error: ") and "to edgesdk/devices/cam01/state: Not authorized" in last, last


def test_the_cli_agent_logs_each_install_rollback_and_refusal(secured, tmp_path, keys, bundles, make_server):
    broker, config = secured
    server = make_server(broker.url, username=config.server_username, password=config.server_password)
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        process = _agent_cli(broker, "cam01", config.credentials["cam01"], keys, tmp_path / "cam01", stderr=log)
    try:
        wait_for(lambda: getattr(server.db.device("cam01"), "status", None) == "online", what="agent online")
        for version in ("1.0.0", "3.0.0-bad"):
            server.upload(pack_bundle(bundles[version]))
            rollout = server.start_rollout("digits", version.split("-")[0], "cams",
                                           RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0))
            wait_for(lambda r=rollout: server.status(r).state != "running", timeout=60, what=f"rollout {version}")
        server.transport.publish(Topics.cmd("cam01"), b"not a command")
        wait_for(lambda: "cam01: rejected" in log_path.read_text(), what="the refusal in the agent's log")
    finally:
        process.terminate()
        process.wait(timeout=30)
    log = log_path.read_text()
    for step in ("INFO edgesdk.agent.agent: cam01: accepted digits 1.0.0 (", "cam01: downloaded digits 1.0.0 (",
                 "cam01: committed digits 1.0.0 (apply ", "cam01: rolled back digits 3.0.0 (back on digits-1.0.0; ",
                 "cam01: rejected ("):
        assert step in log, log
    assert "{" not in log, "events are logged as sentences, not dicts"
