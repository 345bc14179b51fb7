"""The jobs DeviceAgent hands off, each on its own typed inputs: admission, downloads and the measurement service.

No broker here: what would be published is collected from the ``publish`` callables. The agent's own order of
steps over a real mosquitto is in tests/ota/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from edgesdk.agent.admission import AlreadyInstalled, admit, check_still_newer, refused_download
from edgesdk.agent.downloads import Downloads, broadcast_plan
from edgesdk.agent.local_chunks import LocalChunks
from edgesdk.agent.measurements import MeasurementService
from edgesdk.agent.storage_guard import StorageGuard
from edgesdk.agent.store import ModelStore, StoreState
from edgesdk.errors import ConflictError
from edgesdk.fleet.measurement import pack_measurement
from edgesdk.fleet.protocol import ArchiveInfo, Command, MeasureCommand, parse_command, sign_command, sign_measure_command
from edgesdk.fleet.records import AgentEvent
from edgesdk.runtime.profiles import load_profile
from edgesdk.runtime.signing import KeySet, generate_keypair, load_private_key, load_public_key
from edgesdk.testing import random_mlp, write_mlp_onnx


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agent-parts-keys")
    generate_keypair(folder, "server")
    return load_private_key(folder / "server.key"), load_public_key(folder / "server.pub")


def deploy(keys, version: str = "2.0.0", deployment: str = "d2", rollback: bool = False, size: int = 10_000,
           broadcast: frozenset[int] | None = None, reverts: str | None = None) -> Command:
    archive = ArchiveInfo.of(os.urandom(size), chunk_size=4096)
    envelope = sign_command(keys[0], type="rollback" if rollback else "deploy", deployment_id=deployment,
                            transfer_id=f"t-{deployment}", name="digits", version=version, group="cams",
                            rollback=rollback, archive=archive, broadcast=broadcast, reverts=reverts)
    command = parse_command(envelope, keys[1])
    assert isinstance(command, Command)
    return command


# admission ---------------------------------------------------------------------------------------------------

def test_a_new_deployment_of_a_newer_version_goes_ahead_and_is_remembered(keys):
    verdict = admit(deploy(keys), StoreState(), ("digits", "1.0.0"), "digits-1.0.0", in_flight=False, resume=False)
    assert verdict.proceed and verdict.remember and verdict.event is None


def test_a_replayed_deployment_is_refused_naming_it(keys):
    verdict = admit(deploy(keys), StoreState(seen=["d2"]), ("digits", "1.0.0"), "digits-1.0.0", in_flight=False,
                    resume=False)
    assert not verdict.proceed and not verdict.remember
    assert verdict.event == AgentEvent.REJECTED
    assert verdict.details == {"reason": "replayed command: deployment d2 was already handled"}


def test_a_resent_deployment_whose_transfer_runs_is_ignored_silently(keys):
    verdict = admit(deploy(keys), StoreState(seen=["d2"]), None, None, in_flight=True, resume=False)
    assert not verdict.proceed and verdict.event is None


def test_a_resent_deployment_already_committed_reports_committed_again(keys):
    state = StoreState(seen=["d2"], committed="digits-2.0.0")
    verdict = admit(deploy(keys), state, ("digits", "2.0.0"), "digits-2.0.0", in_flight=False, resume=False)
    assert not verdict.proceed and verdict.event == AgentEvent.COMMITTED and verdict.details == {"repeated": True}


def test_a_restarted_agent_takes_up_a_deployment_it_had_seen(keys):
    verdict = admit(deploy(keys), StoreState(seen=["d2"]), ("digits", "1.0.0"), "digits-1.0.0", in_flight=False,
                    resume=True)
    assert verdict.proceed


@pytest.mark.parametrize("installed", ["2.0.1", "3.1.0"])
def test_a_downgrade_is_refused_and_remembered_unless_it_is_a_signed_rollback(keys, installed):
    verdict = admit(deploy(keys), StoreState(), ("digits", installed), f"digits-{installed}", in_flight=False,
                    resume=False)
    assert not verdict.proceed and verdict.remember and verdict.event == AgentEvent.REJECTED
    assert verdict.details["reason"] == (f"refused downgrade: digits 2.0.0 <= installed {installed}; only a signed "
                                         "rollback may go back")
    rollback = admit(deploy(keys, rollback=True), StoreState(), ("digits", installed), f"digits-{installed}",
                     in_flight=False, resume=False, held=True)
    assert rollback.proceed


def test_a_rollback_to_a_version_this_device_does_not_hold_fails_naming_it(keys):
    verdict = admit(deploy(keys, rollback=True), StoreState(), ("digits", "3.0.0"), "digits-3.0.0", in_flight=False,
                    resume=False, held=False)
    assert not verdict.proceed and verdict.remember and verdict.event == AgentEvent.FAILED
    assert verdict.details == {"reason": "rollback target digits-2.0.0 is not in this device's store"}


def test_a_revert_that_arrives_after_a_later_rollout_moved_the_device_on_is_refused(keys):
    """Seen in the 10,000-device chaos run: 5.0.0's revert to 2.0.0 reached devices that had installed 6.0.0 since,
    and took 1,442 of them back two versions."""
    revert = deploy(keys, version="2.0.0", deployment="r5-rollback", rollback=True, reverts="5.0.0")
    assert revert.reverts == "5.0.0"
    applies = admit(revert, StoreState(), ("digits", "5.0.0"), "digits-5.0.0", in_flight=False, resume=False,
                    held=True)
    assert applies.proceed
    moved_on = admit(revert, StoreState(), ("digits", "6.0.0"), "digits-6.0.0", in_flight=False, resume=False,
                     held=True)
    assert not moved_on.proceed and moved_on.remember and moved_on.event == AgentEvent.REJECTED
    assert moved_on.details == {"reason": "superseded: this revert undoes digits 5.0.0, and the device runs 6.0.0 "
                                          "(a later rollout moved it on)"}
    with pytest.raises(ConflictError, match="superseded"):  # its archive finished downloading after the move
        check_still_newer(revert, ("digits", "6.0.0"))
    check_still_newer(revert, ("digits", "5.0.0"))


def test_a_malformed_reverts_field_is_refused(keys):
    from edgesdk.errors import BundleError

    envelope = sign_command(keys[0], type="rollback", deployment_id="r5-rollback", transfer_id="t", name="digits",
                            version="2.0.0", group="cams", rollback=True, reverts="five")
    with pytest.raises(BundleError, match="'five' must be dotted integers"):  # as a malformed version is
        parse_command(envelope, keys[1])


def test_another_models_version_is_no_downgrade(keys):
    assert admit(deploy(keys), StoreState(), ("faces", "9.0.0"), "faces-9.0.0", in_flight=False, resume=False).proceed


# downloads ---------------------------------------------------------------------------------------------------

def test_chunks_are_routed_to_their_transfer_and_the_last_one_completes_it(tmp_path, keys):
    data = os.urandom(10_000)
    archive = ArchiveInfo.of(data, chunk_size=4096)
    command = parse_command(sign_command(keys[0], type="deploy", deployment_id="d3", transfer_id="t3", name="digits",
                                         version="3.0.0", group="cams", archive=archive), keys[1])
    assert isinstance(command, Command)
    downloads = Downloads(lambda payload: None)
    store = ModelStore(tmp_path / "store")
    transfer = downloads.begin(store.incoming, LocalChunks(store.root), command)
    pieces = [data[slice(*archive.chunk_range(i))] for i in range(len(archive.chunks))]
    assert downloads.accept_chunk("edgesdk/groups/cams/chunks/unknown/0", pieces[0]) is None
    assert downloads.accept_chunk("edgesdk/groups/cams/chunks/t3/0", b"tampered") is None
    for i, piece in enumerate(pieces[:-1]):
        assert downloads.accept_chunk(f"edgesdk/groups/cams/chunks/t3/{i}", piece) is None
    assert downloads.accept_chunk(f"edgesdk/groups/cams/chunks/t3/{len(pieces) - 1}", pieces[-1]) == "t3"
    assert transfer.finish().read_bytes() == data
    assert downloads.pop("t3") is transfer and downloads.get("t3") is None
    transfer.discard()


def test_requests_ask_for_a_window_of_missing_chunks_and_leave_out_the_broadcast(tmp_path, keys):
    asked: list[dict] = []
    downloads = Downloads(lambda payload: asked.append(json.loads(payload)), request_window=2, retry_interval_s=0,
                          broadcast_wait_s=60)
    command = deploy(keys, size=40_000, broadcast=frozenset({0, 1}))
    store = ModelStore(tmp_path / "store")
    transfer = downloads.begin(store.incoming, LocalChunks(store.root), command)
    count = len(command.archive.chunks)
    assert count > 4 and broadcast_plan(command) == {0, 1}
    downloads.request_first(transfer, resume=False)
    assert asked[-1] == {"transfer_id": command.transfer_id, "chunks": [2, 3]}
    downloads.request_missing()  # still within the broadcast wait: the broadcast brings 0 and 1
    assert asked[-1]["chunks"] == [2, 3]
    downloads.broadcast_wait_s = 0
    downloads.request_missing()  # the wait is over: everything missing, the window's worth
    assert asked[-1]["chunks"] == [0, 1]
    downloads.request_first(transfer, resume=True)  # a resumed transfer asks for what it lacks
    assert asked[-1]["chunks"] == [0, 1]
    downloads.close()


# the measurement service -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def measure_archive(tmp_path_factory, keys):
    """A measurement archive signed by the server key (which these services pin: no root, so not checked)."""
    folder = tmp_path_factory.mktemp("measure")
    model = write_mlp_onnx(random_mlp([8, 4, 2]), folder / "model.onnx")
    return pack_measurement(model, {"input": np.zeros((4, 8), np.float32)}, [keys[0]])


def measure_command(keys, archive: bytes, mid: str = "m1", sha256: str | None = None) -> MeasureCommand:
    info = ArchiveInfo.of(archive, chunk_size=4096)
    if sha256 is not None:  # a manifest whose chunks are right but whose whole-archive hash is not
        info = dataclasses.replace(info, sha256=sha256)
    envelope = sign_measure_command(keys[0], measurement_id=mid, transfer_id=f"t-{mid}", archive=info,
                                    mode="latency", runs=3)
    command = parse_command(envelope, keys[1])
    assert isinstance(command, MeasureCommand)
    return command


class Published:
    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.state_changes = 0

    def __call__(self, payload: bytes) -> None:
        self.messages.append(json.loads(payload))

    def changed(self) -> None:
        self.state_changes += 1

    def wait(self, count: int, timeout_s: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.messages


def service(tmp_path: Path, published: Published, capacity: int | None = None, timeout_s: float = 60,
            bundle_keys=None):
    store = ModelStore(tmp_path / "store")
    if capacity is not None:
        store.disk_usage = lambda: {"free_bytes": capacity, "store_bytes": 0}  # type: ignore[method-assign]
    downloads = Downloads(lambda payload: None)
    return MeasurementService(downloads, StorageGuard(store), load_profile("generic-x86_64"), published,
                              published.changed, timeout_s=timeout_s, bundle_keys=lambda: bundle_keys), downloads, store


def feed(downloads: Downloads, command: MeasureCommand, archive: bytes) -> None:
    for i in range(len(command.archive.chunks)):
        start, end = command.archive.chunk_range(i)
        downloads.accept_chunk(f"edgesdk/devices/cam0/chunks/{command.transfer_id}/{i}", archive[start:end])


def test_a_measurement_is_accepted_once_measured_in_a_child_and_its_scratch_removed(tmp_path, keys, measure_archive):
    published = Published()
    measurements, downloads, store = service(tmp_path, published)
    command = measure_command(keys, measure_archive)
    measurements.accept(command)
    measurements.accept(command)  # re-delivered: taken once
    assert published.messages == [{"measurement_id": "m1", "status": "accepted"}]
    assert (store.scratch / "m1").is_dir()
    feed(downloads, command, measure_archive)
    transfer = downloads.get(command.transfer_id)
    assert transfer is not None and transfer.complete
    measurements.complete(transfer, command)
    done = published.wait(2)[-1]
    assert done["status"] == "done", done
    assert done["figures"]["runs"] == 3 and done["figures"]["latency_p50_ms"] > 0
    assert set(done["outputs"]) == {"probabilities"}
    assert downloads.get(command.transfer_id) is None
    deadline = time.monotonic() + 10
    while (store.scratch / "m1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (store.scratch / "m1").exists()


def test_a_measurement_not_signed_by_the_bundles_keys_fails_before_anything_is_unpacked(tmp_path, keys,
                                                                                      measure_archive):
    """With a root's bundles role to satisfy, the server key's signature (the commands key) is not enough."""
    folder = tmp_path / "bundles"
    generate_keypair(folder, "ci")
    published = Published()
    measurements, downloads, store = service(tmp_path, published, bundle_keys=KeySet.of([load_public_key(
        folder / "ci.pub")]))
    command = measure_command(keys, measure_archive)
    measurements.accept(command)
    feed(downloads, command, measure_archive)
    transfer = downloads.get(command.transfer_id)
    assert transfer is not None and transfer.complete
    measurements.complete(transfer, command)
    failed = published.wait(2)[-1]
    assert failed["status"] == "failed" and failed["error_type"] == "SignatureError", failed
    assert "the measurement archive of model.onnx: 0 valid signatures of the 1 required" in failed["error"]
    deadline = time.monotonic() + 10
    while (store.scratch / "m1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (store.scratch / "m1").exists()


def test_a_measurement_without_room_fails_at_once_with_the_storage_reason(tmp_path, keys, measure_archive):
    published = Published()
    measurements, downloads, store = service(tmp_path, published, capacity=100)
    measurements.accept(measure_command(keys, measure_archive))
    (message,) = published.messages
    assert message["status"] == "failed" and message["error_type"] == "StorageError"
    assert message["error"].startswith("no room for measurement m1: it needs ")
    assert published.state_changes == 1 and downloads.get("t-m1") is None and not (store.scratch / "m1").exists()


def test_a_measurement_whose_archive_hashes_wrong_fails_and_leaves_nothing(tmp_path, keys, measure_archive):
    published = Published()
    measurements, downloads, store = service(tmp_path, published)
    command = measure_command(keys, measure_archive, sha256="0" * 64)
    measurements.accept(command)
    feed(downloads, command, measure_archive)
    transfer = downloads.get(command.transfer_id)
    assert transfer is not None and transfer.complete
    measurements.complete(transfer, command)
    message = published.messages[-1]
    assert message["status"] == "failed" and message["error_type"] == "TransferError"
    assert downloads.get(command.transfer_id) is None and not (store.scratch / "m1").exists()


def test_a_measurement_whose_archive_never_comes_expires_with_the_reason(tmp_path, keys, measure_archive):
    published = Published()
    measurements, downloads, store = service(tmp_path, published, timeout_s=0.01)
    measurements.accept(measure_command(keys, measure_archive))
    time.sleep(0.05)
    measurements.expire()
    message = published.messages[-1]
    assert message == {"measurement_id": "m1", "status": "failed", "error_type": "TransferError",
                       "error": "the archive did not arrive within 0.01 s; is the server still serving it?"}
    assert downloads.get("t-m1") is None and not (store.scratch / "m1").exists()


def test_a_download_that_ends_after_a_newer_install_is_not_installed(keys):
    """An aborted rollout's straggler: 5.0.0 was admitted over 4.0.0, then 6.0.0 installed while it downloaded."""
    straggler = deploy(keys, version="5.0.0")
    check_still_newer(straggler, ("digits", "4.0.0"))  # still newer: goes ahead
    check_still_newer(straggler, ("other", "9.0.0"))  # another model
    check_still_newer(straggler, None)  # nothing installed
    with pytest.raises(ConflictError, match=r"superseded: digits 6.0.0 was installed while 5.0.0 downloaded"):
        check_still_newer(straggler, ("digits", "6.0.0"))
    check_still_newer(deploy(keys, version="5.0.0", rollback=True), ("digits", "6.0.0"))  # a rollback may go back


def test_a_deploy_of_the_version_the_device_runs_is_answered_committed_not_refused(keys):
    """The device caught up on its group's release (a late target) while the operator pushed that version again: the
    second deployment finds the device where it wants it, on arrival or when its download ends (Mender's
    already-installed), and the rollout must not count a failure."""
    verdict = admit(deploy(keys), StoreState(), ("digits", "2.0.0"), "digits-2.0.0", in_flight=False, resume=False)
    assert not verdict.proceed and verdict.remember
    assert (verdict.event, dict(verdict.details)) == (AgentEvent.COMMITTED, {"already_installed": True})
    with pytest.raises(AlreadyInstalled) as raised:
        check_still_newer(deploy(keys), ("digits", "2.0.0"))
    assert refused_download(raised.value) == (AgentEvent.COMMITTED, {"already_installed": True})
    with pytest.raises(ConflictError) as superseded:
        check_still_newer(deploy(keys), ("digits", "3.0.0"))
    assert refused_download(superseded.value) == (
        AgentEvent.FAILED, {"reason": "bundle rejected: superseded: digits 3.0.0 was installed while 2.0.0 downloaded; "
                                      "not installing an older version"})
    # A rollback to the running version is not a plain deploy: its own rules apply, as before.
    assert admit(deploy(keys, rollback=True), StoreState(), ("digits", "2.0.0"), "digits-2.0.0", in_flight=False,
                 resume=False, held=True).proceed
