"""The transport's network thread reads the packets waiting in its socket together, not one per loop pass
(edgesdk/fleet/burst_client.py), and loses or reorders none of them."""

from __future__ import annotations

import threading
import time

from edgesdk.fleet.transport import MqttTransport
from tests.ota.conftest import broker, wait_for  # noqa: F401 (fixture)

MESSAGES = 200


def test_reports_waiting_in_the_socket_are_read_in_a_few_loop_passes_in_order(broker):  # noqa: F811 (fixture)
    receiver = MqttTransport(broker.url, "burst-receiver")
    sender = MqttTransport(broker.url, "burst-sender")
    first, held, got = threading.Event(), threading.Event(), []

    def handler(topic: str, payload: bytes) -> None:
        if not first.is_set():
            first.set()
            held.wait(30)  # the network thread waits here while the rest piles up in its socket
        got.append(int(payload))

    try:
        receiver.subscribe("burst/+", handler, qos=0)  # at most once, as the server hears chunk requests
        receiver.confirm_access()
        for i in range(MESSAGES):
            sender.publish(f"burst/{i % 7}", str(i).encode(), qos=0)
        sender.confirm_access()
        assert first.wait(30), "the first message did not arrive"
        passes = [0]
        loop = receiver._client._loop

        def counted(timeout: float = 1.0):  # type: ignore[no-untyped-def]
            passes[0] += 1
            return loop(timeout)

        receiver._client._loop = counted  # paho's loop_forever looks it up on each pass
        time.sleep(0.5)  # the broker has written every message to the receiver's socket
        held.set()
        wait_for(lambda: len(got) == MESSAGES, what=f"all {MESSAGES} messages")
        assert got == list(range(MESSAGES))
        # paho's own loop reads one packet per pass when nothing of this client's is in flight: 199 passes
        assert passes[0] <= 20, f"{passes[0]} loop passes for {MESSAGES - 1} waiting messages"
    finally:
        held.set()
        sender.close()
        receiver.close()
