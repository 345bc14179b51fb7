"""Manual checks of the simulated fleet (not tests): how fast 10,000 devices connect, and what its MQTT client
costs per message against paho's.

    python benchmarks/fleet/fleet_sim_checks.py scale --devices 10000
    python benchmarks/fleet/fleet_sim_checks.py mqtt-cost
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.fleet.fleet_servers import peak_rss_mb  # noqa: E402
from benchmarks.shared.fleet_sim import SimulatedFleet, SimulationError  # noqa: E402


def _scale_check(devices: int, processes: int, connect_rate: float | None) -> dict[str, Any]:
    """Connect ``devices`` simulated devices to a fresh mosquitto with raised limits; connect time and costs."""
    from edgesdk.ota_server.broker import LocalMosquitto
    from edgesdk.runtime.signing import generate_keypair

    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        _, public = generate_keypair(Path(tmp) / "keys", "server")
        broker = LocalMosquitto(Path(tmp) / "broker", max_open_files=devices + 2000)
        try:
            fleet = SimulatedFleet(broker.url, public, devices, processes=processes, connect_rate=connect_rate)
            fleet.start(timeout=300)
            print(f"{devices} devices connected in {fleet.start_s:.1f} s", file=sys.stderr, flush=True)
            held = fleet.versions()
            report = fleet.stop()
            broker_rss = peak_rss_mb(broker.process.pid) if broker.process else None
        finally:
            broker.stop()
    return {"devices": devices, "processes": processes, "connect_rate": connect_rate, "start_s": fleet.start_s,
            "held": held, "worker_connect_s": [p.connect_s for p in report.processes],
            "worker_cpu_s": [round(p.cpu_s, 2) for p in report.processes],
            "worker_rss_mb": [round(p.rss_mb, 1) for p in report.processes], "broker_peak_rss_mb": broker_rss,
            "messages_out": report.messages_out, "reconnects": report.counts["reconnects"]}


def _mqtt_cost(messages: int, rounds: int) -> dict[str, Any]:
    """CPU per QoS 1 message (publish + deliver + both acks, both clients in this process): LiteClient vs paho."""
    from edgesdk.ota_server.broker import LocalMosquitto

    payload = b"x" * 200
    results: dict[str, list[float]] = {"lite": [], "paho": []}
    with tempfile.TemporaryDirectory(prefix="mqtt-cost-") as tmp:
        broker = LocalMosquitto(Path(tmp) / "broker")
        try:
            for r in range(rounds):
                order = ["lite", "paho"] if r % 2 == 0 else ["paho", "lite"]
                for name in order:
                    run = _lite_round if name == "lite" else _paho_round
                    results[name].append(run(broker.port, messages, payload) / messages * 1e6)
        finally:
            broker.stop()
    medians = {name: sorted(v)[len(v) // 2] for name, v in results.items()}
    return {"messages": messages, "rounds": rounds, "cpu_us_per_message": results, "median_us": medians,
            "lite_over_paho": medians["lite"] / medians["paho"]}


def _lite_round(port: int, messages: int, payload: bytes) -> float:
    from benchmarks.shared.mqtt_lite import LiteClient

    async def run() -> float:
        done = asyncio.get_running_loop().create_future()
        received = 0

        def on_message(topic: str, data: bytes) -> None:
            nonlocal received
            received += 1
            if received == messages and not done.done():
                done.set_result(None)

        sub = LiteClient("cost-sub", on_message)
        pub = LiteClient("cost-pub", lambda t, p: None)
        await sub.connect("127.0.0.1", port)
        await pub.connect("127.0.0.1", port)
        await sub.subscribe([("cost/t", 1)])
        cpu = time.process_time()
        for i in range(messages):
            ack = pub.publish("cost/t", payload, qos=1)
            if i % 64 == 63:
                await ack  # type: ignore[misc]  # a window of 64 in flight, like the agent's paho setting
        await asyncio.wait_for(done, 60)
        spent = time.process_time() - cpu
        await sub.disconnect()
        await pub.disconnect()
        return spent

    return asyncio.run(run())


def _paho_round(port: int, messages: int, payload: bytes) -> float:
    import paho.mqtt.client as mqtt

    done = threading.Event()
    received = 0

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        nonlocal received
        received += 1
        if received == messages:
            done.set()

    clients = []
    for name in ("cost-paho-sub", "cost-paho-pub"):
        client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=name,
                             protocol=mqtt.MQTTv311)
        client.max_inflight_messages_set(64)
        client.connect("127.0.0.1", port, keepalive=60)
        client.loop_start()
        clients.append(client)
    sub, pub = clients
    sub.on_message = on_message
    sub.subscribe("cost/t", qos=1)[1]
    time.sleep(0.5)  # let the SUBACK land before the timed part (a manual check, not a test)
    cpu = time.process_time()
    for i in range(messages):
        info = pub.publish("cost/t", payload, qos=1)
        if i % 64 == 63:
            info.wait_for_publish(10)  # the same window as the LiteClient round (mosquitto queues 1000 at most)
    if not done.wait(60):
        raise SimulationError(f"paho subscriber got {received} of {messages} messages in 60 s")
    spent = time.process_time() - cpu
    for client in clients:
        client.disconnect()
        client.loop_stop()
    return spent



def main(argv: list[str] | None = None) -> None:
    """``scale`` (connect many devices) or ``mqtt-cost`` (client CPU per message)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    scale = sub.add_parser("scale", help="connect N devices to a fresh mosquitto; print connect time and CPU")
    scale.add_argument("--devices", type=int, default=10_000)
    scale.add_argument("--processes", type=int, default=2)
    scale.add_argument("--connect-rate", type=float, default=None)
    cost = sub.add_parser("mqtt-cost", help="CPU per QoS 1 message: this client vs paho")
    cost.add_argument("--messages", type=int, default=20_000)
    cost.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "scale":
        print(json.dumps(_scale_check(args.devices, args.processes, args.connect_rate), indent=2))
    else:
        print(json.dumps(_mqtt_cost(args.messages, args.rounds), indent=2))


if __name__ == "__main__":
    main()
