"""The hostile device of the security soak (``security_soak.py``), run in its own process.

    python -m benchmarks.security.soak_hostile BROKER_URL MAX_SECONDS RATE RECONNECT_S

One MQTT client, ``edgesdk-agent-evil``, publishing only on its own device topics (as a device
holding its own broker credentials can), ``RATE`` messages a second in turn:

- **chunk requests** (``need``) naming, in turn: the transfers of the other group's rollouts, open
  or closed since (the parent sends the ids it saw open on stdin; a device of that group would read
  them off its group's chunk topic), stages of those rollouts that never were (``<rollout>-w<random
  digits>``), their revert and artifact forms (``-rb``, ``.<random artifact>``), random ids of the
  server's form (``<hex>-w<digits>``) and measurement-like ids; each with random chunk indices;
- **states** and **events** from the poisoner's list (``security_poison.POISON``: malformed,
  refused) and events claiming ``committed`` / ``failed`` for the other group's rollouts it was
  never sent;
- **measurement results** (no measurement of it runs): malformed, and well-formed ones with random
  ids;
- a **reconnect** every ``RECONNECT_S``: the client closes and connects again with the same id,
  publishing a valid retained state of its own group (``outsider``, which has no rollout) at each
  connect.

It stops when its stdin closes (the parent ended the phase, or died) or after ``MAX_SECONDS``, and
prints one JSON line of what it sent, by kind. Stdin lines are JSON: ``{"transfers": [...],
"rollouts": [...]}``."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.security.security_poison import POISON  # noqa: E402
from edgesdk.fleet.protocol import Topics  # noqa: E402
from edgesdk.fleet.transport import MqttTransport  # noqa: E402

HOSTILE = "evil"
HOSTILE_GROUP = "outsider"


class _Known:
    """The other group's open transfers and rollouts, as the parent last sent them (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transfers: list[str] = []
        self.rollouts: list[str] = []
        self.stop = threading.Event()

    def read(self) -> None:
        """Take the parent's lines until EOF, then set :attr:`stop`."""
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.transfers = [str(t) for t in message.get("transfers", [])][:1000]
                self.rollouts = [str(r) for r in message.get("rollouts", [])][:1000]
        self.stop.set()


def _transfer_id(rng: random.Random, known: _Known) -> tuple[str, str]:
    """(kind, transfer id) of the next chunk request."""
    with known.lock:
        transfers, rollouts = list(known.transfers), list(known.rollouts)
    pick = rng.randrange(6)
    if pick in (0, 1) and transfers:
        return "seen_transfer", rng.choice(transfers)
    if pick == 2 and rollouts:
        return "stage_never_was", f"{rng.choice(rollouts)}-w{rng.randrange(10, 10**9)}"
    if pick == 3 and rollouts:
        suffix = rng.choice(
            ["-rb", f"-w0.{rng.getrandbits(32):x}", f"-w{rng.randrange(3)}.generic-x86_64"]
        )
        return "revert_or_artifact", f"{rng.choice(rollouts)}{suffix}"
    if pick == 4:
        return "measurement_like", f"m{time.strftime('%Y%m%d%H%M%S')}-{rng.getrandbits(24):06x}"
    return "random_server_form", f"{rng.getrandbits(48):012x}-w{rng.randrange(10**6)}"


def _message(rng: random.Random, known: _Known, i: int) -> tuple[str, str, bytes]:
    """(kind, topic, payload) of the ``i``-th message."""
    slot = i % 10
    if slot < 4:
        kind, transfer = _transfer_id(rng, known)
        chunks = [rng.randrange(4096) for _ in range(rng.randrange(1, 64))]
        return (
            f"need/{kind}",
            Topics.need(HOSTILE),
            json.dumps({"transfer_id": transfer, "chunks": chunks}).encode(),
        )
    if slot < 6:
        topic_kind, payload = POISON[i % len(POISON)]
        topic = Topics.state(HOSTILE) if topic_kind == "state" else Topics.events(HOSTILE)
        return f"{topic_kind}/malformed", topic, payload
    if slot == 6:
        with known.lock:
            rollouts = list(known.rollouts)
        if rollouts:
            event = {
                "event": rng.choice(["committed", "failed", "accepted", "rolled_back"]),
                "deployment_id": rng.choice(rollouts),
                "name": "digits",
                "version": "9.9.9",
                "time": time.time(),
                "reason": "hostile",
            }
            return "events/foreign_rollout", Topics.events(HOSTILE), json.dumps(event).encode()
    if slot in (6, 7, 8):
        result: Any = rng.choice(
            [
                {
                    "measurement_id": f"m{rng.getrandbits(32):x}",
                    "status": "done",
                    "figures": {"p50_ms": 1.0},
                    "outputs": {},
                },
                {"measurement_id": f"m{rng.getrandbits(32):x}", "status": "accepted"},
                {"measurement_id": {"x": 1}, "status": "done"},
                {"status": "failed"},
            ]
        )
        payload = json.dumps(result).encode() if rng.random() < 0.8 else b"\xff not json"
        return "measurement", Topics.measurements(HOSTILE), payload
    return "state/valid", Topics.state(HOSTILE), _valid_state(session=1.0)


def _valid_state(session: float) -> bytes:
    """A well-formed online state of the hostile device, in its own group (it is never a rollout's target)."""
    state = {"status": "online", "group": HOSTILE_GROUP, "model": "digits", "version": "1.0.0",
             "updated": time.time(), "session": session, "connection": 1}
    return json.dumps(state).encode()


def _connect(broker_url: str) -> MqttTransport:
    will = (
        Topics.state(HOSTILE),
        json.dumps({"status": "offline", "group": HOSTILE_GROUP}).encode(),
    )
    client = MqttTransport(broker_url, client_id=f"edgesdk-agent-{HOSTILE}", will=will)
    client.publish(Topics.state(HOSTILE), _valid_state(session=time.time()), retain=True)
    return client


def run(
    broker_url: str, max_s: float, rate: float, reconnect_s: float, seed: int = 60
) -> dict[str, Any]:
    """Publish until stdin closes or ``max_s`` passed; what was sent, by kind (module docstring)."""
    known = _Known()
    threading.Thread(target=known.read, daemon=True).start()
    rng = random.Random(seed)
    sent: Counter[str] = Counter()
    client = _connect(broker_url)
    reconnects, i = 0, 0
    started = next_at = last_connect = time.monotonic()
    try:
        while not known.stop.is_set() and time.monotonic() - started < max_s:
            if time.monotonic() - last_connect >= reconnect_s:
                client.close()
                client = _connect(broker_url)
                reconnects += 1
                last_connect = time.monotonic()
            kind, topic, payload = _message(rng, known, i)
            client.publish(topic, payload, qos=0)
            sent[kind] += 1
            i += 1
            if i == 1:
                print("started", flush=True)
            next_at += 1.0 / rate
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        client.close()
    return {
        "sent": i,
        "seconds": round(time.monotonic() - started, 3),
        "reconnects": reconnects,
        "by_kind": dict(sorted(sent.items())),
    }


class Hostile:
    """The parent's handle on the hostile process: started, fed the other group's ids, stopped
    with what it sent."""

    def __init__(self, broker_url: str, max_s: float, rate: float, reconnect_s: float) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.security.soak_hostile",
                broker_url,
                str(max_s),
                str(rate),
                str(reconnect_s),
            ],
            cwd=Path(__file__).parents[2],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "started":
            self.kill()
            raise RuntimeError(
                f"the hostile device did not start (it said {line!r}, exit {self.process.poll()})"
            )

    def tell(self, transfers: list[str], rollouts: list[str]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(
                json.dumps({"transfers": transfers, "rollouts": rollouts}) + "\n"
            )
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self) -> dict[str, Any]:
        out, _ = self.process.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def main() -> None:
    """The hostile process (argv: broker url, max seconds, messages a second, reconnect seconds)."""
    url, max_s, rate, reconnect_s = (
        sys.argv[1],
        float(sys.argv[2]),
        float(sys.argv[3]),
        float(sys.argv[4]),
    )
    print(json.dumps(run(url, max_s, rate, reconnect_s)), flush=True)


if __name__ == "__main__":
    main()
