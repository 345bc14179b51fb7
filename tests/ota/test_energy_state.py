"""A device's energy per inference, from its board's power sensor, through its retained state to /metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
from prometheus_client.parser import text_string_to_metric_families

from edgesdk.agent.managed import ManagedRuntime
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutPolicy
from tests.ota.conftest import wait_for

POWER = Path(__file__).resolve().parents[1] / "data" / "power"
#: Its agents run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
ALL_AT_ONCE = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.5,
                            deploy_timeout_s=60)


def _gauge(ota, name: str, **labels: str) -> float | None:
    body, _ = ota.metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_a_jetsons_energy_reaches_the_servers_metrics(broker, start_server, make_agent, bundles, tmp_path):
    tree = tmp_path / "sys"
    shutil.copytree(POWER / "jetson-nano-l4t32", tree)
    server = start_server(broker.url)
    managed = ManagedRuntime(profile="jetson-nano")
    try:
        agent = make_agent("nano01", broker.url, runtime=managed, profile="jetson-nano", sysfs_root=str(tree),
                           state_interval_s=0.3)
        assert agent.energy.sensor.kind == "ina3221-iio"
        wait_for(lambda: server.ota.db.device("nano01") is not None, what="the device's first state")
        server.ota.upload(pack_bundle(bundles["1.0.0-aarch64"]))  # a Jetson is sent an aarch64 bundle only
        rollout = server.ota.start_rollout("digits", "1.0.0", "cams", ALL_AT_ONCE)
        wait_for(lambda: server.ota.status(rollout).state != "running", timeout=60, what="the rollout")
        assert server.ota.status(rollout).state == "completed"
        for _ in range(20):
            managed.predict(np.ones((1, 64), np.float32))
        states: list[dict] = []
        reader = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        reader.on_message = lambda c, u, msg: states.append(json.loads(msg.payload))
        reader.connect("127.0.0.1", broker.port)
        reader.subscribe(Topics.state("nano01"))
        reader.loop_start()
        try:
            wait_for(lambda: any((s.get("energy") or {}).get("avg_watts") for s in states), 20.0,
                     what="a retained state with the board's power")
        finally:
            reader.loop_stop()
            reader.disconnect()
        energy = next(s["energy"] for s in states if (s.get("energy") or {}).get("avg_watts"))
        assert (energy["sensor"], energy["scope"]) == ("ina3221-iio", "module")
        assert energy["avg_watts"] == 1.342  # the recorded rail reads 1342 mW throughout
        wait_for(lambda: _gauge(server.ota, "edgesdk_ota_device_average_watts", model="digits", version="1.0.0"), 20,
                 what="the server's gauge")
        assert _gauge(server.ota, "edgesdk_ota_device_average_watts", model="digits", version="1.0.0") == 1.342
        row = server.ota.db.sql.rows("SELECT energy_mj, avg_watts FROM devices WHERE id = 'nano01'")[0]
        assert row["avg_watts"] == 1.342
        # The 20 predictions fell in one report window: its energy per inference is the window above idle, >= 0
        # (0 once idle was measured on this flat recorded rail; above 0 against the profile's 1.1 W idle).
        wait_for(lambda: server.ota.db.sql.rows("SELECT energy_mj FROM devices WHERE id = 'nano01'")[0]["energy_mj"]
                 is not None, what="an energy per inference")
        assert _gauge(server.ota, "edgesdk_ota_energy_per_inference_mj", model="digits", version="1.0.0") >= 0
    finally:
        managed.close()


def test_an_agent_on_a_board_without_a_sensor_says_so_in_its_state(broker, make_agent, bundles, tmp_path):
    managed = ManagedRuntime(bundles["1.0.0"], profile="raspberry-pi-4")
    try:
        agent = make_agent("pi01", broker.url, runtime=managed, profile="raspberry-pi-4", sysfs_root=str(tmp_path))
        assert agent.state()["energy"] == {"sensor": None, "note": "no power sensor on raspberry-pi-4"}
    finally:
        managed.close()
