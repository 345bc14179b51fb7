"""OTA figures on loopback with a real mosquitto.

1. Fan-out: a 10 MB bundle to 50 agents (one stage, all at once): wall time until every
   agent holds the verified archive, and payload bytes into and out of the broker, against
   a raw fan-out of the same bytes in the same chunks to 50 plain subscribers through the
   same broker. Interleaved: raw, edgesdk, raw, edgesdk, ... All 50 agents share this
   host's 2 cores and disk, so their per-chunk hashing and writing run one after another
   here, where 50 real devices would each use their own CPU.
2. Apply time on one device: archive check + unpack + verify + switch + load + health check.
3. Hot swap under continuous load: 4 threads call ManagedRuntime.predict while versions
   roll out; failed requests are counted.

    python benchmarks/ota.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, goal, log  # noqa: E402

from edgesdk.agent.agent import AgentConfig, DeviceAgent  # noqa: E402
from edgesdk.agent.managed import ManagedRuntime  # noqa: E402
from edgesdk.bundle import BundleSpec, HealthCheck, bundle_from_model  # noqa: E402
from edgesdk.fleet_protocol import RolloutPolicy  # noqa: E402
from edgesdk.ota import ArchiveInfo, pack_bundle  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.server import ServerConfig  # noqa: E402
from edgesdk.signing import generate_keypair, load_private_key, load_public_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402
from edgesdk.transport import MqttTransport  # noqa: E402

ALL_AT_ONCE = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.5, deploy_timeout_s=600)


def make_bundle(out: Path, version: str, size_mb: float, key, seed: int) -> Path:
    width = max(16, int(size_mb * 2**20 / 4 / 74))  # 64 -> width -> 10 weights ~ size_mb
    model_path = write_mlp_onnx(random_mlp([64, width, 10], seed=seed), out.parent / f"m{seed}.onnx")
    x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    spec = BundleSpec("bench", version, "onnx-fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=2000.0))
    bundle_from_model(out, model_path, spec, {"input": x}, private_key=key)
    return out


def raw_fanout(url: str, data: bytes, info: ArchiveInfo, n: int, round_no: str,
               workdir: Path | None = None) -> tuple[float, int]:
    """Publish the same chunks once to n plain subscribers; seconds until all have every chunk.

    With ``workdir`` each subscriber also does the irreducible part of an agent's work per chunk
    (SHA-256 check, write at its offset, running whole-file hash), as a floor for this host.
    """
    counts = [0] * n
    received = [0] * n
    done = threading.Event()
    subscribers = []
    files = [os.open(workdir / f"{round_no}-{i}.part", os.O_RDWR | os.O_CREAT) for i in range(n)] if workdir else []
    running = [hashlib.sha256() for _ in range(n)]
    for i in range(n):
        def handler(topic: str, payload: bytes, i: int = i) -> None:
            if files:
                index = int(topic.rsplit("/", 1)[1])
                if hashlib.sha256(payload).hexdigest() == info.chunks[index]:
                    os.pwrite(files[i], payload, index * info.chunk_size)
                    running[i].update(payload)
            counts[i] += 1
            received[i] += len(payload)
            if all(c >= len(info.chunks) for c in counts):
                done.set()
        t = MqttTransport(url, client_id=f"raw{round_no}-{i}")
        t.subscribe(f"raw/{round_no}/#", handler)
        subscribers.append(t)
    publisher = MqttTransport(url, client_id=f"raw-pub{round_no}")
    time.sleep(0.5)
    started = time.perf_counter()
    for index in range(len(info.chunks)):
        start, end = info.chunk_range(index)
        publisher.publish(f"raw/{round_no}/{index}", data[start:end])
    done.wait(600)
    elapsed = time.perf_counter() - started
    for t in (*subscribers, publisher):
        t.close()
    for fd in files:
        os.close(fd)
    return elapsed, len(data) + sum(received)  # payload bytes into and out of the broker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_agents, size_mb, rounds = (10, 2.0, 1) if args.quick else (50, 10.0, 2)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate_keypair(work / "keys", "server")
        generate_keypair(work / "keys", "converter")
        server_key, converter_key = load_private_key(work / "keys/server.key"), load_private_key(work / "keys/converter.key")
        broker = LocalMosquitto(work / "broker")
        running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05, broadcast_wait_s=5.0),
                                           repo=work / "repo", db=work / "db", signing_key=server_key, keep_latest=3,
                                           bundle_key=load_public_key(work / "keys/converter.pub")))
        server, repo = running.ota, running.repository
        log(f"starting {n_agents} agents")
        agents = [DeviceAgent(AgentConfig(f"dev{i:02d}", "fleet", broker.url, work / "stores" / f"dev{i:02d}",
                                          server_key=load_public_key(work / "keys/server.pub"), retry_interval_s=2.0,
                                          broadcast_wait_s=10.0)).start() for i in range(n_agents)]
        while len(server.db.devices("fleet")) < n_agents:
            time.sleep(0.1)
        fanout: dict[str, list[float]] = {"raw_s": [], "raw_verifying_s": [], "edgesdk_s": [], "raw_bytes": [],
                                          "edgesdk_bytes": [], "edgesdk_total_s": []}
        for r in range(rounds):
            version = f"{r + 1}.0.0"
            bundle = make_bundle(work / f"b{r}", version, size_mb, converter_key, seed=r)
            server.upload(pack_bundle(bundle))
            data, info = repo.archive("bench", version)
            log(f"round {r + 1}: raw fan-out of {len(data) / 1e6:.1f} MB to {n_agents}")
            seconds, raw_bytes = raw_fanout(broker.url, data, info, n_agents, f"{r}p")
            fanout["raw_s"].append(seconds)
            fanout["raw_bytes"].append(raw_bytes)
            (work / "raw").mkdir(exist_ok=True)
            fanout["raw_verifying_s"].append(raw_fanout(broker.url, data, info, n_agents, f"{r}v", work / "raw")[0])
            log(f"round {r + 1}: edgesdk rollout")
            before = server.bytes_published + sum(a.bytes_received + a.bytes_published for a in agents)
            started, wall_start = time.perf_counter(), time.time()
            rollout = server.start_rollout("bench", version, "fleet", ALL_AT_ONCE)
            while server.status(rollout).state == "running":
                time.sleep(0.05)
            fanout["edgesdk_total_s"].append(time.perf_counter() - started)
            # The agents' own clock (same host): the server's receive time also carries SQLite/disk queueing.
            downloaded = [e.payload["time"] for e in server.db.events(rollout) if e.type == "downloaded"]
            assert len(downloaded) == n_agents, f"{len(downloaded)} of {n_agents} agents downloaded"
            fanout["edgesdk_s"].append(max(downloaded) - wall_start)
            fanout["edgesdk_bytes"].append(
                server.bytes_published + sum(a.bytes_received + a.bytes_published for a in agents) - before)
            state = server.status(rollout)
            assert state.state == "completed", state
        results["fanout"] = {
            "agents": n_agents, "archive_bytes": len(data), "chunks": len(info.chunks), "rounds": rounds,
            **{k: v for k, v in fanout.items()},
            "ratio_wall": statistics.median(a / b for a, b in zip(fanout["edgesdk_s"], fanout["raw_s"])),
            "ratio_wall_vs_raw_verifying": statistics.median(
                a / b for a, b in zip(fanout["edgesdk_s"], fanout["raw_verifying_s"])),
            "ratio_bytes": statistics.median(a / b for a, b in zip(fanout["edgesdk_bytes"], fanout["raw_bytes"])),
        }
        for agent in agents:
            agent.stop()

        log("apply time on one device")
        solo_key = load_public_key(work / "keys/server.pub")
        solo = DeviceAgent(AgentConfig("solo", "solo", broker.url, work / "stores/solo", server_key=solo_key)).start()
        while not server.db.device("solo"):
            time.sleep(0.05)
        apply_ms = []
        for r in range(3 if args.quick else 5):
            version = f"{10 + r}.0.0"
            server.upload(pack_bundle(make_bundle(work / f"s{r}", version, size_mb, converter_key, seed=100 + r)))
            rollout = server.start_rollout("bench", version, "solo", ALL_AT_ONCE)
            while server.status(rollout).state == "running":
                time.sleep(0.05)
            committed = next(e for e in server.db.events(rollout) if e.type == "committed")
            apply_ms.append(committed.payload["apply_ms"])
        solo.stop()
        results["apply_ms"] = {"samples": apply_ms, "median": statistics.median(apply_ms), "archive_mb": size_mb}

        log("hot swap under load")
        managed = ManagedRuntime(profile="generic-x86_64", swap_order="load-first")
        hot = DeviceAgent(AgentConfig("hot", "hot", broker.url, work / "stores/hot", server_key=solo_key),
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

        swaps = 4 if args.quick else 8
        for r in range(swaps):
            version = f"{20 + r}.0.0"
            server.upload(pack_bundle(make_bundle(work / f"h{r}", version, 1.0, converter_key, seed=200 + r)))
            rollout = server.start_rollout("bench", version, "hot", ALL_AT_ONCE)
            if r == 0:  # the first version installs before any traffic
                while server.status(rollout).state == "running":
                    time.sleep(0.05)
                threads = [threading.Thread(target=load) for _ in range(4)]
                for t in threads:
                    t.start()
                continue
            while server.status(rollout).state == "running":
                time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        hot.stop()
        results["hot_swap"] = {"swaps_under_load": swaps - 1, "requests": served[0], "failed": failed[0],
                               "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
                               "runtime_swaps": managed.swaps}
        running.stop()
        broker.stop()
    f = results["fanout"]
    goals = [
        goal(f"push {size_mb:g} MB to {n_agents} agents: wall / raw fan-out (median)", "<= 1.5", f["ratio_wall"],
             f["ratio_wall"] <= 1.5),
        goal("payload bytes through the broker / raw fan-out (median)", "<= 1.05", f["ratio_bytes"], f["ratio_bytes"] <= 1.05),
        goal("wall / raw fan-out whose subscribers also hash and write each chunk (median)", "report",
             f["ratio_wall_vs_raw_verifying"], True),
        goal("apply time on one device (verify + swap + load), median ms", "<= 1000", results["apply_ms"]["median"],
             results["apply_ms"]["median"] <= 1000),
        goal("failed requests during hot swaps under load", "0", results["hot_swap"]["failed"],
             results["hot_swap"]["failed"] == 0),
    ]
    emit("ota", {"agents": n_agents, "archive_mb": size_mb, "rounds": rounds, "quick": args.quick}, results, goals)


if __name__ == "__main__":
    main()
