"""The fan-out harness of benchmarks/fleet/ota.py (benchmarks/fleet/fanout_procs.py): verifying subscribers and device agents,
each in a process of its own, against a real mosquitto and a real OTA server."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from benchmarks.fleet.fanout_procs import AgentProcesses, FanoutError, raw_verifying_fanout
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import ArchiveInfo
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.app import ServerSetup, build_server
from edgesdk.ota_server.broker import LocalMosquitto
from edgesdk.ota_server.server import ServerConfig
from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key
from tests.ota.conftest import make_bundle, wait_for

ALL_AT_ONCE = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)


@pytest.fixture
def mosquitto(tmp_path):
    broker = LocalMosquitto(tmp_path / "broker")
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def archive():
    data = np.random.default_rng(13).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    return data, ArchiveInfo.of(data)


def test_verifying_subscribers_each_hold_the_whole_archive(mosquitto, archive, tmp_path):
    data, info = archive
    result = raw_verifying_fanout(mosquitto.url, data, info, 3, "ok", tmp_path)
    assert result["verified"] == 3
    assert len(result["cpu_s"]) == 3 and all(cpu > 0 for cpu in result["cpu_s"])
    assert result["wall_s"] > 0
    assert not list((tmp_path / "raw-ok").glob("*.part"))  # the copies are removed, the table and logs stay


def test_a_tampered_chunk_table_fails_verification(mosquitto, archive, tmp_path):
    data, info = archive
    bad_chunk = dataclasses.replace(info, chunks=("0" * 64, *info.chunks[1:]))
    assert raw_verifying_fanout(mosquitto.url, data, bad_chunk, 2, "chunk", tmp_path)["verified"] == 0
    bad_whole = dataclasses.replace(info, sha256="0" * 64)
    assert raw_verifying_fanout(mosquitto.url, data, bad_whole, 2, "whole", tmp_path)["verified"] == 0


def test_bad_setups_are_refused_with_the_value(tmp_path, archive):
    data, info = archive
    with pytest.raises(FanoutError, match="loopback"):
        raw_verifying_fanout("mqtt://10.0.0.1:1883", data, info, 2, "x", tmp_path)
    with pytest.raises(FanoutError, match="n=0"):
        raw_verifying_fanout("mqtt://127.0.0.1:1883", data, info, 0, "x", tmp_path)
    with pytest.raises(FanoutError, match="1000 bytes"):
        raw_verifying_fanout("mqtt://127.0.0.1:1883", data[:1000], info, 2, "x", tmp_path)
    with pytest.raises(FanoutError, match="nokey.pub"):
        AgentProcesses("mqtt://127.0.0.1:1883", tmp_path / "nokey.pub", tmp_path, 2, "g")
    assert issubclass(FanoutError, EdgeSDKError)


def test_agents_in_processes_report_cpu_and_time_of_a_rollout(mosquitto, tmp_path):
    keys = tmp_path / "keys"
    generate_keypair(keys, "server")
    generate_keypair(keys, "converter")
    converter = {"converter": load_private_key(keys / "converter.key")}
    running = build_server(ServerSetup(ServerConfig(mosquitto.url, tick_s=0.05), repo=tmp_path / "repo",
                                       db=tmp_path / "fleet.db", signing_key=load_private_key(keys / "server.key"),
                                       bundle_key=load_public_key(keys / "converter.pub")))
    try:
        server = running.ota
        server.upload(pack_bundle(make_bundle(tmp_path / "b1", "1.0.0", converter, seed=1)))
        with AgentProcesses(mosquitto.url, keys / "server.pub", tmp_path / "stores", 2, "cams",
                            retry_interval_s=0.3, broadcast_wait_s=0.5, profile="generic-x86_64") as agents:
            assert agents.startup_s > 0 and all(rss > 0 for rss in agents.rss_mb())
            pids = agents.pids
            wait_for(lambda: len(server.db.devices("cams", status="online")) == 2, timeout=30, what="2 agents online")
            before = agents.cpu_now()
            assert len(before) == 2 and all(cpu > 0 for cpu in before)
            rollout = server.start_rollout("digits", "1.0.0", "cams", ALL_AT_ONCE)
            accepted = agents.wait_event("accepted", rollout, timeout=30)
            downloaded = agents.wait_downloaded(rollout, timeout=30)
            wait_for(lambda: server.status(rollout).state != "running", timeout=30, what="the rollout to end")
            assert server.status(rollout).state == "completed"
            for (cpu0, wall0), (cpu1, wall1), idle in zip(accepted, downloaded, before):
                assert idle <= cpu0 <= cpu1 and wall0 <= wall1
            with pytest.raises(FanoutError, match="dev00, dev01"):
                agents.wait_downloaded("no-such-deployment", timeout=0.2)
        assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]  # stopped and reaped
    finally:
        running.stop()
