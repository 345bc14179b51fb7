"""benchmarks/fleet/lone_messages.py on a real mosquitto: it measures only messages its receiver heard."""

from __future__ import annotations

import pytest

from benchmarks.fleet.lone_messages import Receiver, run_pattern
from edgesdk.fleet.transport import MqttTransport


@pytest.fixture
def pair(broker):
    receiver = Receiver(broker.url)
    sender = MqttTransport(broker.url, "lone-sender-test")
    yield receiver, sender
    sender.close()
    receiver.transport.close()


def test_a_burst_is_heard_whole_and_its_thread_cpu_measured(pair):
    receiver, sender = pair
    us = run_pattern(receiver, sender, 20, 10, 0.05)
    assert receiver.heard == 20
    assert us > 0


class _Lost:
    """A sender whose messages never reach the broker (as mosquitto's queue cap dropped a crowd's)."""

    def publish(self, topic: str, payload: bytes) -> None:
        pass


def test_messages_the_receiver_does_not_hear_stop_the_run(pair):
    receiver, _ = pair
    with pytest.raises(RuntimeError, match="heard 0 of 3"):
        run_pattern(receiver, _Lost(), 3, 3, 0.0, timeout_s=1.0)  # type: ignore[arg-type]
