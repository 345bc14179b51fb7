"""Rollouts end to end: a real mosquitto, a real server, real agents, real models."""

from __future__ import annotations

from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy
from tests.ota.conftest import wait_for


def _online(server, n, group="cams"):
    wait_for(lambda: len([d for d in server.db.devices(group) if d.status == "online"]) == n, what=f"{n} devices")


def _finished(server, rollout_id):
    wait_for(lambda: server.status(rollout_id).state != "running", timeout=60, what=f"rollout {rollout_id}")
    return server.status(rollout_id)


def test_canary_then_waves_update_every_device(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(5)]
    _online(server, 5)
    server.upload(pack_bundle(bundles["1.0.0"]))
    rollout = server.start_rollout("digits", "1.0.0", "cams",
                                   RolloutPolicy(analysis=False, canary=0.2, waves=(0.6, 1.0), health_window_s=0.2))
    r = _finished(server, rollout)
    assert r.state == "completed", r
    assert [sum(t.stage == w for t in r.targets) for w in range(3)] == [1, 2, 2]
    assert all(t.status == "committed" for t in r.targets)
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    committed = [e for e in server.db.events(rollout) if e.type == "committed"]
    assert len(committed) == 5 and all(e.payload["health"]["max_abs_error"] < 1e-4 for e in committed)
    wait_for(lambda: all(d.version == "1.0.0" for d in server.db.devices("cams")), what="retained state")


def test_embedded_broker_carries_a_rollout_when_mosquitto_is_absent(make_server, make_agent, bundles):
    from edgesdk.ota_server.broker import EmbeddedBroker

    broker = EmbeddedBroker()
    try:
        server = make_server(broker.url)
        agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
        _online(server, 2)
        server.upload(pack_bundle(bundles["1.0.0"]))
        policy = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0)
        r = _finished(server, server.start_rollout("digits", "1.0.0", "cams", policy))
        assert r.state == "completed"
        assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    finally:
        for agent in agents:
            agent.stop()
        broker.stop()
