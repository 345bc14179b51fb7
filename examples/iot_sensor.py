"""IoT example: vibration anomaly detection within a stated power budget, results published to MQTT.

A pump's accelerometer is sampled in windows of 256 values; each window's spectrum goes through a
small classifier (normal / bearing fault) on a timer, and every result is published to MQTT.
While the broker is away, results wait in a bounded local buffer and go out, in order, when it
is back.

The device runs off a small solar panel, so ``build`` states its budget: one window a second
within 3.7 W on an RK3588 board (which idles at 3.6 W). ``edgesdk.converters.convert`` picks
the variant, power mode and threads of least energy that meet it (the little A55 cores, on
this profile's figures) and the bundle records them; ``run`` runs there and prints the
planned average power.

    python examples/iot_sensor.py build OUT                  # simulate data, train, convert to OUT/bundle
    python examples/iot_sensor.py run --model OUT/bundle --broker mqtt://127.0.0.1:1883 --device pump01

``build`` needs the ``[convert]`` extra (onnx); ``run`` needs only the base install.

MQTT: topic ``edgesdk/sensors/<device>/vibration``, QoS 1, not retained; payload JSON::

    {"device": "pump01", "seq": 17, "time": 1732350000.25, "model": "vibration", "version": "1.0.0",
     "anomaly_score": 0.93, "anomaly": true, "rms": 1.41, "buffered": 0}

Delivery is at least once: ``seq`` counts windows from 0, so a consumer drops a ``seq`` it has
seen. When more than ``--buffer`` results wait for the broker, the oldest are dropped (counted in
the log line at exit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

WINDOW = 256
RATE_HZ = 2048.0
FEATURES = 64
TOPIC = "edgesdk/sensors/{device}/vibration"


# --- the sensor and its features (shared by build and run) ------------------------------------
def vibration(rng: np.random.Generator, fault: bool) -> np.ndarray:
    """One window of a simulated pump: a 50 Hz shaft line and harmonics; a bearing fault adds 400 Hz bursts."""
    t = np.arange(WINDOW) / RATE_HZ
    f0 = 50.0 * rng.uniform(0.95, 1.05)
    signal = sum(a * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi)) for k, a in ((1, 1.0), (2, 0.4), (3, 0.2)))
    if fault:
        bursts = np.sin(2 * np.pi * 400.0 * rng.uniform(0.97, 1.03) * t) * (np.sin(2 * np.pi * 25 * t) > 0.6)
        signal = signal + rng.uniform(0.5, 1.0) * bursts
    return (signal + 0.1 * rng.standard_normal(WINDOW)).astype(np.float32)


def features(window: np.ndarray) -> np.ndarray:
    """The model's input: log magnitudes of the window's first 64 spectral bins above DC, shape [1, 64]."""
    spectrum = np.abs(np.fft.rfft(window * np.hanning(WINDOW)))[1:FEATURES + 1]
    return np.log1p(spectrum).astype(np.float32)[None, :]


# --- build: simulate, train, bundle ---------------------------------------------------------------
def train(rng: np.random.Generator, n: int = 600, hidden: int = 16, steps: int = 300) -> list[tuple[np.ndarray, np.ndarray]]:
    """A 64-16-2 MLP trained by full-batch gradient descent on simulated windows (numpy only, about a second)."""
    labels = rng.integers(0, 2, n)
    raw = np.concatenate([features(vibration(rng, bool(y))) for y in labels])
    mean, std = raw.mean(0), raw.std(0) + 1e-3
    x = (raw - mean) / std  # trained on standardised features; the scaling is folded into w1/b1 below
    w1 = rng.standard_normal((FEATURES, hidden)) * np.sqrt(2 / FEATURES)
    b1 = np.zeros(hidden)
    w2 = rng.standard_normal((hidden, 2)) * np.sqrt(2 / hidden)
    b2 = np.zeros(2)
    onehot = np.eye(2)[labels]
    for _ in range(steps):
        h = np.maximum(x @ w1 + b1, 0)
        logits = h @ w2 + b2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = (p - onehot) / n
        gh = grad @ w2.T * (h > 0)
        w2 -= 0.5 * h.T @ grad
        b2 -= 0.5 * grad.sum(0)
        w1 -= 0.5 * x.T @ gh
        b1 -= 0.5 * gh.sum(0)
    w1, b1 = w1 / std[:, None], b1 - (mean / std) @ w1
    return [(w1.astype(np.float32), b1.astype(np.float32)), (w2.astype(np.float32), b2.astype(np.float32))]


def build(out: Path, profile: str = "rk3588", fps: float = 1.0, power_budget_w: float = 3.7) -> Path:
    """Train the classifier and convert it for ``profile`` within ``power_budget_w`` at ``fps``: ``out/bundle``."""
    from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert
    from edgesdk.testing import MLPWeights, mlp_forward, write_mlp_onnx

    rng = np.random.default_rng(7)
    weights = MLPWeights(tuple(train(rng)))
    test_labels = rng.integers(0, 2, 200)
    test_x = np.concatenate([features(vibration(rng, bool(y))) for y in test_labels])
    calibration = np.concatenate([features(vibration(rng, bool(y))) for y in rng.integers(0, 2, 64)])
    accuracy = float((mlp_forward(weights, test_x).argmax(1) == test_labels).mean())
    print(f"trained: accuracy {accuracy:.1%} on 200 fresh simulated windows", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    model = write_mlp_onnx(weights, out / "vibration.onnx")
    report = convert(ConversionRequest(
        Source(model), Target(profile, mode="power"),
        Data({"input": calibration}, {"input": test_x}, labels=test_labels),
        Output(out / "converted", name="vibration", version="1.0.0", force=True),
        Bounds(max_accuracy_drop=1.0, fps=fps, power_budget_w=power_budget_w)))
    power = report.plan.chosen.power
    assert power is not None and power.avg_watts is not None
    print(f"converted for {profile}: {report.plan.chosen.name} in power mode {power.point.power_mode} with "
          f"{power.point.threads} thread(s), {power.energy_mj:.3g} mJ per inference, average {power.avg_watts:.3f} W "
          f"at {fps:g} fps within the {power_budget_w:g} W budget ({power.energy_basis})", file=sys.stderr)
    bundle = out / "bundle"
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(report.bundle.path, bundle)
    print(f"wrote {bundle}", file=sys.stderr)
    return bundle


# --- run: timer loop, MQTT with a local buffer ----------------------------------------------------
class BufferedPublisher:
    """Publishes with QoS 1; results wait in a bounded buffer until the broker acknowledges them.

    A result leaves the buffer only on its PUBACK, so a broker that goes away mid-publish gets it
    again after the reconnect (at least once). Past ``capacity`` waiting results, the oldest is dropped.
    """

    def __init__(self, broker: str, client_id: str, capacity: int) -> None:
        import paho.mqtt.client as mqtt

        url = urlparse(broker)
        self.capacity, self.dropped = capacity, 0
        self._lock = threading.Lock()
        self._waiting: OrderedDict[int, tuple[str, bytes]] = OrderedDict()
        self._inflight: dict[int, int] = {}  # paho message id -> seq
        self._connected = False
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish
        self._client.reconnect_delay_set(0.2, 2.0)
        self._client.connect_async(url.hostname or "127.0.0.1", url.port or 1883)
        self._client.loop_start()

    def _send(self, seq: int) -> None:
        topic, payload = self._waiting[seq]
        self._inflight[self._client.publish(topic, payload, qos=1).mid] = seq

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._connected = not reason_code.is_failure
            if self._connected:
                for seq in list(self._waiting):
                    self._send(seq)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._connected = False
            self._inflight.clear()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            seq = self._inflight.pop(mid, None)
            if seq is not None:
                self._waiting.pop(seq, None)

    @property
    def waiting(self) -> int:
        """Results not yet acknowledged by the broker."""
        with self._lock:
            return len(self._waiting)

    def publish(self, topic: str, seq: int, payload: bytes) -> None:
        """Queue one result and send it now if the broker is there."""
        with self._lock:
            self._waiting[seq] = (topic, payload)
            while len(self._waiting) > self.capacity:
                self._waiting.popitem(last=False)
                self.dropped += 1
            if self._connected:
                self._send(seq)

    def close(self, drain_s: float) -> None:
        """Wait up to ``drain_s`` seconds for the buffer to empty, then disconnect."""
        deadline = time.monotonic() + drain_s
        while self.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        self._client.disconnect()
        self._client.loop_stop()


def run(args: argparse.Namespace) -> int:
    """Classify a window every ``--period-s`` seconds where the bundle was planned to run; publish each result."""
    from edgesdk import Runtime

    rng = np.random.default_rng(args.seed)
    publisher = BufferedPublisher(args.broker, f"sensor-{args.device}", args.buffer)
    topic = TOPIC.format(device=args.device)
    # A bundle runs in the mode and threads its conversion planned for the budget; a bare model in power mode.
    mode = None if Path(args.model).is_dir() else "power"
    with Runtime(args.model, profile=args.profile, mode=mode) as runtime:
        manifest = runtime.bundle.manifest if runtime.bundle else None
        print(f"{args.device}: {runtime.info.model_format} on cores {list(runtime.info.cores)} "
              f"({runtime.info.mode} mode, {runtime.info.threads} thread(s)), publishing to {topic}", file=sys.stderr)
        planned = manifest.measured.get("power") if manifest else None
        if planned:
            budget = planned["budget"]
            print(f"{args.device}: planned on {manifest.target_profile}: average {planned['avg_watts']:.3f} W at "
                  f"{budget['fps']:g} fps within {budget['watts']:g} W ({planned['energy_basis']})", file=sys.stderr)
        next_tick = time.monotonic()
        seq = 0
        while args.count is None or seq < args.count:
            window = vibration(rng, fault=args.fault_after is not None and seq >= args.fault_after)
            probabilities = np.asarray(runtime.predict(features(window)))
            score = float(probabilities[0, 1])
            payload = {"device": args.device, "seq": seq, "time": time.time(),
                       "model": manifest.name if manifest else None, "version": manifest.version if manifest else None,
                       "anomaly_score": round(score, 4), "anomaly": score >= args.threshold,
                       "rms": round(float(np.sqrt(np.mean(window ** 2))), 4), "buffered": publisher.waiting}
            publisher.publish(topic, seq, json.dumps(payload).encode())
            seq += 1
            next_tick += args.period_s
            time.sleep(max(0.0, next_tick - time.monotonic()))
    publisher.close(drain_s=args.drain_s)
    print(f"{args.device}: {seq} windows, {publisher.waiting} unsent, {publisher.dropped} dropped from a full buffer",
          file=sys.stderr)
    return 0 if publisher.waiting == 0 and publisher.dropped == 0 else 1


def main() -> int:
    """``build`` or ``run`` (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="simulate data, train the classifier, convert it to OUT/bundle")
    build_cmd.add_argument("out", type=Path)
    build_cmd.add_argument("--profile", default="rk3588", help="the board to convert for")
    build_cmd.add_argument("--fps", type=float, default=1.0, help="windows per second the device classifies")
    build_cmd.add_argument("--power-budget", type=float, default=3.7, help="average board watts allowed")
    run_cmd = commands.add_parser("run", help="classify windows on a timer and publish the results")
    run_cmd.add_argument("--model", required=True, help="the bundle directory (or .onnx) written by build")
    run_cmd.add_argument("--broker", default="mqtt://127.0.0.1:1883")
    run_cmd.add_argument("--device", default="pump01")
    run_cmd.add_argument("--profile", default=None, help="device profile (default: detect this board)")
    run_cmd.add_argument("--period-s", type=float, default=1.0)
    run_cmd.add_argument("--count", type=int, default=None, help="stop after N windows (default: run until killed)")
    run_cmd.add_argument("--fault-after", type=int, default=None, help="simulate a bearing fault from window N on")
    run_cmd.add_argument("--threshold", type=float, default=0.5)
    run_cmd.add_argument("--buffer", type=int, default=10_000, help="results kept while the broker is away")
    run_cmd.add_argument("--drain-s", type=float, default=10.0, help="how long to wait for unsent results at exit")
    run_cmd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "build":
        build(args.out, args.profile, args.fps, args.power_budget)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
