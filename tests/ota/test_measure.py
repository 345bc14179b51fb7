"""Measuring a candidate model on a device of the fleet: a real mosquitto, server, admin API and agents."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.agent.managed import ManagedRuntime
from edgesdk.converters.board.remote import measure_on_device
from edgesdk.errors import TransferError
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.measurement import pack_measurement, parse_result
from edgesdk.fleet.protocol import ArchiveInfo, Topics, sign_measure_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.app import ServerSetup, build_server
from edgesdk.ota_server.server import ServerConfig
from edgesdk.testing import random_mlp, write_mlp_onnx
from tests.ota.conftest import wait_for


@pytest.fixture
def admin(broker, start_server):
    """A server with its admin API on loopback, and a client for it."""
    token = secrets.token_urlsafe(16)
    running = start_server(broker.url, token=token)
    return running.ota, AdminClient(running.url, token, timeout=30)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A model no device runs, and 70 evaluation samples (two batches of at most 64)."""
    folder = tmp_path_factory.mktemp("candidate")
    model = write_mlp_onnx(random_mlp([64, 16, 10], seed=7), folder / "candidate.onnx")
    return model, np.random.default_rng(7).standard_normal((70, 64)).astype(np.float32)


def _online(server, device):
    wait_for(lambda: getattr(server.db.device(device), "status", None) == "online", what=f"{device} online")


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash (or link target), to show nothing changed."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = "-> " + str(path.readlink())
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path.relative_to(root))] = "dir"
    return found


def _finished(client, measurement_id):
    wait_for(lambda: client.measurement(measurement_id)["status"] in ("done", "failed"), timeout=60,
             what=f"measurement {measurement_id}")
    return client.measurement(measurement_id)


def test_measured_on_the_board_without_touching_the_serving_model(admin, broker, make_agent, bundles, candidate, keys):
    server, client = admin
    managed = ManagedRuntime(profile="rk3588")
    board = make_agent("rk1", broker.url, runtime=managed, profile="rk3588")
    other = make_agent("pi1", broker.url, profile="raspberry-pi-5")
    _online(server, "rk1")
    _online(server, "pi1")
    server.upload(pack_bundle(bundles["1.0.0-aarch64"]))  # both boards are aarch64: sent an aarch64 bundle only
    rollout = server.start_rollout("digits", "1.0.0", "cams", RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,),
                                                                            health_window_s=0))
    wait_for(lambda: server.status(rollout).state != "running", timeout=60, what="the first install")
    assert board.current_version() == ("digits", "1.0.0")
    serving, swaps, before = managed.bundle, managed.swaps, _tree(board.store.root)
    x_serving = np.ones((1, 64), np.float32)
    answer = managed.predict(x_serving)
    chunks_elsewhere = other.bytes_received

    model, x = candidate
    m = measure_on_device(client, "rk1", model, {"input": x}, "latency", runs=20, timeout_s=120,
                          sign_keys=[keys["converter"]])

    with Runtime(model, profile="rk3588", mode="latency") as local:
        expected = local.predict(x)
    assert set(m.outputs) == {"probabilities"}
    np.testing.assert_allclose(m.outputs["probabilities"], expected, rtol=1e-5, atol=1e-6)
    assert (m.device, m.profile, m.backend) == ("rk1", "rk3588", "onnxruntime")
    assert m.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    assert 0 < m.latency_p50_ms <= m.latency_p90_ms <= m.latency_p99_ms
    assert m.load_ms > 0 and 0 < m.rss_before_mb <= m.peak_rss_mb and m.threads >= 1
    # Nothing of the serving side moved: same model, slots, pointers, state; the scratch is gone.
    assert board.current_version() == ("digits", "1.0.0")
    assert managed.bundle is serving and managed.swaps == swaps
    np.testing.assert_array_equal(managed.predict(x_serving), answer)
    assert _tree(board.store.root) == before
    assert list(board.store.scratch.iterdir()) == []
    # The archive went to that one device only.
    assert other.bytes_received == chunks_elsewhere
    logged = [e.type for e in server.db.events(device_id="rk1") if e.type.startswith("measurement_")]
    assert logged == ["measurement_requested", "measurement_done"]


def test_measure_command_signed_with_another_key_is_refused_and_writes_nothing(broker, make_agent, keys, tmp_path,
                                                                                candidate):
    board = make_agent("rk1", broker.url, profile="rk3588")
    before = _tree(board.store.root)
    with build_server(ServerSetup(ServerConfig(broker.url, tick_s=0.05), repo=tmp_path / "repo2",
                                  db=tmp_path / "impostor.db", signing_key=keys["converter"])) as running:
        impostor = running.ota
        _online(impostor, "rk1")
        model, x = candidate
        mid = impostor.request_measurement("rk1", pack_measurement(model, {"input": x}), "latency", 5, timeout_s=3)
        wait_for(lambda: impostor.measurement(mid)["status"] == "failed", what="the impostor's measurement to fail")
    rejected = [e for e in board.events if e["event"] == "rejected"]
    assert len(rejected) == 1 and "signature does not verify" in rejected[0]["reason"]
    assert "did not report measurement" in impostor.measurement(mid)["error"]
    assert _tree(board.store.root) == before


def test_truncated_archive_fails_clearly_and_leaves_no_scratch(admin, broker, make_agent, candidate):
    server, client = admin
    board = make_agent("rk1", broker.url, profile="rk3588")
    _online(server, "rk1")
    model, x = candidate
    archive = pack_measurement(model, {"input": x})
    result = _finished(client, client.request_measurement("rk1", archive[: len(archive) // 2], "latency", 5))
    assert result["status"] == "failed" and result["error_type"] == "BundleError"
    assert "not a complete uncompressed tar" in result["error"]
    assert list(board.store.scratch.iterdir()) == [] and list(board.store.incoming.iterdir()) == []


def test_archive_that_does_not_hash_to_its_signed_sha256_is_not_measured(broker, make_agent, keys, candidate):
    board = make_agent("rk1", broker.url, profile="rk3588")
    model, x = candidate
    data = pack_measurement(model, {"input": x})
    info = replace(ArchiveInfo.of(data, chunk_size=4096), sha256=hashlib.sha256(b"another archive").hexdigest())
    results: list[dict] = []
    answered = threading.Event()
    server = MqttTransport(broker.url, client_id="test-server")
    try:
        def serve(topic: str, payload: bytes) -> None:
            for index in json.loads(payload)["chunks"]:
                start, end = info.chunk_range(index)
                server.publish(f"{Topics.device_chunks('rk1', 'm1')}/{index}", data[start:end])

        def collect(topic: str, payload: bytes) -> None:
            results.append(parse_result(payload))
            if results[-1]["status"] in ("done", "failed"):
                answered.set()

        server.subscribe(Topics.need("rk1"), serve)
        server.subscribe(Topics.measurements("rk1"), collect)
        server.publish(Topics.cmd("rk1"), sign_measure_command(keys["server"], measurement_id="m1", transfer_id="m1",
                                                               archive=info, mode="latency", runs=5))
        assert answered.wait(30), results
    finally:
        server.close()
    assert [r["status"] for r in results] == ["accepted", "failed"]
    assert results[-1]["error_type"] == "TransferError" and "the signed manifest says" in results[-1]["error"]
    assert list(board.store.scratch.iterdir()) == [] and list(board.store.incoming.iterdir()) == []


def test_unknown_or_offline_device_fails_fast(admin, broker, make_agent, candidate):
    server, client = admin
    model, x = candidate
    with pytest.raises(TransferError, match="no device 'ghost' has reported to this server"):
        measure_on_device(client, "ghost", model, {"input": x}, "latency", timeout_s=5)
    board = make_agent("rk1", broker.url, profile="rk3588")
    _online(server, "rk1")
    board.stop()
    wait_for(lambda: server.db.device("rk1").status == "offline", what="rk1 offline")
    with pytest.raises(TransferError, match="device 'rk1' is offline; start its agent"):
        measure_on_device(client, "rk1", model, {"input": x}, "latency", timeout_s=5)


def test_convert_plans_with_the_figures_a_board_of_the_fleet_measured(admin, broker, make_agent, digits_onnx, digits,
                                                                      tmp_path):
    from edgesdk.converters import ConversionRequest, Data, Output, QuantizationConfig, Source, Target, board_measure, convert
    from edgesdk.runtime.bundle import read_bundle

    server, client = admin
    make_agent("rk1", broker.url, profile="rk3588")
    _online(server, "rk1")
    target = Target("rk3588", measure_on=board_measure(client, "rk1", "latency", runs=20, timeout_s=120))
    report = convert(ConversionRequest(
        Source(digits_onnx), target,
        Data({"input": digits.x_train[:64]}, {"input": digits.x_test[:64]}, labels=digits.y_test[:64]),
        Output(tmp_path / "out"), quantization=QuantizationConfig(calibration_methods=("minmax",))))
    assert len(report.plan.candidates) >= 4
    for c in report.plan.candidates:
        assert c.measurement.measured_on == "rk1", c.name
        assert c.estimate.basis == "measured on board" and c.estimate.latency_ms == c.measurement.latency_p50_ms
    assert report.to_dict()["variants"][0]["measured_on"] == "rk1"
    assert read_bundle(report.bundle.path).manifest.measured["board"]["basis"] == "measured on board"


def test_measure_on_a_device_the_fleet_does_not_have_fails_before_any_work(admin):
    from edgesdk.converters.board.remote import board_measure

    _, client = admin
    with pytest.raises(TransferError, match="not in the fleet.*edgesdk devices"):
        board_measure(client, "no-such-board", "latency")


def test_on_a_root_of_trust_only_the_bundles_threshold_runs_a_model(tmp_path, broker, make_server, make_agent,
                                                                    candidate):
    """The server's commands key signs the measure command; the archive's manifest needs the bundles role too."""
    from edgesdk.fleet import key_ceremony
    from edgesdk.runtime.signing import load_private_key

    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"bundles": 2}, {"bundles": 2})
    commands_key = load_private_key(private["commands"][0])
    bundle_keys = [load_private_key(p) for p in private["bundles"]]
    board = make_agent("rk1", broker.url, server_key=None, root=root_path, profile="rk3588")
    server = make_server(broker.url, signing_key=commands_key)
    _online(server, "rk1")
    model, x = candidate
    before = _tree(board.store.slots)

    def measured(archive: bytes) -> dict:
        mid = server.request_measurement("rk1", archive, "latency", 5, timeout_s=60)
        wait_for(lambda: server.measurement(mid)["status"] in ("done", "failed"), timeout=60, what=mid)
        return server.measurement(mid)

    for signers, valid in (([commands_key], 0), (bundle_keys[:1], 1), ([], None)):
        result = measured(pack_measurement(model, {"input": x}, signers))
        assert result["status"] == "failed" and result["error_type"] == "SignatureError", result
        expected = "is not signed" if valid is None else f"{valid} valid signatures? of the 2 required"
        assert re.search(expected, result["error"]), result["error"]
        assert "figures" not in result  # nothing was measured: the model never ran
        assert list(board.store.scratch.iterdir()) == [] and _tree(board.store.slots) == before
        assert list(board.store.incoming.iterdir()) == []

    result = measured(pack_measurement(model, {"input": x}, bundle_keys))
    assert result["status"] == "done", result
    assert result["figures"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
