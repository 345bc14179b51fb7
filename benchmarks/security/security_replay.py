"""Replayed commands (issue 36, parts 3 and 6): real signed commands recorded off the broker, replayed to devices
they were not for. Goal: none admitted.

A real mosquitto, a real OTA server (signing with the commands key of a real root of trust) and real device
agents: ``cam01`` (group cams, pinned key) and ``c1`` (group canary, holding the root). The server deploys
1.0.0 and 2.0.0 to cams, canary and prod, rolls canary back to 1.0.0 and measures a model on cam01; a client of
the broker records every command it sends. Then:

- **another group**: every command recorded for cam01 and c1 goes to ``p1`` (prod, root) and ``p2`` (prod,
  pinned key) on the same broker; both hold 1.0.0 and run 2.0.0, so the canary's rollback is one they could act on;
- **an attacker's broker**: a second mosquitto the attacker runs, with fresh devices of the same groups
  (``cam03`` pinned and ``cam04`` root in cams, ``c2`` root in canary, ``p3`` pinned in prod): every recorded
  command goes to every one of them, so each is also **another device** of the recorded one's group.

Admitted: any event but ``rejected`` (accepted, downloaded, committed, failed, rolled_back), a measurement
taken up, or a version change. As a control, the same manifests sealed as a server of an earlier release did
(no binding, no expiry) go to the attacker's pinned-key devices of their own group: what binding does not cover
(a pinned-key device still takes an earlier server's command for its group; a device holding a root does not).

The cost of binding: one stage's command (a 20 MB bundle's manifest, content-defined chunks) bound to 10,000
devices, against signing the whole manifest per device, and what a device's check costs with the binding.

    .venv/bin/python -c "import json; from benchmarks.security.security_replay import run; print(json.dumps(run(True), indent=2))"
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import goal, log  # noqa: E402
from benchmarks.shared.polling import wait_until  # noqa: E402

__all__ = ["run", "binding_cost"]

#: Events that mean a device took a command up.
_ADMITTED = {"accepted", "downloaded", "committed", "rolled_back", "failed"}



def _bundle(work: Path, version: str, seed: int, signer: Any) -> Path:
    import numpy as np

    from edgesdk.runtime.bundle import BundleSpec, sign_bundle
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.testing import random_mlp, write_mlp_onnx

    model = write_mlp_onnx(random_mlp([16, 8, 4], seed=seed), work / f"m{seed}.onnx")
    out = bundle_from_model(work / f"bundle-{version}", model,
                            BundleSpec("digits", version, "onnx-fp32", "rk3588", "latency"),
                            {"input": np.zeros((1, 16), np.float32)}).path
    sign_bundle(out, signer)
    return out


class _Fleet:
    """Real agents, each pinned to the commands key or holding the root."""

    def __init__(self, work: Path, root: Path, commands_pub: Any) -> None:
        self.work, self.root, self.pub = work, root, commands_pub
        self.agents: dict[str, Any] = {}

    def add(self, device: str, group: str, broker: str, rooted: bool) -> Any:
        from edgesdk.agent.agent import DeviceAgent
        from edgesdk.agent.config import AgentConfig

        trust = {"root": self.root} if rooted else {"server_key": self.pub}
        config = AgentConfig(device, group, broker, self.work / "devices" / device, retry_interval_s=0.3,
                             broadcast_wait_s=0.5, profile="rk3588", **trust)
        self.agents[device] = DeviceAgent(config).start()
        return self.agents[device]

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()


def _replay(broker_url: str, deliveries: list[tuple[str, bytes]]) -> None:
    from edgesdk.fleet.protocol import Topics
    from edgesdk.fleet.transport import MqttTransport

    attacker = MqttTransport(broker_url, client_id=f"attacker-{time.monotonic_ns()}")
    try:
        attacker.confirm_access()
        for device, envelope in deliveries:
            attacker.publish(Topics.cmd(device), envelope)
        time.sleep(0.5)
    finally:
        attacker.close()


def _verdicts(agents: list[Any], before: dict[str, int], versions: dict[str, Any]) -> dict[str, int]:
    """Rejected and admitted replies of ``agents`` since ``before`` (their event counts), and version changes."""
    counts = {"rejected": 0, "admitted": 0, "version_changed": 0}
    for agent in agents:
        for event in list(agent.events)[before[agent.config.device_id]:]:
            if event["event"] == "rejected":
                counts["rejected"] += 1
            elif event["event"] in _ADMITTED:
                counts["admitted"] += 1
        counts["version_changed"] += agent.current_version() != versions[agent.config.device_id]
    return counts


def _replay_round(broker_url: str, victims: list[Any], recorded: list[tuple[str, bytes]],
                  settle_s: float = 1.0) -> dict[str, Any]:
    """Every recorded command to every victim; the verdicts once each victim answered each (or 30 s passed)."""
    before = {a.config.device_id: len(a.events) for a in victims}
    versions = {a.config.device_id: a.current_version() for a in victims}
    deliveries = [(a.config.device_id, envelope) for a in victims for _, envelope in recorded]
    _replay(broker_url, deliveries)
    try:
        wait_until(lambda: all(len(a.events) - before[a.config.device_id] >= len(recorded) for a in victims), 30,
                   "an answer to every replay", interval=0.02)
    except RuntimeError as exc:
        log(f"replay: {exc}")
    time.sleep(settle_s)  # a command admitted would report more by now
    return {"replayed": len(deliveries), **_verdicts(victims, before, versions)}


def _unbound(envelope: bytes, key: Any) -> bytes:
    """The manifest of ``envelope`` sealed as a server of an earlier release did: no binding, no expiry."""
    from edgesdk.fleet.protocol import _seal

    manifest = json.loads(base64.b64decode(json.loads(envelope)["manifest"]))
    manifest.pop("expires_at", None)
    return _seal(key, manifest)


def replays(work: Path) -> dict[str, Any]:
    from edgesdk.fleet import key_ceremony
    from edgesdk.fleet.archive import pack_bundle
    from edgesdk.fleet.measurement import pack_measurement
    from edgesdk.fleet.protocol import Topics
    from edgesdk.fleet.records import RolloutPolicy
    from edgesdk.fleet.transport import MqttTransport
    from edgesdk.ota_server.app import ServerSetup, build_server
    from edgesdk.ota_server.broker import LocalMosquitto
    from edgesdk.ota_server.server import ServerConfig
    from edgesdk.runtime.signing import load_private_key, load_public_key
    from edgesdk.testing import random_mlp, write_mlp_onnx

    root, private = key_ceremony.init_fleet(work / "fleet", {}, {})
    commands = load_private_key(private["commands"][0])
    fleet = _Fleet(work, root, load_public_key(Path(str(private["commands"][0])).with_suffix(".pub")))
    broker, evil = LocalMosquitto(work / "broker"), LocalMosquitto(work / "evil-broker")
    running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05), repo=work / "repo", db=work / "fleet.db",
                                       signing_key=commands, allow_unsigned=True))
    server, recorded = running.ota, []
    recorder = MqttTransport(broker.url, client_id="recorder")
    try:
        recorder.subscribe("edgesdk/devices/+/cmd", lambda t, p: recorded.append((Topics.device_of(t), p)))
        recorder.confirm_access()
        fleet.add("cam01", "cams", broker.url, rooted=False)
        fleet.add("c1", "canary", broker.url, rooted=True)
        prod = [fleet.add("p1", "prod", broker.url, rooted=True), fleet.add("p2", "prod", broker.url, rooted=False)]
        wait_until(lambda: all(getattr(server.db.device(d), "status", "") == "online" for d in fleet.agents), 60, "online",
                   interval=0.02)
        for seed, version in enumerate(("1.0.0", "2.0.0"), 1):
            server.upload(pack_bundle(_bundle(work, version, seed, load_private_key(private["bundles"][0]))))
        # Its agents run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
        policy = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)
        steps = [(v, g, False) for v in ("1.0.0", "2.0.0") for g in ("cams", "canary", "prod")]
        for version, group, rollback in [*steps, ("1.0.0", "canary", True)]:
            rid = server.start_rollout("digits", version, group, policy, rollback=rollback)
            wait_until(lambda rid=rid: server.status(rid).state != "running", 120, f"{group} on {version}", interval=0.02)
        model = write_mlp_onnx(random_mlp([64, 16, 10], seed=7), work / "candidate.onnx")
        import numpy as np

        mid = server.request_measurement("cam01", pack_measurement(model, {"input": np.zeros((4, 64), np.float32)}),
                                         "latency", 3)
        wait_until(lambda: server.measurements.status(mid)["status"] in ("done", "failed"), 120, "the measurement", interval=0.02)
        time.sleep(0.5)
        # Distinct envelopes sent to cam01 and c1 (re-sends repeat the same bytes).
        mine = list(dict.fromkeys((d, p) for d, p in recorded if d in ("cam01", "c1")))
        kinds: dict[str, int] = {}
        for _, envelope in mine:
            kind = json.loads(base64.b64decode(json.loads(envelope)["manifest"]))["type"]
            kinds[kind] = kinds.get(kind, 0) + 1
        log(f"replay: recorded {len(mine)} commands {kinds}")
        results: dict[str, Any] = {"recorded": kinds, "devices": {"recorded": ["cam01 (cams, pinned)",
                                                                             "c1 (canary, root)"]}}
        results["another_group"] = _replay_round(broker.url, prod, mine)
        results["devices"]["another_group"] = ["p1 (prod, root)", "p2 (prod, pinned)"]
        victims = [fleet.add("cam03", "cams", evil.url, rooted=False), fleet.add("cam04", "cams", evil.url, rooted=True),
                   fleet.add("c2", "canary", evil.url, rooted=True), fleet.add("p3", "prod", evil.url, rooted=False)]
        results["attackers_broker"] = _replay_round(evil.url, victims, mine)
        results["devices"]["attackers_broker"] = ["cam03 (cams, pinned)", "cam04 (cams, root)", "c2 (canary, root)",
                                                  "p3 (prod, pinned)"]
        same_group = [a for a in victims if a.config.group in ("cams", "canary")]
        results["another_device_same_group"] = {
            "note": "included in attackers_broker: cam03/cam04 got cam01's commands, c2 got c1's",
            "devices": [a.config.device_id for a in same_group]}
        # Control: the same manifests as an earlier server sealed them (unbound, no expiry), each to its own group.
        control: dict[str, Any] = {}
        for agent in victims:
            group_of = {"cam01": "cams", "c1": "canary"}
            theirs = [(d, _unbound(p, commands)) for d, p in mine if group_of[d] == agent.config.group]
            if theirs and agent.config.device_id in ("cam03", "cam04"):
                control[agent.config.device_id] = _replay_round(evil.url, [agent], theirs[:1], settle_s=1.0)
        results["control_unbound_earlier_server"] = control
    finally:
        recorder.close()
        fleet.stop()
        running.stop()
        broker.stop()
        evil.stop()
    return results


def binding_cost(devices: int, full_resign: int, bundle_bytes: int = 20 * 1024**2) -> dict[str, Any]:
    """Signing one stage's command for ``devices`` devices by binding, against sealing the whole manifest per device
    (``full_resign`` of them, scaled), and a device's check with and without the binding."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgesdk.fleet.command_scope import Binder
    from edgesdk.fleet.protocol import archive_info, parse_command, sign_command

    key = Ed25519PrivateKey.generate()
    info = archive_info(os.urandom(bundle_bytes))
    fields = dict(type="deploy", deployment_id="r1", transfer_id="r1-w0", name="digits", version="2.0.0",
                  group="cams", archive=info, broadcast=[])
    started = time.perf_counter()
    stage = sign_command(key, **fields)  # type: ignore[arg-type]
    binder = Binder(key, stage)
    seal_s = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(devices):
        bound = binder.bind(f"cam{i:05d}")
    bind_s = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(full_resign):
        sign_command(key, **fields, device=f"cam{i:05d}")  # type: ignore[arg-type]
    full_s = (time.perf_counter() - started) / full_resign
    to = type("To", (), {"device_id": f"cam{devices - 1:05d}", "group": "cams"})()
    pub = key.public_key()

    def check(envelope: bytes, **kw: Any) -> float:
        times = []
        for _ in range(50):
            t = time.perf_counter()
            parse_command(envelope, pub, **kw)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    per_device = bind_s / devices
    ids = json.dumps([f"cam{i:05d}" for i in range(10_000)]).encode()
    return {"bundle_bytes": bundle_bytes, "chunks": len(info.chunks), "devices": devices,
            "stage_envelope_bytes": len(stage), "bound_envelope_bytes": len(bound),
            "binding_bytes_per_device": len(bound) - len(stage), "seal_stage_once_s": round(seal_s, 4),
            "bind_per_device_us": round(per_device * 1e6, 1), "bind_10000_devices_s": round(per_device * 10_000, 3),
            "full_resign_per_device_us": round(full_s * 1e6, 1), "full_resign_10000_devices_s": round(full_s * 10_000, 3),
            "device_list_alternative_bytes_per_copy_10000": len(ids),
            "device_list_alternative_broker_bytes_10000": len(ids) * 10_000,
            "device_check_unbound_us": round(check(stage) * 1e6, 1),
            "device_check_bound_us": round(check(bound, to=to, strict=True) * 1e6, 1)}


def run(quick: bool) -> dict[str, Any]:
    """Replays (real server, agents, two brokers) and the cost of binding; ``quick`` binds 2,000 devices, not 10,000."""
    work = Path(tempfile.mkdtemp(prefix="edgesdk-replay-"))
    try:
        replayed = replays(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cost = binding_cost(2_000 if quick else 10_000, 200 if quick else 1_000)
    rounds = [replayed["another_group"], replayed["attackers_broker"]]
    admitted = sum(r["admitted"] + r["version_changed"] for r in rounds)
    refused = sum(r["rejected"] for r in rounds)
    replayed_n = sum(r["replayed"] for r in rounds)
    results = {"replays": replayed, "binding_cost": cost}
    goals = [goal("recorded commands (deploy, rollback, measure) replayed to another group, another device and from "
                  "an attacker's broker: admitted", "0", admitted, admitted == 0),
             goal("replays refused with a REJECTED event (share)", "1.0", refused / max(replayed_n, 1),
                  refused == replayed_n),
             goal("binding one stage's command to 10,000 devices (s, 20 MB bundle)", "<= 2 s",
                  cost["bind_10000_devices_s"], cost["bind_10000_devices_s"] <= 2.0)]
    return {"results": results, "goals": goals}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
