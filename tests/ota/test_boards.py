"""Releases with an artifact per board: each device gets its board's bundle, and never another board's."""

from __future__ import annotations

import shutil

import pytest

from edgesdk.errors import ConflictError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import TargetStatus
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.runtime.bundle import read_bundle
from edgesdk.testing import random_mlp
from tests.ota.conftest import FAST, make_bundle, rollout_to, wait_for


def _installed_profile(agent) -> str | None:
    """The target profile of the bundle the agent's ``current`` slot holds (what it really installed)."""
    slot = agent.store.pointer("current")
    return None if slot is None else read_bundle(agent.store.slots / slot).manifest.target_profile


@pytest.fixture(scope="module")
def two_boards(tmp_path_factory, keys):
    """digits 2.0.0 converted twice from the same model: for generic-x86_64 and for raspberry-pi-5."""
    folder = tmp_path_factory.mktemp("two-boards")
    return {profile: make_bundle(folder / profile, "2.0.0", keys, seed=2, profile=profile)
            for profile in ("generic-x86_64", "raspberry-pi-5")}


def test_a_two_board_release_reaches_each_board_with_its_own_artifact(broker, make_server, make_agent, bundles,
                                                                      two_boards, keys):
    server = make_server(broker.url)
    server.repo.add(bundles["1.0.0"])
    for bundle in two_boards.values():
        server.repo.add(bundle)
    assert server.repo.artifacts("digits", "2.0.0") == ["generic-x86_64", "raspberry-pi-5"]
    agents = {"cam01": make_agent("cam01", broker.url),  # detects this host: generic-x86_64
              "cam02": make_agent("cam02", broker.url, profile="raspberry-pi-5"),
              "cam03": make_agent("cam03", broker.url, profile="jetson-orin-nano")}
    wait_for(lambda: len([d for d in server.db.devices("cams") if d.profile]) == 3, what="three boards reported")
    assert {d.id: (d.profile, d.arch) for d in server.db.devices("cams")} == {
        "cam01": ("generic-x86_64", "x86_64"), "cam02": ("raspberry-pi-5", "aarch64"),
        "cam03": ("jetson-orin-nano", "aarch64")}

    done = rollout_to(server, "2.0.0")

    assert done.state == "completed", done.reason
    by_device = {t.device_id: t for t in done.targets}
    assert (by_device["cam01"].status, by_device["cam01"].artifact) == (TargetStatus.COMMITTED, "generic-x86_64")
    assert (by_device["cam02"].status, by_device["cam02"].artifact) == (TargetStatus.COMMITTED, "raspberry-pi-5")
    assert (by_device["cam03"].status, by_device["cam03"].artifact) == (TargetStatus.NO_ARTIFACT, None)
    # What each device really installed, read from its own store: its board's bundle, or nothing.
    assert _installed_profile(agents["cam01"]) == "generic-x86_64"
    assert _installed_profile(agents["cam02"]) == "raspberry-pi-5"
    assert _installed_profile(agents["cam03"]) is None
    # The group's release per board: which bundle each board gets and how many of its devices run it.
    (group,) = server.groups_status()
    assert sorted((b["profile"], b["artifact"], b["converged"], b["devices"]) for b in group.boards) == [
        ("generic-x86_64", "generic-x86_64", 1, 1), ("jetson-orin-nano", None, 0, 1),
        ("raspberry-pi-5", "raspberry-pi-5", 1, 1)]
    # Issue 60: the Jetson's bundle of 2.0.0 uploaded afterwards reaches the device that had none (it stayed
    # no_artifact for good).
    jetson = make_bundle(two_boards["generic-x86_64"].parent.parent / "jetson", "2.0.0", keys, seed=2,
                         profile="jetson-orin-nano")
    assert server.upload(pack_bundle(jetson))["stored"]
    wait_for(lambda: _installed_profile(agents["cam03"]) == "jetson-orin-nano", timeout=60,
             what="the Jetson's artifact installed")
    def cam03():
        return next(t for t in server.status(done.id).targets if t.device_id == "cam03")

    wait_for(lambda: cam03().status == TargetStatus.COMMITTED, what="its late commit")
    assert cam03().artifact == "jetson-orin-nano" and cam03().late


def test_a_release_with_no_artifact_for_any_board_of_the_group_is_refused_before_anything_is_sent(
        broker, make_server, make_agent, two_boards):
    server = make_server(broker.url)
    server.repo.add(two_boards["raspberry-pi-5"])
    make_agent("cam01", broker.url)
    wait_for(lambda: server.db.devices("cams"), what="cam01 reported")
    with pytest.raises(ConflictError, match=r"artifacts for raspberry-pi-5.*\(generic-x86_64\).*--profile"):
        server.start_rollout("digits", "2.0.0", "cams", FAST)
    assert server.db.rollouts() == []


def test_a_board_bundle_with_other_outputs_cannot_join_a_release(tmp_path, keys, two_boards):
    repo = ModelRepository(tmp_path / "repo", signer_key=keys["converter_pub"])
    repo.add(two_boards["generic-x86_64"])
    wide = make_bundle(tmp_path / "wide", "2.0.0", keys, seed=2, profile="rk3588", width=48)
    assert repo.add(wide)[1] is True  # the same inputs and outputs (another hidden width): it joins the release
    five_classes = make_bundle(tmp_path / "five", "2.0.0", keys, profile="raspberry-pi-4",
                               weights=random_mlp([64, 32, 5], seed=3))

    with pytest.raises(ConflictError, match=r"raspberry-pi-4 cannot join the release.*float32\[\?, 10\] -> "
                                            r"float32\[\?, 5\]"):
        repo.add(five_classes)
    assert repo.artifacts("digits", "2.0.0") == ["generic-x86_64", "rk3588"]


def test_a_repository_of_single_bundle_versions_is_moved_to_artifacts_when_opened(tmp_path, keys, bundles):
    old = tmp_path / "repo" / "digits" / "1.0.0"
    old.parent.mkdir(parents=True)
    shutil.copytree(bundles["1.0.0"], old)

    repo = ModelRepository(tmp_path / "repo", signer_key=keys["converter_pub"])

    assert repo.versions("digits") == ["1.0.0"]
    assert repo.artifacts("digits", "1.0.0") == ["generic-x86_64"]
    assert read_bundle(repo.path("digits", "1.0.0")).manifest.version == "1.0.0"
    assert not list((tmp_path / "repo" / "digits").glob(".*"))  # nothing left aside
