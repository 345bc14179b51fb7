"""The agent's public names and its bounded event history (the latter against a real mosquitto)."""

from __future__ import annotations

import json
import subprocess
import sys

import edgesdk.agent
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.transport import MqttTransport
from tests.ota.conftest import wait_for


def test_the_public_names_import_from_edgesdk_agent():
    from edgesdk.agent import AgentConfig, DeviceAgent, ManagedRuntime, load_credentials
    from edgesdk.agent.agent import DeviceAgent as deep

    assert DeviceAgent is deep and AgentConfig.__module__ == "edgesdk.agent.config"
    assert callable(load_credentials) and ManagedRuntime.__module__ == "edgesdk.agent.managed"
    assert all(getattr(edgesdk.agent, name) is not None for name in edgesdk.agent.__all__)
    assert sorted(dir(edgesdk.agent)) == sorted(edgesdk.agent.__all__)


def test_the_managed_runtime_alone_does_not_load_mqtt():
    code = "import sys; from edgesdk.agent import ManagedRuntime; print('paho' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_event_history_keeps_the_latest_events(broker, make_agent):
    agent = make_agent("cam0", broker.url, event_history=3)
    published: list[dict] = []
    sender = MqttTransport(broker.url, client_id="sender")
    try:
        sender.subscribe(Topics.events("cam0"), lambda topic, payload: published.append(json.loads(payload)))
        sender.confirm_access()
        for i in range(5):
            sender.publish(Topics.cmd("cam0"), f"not a command {i}".encode())
        wait_for(lambda: len(published) == 5, what="five rejections published")
    finally:
        sender.close()
    assert [e["event"] for e in published] == ["rejected"] * 5
    assert list(agent.events) == published[-3:] and agent.events.maxlen == 3
