"""Slot retention in the device's model store: what prune() deletes, what it never touches, and disk figures."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgesdk.agent import store as store_module
from edgesdk.agent.config import AgentConfig
from edgesdk.agent.storage_guard import Room, StorageGuard
from edgesdk.agent.store import SLOT_SIDECARS, ModelStore, PendingInstall, StoreState, space_needed
from edgesdk.errors import BundleError, StorageError
from edgesdk.fleet.protocol import ArchiveInfo
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.testing import random_mlp, write_mlp_onnx

VERSIONS = [f"{i}.0.0" for i in range(1, 8)]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """One small unsigned bundle of ``digits`` per version."""
    folder = tmp_path_factory.mktemp("retention")
    model = write_mlp_onnx(random_mlp([8, 4, 2]), folder / "model.onnx")
    sample = {"input": np.zeros((1, 8), np.float32)}
    out = {}
    for version in VERSIONS:
        spec = BundleSpec("digits", version, "onnx-fp32", "generic-x86_64", "latency")
        out[version] = bundle_from_model(folder / version, model, spec, sample).path
    return out


def add(store: ModelStore, bundles: dict[str, Path], version: str) -> str:
    slot = store.slot_name("digits", version)
    store.add_slot(slot, lambda tmp: shutil.copytree(bundles[version], tmp, dirs_exist_ok=True))
    return slot


def names(versions: list[str]) -> list[str]:
    return [f"digits-{v}" for v in versions]


@pytest.fixture
def store(tmp_path, bundles) -> ModelStore:
    """A store that installed versions 1..7 in order, with ``current`` on 7 and ``previous`` on 6."""
    store = ModelStore(tmp_path / "store")
    for version in VERSIONS:
        add(store, bundles, version)
    store.set_pointer("previous", "digits-6.0.0")
    store.set_pointer("current", "digits-7.0.0")
    return store


def present(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.slots.iterdir())


def test_add_slot_records_the_install_order(store):
    assert store.load_state().installed == names(VERSIONS)
    assert store.slot_names() == names(VERSIONS)


def test_prune_keeps_the_newest_n_and_deletes_the_rest_oldest_first(store):
    removed = store.prune(keep_newest=3)
    assert removed == names(VERSIONS[:4])
    assert present(store) == names(VERSIONS[4:])
    assert store.load_state().installed == names(VERSIONS[4:])
    assert store.prune(keep_newest=3) == []


def test_prune_never_touches_current_previous_committed_or_a_pending_install(store):
    # committed on 2 (e.g. a health check pending on 4, which replaces 3), pointers on 7 and 6
    store.save_state(StoreState(committed="digits-2.0.0", pending=PendingInstall("digits-4.0.0", "digits-3.0.0"),
                                installed=store.load_state().installed))
    removed = store.prune(keep_newest=0)
    assert removed == names(["1.0.0", "5.0.0"])
    assert present(store) == names(["2.0.0", "3.0.0", "4.0.0", "6.0.0", "7.0.0"])
    assert store.pointer("current") == "digits-7.0.0" and store.pointer("previous") == "digits-6.0.0"


def test_a_pin_is_a_slot_name_or_a_bare_version(store):
    removed = store.prune(keep_newest=0, pinned=("digits-1.0.0", "3.0.0", "9.9.9"))
    assert removed == names(["2.0.0", "4.0.0", "5.0.0"])
    assert present(store) == names(["1.0.0", "3.0.0", "6.0.0", "7.0.0"])


def test_a_bare_version_pin_matches_any_model_name(tmp_path, bundles):
    store = ModelStore(tmp_path / "store")
    model = write_mlp_onnx(random_mlp([8, 4, 2]), tmp_path / "vibration.onnx")
    vibration = bundle_from_model(tmp_path / "vibration", model, BundleSpec("vibration", "1.0.0", "onnx-fp32",
                                  "generic-x86_64", "latency"), {"input": np.zeros((1, 8), np.float32)}).path
    sources = {"vibration-1.0.0": vibration, "digits-1.0.0": bundles["1.0.0"], "digits-2.0.0": bundles["2.0.0"]}
    for slot, source in sources.items():
        store.add_slot(slot, lambda tmp, src=source: shutil.copytree(src, tmp, dirs_exist_ok=True))
    assert store.prune(keep_newest=0, pinned=("1.0.0",)) == ["digits-2.0.0"]
    assert present(store) == ["digits-1.0.0", "vibration-1.0.0"]


def test_prune_deletes_a_slots_sidecars_and_keeps_those_of_kept_slots(store):
    assert set(SLOT_SIDECARS) >= {"offload", "layouts"}
    for slot in names(["1.0.0", "7.0.0"]):
        store.save_offload_endpoint(slot, {"url": "http://127.0.0.1:1", "model": "digits", "version": slot})
        (store.root / "layouts").mkdir(exist_ok=True)
        (store.root / "layouts" / f"{slot}.json").write_text("{}")
    store.prune(keep_newest=1)
    for sidecar in ("offload", "layouts"):
        assert not (store.root / sidecar / "digits-1.0.0.json").exists()
        assert (store.root / sidecar / "digits-7.0.0.json").exists()


def test_a_store_of_an_older_agent_prunes_its_unrecorded_slots_by_age(store, bundles):
    state = store.load_state()
    state.installed = []  # what an agent before install records wrote
    store.save_state(state)
    # Directory ages unlike the version order: 5 oldest, then 1, 2, 3, 4, 6, 7.
    for age, version in enumerate(["5.0.0", "1.0.0", "2.0.0", "3.0.0", "4.0.0", "6.0.0", "7.0.0"]):
        os.utime(store.slots / f"digits-{version}", (1_000_000 + age, 1_000_000 + age))
    restarted = ModelStore(store.root)
    assert restarted.slot_names() == names(["5.0.0", "1.0.0", "2.0.0", "3.0.0", "4.0.0", "6.0.0", "7.0.0"])
    assert restarted.prune(keep_newest=3) == names(["5.0.0", "1.0.0", "2.0.0", "3.0.0"])


def test_unrecorded_slots_count_as_older_than_recorded_ones(store):
    state = store.load_state()
    state.installed = names(["1.0.0", "2.0.0"])  # the rest predate the record
    store.save_state(state)
    assert store.slot_names()[-2:] == names(["1.0.0", "2.0.0"])
    removed = store.prune(keep_newest=2)
    assert "digits-1.0.0" not in removed and "digits-2.0.0" not in removed
    assert present(store) == names(["1.0.0", "2.0.0", "6.0.0", "7.0.0"])


def test_adding_an_existing_but_unrecorded_slot_records_it(store, bundles):
    state = store.load_state()
    state.installed.remove("digits-3.0.0")  # named just before a crash could record it
    store.save_state(state)
    add(store, bundles, "3.0.0")
    assert store.load_state().installed[-1] == "digits-3.0.0"


class Crash(BaseException):
    """Stands in for the process dying between the rename and the delete."""


def test_a_crash_mid_prune_leaves_a_hidden_leftover_the_next_start_removes(store, monkeypatch):
    def crash(path):
        raise Crash(str(path))

    monkeypatch.setattr(store_module, "fsync_dir", crash)  # called right after the rename
    with pytest.raises(Crash):
        store.prune(keep_newest=6)
    monkeypatch.undo()
    assert "digits-1.0.0" not in store.slot_names(), "a slot is gone at once or not at all"
    assert [p.name for p in store.slots.glob(".*")] == [".pruned-digits-1.0.0"]
    restarted = ModelStore(store.root)
    assert not list(restarted.slots.glob(".*"))
    assert restarted.slot_names() == names(VERSIONS[1:])
    assert restarted.prune(keep_newest=6) == []


def test_disk_usage_counts_the_slots_and_incoming_transfers(store):
    (store.incoming / "t1.part").write_bytes(b"x" * 1000)
    expected = sum(p.stat().st_size for top in (store.slots, store.incoming) for p in top.rglob("*") if p.is_file())
    usage = store.disk_usage()
    assert usage["store_bytes"] == expected and expected > 1000
    assert isinstance(usage["free_bytes"], int) and usage["free_bytes"] > 0
    before = usage["store_bytes"]
    store.prune(keep_newest=2)
    assert store.disk_usage()["store_bytes"] < before


def test_an_update_needs_room_for_its_archive_and_its_unpacked_slot():
    archive = ArchiveInfo.of(b"a" * 5000, chunk_size=1024)
    assert space_needed(archive) == 10_000


def test_a_negative_keep_count_is_refused_with_the_fix(store):
    with pytest.raises(StorageError, match=r"keep_newest=-1 .* pass 0 or more"):
        store.prune(keep_newest=-1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("keep_slots", -1, r"keep_slots=-1 is out of range; pass a whole number of 0 or more"),
    ("min_free_bytes", -5, r"min_free_bytes=-5 is out of range; pass a whole number of 0 or more"),
    ("pinned", "1.2.0", r"pinned='1.2.0' is not a list of slot names or versions; pass e.g."),
    ("pinned", ("",), r"pinned=\(''\,\) is not a list"),
])
def test_the_agent_config_refuses_bad_retention_settings(tmp_path, field, value, message):
    with pytest.raises(StorageError, match=message):
        AgentConfig(device_id="cam0", group="cams", broker="mqtt://127.0.0.1:1", store=tmp_path, **{field: value})


def test_the_agent_config_takes_pins_as_a_tuple(tmp_path):
    config = AgentConfig(device_id="cam0", group="cams", broker="mqtt://127.0.0.1:1", store=tmp_path,
                         pinned=["1.2.0"])  # type: ignore[arg-type]
    assert config.pinned == ("1.2.0",) and config.keep_slots == 3 and config.min_free_bytes == 0


def test_state_json_keeps_the_install_record(store):
    assert json.loads((store.root / "state.json").read_text())["installed"] == names(VERSIONS)


# The storage guard, on a simulated small disk: free space is a fixed capacity minus what the store holds
# (this host's own free space moves under other writers, so the exact boundary is tested here).

def small_disk(store: ModelStore, capacity: int) -> ModelStore:
    real = store.disk_usage
    store.disk_usage = lambda: {"free_bytes": capacity - real()["store_bytes"],  # type: ignore[method-assign]
                                "store_bytes": real()["store_bytes"]}
    return store


def archive_of(size: int) -> ArchiveInfo:
    return ArchiveInfo.of(os.urandom(size), chunk_size=4096)


def test_an_update_that_fits_exactly_is_taken_without_pruning(store):
    guard = StorageGuard(small_disk(store, store.disk_usage()["store_bytes"] + 20_000 + 500), min_free_bytes=500)
    room = guard.make_room(archive_of(10_000), "digits 9.0.0", "t9")
    assert room.fits and room.pruned == () and room.error is None and room.needed_bytes == 20_000
    assert present(store) == names(VERSIONS)


def test_an_update_that_fits_once_old_slots_go_prunes_down_to_the_protected_ones(store):
    guard = StorageGuard(small_disk(store, store.disk_usage()["store_bytes"] + 20_000 - 1))
    room = guard.make_room(archive_of(10_000), "digits 9.0.0", "t9")
    assert room.fits and room.error is None
    assert room.pruned == tuple(names(VERSIONS[:5]))
    assert present(store) == names(["6.0.0", "7.0.0"])


def test_the_guard_never_prunes_a_pinned_slot_to_make_room(store):
    guard = StorageGuard(small_disk(store, store.disk_usage()["store_bytes"] + 20_000 - 1), pinned=("2.0.0",))
    assert guard.make_room(archive_of(10_000), "digits 9.0.0", "t9").fits
    assert present(store) == names(["2.0.0", "6.0.0", "7.0.0"])


def test_an_update_that_cannot_fit_is_refused_with_the_figures_and_its_partial_files_go(store):
    (store.incoming / "t9.part").write_bytes(b"x" * 100)
    (store.incoming / "t9.cmd").write_bytes(b"{}")
    capacity = store.disk_usage()["store_bytes"] + 200_000
    guard = StorageGuard(small_disk(store, capacity), min_free_bytes=200_000)
    room = guard.make_room(archive_of(10_000), "digits 9.0.0", "t9")
    # Measured after pruning to current and previous, while the 102 bytes of partial files were still there.
    free = capacity - store.disk_usage()["store_bytes"] - 102
    assert not room.fits and (room.needed_bytes, room.free_bytes, room.reserved_bytes) == (20_000, free, 200_000)
    assert isinstance(room.error, StorageError) and str(room.error) == (
        f"no room for digits 9.0.0: it needs 20000 bytes (archive and unpacked slot), the store's disk has {free} bytes "
        "free and 200000 of them are reserved (min_free_bytes), after pruning every slot not in use or pinned; free "
        "space on the device or lower min_free_bytes")
    assert present(store) == names(["6.0.0", "7.0.0"]) and not list(store.incoming.iterdir())


def test_a_command_without_an_archive_always_fits(store):
    assert StorageGuard(small_disk(store, 0)).make_room(None, "a rollback", "t0") == Room(fits=True)


def test_a_prune_that_fails_is_logged_and_leaves_the_slots(store, monkeypatch, caplog):
    def refuse(*args):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(store, "prune", refuse)
    assert StorageGuard(store, label="cam0").prune(0) == ()
    assert "cam0: pruning old slots failed: read-only file system" in caplog.text
    assert present(store) == names(VERSIONS)


# The agent reports the guard's refusal as a FAILED event (never started: events land in agent.events).

@pytest.fixture(scope="module")
def server_key(tmp_path_factory):
    from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key

    folder = tmp_path_factory.mktemp("retention-keys")
    generate_keypair(folder, "server")
    return load_private_key(folder / "server.key"), load_public_key(folder / "server.pub")


def deploy_command(server_key, size: int):
    from edgesdk.fleet.protocol import parse_command, sign_command

    envelope = sign_command(server_key[0], type="deploy", deployment_id="d9", transfer_id="t9", name="digits",
                            version="9.0.0", group="cams", archive=archive_of(size))
    return parse_command(envelope, server_key[1])


def test_the_agent_reports_an_update_that_cannot_fit_with_the_figures_and_the_fix(store, server_key):
    from edgesdk.agent.agent import DeviceAgent

    command = deploy_command(server_key, 10_000)
    store.save_offload_endpoint("digits-9.0.0", {"url": "http://127.0.0.1:1", "model": "digits", "version": "9.0.0"})
    config = AgentConfig(device_id="cam0", group="cams", broker="mqtt://127.0.0.1:1", store=store.root,
                         server_key=server_key[1], profile="generic-x86_64", min_free_bytes=200_000)
    agent = DeviceAgent(config)
    capacity = store.disk_usage()["store_bytes"] + 200_000
    small_disk(agent.store, capacity)
    assert not agent._fits(command)
    (event,) = agent.events
    free = capacity - store.disk_usage()["store_bytes"]
    assert event["event"] == "failed" and event["error_type"] == "StorageError"
    assert event["reason"].startswith("no room for digits 9.0.0: it needs 20000 bytes") and "lower min_free_bytes" in \
        event["reason"]
    assert (event["needed_bytes"], event["free_bytes"], event["reserved_bytes"]) == (20_000, free, 200_000)
    assert not (store.root / "offload" / "digits-9.0.0.json").exists()


def test_a_slot_refuses_a_bundle_of_another_model_or_version(tmp_path, bundles):
    store = ModelStore(tmp_path / "store")
    with pytest.raises(BundleError, match=r"the archive for digits-3.0.0 holds digits 1.0.0: .* \(mix-and-match\)"):
        store.add_slot("digits-3.0.0", lambda tmp: shutil.copytree(bundles["1.0.0"], tmp, dirs_exist_ok=True))
    assert not (store.slots / "digits-3.0.0").exists() and not list(store.slots.iterdir())
