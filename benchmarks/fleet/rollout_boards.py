"""Part ``boards`` of benchmarks/fleet/rollout_safety.py: one release for a fleet of mixed boards (issue 37).

A real :class:`~edgesdk.ota_server.server.OTAServer` (in this process, SQLite store, a real
repository holding real signed bundles) on a real mosquitto signs and publishes every command.
1,000 simulated devices across four boards report retained states with their profile and CPU
architecture, as the agent does: 400 ``raspberry-pi-5``, 300 ``jetson-orin-nano``, 250 ``rk3588``
(aarch64) and 50 ``generic-x86_64`` gateways, all on digits 1.0.0. Release 2.0.0 has three
artifacts: ``raspberry-pi-5``, ``jetson-orin-nano`` and ``generic-aarch64``. So the Pi 5s and the
Orins have their own bundle, the RK3588s take the generic aarch64 one, and the gateways have none.

Each simulated device verifies each command it is sent as an agent does (the server's signature,
and the binding to this device: :func:`edgesdk.fleet.protocol.parse_command` with ``to=``),
records the archive it names (its SHA-256, which the agent checks the download against), and
answers ``accepted`` then ``committed`` (no download: the archive a device would install is the one
its signed command names, and the real agents' download and check are covered by
``tests/ota/test_boards.py``). The benchmark then compares every device's archive with the archive
of its board's artifact in the repository. The rollout is pushed with canary analysis off
(``analysis=False``, as ``push --no-analysis``): these devices serve no traffic, and this part
measures the bundles each board gets, not the verdicts (part ``canary`` does).

Goals: 0 wrong-board installs; every device of a board with an artifact on that artifact
(committed, the archive of its board); every device of a board without one reported as
``no_artifact`` and left on 1.0.0, sent nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.shared.common import goal, log
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.protocol import Topics, parse_command
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.fleet.transport import MqttTransport
from edgesdk.runtime.boards import artifact_for

__all__ = ["run_boards"]

#: Boards of the simulated fleet: (profile, arch, devices).
BOARDS = (("raspberry-pi-5", "aarch64", 400), ("jetson-orin-nano", "aarch64", 300), ("rk3588", "aarch64", 250),
          ("generic-x86_64", "x86_64", 50))
ARTIFACTS = ("raspberry-pi-5", "jetson-orin-nano", "generic-aarch64")
#: This part measures which bundle each board is sent, not the canary analysis (part ``canary``):
#: its simulated devices serve no traffic, so the rollout is an explicit ``--no-analysis`` one
#: (stages pass on install reports alone).
POLICY = RolloutPolicy(canary=0.1, waves=(0.5, 1.0), health_window_s=0.0, max_failure_rate=0.0,
                       analysis=False)


def _bundles(folder: Path, key: Any) -> list[Path]:
    """digits 2.0.0 converted for each of :data:`ARTIFACTS` from one model (signed with ``key``)."""
    from edgesdk.runtime.bundle import BundleSpec, HealthCheck
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.testing import random_mlp, write_mlp_onnx

    model = write_mlp_onnx(random_mlp([64, 32, 10], seed=2), folder / "model.onnx")
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    out = []
    for profile in ARTIFACTS:
        spec = BundleSpec("digits", "2.0.0", "onnx-fp32", profile, "latency",
                          health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
        bundle_from_model(folder / profile, model, spec, {"input": x}, private_key=key)
        out.append(folder / profile)
    return out


class _Fleet:
    """The simulated devices: one broker connection speaking for all of them (the server sees their topics)."""

    def __init__(self, broker_url: str, server_pub: Any, boards: dict[str, tuple[str, str]]) -> None:
        self.boards, self.server_pub = boards, server_pub
        self.archives: dict[str, list[str]] = {d: [] for d in boards}  # device -> archive sha256 of each command
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.transport = MqttTransport(broker_url, client_id="simulated-boards")
        self.transport.subscribe(f"{Topics.cmd('+')}", self._on_command)
        self.transport.confirm_access()

    def state(self, device: str, version: str) -> None:
        profile, arch = self.boards[device]
        self.transport.publish(Topics.state(device), json.dumps(
            {"status": "online", "group": "cams", "model": "digits", "version": version,
             "slots": [f"digits-{version}"], "profile": profile, "arch": arch, "updated": time.time()}).encode(),
            retain=True)

    def _on_command(self, topic: str, payload: bytes) -> None:
        device = topic.split("/")[-2]
        try:
            command = parse_command(payload, self.server_pub, to=SimpleNamespace(device_id=device, group="cams"))
        except EdgeSDKError as exc:
            with self.lock:
                self.refused.append(f"{device}: {exc}")
            return
        archive = getattr(command, "archive", None)
        with self.lock:
            self.archives[device].append(archive.sha256 if archive is not None else "")
        for event in ("accepted", "committed"):
            self.transport.publish(Topics.events(device), json.dumps(
                {"event": event, "time": time.time(), "deployment_id": command.deployment_id, "name": command.name,
                 "version": command.version}).encode())
        self.state(device, command.version)

    def close(self) -> None:
        self.transport.close()


def run_boards(args: argparse.Namespace) -> dict[str, Any]:
    """Run the mixed-board release (see the module docstring); ``{"results", "goals"}``."""
    from edgesdk.ota_server.app import ServerSetup, build_server
    from edgesdk.ota_server.broker import LocalMosquitto
    from edgesdk.ota_server.server import ServerConfig
    from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key

    boards = {f"{profile[:4]}{i:04d}": (profile, arch) for profile, arch, n in BOARDS for i in range(n)}
    with tempfile.TemporaryDirectory(prefix="edgesdk-boards-") as tmp:
        folder = Path(tmp)
        for name in ("server", "converter"):
            generate_keypair(folder, name)
        bundles = _bundles(folder, load_private_key(folder / "converter.key"))
        broker = LocalMosquitto(folder / "broker")
        running = build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05), repo=folder / "repo",
                                           db=folder / "fleet.db", signing_key=load_private_key(folder / "server.key"),
                                           bundle_key=load_public_key(folder / "converter.pub")))
        fleet = _Fleet(broker.url, load_public_key(folder / "server.pub"), boards)
        try:
            server = running.ota
            for bundle in bundles:
                server.repo.add(bundle)
            expected = {a: server.repo.archive("digits", "2.0.0", a)[1].sha256 for a in ARTIFACTS}
            for device in boards:
                fleet.state(device, "1.0.0")
            deadline = time.monotonic() + 120
            while sum(1 for d in server.db.devices("cams") if d.profile) < len(boards):
                if time.monotonic() > deadline:
                    raise EdgeSDKError("the simulated devices' states did not all reach the store in 120 s")
                time.sleep(0.2)
            started = time.perf_counter()
            rollout_id = server.start_rollout("digits", "2.0.0", "cams", POLICY)
            while (r := server.status(rollout_id, targets=False)).state == RolloutState.RUNNING:
                if time.perf_counter() - started > 600:
                    break
                time.sleep(0.2)
            took = time.perf_counter() - started
            r = server.status(rollout_id)
        finally:
            fleet.close()
            running.stop()
            broker.stop()
    wrong, right, unserved_ok, per_board = 0, 0, 0, Counter()
    for t in r.targets:
        profile, arch = boards[t.device_id]
        artifact = artifact_for(ARTIFACTS, profile, arch)
        sent = fleet.archives[t.device_id]
        wrong += sum(1 for sha in sent if sha != expected.get(artifact or "", "none"))
        if artifact is None:
            unserved_ok += int(t.status == TargetStatus.NO_ARTIFACT and not sent)
        else:
            right += int(t.status == TargetStatus.COMMITTED and t.artifact == artifact and bool(sent)
                         and set(sent) == {expected[artifact]})
        per_board[f"{profile} -> {t.artifact or 'none'}: {t.status.value}"] += 1
    served = sum(n for profile, arch, n in BOARDS if artifact_for(ARTIFACTS, profile, arch))
    unserved = len(boards) - served
    log(f"boards: {r.state} in {took:.1f} s; {dict(per_board)}; refused commands {len(fleet.refused)}")
    results = {"devices": len(boards), "boards": [list(b) for b in BOARDS], "artifacts": list(ARTIFACTS),
               "state": r.state.value, "reason": r.reason, "took_s": round(took, 2), "by_board": dict(per_board),
               "commands_refused_by_devices": fleet.refused[:5], "wrong_board_commands": wrong,
               "on_their_boards_artifact": right, "no_artifact_reported_and_left": unserved_ok}
    goals = [goal("devices sent another board's bundle (of 1,000)", "0", wrong, wrong == 0),
             goal(f"devices of a board with an artifact, committed on their board's artifact (of {served})",
                  f"{served}", right, right == served),
             goal(f"devices of a board with no artifact, reported no_artifact and sent nothing (of {unserved})",
                  f"{unserved}", unserved_ok, unserved_ok == unserved)]
    return {"results": results, "goals": goals}
