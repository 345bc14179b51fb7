"""An agent the broker refuses says so and stops (exit 21) instead of saying "connected" and going deaf."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgesdk.agent.agent import AgentConfig, DeviceAgent
from edgesdk.errors import BrokerError
from edgesdk.ota import pack_bundle
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from edgesdk.ota_server.mosquitto import write_mosquitto_config
from edgesdk.ota_server.rollout import RolloutPolicy
from tests.ota.conftest import wait_for

EDGESDK = str(Path(sys.executable).parent / "edgesdk")


@pytest.fixture
def secured(tmp_path):
    """A real mosquitto with the password file and ACL `edgesdk server mosquitto-config` writes."""
    port = free_port()
    config = write_mosquitto_config(tmp_path / "broker", {"cam01": "cams", "cam02": "cams"}, port=port)
    broker = LocalMosquitto(tmp_path / "run", conf_lines=config.conf.read_text().splitlines(), port=port)
    yield broker, config
    broker.stop()


def _config(tmp_path, broker, device: str, credentials: Path, keys) -> AgentConfig:
    creds = json.loads(credentials.read_text())
    return AgentConfig(device, "cams", broker.url, tmp_path / device, server_key=keys["server_pub"],
                       username=creds["username"], password=creds["password"])


def test_a_wrong_password_is_refused_at_once(secured, tmp_path, keys):
    broker, config = secured
    creds = json.loads(config.credentials["cam01"].read_text())
    started = time.monotonic()
    with pytest.raises(BrokerError, match="refused 'edgesdk-agent-cam01'.*check --credentials"):
        DeviceAgent(AgentConfig("cam01", "cams", broker.url, tmp_path / "cam01", server_key=keys["server_pub"],
                                username=creds["username"], password="wrong")).start()
    assert time.monotonic() - started < 8, "the refusal must not wait for the 10 s connect timeout"


def test_credentials_of_another_device_are_refused_by_the_acl(secured, tmp_path, keys):
    broker, config = secured
    agent = DeviceAgent(_config(tmp_path, broker, "cam02", config.credentials["cam01"], keys))
    with pytest.raises(BrokerError, match="refused a publish .* to edgesdk/devices/cam02/state.*ACL"):
        agent.start()


def _agent_cli(broker, device: str, credentials: Path, keys, store: Path) -> subprocess.Popen:
    return subprocess.Popen([EDGESDK, "agent", "--device-id", device, "--group", "cams", "--broker", broker.url,
                             "--store", str(store), "--server-key", str(keys["dir"] / "server.pub"),
                             "--credentials", str(credentials), "--profile", "generic-x86_64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_cli_agent_exits_21_with_one_error_line(secured, tmp_path, keys):
    broker, config = secured
    cases = {"cam02": config.credentials["cam01"]}  # a credentials file that names another device
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"device_id": "cam01", "username": "cam01", "password": "nope"}))
    cases["cam01"] = wrong
    for device, credentials in cases.items():
        process = _agent_cli(broker, device, credentials, keys, tmp_path / device)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == BrokerError.exit_code, stderr
        assert "connected" not in stderr and "error:" in stderr and "Traceback" not in stderr, stderr


def test_the_cli_agent_logs_each_install_step(secured, tmp_path, keys, bundles, make_server):
    broker, config = secured
    server_creds = json.loads(config.credentials["edgesdk-server"].read_text()) \
        if "edgesdk-server" in config.credentials else {"username": config.server_username,
                                                        "password": config.server_password}
    server = make_server(broker.url, username=server_creds["username"], password=server_creds["password"])
    process = _agent_cli(broker, "cam01", config.credentials["cam01"], keys, tmp_path / "cam01")
    try:
        wait_for(lambda: (server.db.device("cam01") or {}).get("status") == "online", what="agent online")
        server.upload(pack_bundle(bundles["1.0.0"]))
        rollout = server.start_rollout("digits", "1.0.0", "cams", RolloutPolicy(canary=1.0, waves=(1.0,),
                                                                                 health_window_s=0))
        wait_for(lambda: server.status(rollout)["state"] == "completed", what="rollout")
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    for step in ("cam01: accepted digits 1.0.0", "cam01: downloaded digits 1.0.0", "cam01: committed digits 1.0.0"):
        assert step in stderr, stderr
