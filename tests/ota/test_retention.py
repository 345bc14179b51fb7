"""Slot retention and the disk check on a real agent, against a real mosquitto and OTA server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgesdk.agent.store import SLOT_SIDECARS
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from tests.ota.conftest import make_bundle, wait_for

FAST = RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0)
UPDATES = 10


@pytest.fixture(scope="module")
def versions(tmp_path_factory, keys) -> dict[str, Path]:
    """Ten signed bundles of the same small model, versions 1.0.0 .. 10.0.0."""
    folder = tmp_path_factory.mktemp("retention-bundles")
    return {f"{i}.0.0": make_bundle(folder / f"v{i}", f"{i}.0.0", keys, seed=i) for i in range(1, UPDATES + 1)}


def _rollout(server, version: str):
    rollout = server.start_rollout("digits", version, "cams", FAST)
    wait_for(lambda: server.status(rollout).state != "running", what=f"rollout {version}")
    return server.status(rollout)


def _bundle_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _slots(agent) -> list[str]:
    return sorted(p.name for p in agent.store.slots.iterdir())


def _state_with_slots(broker_url: str, device: str, slots: list[str]) -> dict:
    """The device's state as published, once it lists ``slots`` (the agent prunes after reporting a commit)."""
    got: list[dict] = []
    reader = MqttTransport(broker_url, client_id="state-reader")
    try:
        reader.subscribe(Topics.state(device), lambda topic, payload: got.append(json.loads(payload)))
        reader.confirm_access()
        wait_for(lambda: got and got[-1]["slots"] == slots, what=f"a state listing {slots}")
    finally:
        reader.close()
    return got[-1]


def test_ten_updates_leave_a_bounded_number_of_slots_and_bytes(broker, make_server, make_agent, versions):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.device("cam0"), what="device")
    largest = max(_bundle_bytes(path) for path in versions.values())
    keep = agent.config.keep_slots
    for version, path in versions.items():
        server.upload(pack_bundle(path))
        assert _rollout(server, version).state == "completed"
        slots = _slots(agent)
        assert len(slots) <= keep + 2, slots
        assert agent.store.disk_usage()["store_bytes"] <= (keep + 2) * largest
    assert agent.current_version() == ("digits", f"{UPDATES}.0.0")
    newest = [f"digits-{i}.0.0" for i in range(UPDATES - keep + 1, UPDATES + 1)]
    state = _state_with_slots(broker.url, "cam0", sorted(newest))
    assert _slots(agent) == sorted(newest) and agent.store.load_state().installed == newest
    assert not list(agent.store.incoming.iterdir())
    for sidecar in SLOT_SIDECARS:  # e.g. chunk layouts: none is left for a deleted slot
        assert {p.stem for p in (agent.store.root / sidecar).glob("*.json")} <= set(newest), sidecar
    assert state["keep_slots"] == keep and state["pinned"] == []
    assert state["disk"]["store_bytes"] <= (keep + 2) * largest and state["disk"]["free_bytes"] > 0


def test_a_pinned_version_outlives_newer_ones(broker, make_server, make_agent, versions):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url, keep_slots=1, pinned=("1.0.0",))
    wait_for(lambda: server.db.device("cam0"), what="device")
    for version in ("1.0.0", "2.0.0", "3.0.0", "4.0.0"):
        server.upload(pack_bundle(versions[version]))
        assert _rollout(server, version).state == "completed"
    kept = ["digits-1.0.0", "digits-3.0.0", "digits-4.0.0"]  # pinned, previous, current
    assert _state_with_slots(broker.url, "cam0", kept)["pinned"] == ["1.0.0"]
    assert _slots(agent) == kept


def test_an_update_that_does_not_fit_is_refused_and_the_old_model_keeps_running(broker, make_server, make_agent,
                                                                                  versions):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.device("cam0"), what="device")
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(versions[version]))
    assert _rollout(server, "1.0.0").state == "completed"
    # Reserve more than the disk has free: no pruning can make room. (Other processes on this host write and
    # delete files meanwhile, so a reserve at the exact boundary would be flaky; tests/unit/test_retention.py
    # checks the boundary itself on a simulated disk.)
    free = shutil.disk_usage(agent.store.root).free
    agent.guard.min_free_bytes = free + 2**30  # as if the agent had started with it
    _state_with_slots(broker.url, "cam0", ["digits-1.0.0"])  # the first install is fully reported

    result = _rollout(server, "2.0.0")

    assert result.state == "aborted"
    (target,) = result.targets
    assert target.status == "failed" and "no room for digits 2.0.0" in target.reason
    (refusal,) = [e for e in agent.events if e["event"] == "failed"]
    assert refusal["error_type"] == "StorageError" and refusal["version"] == "2.0.0"
    _, info = server.repo.archive("digits", "2.0.0")
    assert refusal["needed_bytes"] == 2 * info.size and refusal["reserved_bytes"] == free + 2**30
    assert refusal["reason"].startswith(f"no room for digits 2.0.0: it needs {2 * info.size} bytes (archive and "
                                        f"unpacked slot), the store's disk has {refusal['free_bytes']} bytes free and "
                                        f"{free + 2**30} of them are reserved (min_free_bytes)")
    assert refusal["reason"].endswith("free space on the device or lower min_free_bytes")
    assert not list(agent.store.incoming.iterdir())
    assert _slots(agent) == ["digits-1.0.0"]
    assert agent.current_version() == ("digits", "1.0.0") and agent.store.load_state().committed == "digits-1.0.0"


def test_a_rollback_prunes_too_and_keeps_the_slot_the_device_went_back_to(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url, keep_slots=0)  # only what is in use stays
    wait_for(lambda: server.db.device("cam0"), what="device")
    for version in ("1.0.0", "2.0.0", "3.0.0-bad"):
        server.upload(pack_bundle(bundles[version]))
    for version in ("1.0.0", "2.0.0"):
        assert _rollout(server, version).state == "completed"
    _state_with_slots(broker.url, "cam0", ["digits-1.0.0", "digits-2.0.0"])  # current and previous

    assert _rollout(server, "3.0.0").state == "aborted"  # its health check fails on the device

    assert any(e["event"] == "rolled_back" and e["version"] == "3.0.0" for e in agent.events)
    _state_with_slots(broker.url, "cam0", ["digits-2.0.0"])
    assert _slots(agent) == ["digits-2.0.0"] and agent.current_version() == ("digits", "2.0.0")
