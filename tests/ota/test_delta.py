"""Only the bytes a device lacks cross the network: a real broker, server and agent, real bundles on disk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.testing import MLPWeights, random_mlp
from tests.ota.conftest import make_bundle, wait_for

#: Its agents run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
ALL_AT_ONCE = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.5,
                            deploy_timeout_s=60)
BACKBONE = random_mlp([64, 1024, 10], seed=5)  # 64x1024 weights: ~260 KB that a head-only update keeps


def _bundle(out: Path, version: str, keys: dict, head_seed: int) -> Path:
    """A signed bundle of BACKBONE's first layer with a head drawn from ``head_seed`` (a retrained last layer)."""
    rng = np.random.default_rng(head_seed)
    head = (rng.standard_normal((1024, 10)) * 0.05).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    return make_bundle(out, version, keys, weights=MLPWeights((BACKBONE.layers[0], head)))


@pytest.fixture(scope="module")
def versions(tmp_path_factory, keys) -> dict[str, Path]:
    """1.0.0; 2.0.0 with a retrained head; 3.0.0 the same model as 2.0.0 under a new version."""
    folder = tmp_path_factory.mktemp("delta")
    return {"1.0.0": _bundle(folder / "v1", "1.0.0", keys, head_seed=1),
            "2.0.0": _bundle(folder / "v2", "2.0.0", keys, head_seed=2),
            "3.0.0": _bundle(folder / "v3", "3.0.0", keys, head_seed=2)}


def _deploy(server, agent, bundle: Path, version: str) -> dict:
    """Roll ``version`` out to the agent's group; the agent's ``downloaded`` event for it."""
    server.upload(pack_bundle(bundle))
    rollout = server.start_rollout("digits", version, agent.config.group, ALL_AT_ONCE)
    wait_for(lambda: server.status(rollout).state != "running", timeout=60, what=f"rollout of {version}")
    assert server.status(rollout).state == "completed", server.status(rollout).reason
    return next(e for e in agent.events if e["event"] == "downloaded" and e["version"] == version)


def _accepted(agent, version: str) -> dict:
    return next(e for e in agent.events if e["event"] == "accepted" and e["version"] == version)


def _new_chunks(server, version: str, held: str) -> tuple[int, int]:
    """How many chunks of ``version``'s archive ``held``'s archive lacks, and their bytes (from the repository)."""
    table, old = server.repo.chunk_table("digits", version), set(server.repo.chunk_table("digits", held).chunks)
    new = [i for i, digest in enumerate(table.chunks) if digest not in old]
    return len(new), sum(table.sizes[i] for i in new)


def test_a_head_only_update_fetches_only_the_chunks_that_changed(broker, make_server, make_agent, versions):
    server = make_server(broker.url, broadcast_wait_s=0.3)
    agent = make_agent("cam1", broker.url)
    wait_for(lambda: server.db.device("cam1"), what="cam1 online")
    first = _deploy(server, agent, versions["1.0.0"], "1.0.0")
    assert first["local_chunks"] == 0
    wait_for(lambda: "digits-1.0.0" in server.db.slots(["cam1"], column="chunk_slots").get("cam1", ()),
             what="cam1 reporting the chunks it holds")
    received = agent.bytes_received
    second = _deploy(server, agent, versions["2.0.0"], "2.0.0")
    new_chunks, new_bytes = _new_chunks(server, "2.0.0", held="1.0.0")
    table = server.repo.chunk_table("digits", "2.0.0")
    assert 0 < new_chunks < len(table.chunks) and new_bytes < 0.5 * table.size  # the backbone's chunks are shared
    assert second["local_chunks"] == len(table.chunks) - new_chunks
    assert second["local_bytes"] == table.size - new_bytes
    assert 0 < second["fetched_bytes"] <= new_bytes  # the changed chunks, some zstd-compressed
    assert agent.bytes_received - received == second["fetched_bytes"]  # nothing else arrived: no full broadcast
    assert agent.current_version() == ("digits", "2.0.0")


def test_the_same_model_under_a_new_version_sends_almost_nothing(broker, make_server, make_agent, versions):
    server = make_server(broker.url, broadcast_wait_s=0.3)
    agent = make_agent("cam2", broker.url)
    wait_for(lambda: server.db.device("cam2"), what="cam2 online")
    _deploy(server, agent, versions["2.0.0"], "2.0.0")
    wait_for(lambda: server.db.slots(["cam2"], column="chunk_slots").get("cam2"), what="cam2 chunk slots")
    received = agent.bytes_received
    again = _deploy(server, agent, versions["3.0.0"], "3.0.0")
    # The manifest (name, version, signature) differs; the model's bytes come from the device's own slot.
    assert again["fetched_bytes"] <= 0.02 * again["bytes"]
    assert agent.bytes_received - received == again["fetched_bytes"]
    assert agent.current_version() == ("digits", "3.0.0")


def test_a_corrupted_local_chunk_is_detected_and_fetched(broker, make_server, make_agent, versions, keys, tmp_path):
    server = make_server(broker.url, broadcast_wait_s=0.3)
    agent = make_agent("cam3", broker.url)
    wait_for(lambda: server.db.device("cam3"), what="cam3 online")
    _deploy(server, agent, versions["1.0.0"], "1.0.0")
    _deploy(server, agent, versions["2.0.0"], "2.0.0")
    wait_for(lambda: len(server.db.slots(["cam3"], column="chunk_slots").get("cam3", ())) == 2,
             what="cam3 reporting both slots' chunks")
    # Damage the head of 1.0.0's model, in the device's previous slot: only that slot holds those bytes.
    model = agent.store.slots / "digits-1.0.0" / "model.onnx"
    os.chmod(model, 0o644)
    with open(model, "r+b") as f:
        f.seek(model.stat().st_size - 200)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    # 4.0.0 brings 1.0.0's head back: the device holds all of it, one chunk of it damaged.
    done = _deploy(server, agent, _bundle(tmp_path / "v4", "4.0.0", keys, head_seed=1), "4.0.0")
    accepted = _accepted(agent, "4.0.0")
    table = server.repo.chunk_table("digits", "4.0.0")
    held = set(server.repo.chunk_table("digits", "1.0.0").chunks) | set(server.repo.chunk_table("digits", "2.0.0").chunks)
    lacking = sum(digest not in held for digest in table.chunks)  # the manifest and signature of 4.0.0
    assert accepted["local_corrupt"] == 1 and accepted["missing"] == lacking + 1
    # The server counted on the device's copy, so it broadcast nothing: the device asked for that chunk at once.
    assert [len(chunks) for (device, transfer), chunks in server.resent.items() if device == "cam3"] == [1]
    assert 0 < done["fetched_bytes"] and done["rejected_chunks"] == 0
    assert agent.current_version() == ("digits", "4.0.0")
