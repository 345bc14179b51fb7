"""Security benchmark (issues 23, 36 and 60): the root of trust, and hostile input from devices, brokers and keys.

    python benchmarks/security/security.py [--quick] [--part all|trust|fuzz|poison|replay|archives|floor|soak] [--devices N]

Part ``trust`` (issue 23):

- **Rotation reach.** A real mosquitto, an OTA server (in this process) and N simulated devices
  (``benchmarks/shared/fleet_sim.py``, 1,000 by default; each verifies root metadata as the agent does) on root v1.
  Root v2 (the commands key rotated) is published retained; the clock runs until the server's fleet store
  shows every device reporting v2.
- **Revoked key.** Real device agents on a root whose bundles role is then rotated (the old key revoked);
  a bundle signed by the revoked key is pushed to all of them: how many install it.
- **Stale detection.** A real agent and a server publishing timestamps every 0.5 s, valid 2 s; the server
  stops: how long until the agent reports ``stale``, against the bound of expiry + one interval.
- **Verification cost.** Per deployment with a rotation: the next root (2 root signatures), a timestamp,
  a 2-of-2 bundle and the command, against the single command check a device made before; medians of
  interleaved rounds on this host.

Issue 36, each part in its own module:

- ``fuzz`` (``security_fuzz.py``, ``security_atheris.py``): the fuzz suite's long profile, 100,000
  Hypothesis inputs across every network parser (5,000 with ``--quick``), then atheris on the command and tar
  parsers: unhandled exceptions, writes outside the slot, peak RSS growth.
- ``poison`` (``security_poison.py``): 1,000 simulated devices, one of them sending a malformed report every
  10 ms: the others all recorded, the rollouts complete, ingest lag p99 against clean phases.
- ``replay`` (``security_replay.py``): recorded signed commands replayed to another group, another device and
  from an attacker's broker: none admitted; what binding costs.
- ``archives`` (``security_archives.py``): sparse, undeclared, oversized, linked members and archives below the
  bundles threshold through the install and measurement paths: bytes written beyond the signed sizes.
- ``floor`` (``security_trust.py``): signed rollbacks below the bundles-signed floor; 400 hostile roots.

Issue 60: ``soak`` (``security_soak.py``): one hostile device among 1,000 for a simulated hour (10 minutes of
wall time): the server's RSS growth, archive work for a non-target, the others' lag against clean phases.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import emit, goal, interleaved, log, summary  # noqa: E402
from benchmarks.shared.fleet_sim import SimulatedFleet  # noqa: E402
from benchmarks.shared.polling import wait_until  # noqa: E402
from edgesdk.agent.agent import DeviceAgent  # noqa: E402
from edgesdk.agent.config import AgentConfig  # noqa: E402
from edgesdk.fleet import key_ceremony  # noqa: E402
from edgesdk.fleet.archive import pack_bundle  # noqa: E402
from edgesdk.fleet.protocol import ArchiveInfo, Topics, parse_command, sign_command  # noqa: E402
from edgesdk.fleet.records import RolloutPolicy  # noqa: E402
from edgesdk.fleet.transport import MqttTransport, publish_retained  # noqa: E402
from edgesdk.fleet.trust import new_timestamp, parse_timestamp, sign_metadata, trust_root, update_root  # noqa: E402
from edgesdk.ota_server.app import ServerSetup, build_server  # noqa: E402
from edgesdk.ota_server.broker import LocalMosquitto  # noqa: E402
from edgesdk.ota_server.server import ServerConfig  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec, sign_bundle  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import generate_keypair, key_id, load_private_key, load_public_key  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
FAST = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0,
                     deploy_timeout_s=60)



def _fleet(work: Path, key_counts: dict[str, int], thresholds: dict[str, int]) -> tuple[Path, dict]:
    root_path, private = key_ceremony.init_fleet(work / "fleet", key_counts, thresholds)
    return root_path, {role: [load_private_key(p) for p in paths] for role, paths in private.items()}


def rotation_reach(work: Path, devices: int) -> dict:
    root_path, keys = _fleet(work, {"root": 2}, {"root": 2})
    (work / "commands.pub").write_bytes((work / "fleet" / "keys" / "commands-1.pub").read_bytes())
    broker = LocalMosquitto(work / "broker", max_open_files=devices + 4096)
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.1), repo=work / "repo", db=work / "fleet.db",
                                       signing_key=keys["commands"][0], allow_unsigned=True,
                                       root=root_path.read_bytes()))
    fleet = SimulatedFleet(broker.url, work / "commands.pub", devices, group="sec", id_prefix="s", fetch=False,
                           root=root_path, max_runtime_s=600)
    try:
        fleet.start(timeout=300)
        wait_until(lambda: dict((v, n) for v, _, n in running.ota.db.trust_counts()).get(1, 0) == devices, 120,
                   "fleet on root v1 in the store", interval=0.01)
        generate_keypair(work / "new", "commands-2")
        v2 = key_ceremony.rotate(root_path.read_bytes(), "commands", keys["root"],
                                 add=[load_public_key(work / "new" / "commands-2.pub")],
                                 remove=[key_id(keys["commands"][0].public_key())])
        started = time.monotonic()
        publish_retained(broker.url, Topics.root(2), v2.document)
        wait_until(lambda: dict((v, n) for v, _, n in running.ota.db.trust_counts()).get(2, 0) == devices, 300,
                   f"{devices} devices on root v2", interval=0.01)
        seconds = time.monotonic() - started
    finally:
        report = fleet.stop()
        running.stop()
        broker.stop()
    return {"devices": devices, "seconds_to_all_on_v2": round(seconds, 3), "root_updates": report.counts["root_updates"],
            "roots_refused": report.counts["roots_refused"], "connect_s": fleet.start_s,
            "worker_cpu_s": round(report.cpu_s, 2)}


def _bundle(work: Path, version: str, seed: int, *signers) -> Path:
    model = write_mlp_onnx(random_mlp([16, 8, 4], seed=seed), work / f"m{seed}.onnx")
    import numpy as np

    out = bundle_from_model(work / f"bundle-{version}", model,
                            BundleSpec("digits", version, "onnx-fp32", "generic-x86_64", "latency"),
                            {"input": np.zeros((1, 16), np.float32)}).path
    for key in signers:
        sign_bundle(out, key)
    return out


def revoked_reach(work: Path, agents: int) -> dict:
    root_path, keys = _fleet(work, {}, {})
    ci = keys["bundles"][0]
    broker = LocalMosquitto(work / "broker")
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05), repo=work / "repo", db=work / "fleet.db",
                                       signing_key=keys["commands"][0], allow_unsigned=True))
    started = [DeviceAgent(AgentConfig(f"cam{i}", "cams", broker.url, work / f"device{i}", root=root_path,
                                       retry_interval_s=0.3, broadcast_wait_s=0.5)).start() for i in range(agents)]
    server = running.ota
    try:
        wait_until(lambda: len(server.db.devices("cams")) == agents, 60, "agents online", interval=0.01)
        server.upload(pack_bundle(_bundle(work, "1.0.0", 1, ci)))
        first = server.start_rollout("digits", "1.0.0", "cams", FAST)
        wait_until(lambda: server.status(first).state != "running", 120, "rollout 1.0.0", interval=0.01)
        installed_before = sum(a.current_version() == ("digits", "1.0.0") for a in started)
        generate_keypair(work / "new", "bundles-2")
        v2 = key_ceremony.rotate(root_path.read_bytes(), "bundles", keys["root"],
                                 add=[load_public_key(work / "new" / "bundles-2.pub")],
                                 remove=[key_id(ci.public_key())])
        publish_retained(broker.url, Topics.root(2), v2.document)
        wait_until(lambda: all(a.trust is not None and a.trust.root.version == 2 for a in started), 60, "agents on v2",
                   interval=0.01)
        server.upload(pack_bundle(_bundle(work, "2.0.0", 2, ci)))  # signed by the revoked key only
        second = server.start_rollout("digits", "2.0.0", "cams", FAST)
        wait_until(lambda: server.status(second).state != "running", 120, "rollout 2.0.0", interval=0.01)
        reached = sum(a.current_version() == ("digits", "2.0.0") for a in started)
        slots = sum((a.store.slots / "digits-2.0.0").exists() for a in started)
        state = server.status(second).state.value
    finally:
        for agent in started:
            agent.stop()
        running.stop()
        broker.stop()
    return {"agents": agents, "installed_1_0_0_signed_by_ci_before": installed_before,
            "installed_2_0_0_signed_by_revoked_key": reached, "slots_of_2_0_0": slots, "rollout_state": state}


def stale_detection(work: Path, rounds: int) -> dict:
    """Seconds from the server stopping until the device's retained state on the broker says ``stale``."""
    import json
    import threading

    root_path, keys = _fleet(work, {}, {})
    every, expires = 0.5, 2.0
    broker = LocalMosquitto(work / "broker")
    agent = DeviceAgent(AgentConfig("cam0", "cams", broker.url, work / "device", root=root_path)).start()
    reported = {"stale": threading.Event(), "fresh": threading.Event()}

    def on_state(topic: str, payload: bytes) -> None:
        trust = json.loads(payload).get("trust") or {}
        if "stale" in trust:
            reported["stale" if trust["stale"] else "fresh"].set()

    watcher = MqttTransport(broker.url, client_id="operator-watch")
    watcher.subscribe(Topics.state("cam0"), on_state)
    latencies = []
    try:
        for round_ in range(rounds):
            reported["fresh"].clear()
            running = build_server(ServerSetup(
                ServerConfig(broker.url, tick_s=0.05, timestamp_every_s=every, timestamp_expires_s=expires),
                repo=work / "repo", db=work / f"fleet{round_}.db", signing_key=keys["commands"][0], allow_unsigned=True,
                timestamp_key=keys["timestamp"][0]))
            wait_until(reported["fresh"].is_set, 30, "a fresh state", interval=0.01)
            time.sleep(every * 2)
            reported["stale"].clear()
            running.stop()  # the timestamps stop
            latencies.append(wait_until(reported["stale"].is_set, expires + 30, "a stale state", interval=0.01))
    finally:
        watcher.close()
        agent.stop()
        broker.stop()
    return {"every_s": every, "expires_s": expires, "bound_s": every + expires,
            "seconds_to_stale_state": [round(x, 3) for x in latencies], "worst_s": round(max(latencies), 3)}


def verification_cost(rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="edgesdk-sec-keys-") as folder:
        keys = _fleet(Path(folder), {"root": 2, "bundles": 2}, {"root": 2, "bundles": 2})[1]
    v1_doc = sign_metadata(_signed_root(keys, 1), keys["root"])
    v2_doc = sign_metadata(_signed_root(keys, 2), keys["root"])
    v1 = trust_root(v1_doc)
    v2 = update_root(v1, v2_doc)
    stamp = sign_metadata(new_timestamp(1, time.time() + 300, 2, {"cams": "ab" * 32}), keys["timestamp"])
    manifest = b"{" + b'"x": 1, ' * 300 + b"}"
    bundle_sigs = [(key_id(k.public_key()), k.sign(manifest)) for k in keys["bundles"]]
    bundles = v2.keyset("bundles")
    command = sign_command(keys["commands"][0], type="deploy", deployment_id="d1", transfer_id="t1", name="digits",
                           version="1.0.0", group="cams", archive=ArchiveInfo.of(b"x" * 50_000, chunk_size=16_384))
    single = keys["commands"][0].public_key()

    def with_trust() -> None:
        update_root(v1, v2_doc)
        parse_timestamp(stamp, v2)
        bundles.verify(manifest, bundle_sigs, "bundle")
        parse_command(command, v2.keyset("commands"))

    def before() -> None:
        parse_command(command, single)

    samples = interleaved({"with_trust": with_trust, "before": before}, rounds=rounds, calls=20, warmup=10)
    added = [a - b for a, b in zip(samples["with_trust"], samples["before"])]
    return {"with_trust_ms": summary(samples["with_trust"]), "before_ms": summary(samples["before"]),
            "added_ms": summary(added), "bundles_threshold": bundles.threshold}


def _signed_root(keys: dict, version: int) -> dict:
    from edgesdk.fleet.trust import ROLES, new_root

    thresholds = {"root": 2, "bundles": 2, "commands": 1, "timestamp": 1}
    return new_root(version, time.time() + 86400, {r: ([k.public_key() for k in keys[r]], thresholds[r]) for r in ROLES})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 simulated devices, 2 agents, fewer rounds")
    parser.add_argument("--devices", type=int, help="simulated devices for the rotation (default 1000; quick 100)")
    parser.add_argument("--part", default="all", choices=["all", "trust", *_PARTS],
                        help="one part only (default: all)")
    parser.add_argument("--fuzz-examples", type=int, help="Hypothesis inputs across the parsers (default 100000; "
                        "quick 5000)")
    args = parser.parse_args()
    results: dict = {}
    goals: list = []
    for name in ([*_PARTS] if args.part == "all" else [args.part] if args.part != "trust" else []):
        log(f"part {name}")
        part = _PARTS[name](args)
        results[name] = part["results"]
        goals += list(part["goals"].values()) if isinstance(part["goals"], dict) else part["goals"]
    if args.part in ("all", "trust"):
        trust_results, trust_goals = _trust(args)
        results.update(trust_results)
        goals = trust_goals + goals
    emit("security", {"quick": args.quick, "part": args.part, "devices": args.devices}, results, goals)


def _fuzz(args: argparse.Namespace) -> dict:
    from benchmarks.security import security_fuzz

    examples = args.fuzz_examples or (5_000 if args.quick else 100_000)
    return security_fuzz.run(examples, atheris_runs=2_000 if args.quick else 50_000)


def _module_part(module: str) -> Any:
    def part(args: argparse.Namespace) -> dict:
        return importlib.import_module(f"benchmarks.security.{module}").run(args.quick)

    return part


_PARTS = {"fuzz": _fuzz, "poison": _module_part("security_poison"), "replay": _module_part("security_replay"),
          "archives": _module_part("security_archives"), "floor": _module_part("security_trust"),
          "soak": _module_part("security_soak")}


def _trust(args: argparse.Namespace) -> tuple[dict, list]:
    """Issue 23's parts: rotation reach, revoked key, stale detection, verification cost."""
    devices = args.devices or (100 if args.quick else 1000)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="edgesdk-security-") as tmp:
        work = Path(tmp)
        log(f"rotation: {devices} simulated devices on root v1, then v2 published")
        results["rotation"] = rotation_reach(work / "rotation", devices)
        log("revoked key: real agents, a bundle signed by the revoked key")
        results["revoked"] = revoked_reach(work / "revoked", 2 if args.quick else 5)
        log("stale detection: the server's timestamps stop")
        results["stale"] = stale_detection(work / "stale", 2 if args.quick else 5)
        shutil.rmtree(work / "stale", ignore_errors=True)
    log("verification cost per deployment")
    results["verification"] = verification_cost(3 if args.quick else 9)
    goals = [
        goal(f"key rotation reaches {devices} simulated devices, every one on the new root (s)", "<= 60",
             results["rotation"]["seconds_to_all_on_v2"], results["rotation"]["seconds_to_all_on_v2"] <= 60
             and results["rotation"]["roots_refused"] == 0),
        goal("a bundle signed by the revoked key: devices that install it", "0",
             results["revoked"]["installed_2_0_0_signed_by_revoked_key"],
             results["revoked"]["installed_2_0_0_signed_by_revoked_key"] == 0 and results["revoked"]["slots_of_2_0_0"] == 0),
        goal("stale detection after the timestamps stop, worst of the rounds (s; bound: expiry + one interval)",
             f"<= {results['stale']['bound_s']}", results["stale"]["worst_s"],
             results["stale"]["worst_s"] <= results["stale"]["bound_s"]),
        goal("verifying root, timestamp and a 2-of-2 bundle threshold, added per deployment (ms, median)", "<= 5",
             results["verification"]["added_ms"]["median"], results["verification"]["added_ms"]["median"] <= 5),
    ]
    return results, goals


if __name__ == "__main__":
    main()
