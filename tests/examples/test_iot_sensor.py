"""examples/iot_sensor.py against a real mosquitto, read by a separate MQTT client, across a broker outage."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgesdk.ota_server.broker import LocalMosquitto, free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "iot_sensor.py"


@pytest.fixture(scope="module")
def sensor_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iot")
    built = subprocess.run([sys.executable, str(EXAMPLE), "build", str(out)], check=True, capture_output=True,
                           text=True, timeout=300)
    # The build states a budget and reports the planned average power within it.
    assert "converted for rk3588" in built.stderr and "within the 3.7 W budget" in built.stderr, built.stderr
    return out / "bundle"


class Reader:
    """A persistent-session QoS 1 subscriber: the broker queues results for it while it is away."""

    def __init__(self, port: int, topic: str) -> None:
        self.messages: list[dict] = []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="reader", clean_session=False)
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = lambda c, u, msg: self.messages.append(json.loads(msg.payload))
        self.client.reconnect_delay_set(0.1, 1.0)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "the reader could not subscribe"

    def seqs(self) -> set[int]:
        return {m["seq"] for m in self.messages}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_results_reach_a_separate_client_and_survive_a_broker_outage(tmp_path, sensor_bundle):
    port = free_port()
    # Persistence keeps the reader's session (and the results queued for it) across the restart.
    broker = LocalMosquitto(tmp_path / "broker", port=port, conf_lines=[
        f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence true",
        f"persistence_location {tmp_path / 'broker'}/"])
    reader = Reader(port, "edgesdk/sensors/pump07/vibration")
    count, fault_after = 60, 40
    sensor = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "run", "--model", str(sensor_bundle), "--broker", broker.url,
         "--device", "pump07", "--period-s", "0.05", "--count", str(count), "--fault-after", str(fault_after),
         "--profile", "generic-x86_64", "--drain-s", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: len(reader.seqs()) >= 10, 60, "the first results")
        broker.restart(down_s=1.0)  # results produced meanwhile wait in the sensor's buffer
        _, err = sensor.communicate(timeout=120)
        assert sensor.returncode == 0, err
        _wait(lambda: reader.seqs() == set(range(count)), 30, f"all {count} results (have {sorted(reader.seqs())})")
    finally:
        sensor.kill()
        reader.close()
        broker.stop()
    by_seq = {m["seq"]: m for m in reader.messages}
    assert any(m["buffered"] > 0 for m in reader.messages), "no result was ever buffered: the outage was not seen"
    assert set(by_seq[0]) == {"device", "seq", "time", "model", "version", "anomaly_score", "anomaly", "rms", "buffered"}
    assert (by_seq[0]["device"], by_seq[0]["model"], by_seq[0]["version"]) == ("pump07", "vibration", "1.0.0")
    normal = [by_seq[s]["anomaly"] for s in range(fault_after)]
    faulty = [by_seq[s]["anomaly"] for s in range(fault_after, count)]
    assert sum(normal) <= 1 and sum(faulty) >= len(faulty) - 1, (normal, faulty)
    assert "on cores" in err and "power mode" in err
    assert "planned on rk3588: average" in err and "within 3.7 W" in err
