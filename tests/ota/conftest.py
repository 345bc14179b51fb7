"""OTA fixtures: a real mosquitto on a free loopback port, signed bundles, a server, agents."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from edgesdk.agent.agent import DeviceAgent
from edgesdk.agent.config import AgentConfig
from edgesdk.fleet.records import RolloutPolicy, RolloutRecord
from edgesdk.fleet.transport import MqttTransport, publish_retained  # noqa: F401 (tests import it from here)
from edgesdk.ota_server.app import RunningServer, ServerSetup, build_server
from edgesdk.ota_server.broker import LocalMosquitto as Mosquitto
from edgesdk.ota_server.broker import free_port
from edgesdk.ota_server.server import OTAServer, ServerConfig
from edgesdk.runtime.bundle import BundleSpec, HealthCheck, write_bundle
from edgesdk.runtime.bundling import bundle_from_model, sample_model
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key
from edgesdk.testing import MLPWeights, random_mlp, write_mlp_onnx
from tests.shared_cache import shared_dir


@pytest.fixture
def broker(tmp_path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path / "broker")
    yield b
    b.stop()


def _make_keys(folder: Path) -> None:
    generate_keypair(folder, "server")
    generate_keypair(folder, "converter")


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict:
    """The server's and the converter's key pairs, made once per run (every worker signs and verifies with them)."""
    folder = shared_dir(tmp_path_factory, "ota-keys", _make_keys)
    return {"server": load_private_key(folder / "server.key"), "server_pub": load_public_key(folder / "server.pub"),
            "converter": load_private_key(folder / "converter.key"),
            "converter_pub": load_public_key(folder / "converter.pub"), "dir": folder}


def make_bundle(out: Path, version: str, keys: dict, seed: int = 0, wrong_health_output: bool = False,
                width: int = 32, name: str = "digits", weights: MLPWeights | None = None,
                profile: str = "generic-x86_64") -> Path:
    """A signed bundle of a small MLP (``weights``, or random ones of ``width`` drawn from ``seed``) planned for
    ``profile``; ``wrong_health_output`` stores an expected output the model won't give."""
    work = out.parent / f".{out.name}-model"
    work.mkdir(parents=True, exist_ok=True)
    model_path = write_mlp_onnx(weights or random_mlp([64, width, 10], seed=seed), work / "model.onnx")
    x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    spec = BundleSpec(name, version, "onnx-fp32", profile, "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=1000.0))
    if not wrong_health_output:
        bundle_from_model(out, model_path, spec, {"input": x}, private_key=keys["converter"])
        return out
    sample = sample_model(model_path, {"input": x}, profile)
    wrong = {k: np.roll(v, 3, axis=-1) + 0.5 for k, v in sample.outputs.items()}
    write_bundle(out, read_model(model_path), spec, replace(sample, outputs=wrong), private_key=keys["converter"])
    return out


@pytest.fixture(scope="session")
def bundles(tmp_path_factory, keys) -> dict[str, Path]:
    """Signed bundles 1.0.0, 2.0.0 and a 3.0.0 whose health check fails, made once per run (read-only for tests),
    for this host (generic-x86_64); and 1.0.0 for any aarch64 board (generic-aarch64), for agents that run as one."""
    def build(folder: Path) -> None:
        make_bundle(folder / "v1", "1.0.0", keys, seed=1)
        make_bundle(folder / "v1-aarch64", "1.0.0", keys, seed=1, profile="generic-aarch64")
        make_bundle(folder / "v2", "2.0.0", keys, seed=2)
        make_bundle(folder / "v3", "3.0.0", keys, seed=3, wrong_health_output=True)

    folder = shared_dir(tmp_path_factory, "ota-bundles", build)
    return {"1.0.0": folder / "v1", "2.0.0": folder / "v2", "3.0.0-bad": folder / "v3",
            "1.0.0-aarch64": folder / "v1-aarch64"}


_SETUP_FIELDS = {f.name for f in fields(ServerSetup)} - {"server", "http"}


@pytest.fixture
def start_server(tmp_path, keys) -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``start_server(broker_url, token=None, **config)`` builds a server with build_server.

    ``config`` names ServerSetup fields (``chunk_size``, ``server_class``, ``repo``, ...) or ServerConfig
    fields (``resend_s``, ...); a ``token`` also starts the admin API on a free loopback port. By default
    every server of a test shares one repository and fleet DB under ``tmp_path``; all are stopped at the end.
    """
    running: list[RunningServer] = []

    def factory(broker_url: str, token: str | None = None, **config: object) -> RunningServer:
        setup: dict = {"repo": tmp_path / "repo", "db": tmp_path / "fleet.db", "signing_key": keys["server"],
                       "bundle_key": keys["converter_pub"]}
        # Quicker than the defaults, which trade latency for CPU at 10,000 devices: a release pass every 0.5 s (not 5)
        # and the report writer's wait for company cut to 20 ms of quiet (not 0.3 s); tests of those trade-offs set them.
        server: dict = {"tick_s": 0.05, "reconcile_s": 0.5, "ingest_quiet_s": 0.02}
        for key, value in config.items():
            (setup if key in _SETUP_FIELDS else server)[key] = value
        running.append(build_server(ServerSetup(ServerConfig(broker_url, **server), **setup, token=token,
                                                http=f"127.0.0.1:{free_port()}" if token else None)))
        return running[-1]

    yield factory
    for r in running:
        r.stop()


@pytest.fixture
def make_server(start_server) -> Callable[..., OTAServer]:
    """Factory: ``make_server(broker_url, **config)`` is ``start_server(...).ota`` without an admin API."""

    def factory(broker_url: str, **config: object) -> OTAServer:
        return start_server(broker_url, **config).ota

    return factory


@pytest.fixture
def make_agent(tmp_path, keys) -> Iterator[Callable[..., DeviceAgent]]:
    agents: list[DeviceAgent] = []

    def factory(device_id: str, broker_url: str, group: str = "cams", runtime=None, **config: object) -> DeviceAgent:
        settings = {"server_key": keys["server_pub"], "retry_interval_s": 0.3, "broadcast_wait_s": 0.5, **config}
        cfg = AgentConfig(device_id=device_id, group=group, broker=broker_url, store=tmp_path / "devices" / device_id,
                          **settings)
        agent = DeviceAgent(cfg, runtime=runtime).start()
        agents.append(agent)
        return agent

    yield factory
    for a in agents:
        a.stop()


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")


def read_retained(broker_url: str, topic: str) -> bytes:
    """The message kept retained on ``topic`` (waits for it)."""

    got: list[bytes] = []
    reader = MqttTransport(broker_url, client_id=f"reader-{time.monotonic_ns()}")
    try:
        reader.subscribe(topic, lambda t, payload: got.append(payload))
        wait_for(lambda: got, what=f"the retained message on {topic}")
    finally:
        reader.close()
    return got[-1]


@pytest.fixture
def console_fleet(broker, start_server, make_agent, bundles) -> tuple[RunningServer, list[DeviceAgent]]:
    """A server with the console (admin token ``console_client.TOKEN``), agents cam0-cam2 in ``cams`` and ``door``
    in ``lobby``, all running digits 1.0.0; bundles 1.0.0 and 2.0.0 stored."""
    from edgesdk.fleet.archive import pack_bundle
    from edgesdk.fleet.records import RolloutPolicy
    from tests.ota.console_client import TOKEN

    running = start_server(broker.url, token=TOKEN, console=True)
    server = running.ota
    agents = [make_agent(f"cam{i}", broker.url) for i in range(3)] + [make_agent("door", broker.url, group="lobby")]
    wait_for(lambda: server.db.device_total(status="online") == 4, what="4 devices online")
    server.upload(pack_bundle(bundles["1.0.0"]))
    server.upload(pack_bundle(bundles["2.0.0"]))
    for group in ("cams", "lobby"):
        rollout = server.start_rollout("digits", "1.0.0", group, RolloutPolicy(canary=1.0, waves=(1.0,),
                                                                                health_window_s=0, analysis=False))
        wait_for(lambda r=rollout: server.status(r, targets=False).state != "running", timeout=60, what="1.0.0")
    return running, agents


#: A rollout with no canary wait and no failures allowed: one stage to the whole group. These tests' agents run no
#: app (no traffic to judge), so the canary analysis is off: an explicit choice, as ``push --no-analysis`` is.
FAST = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0, analysis=False)


def rollout_to(server: OTAServer, version: str, group: str = "cams", policy: RolloutPolicy = FAST) -> RolloutRecord:
    """Roll ``digits`` ``version`` out to ``group`` and wait (60 s at most) until the rollout stops running."""
    rollout = server.start_rollout("digits", version, group, policy)
    wait_for(lambda: server.status(rollout).state != "running", timeout=60, what=f"rollout {version}")
    return server.status(rollout)
