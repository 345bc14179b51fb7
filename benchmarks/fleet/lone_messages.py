"""What one device message costs the server's MQTT thread when it arrives alone, in a small burst, or in a crowd.

A late device's reports reach the server one by one (devices return at random times); an online device's come in
a crowd (a rollout stage). This measures, on this machine and with nothing of the server behind the transport, the
network thread's CPU per message of edgesdk's own transport (:class:`edgesdk.fleet.transport.MqttTransport`, the
server's client class) subscribed on a real mosquitto, each message a device event's JSON parsed by the handler:

- ``alone``: one message every 1/6 s, the rate at which late devices return in the fleet benchmark
  (3,500 over 10 minutes);
- ``bursts_of_12``: the same messages, 12 at once every 2 s;
- ``crowd``: all at once, as a stage's answers come.

The thread's CPU is its ``sum_exec_runtime`` (``/proc/self/task/TID/schedstat``): the time it ran, in ns. The
patterns are interleaved over ``--rounds`` rounds, the order rotated each round; a message not heard within 60 s
stops the run. It has no goal of its own (``goals`` is empty): it measures the floor under ``late_over_online`` in
``fleet.py --part returning``, where a late device's messages arrive alone.

    python benchmarks/fleet/lone_messages.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.shared.common import emit, log  # noqa: E402
from edgesdk.fleet.transport import MqttTransport  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402

#: A device event as agents send it (the size matters more than the fields).
EVENT = json.dumps({"type": "committed", "device": "d00001", "deployment_id": "r-0123456789abcdef-w0",
                    "model": "digits", "version": "1.0.1", "slots": {"a": "1.0.0", "b": "1.0.1"},
                    "ts": 1764270000.0, "missing": 0, "seconds": 0.42}).encode()


class Receiver:
    """The server's transport, counting and parsing what it hears; the CPU of its network thread."""

    def __init__(self, url: str) -> None:
        self.transport = MqttTransport(url, "lone-receiver")
        self.heard, self._lock = 0, threading.Lock()
        self.transport.subscribe("bench/events/+", self._on_event)
        self.transport.confirm_access()
        self.tid = self.transport._client._thread.native_id  # the paho network thread

    def _on_event(self, topic: str, payload: bytes) -> None:
        json.loads(payload)
        with self._lock:
            self.heard += 1

    def cpu_s(self) -> float:
        with open(f"/proc/self/task/{self.tid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0]) / 1e9


def run_pattern(receiver: Receiver, sender: MqttTransport, messages: int, burst: int, gap_s: float,
                timeout_s: float = 60.0) -> float:
    """Send ``messages`` in bursts of ``burst`` every ``gap_s``; µs of the receiver's thread CPU per message.
    RuntimeError when the receiver has not heard them all ``timeout_s`` after the last was sent."""
    start_heard, start_cpu, sent = receiver.heard, receiver.cpu_s(), 0
    while sent < messages:
        for _ in range(min(burst, messages - sent)):
            sender.publish(f"bench/events/d{sent:05d}", EVENT)
            sent += 1
        if sent < messages:
            time.sleep(gap_s)
    deadline = time.monotonic() + timeout_s
    while receiver.heard - start_heard < messages and time.monotonic() < deadline:
        time.sleep(0.01)
    if receiver.heard - start_heard < messages:
        raise RuntimeError(f"the receiver heard {receiver.heard - start_heard} of {messages} messages")
    time.sleep(0.3)  # the last acknowledgements
    return (receiver.cpu_s() - start_cpu) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds (CI smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every pattern (default 3, --quick 1)")
    args = parser.parse_args()
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1 round")
    rounds = args.rounds or (1 if args.quick else 3)
    alone_n = 30 if args.quick else 240
    patterns = {"alone": (alone_n, 1, 1 / 6), "bursts_of_12": (alone_n, 12, 2.0),
                "crowd": (alone_n * 10, alone_n * 10, 0.0)}
    samples: dict[str, list[float]] = {name: [] for name in patterns}
    with tempfile.TemporaryDirectory(prefix="edgesdk-lone-") as work:
        broker = LocalMosquitto(Path(work) / "broker", max_open_files=4096)  # and no cap on queued messages, as fleet.py
        try:
            receiver = Receiver(broker.url)
            sender = MqttTransport(broker.url, "lone-sender")
            try:
                run_pattern(receiver, sender, 50, 50, 0.0)  # warm-up
                names = list(patterns)
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        samples[name].append(round(run_pattern(receiver, sender, *patterns[name]), 1))
                        log(f"round {r + 1}: {name} {samples[name][-1]} us a message")
            finally:
                sender.close()
                receiver.transport.close()
        finally:
            broker.stop()
    median = {name: statistics.median(values) for name, values in samples.items()}
    results = {"us_per_message": {name: {"median": median[name], "min": min(v), "max": max(v), "runs": v}
                                  for name, v in samples.items()},
               "alone_over_crowd": round(median["alone"] / median["crowd"], 2),
               "bursts_of_12_over_crowd": round(median["bursts_of_12"] / median["crowd"], 2),
               "alone_over_bursts_of_12": round(median["alone"] / median["bursts_of_12"], 2)}
    emit("lone_messages", {"rounds": rounds, "patterns": {k: {"messages": n, "burst": b, "gap_s": g}
                                                          for k, (n, b, g) in patterns.items()}}, results, [])


if __name__ == "__main__":
    main()
