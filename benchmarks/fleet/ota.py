"""OTA figures on loopback with a real mosquitto, a real server and real agents.

1. Bytes on the wire for an update (one device, every payload byte the broker delivers to
   its topics counted by a listening client: command and chunks):
   - head-only retrain: a real pretrained network (PP-OCRv4's recognizer, 10.9 MB) with its
     head replaced and trained (version A), then retrained (version B; benchmarks/fleet/head_retrain.py);
     the device runs A, the figure is bytes for B / B's archive;
   - the same model re-pushed under a new version: bytes / archive.
2. Fan-out: a fresh ~10 MB bundle to 50 agents, each in its own process (one interpreter
   each, as on devices), against 50 subscriber processes that do the irreducible work of an
   agent per chunk (hash it, pwrite it, running whole-archive hash) for the same chunks
   through the same broker. Interleaved raw, edgesdk, raw, edgesdk ...; all 50 agents stay
   up during both, so both see the same host. Wall time until every device holds the
   verified archive, and per-device CPU seconds per MB (agents: from idle to "downloaded").
3. Fixed server cost per rollout: start_rollout to the device's "accepted" as the server
   receives it, for stages that move no bytes (the devices hold every chunk).
4. Retention: 10 consecutive updates to one device (keep_slots=3): slots held and store bytes.
5. Apply time on one device, and hot swaps under load (4 threads calling predict).

    python benchmarks/fleet/ota.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.fleet.fanout_procs import AgentProcesses, raw_verifying_fanout  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk.agent.agent import DeviceAgent  # noqa: E402
from edgesdk.agent.config import AgentConfig  # noqa: E402
from edgesdk.agent.managed import ManagedRuntime  # noqa: E402
from edgesdk.fleet.archive import pack_bundle  # noqa: E402
from edgesdk.fleet.protocol import Topics  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy  # noqa: E402
from edgesdk.fleet.transport import MqttTransport  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.server import OTAServer, ServerConfig  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec, HealthCheck  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
ALL_AT_ONCE = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.5,
                            deploy_timeout_s=600)
KEEP_SLOTS = 3


def _bundle(out: Path, version: str, model_path: Path, inputs: dict[str, np.ndarray], key, name: str = "bench") -> Path:
    spec = BundleSpec(name, version, "onnx-fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=5000.0))
    bundle_from_model(out, model_path, spec, inputs, private_key=key)
    return out


def mlp_bundle(out: Path, version: str, size_mb: float, key, seed: int) -> Path:
    """A bundle of an MLP of about ``size_mb`` MB of float weights drawn from ``seed``."""
    width = max(16, int(size_mb * 2**20 / 4 / 74))  # 64 -> width -> 10 weights ~ size_mb
    model_path = write_mlp_onnx(random_mlp([64, width, 10], seed=seed), out.parent / f"m{seed}.onnx")
    x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    return _bundle(out, version, model_path, {"input": x}, key)


class WireMeter:
    """Counts the payload bytes the broker delivers to one device's topics (its commands and chunks)."""

    def __init__(self, url: str, device: str, group: str) -> None:
        self.bytes = 0
        self._lock = threading.Lock()
        self._transport = MqttTransport(url, client_id=f"meter-{device}")
        for topic in (Topics.cmd(device), f"{Topics.device_chunks(device, '+')}/+", f"{Topics.group_chunks(group, '+')}/+"):
            self._transport.subscribe(topic, self._count)

    def _count(self, topic: str, payload: bytes) -> None:
        with self._lock:
            self.bytes += len(payload)

    def close(self) -> None:
        self._transport.close()


def rollout(server: OTAServer, name: str, version: str, group: str, timeout: float = 600) -> tuple[str, float]:
    """Run a rollout to completion; its id and the wall time it was started at."""
    started = time.time()
    rollout_id = server.start_rollout(name, version, group, ALL_AT_ONCE)
    deadline = time.monotonic() + timeout
    while server.status(rollout_id).state == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    state = server.status(rollout_id)
    assert state.state == "completed", f"{name} {version}: {state.state} ({state.reason})"
    return rollout_id, started


def first_event_ts(server: OTAServer, rollout_id: str, kind: str) -> list[float]:
    """Server receipt times of every ``kind`` event of a rollout."""
    return [e.ts for e in server.db.events(rollout_id) if e.type == kind]


def delta_figures(server: OTAServer, broker_url: str, work: Path, key, server_pub, quick: bool) -> dict:
    """Bytes to one device for a head-only retrain of a real network, and for a re-push of the same model."""
    from benchmarks.fleet.head_retrain import head_retrain_pair

    model_a, model_b, training = head_retrain_pair(work / "retrain", quick=quick)
    line = np.random.default_rng(0).random((1, 3, 48, training["line_shape"][-1]), dtype=np.float32) - 0.5
    agent = DeviceAgent(AgentConfig("edge", "delta", broker_url, work / "stores/edge", server_key=server_pub,
                                    broadcast_wait_s=5.0)).start()
    meter = WireMeter(broker_url, "edge", "delta")
    try:
        while not server.db.device("edge"):
            time.sleep(0.05)
        figures: dict = {"training": training}
        for version, model, what in (("1.0.0", model_a, "first_install"), ("2.0.0", model_b, "head_retrain"),
                                     ("3.0.0", model_b, "same_model_new_version")):
            bundle = _bundle(work / f"ocr-{version}", version, model, {"x": line}, key, name="ocr")
            server.upload(pack_bundle(bundle))
            archive_bytes = server.repo.chunk_table("ocr", version).size
            while version != "1.0.0" and f"ocr-{figures['previous']}" not in \
                    server.db.slots(["edge"], column="chunk_slots").get("edge", ()):
                time.sleep(0.05)  # the server plans from the state the device reports after its commit
            before = meter.bytes
            rollout_id, _ = rollout(server, "ocr", version, "delta")
            time.sleep(0.3)  # the meter's own subscription may lag the device's by a few messages
            downloaded = next(e.payload for e in server.db.events(rollout_id) if e.type == "downloaded")
            figures[what] = {"version": version, "archive_bytes": archive_bytes, "wire_bytes": meter.bytes - before,
                             "ratio": (meter.bytes - before) / archive_bytes, "fetched_bytes": downloaded["fetched_bytes"],
                             "local_bytes": downloaded["local_bytes"], "local_chunks": downloaded["local_chunks"],
                             "chunks": len(server.repo.chunk_table("ocr", version).chunks)}
            figures["previous"] = version
            log(f"{what}: {figures[what]['wire_bytes']} bytes on the wire for a {archive_bytes}-byte archive")
        del figures["previous"]
        return figures
    finally:
        meter.close()
        agent.stop()


def fanout_figures(server: OTAServer, broker_url: str, work: Path, key, quick: bool) -> dict:
    """Agents in processes against the verifying baseline in processes, interleaved, same chunks, same broker."""
    n_agents, size_mb, rounds = (10, 2.0, 1) if quick else (50, 10.0, 2)
    figures: dict[str, list[float]] = {k: [] for k in ("raw_wall_s", "edgesdk_wall_s", "raw_cpu_s_per_mb",
                                                        "edgesdk_cpu_s_per_mb", "accept_s")}
    with AgentProcesses(broker_url, work / "keys/server.pub", work / "procs", n_agents, "fleet",
                        retry_interval_s=2.0, broadcast_wait_s=10.0) as agents:
        log(f"{n_agents} agent processes up in {agents.startup_s:.1f} s")
        while len(server.db.devices("fleet")) < n_agents:
            time.sleep(0.1)
        for r in range(rounds):
            version = f"{r + 1}.0.0"
            server.upload(pack_bundle(mlp_bundle(work / f"f{r}", version, size_mb, key, seed=r)))
            data, info = server.repo.archive("bench", version)
            mb = len(data) / 1e6
            raw = raw_verifying_fanout(broker_url, data, info, n_agents, f"r{r}", work / "raw")
            assert raw["verified"] == n_agents, raw
            figures["raw_wall_s"].append(raw["wall_s"])
            figures["raw_cpu_s_per_mb"].append(statistics.median(raw["cpu_s"]) / mb)
            idle = agents.cpu_now()
            rollout_id, started = rollout(server, "bench", version, "fleet")
            done = agents.wait_downloaded(rollout_id, timeout=60)
            figures["edgesdk_wall_s"].append(max(wall for _, wall in done) - started)
            figures["edgesdk_cpu_s_per_mb"].append(statistics.median(cpu - before for (cpu, _), before in
                                                                     zip(done, idle)) / mb)
            figures["accept_s"].append(max(first_event_ts(server, rollout_id, "accepted")) - started)
            log(f"round {r + 1}: raw {raw['wall_s']:.2f} s, edgesdk {figures['edgesdk_wall_s'][-1]:.2f} s")
        rss = agents.rss_mb()
    return {"agents": n_agents, "archive_bytes": len(data), "chunks": len(info.chunks), "rounds": rounds,
            "agent_startup_s": agents.startup_s, "agent_rss_mb_median": statistics.median(rss), **figures,
            "ratio_wall": statistics.median(a / b for a, b in zip(figures["edgesdk_wall_s"], figures["raw_wall_s"])),
            "ratio_cpu_per_mb": statistics.median(a / b for a, b in zip(figures["edgesdk_cpu_s_per_mb"],
                                                                       figures["raw_cpu_s_per_mb"]))}


def solo_figures(server: OTAServer, broker_url: str, work: Path, key, server_pub, quick: bool) -> dict:
    """One device: fixed cost of a rollout that moves no bytes, apply time, and slots over 10 updates."""
    agent = DeviceAgent(AgentConfig("solo", "solo", broker_url, work / "stores/solo", server_key=server_pub,
                                    keep_slots=KEEP_SLOTS)).start()
    try:
        while not server.db.device("solo"):
            time.sleep(0.05)
        accept_s, apply_ms, slots, store_bytes, sizes = [], [], [], [], []
        model = work / "solo-model"
        model.mkdir()
        for r in range(10):  # new weights each time: 10 consecutive real updates
            version = f"{10 + r}.0.0"
            bundle = mlp_bundle(model / f"s{r}", version, 1.0, key, seed=100 + r)
            sizes.append(sum(p.stat().st_size for p in bundle.iterdir()))
            server.upload(pack_bundle(bundle))
            rollout_id, _ = rollout(server, "bench", version, "solo")
            apply_ms.append(next(e.payload["apply_ms"] for e in server.db.events(rollout_id) if e.type == "committed"))
            slots.append(len([p for p in agent.store.slots.iterdir() if not p.name.startswith(".")]))
            store_bytes.append(agent.store.disk_usage()["store_bytes"])
        # Fixed cost: the same model again under new versions, so the stage moves no chunk bytes.
        current = model / "s9"
        for r in range(3 if quick else 7):
            version = f"{30 + r}.0.0"
            bundle = shutil.copytree(current, model / f"same{r}")
            again = _rebuild(bundle, version, key)
            server.upload(pack_bundle(again))
            while f"bench-{_version_of(current)}" not in server.db.slots(["solo"], column="chunk_slots").get("solo", ()):
                time.sleep(0.02)
            rollout_id, started = rollout(server, "bench", version, "solo")
            accept_s.append(min(first_event_ts(server, rollout_id, "accepted")) - started)
            current = again
        return {"fixed_cost_s": accept_s, "fixed_cost_median_ms": statistics.median(accept_s) * 1e3,
                "apply_ms": apply_ms, "apply_median_ms": statistics.median(apply_ms),
                "slots_after_each_update": slots, "store_bytes_after_each_update": store_bytes,
                "bundle_bytes_max": max(sizes), "keep_slots": KEEP_SLOTS}
    finally:
        agent.stop()


def _version_of(bundle: Path) -> str:
    return json.loads((bundle / "manifest.json").read_text())["version"]


def _rebuild(bundle: Path, version: str, key) -> Path:
    """The bundle's model and health sample under ``version`` (a re-push of the identical model)."""
    out = bundle.parent / f"{bundle.name}-v"
    sample = np.load(bundle / "health_check.npz")
    inputs = {k.removeprefix("input:"): sample[k] for k in sample.files if k.startswith("input:")}
    return _bundle(out, version, bundle / "model.onnx", inputs, key)


def hot_swap_figures(server: OTAServer, broker_url: str, work: Path, key, server_pub, quick: bool) -> dict:
    """Failed requests while versions roll out under 4 threads of predict."""
    managed = ManagedRuntime(profile="generic-x86_64", swap_order="load-first")
    hot = DeviceAgent(AgentConfig("hot", "hot", broker_url, work / "stores/hot", server_key=server_pub),
                      runtime=managed).start()
    while not server.db.device("hot"):
        time.sleep(0.05)
    served, failed, latencies = [0], [0], []
    stop = threading.Event()
    x = np.zeros((1, 64), np.float32)

    def load() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                managed.predict(x)
                served[0] += 1
                latencies.append((time.perf_counter() - t0) * 1e3)
            except Exception:
                failed[0] += 1

    swaps = 4 if quick else 8
    threads: list[threading.Thread] = []
    for r in range(swaps):
        version = f"{50 + r}.0.0"  # above every earlier version: the repository keeps the newest few
        server.upload(pack_bundle(mlp_bundle(work / f"h{r}", version, 1.0, key, seed=200 + r)))
        rollout(server, "bench", version, "hot")
        if r == 0:  # the first version installs before any traffic
            threads = [threading.Thread(target=load) for _ in range(4)]
            for t in threads:
                t.start()
    stop.set()
    for t in threads:
        t.join()
    hot.stop()
    return {"swaps_under_load": swaps - 1, "requests": served[0], "failed": failed[0],
            "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "runtime_swaps": managed.swaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate_keypair(work / "keys", "server")
        generate_keypair(work / "keys", "converter")
        key = load_private_key(work / "keys/converter.key")
        server_pub = load_public_key(work / "keys/server.pub")
        broker = LocalMosquitto(work / "broker")
        running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05, broadcast_wait_s=5.0),
                                           repo=work / "repo", db=work / "db", keep_latest=3,
                                           signing_key=load_private_key(work / "keys/server.key"),
                                           bundle_key=load_public_key(work / "keys/converter.pub")))
        server = running.ota
        steps: list[tuple[str, Callable[[], dict]]] = [
            ("delta", lambda: delta_figures(server, broker.url, work, key, server_pub, args.quick)),
            ("fanout", lambda: fanout_figures(server, broker.url, work, key, args.quick)),
            ("solo", lambda: solo_figures(server, broker.url, work, key, server_pub, args.quick)),
            ("hot_swap", lambda: hot_swap_figures(server, broker.url, work, key, server_pub, args.quick)),
        ]
        try:
            for name, step in steps:
                log(f"--- {name}")
                results[name] = step()
        finally:
            running.stop()
            broker.stop()
    d, f, s = results["delta"], results["fanout"], results["solo"]
    goals = [
        goal("head-only retrain of a real pretrained network: bytes sent / full archive", "<= 0.20",
             d["head_retrain"]["ratio"], d["head_retrain"]["ratio"] <= 0.20),
        goal("identical model re-pushed under a new version: bytes sent / archive", "<= 0.01",
             d["same_model_new_version"]["ratio"], d["same_model_new_version"]["ratio"] <= 0.01),
        goal(f"fan-out to {f['agents']} agent processes: wall / verifying baseline in processes (median)", "<= 1.3",
             f["ratio_wall"], f["ratio_wall"] <= 1.3),
        goal("per-device CPU per MB: agent / verifying baseline subscriber (median)", "<= 1.3",
             f["ratio_cpu_per_mb"], f["ratio_cpu_per_mb"] <= 1.3),
        goal("fixed server cost per rollout: start to accept, stage moving no bytes (median ms)", "<= 100",
             s["fixed_cost_median_ms"], s["fixed_cost_median_ms"] <= 100),
        goal(f"slots held after 10 consecutive updates (keep_slots={KEEP_SLOTS})", f"<= {KEEP_SLOTS + 2}",
             max(s["slots_after_each_update"]), max(s["slots_after_each_update"]) <= KEEP_SLOTS + 2),
        goal("store bytes after 10 updates / (keep_slots + 2) x largest bundle (bounded)", "<= 1.0",
             s["store_bytes_after_each_update"][-1] / ((KEEP_SLOTS + 2) * s["bundle_bytes_max"]),
             s["store_bytes_after_each_update"][-1] <= (KEEP_SLOTS + 2) * s["bundle_bytes_max"]),
        goal("apply time on one device (verify + swap + load), median ms", "<= 1000", s["apply_median_ms"],
             s["apply_median_ms"] <= 1000),
        goal("failed requests during hot swaps under load", "0", results["hot_swap"]["failed"],
             results["hot_swap"]["failed"] == 0),
    ]
    emit("ota", {"quick": args.quick, "keep_slots": KEEP_SLOTS}, results, goals)


if __name__ == "__main__":
    main()
