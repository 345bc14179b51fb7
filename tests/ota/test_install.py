"""The install transaction without a broker: real signed bundles, a real store on disk, real ONNX Runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgesdk.agent import Installer, ManagedRuntime, ModelStore, PendingInstall
from edgesdk.agent import install as install_module
from tests.ota.conftest import make_bundle

V1, V2, BAD = "digits-1.0.0", "digits-2.0.0", "digits-3.0.0"


@pytest.fixture(scope="module")
def slots(tmp_path_factory, keys) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("install")
    return {V1: make_bundle(folder / "v1", "1.0.0", keys, seed=1), V2: make_bundle(folder / "v2", "2.0.0", keys, seed=2),
            BAD: make_bundle(folder / "v3", "3.0.0", keys, seed=3, wrong_health_output=True)}


@pytest.fixture
def store(tmp_path, slots) -> ModelStore:
    """A device store holding all three slots, none installed yet."""
    store = ModelStore(tmp_path / "store")
    for slot, bundle in slots.items():
        store.add_slot(slot, lambda tmp, b=bundle: shutil.copytree(b, tmp, dirs_exist_ok=True))
    return store


@pytest.fixture
def runtime():
    with ManagedRuntime(profile="generic-x86_64") as managed:
        yield managed


class Crash(BaseException):
    """Stands in for the process dying at a failpoint (os._exit in production)."""


def crash_at(monkeypatch, where: str) -> None:
    def failpoint(name: str, count: int | None = None) -> None:
        if name == where:
            raise Crash(name)

    monkeypatch.setattr(install_module, "failpoint", failpoint)


def test_install_commits_and_remembers_the_previous_slot(store, runtime):
    installer = Installer(store, runtime)
    first = installer.install(V1, deployment_id="d1", name="digits", version="1.0.0", verify=True)
    assert first.event == "committed" and first.install == PendingInstall(V1, None, "d1", "digits", "1.0.0")
    assert first.details["apply_ms"] > 0 and first.details["health"]["max_abs_error"] <= 1e-4
    second = installer.install(V2, deployment_id="d2", name="digits", version="2.0.0")
    assert second.event == "committed" and second.install.previous == V1
    assert store.pointer("current") == V2 and store.pointer("previous") == V1
    state = store.load_state()
    assert state.committed == V2 and state.pending is None
    assert runtime.bundle is not None and runtime.bundle.manifest.version == "2.0.0"


def test_install_without_a_managed_runtime_health_checks_on_its_own(store):
    outcome = Installer(store).install(V1)
    assert outcome.event == "committed" and store.load_state().committed == V1


def test_a_failed_health_check_points_current_back(store, runtime):
    installer = Installer(store, runtime)
    assert installer.install(V1).event == "committed"
    outcome = installer.install(BAD, deployment_id="d3", name="digits", version="3.0.0")
    assert outcome.event == "rolled_back" and outcome.details["restored"] == V1
    assert outcome.details["reason"].startswith("HealthCheckError: health check: output 'probabilities' differs")
    assert store.pointer("current") == V1
    state = store.load_state()
    assert state.committed == V1 and state.pending is None
    assert runtime.bundle is not None and runtime.bundle.manifest.version == "1.0.0", "the app lost its model"


def test_a_slot_that_does_not_verify_fails_before_anything_is_recorded(store):
    installer = Installer(store)
    assert installer.install(V1).event == "committed"
    model = next(p for p in (store.slots / V2).iterdir() if p.suffix == ".onnx")
    model.write_bytes(model.read_bytes()[:-1] + b"\0")
    outcome = installer.install(V2)
    assert outcome.event == "failed" and outcome.details["reason"].startswith(f"slot {V2} does not verify")
    assert store.pointer("current") == V1 and store.load_state().pending is None


def test_crash_between_recording_and_switching_is_recovered(store, monkeypatch):
    assert Installer(store).install(V1).event == "committed"
    crash_at(monkeypatch, "before_switch")
    with pytest.raises(Crash):
        Installer(store).install(V2, deployment_id="d2", name="digits", version="2.0.0")
    assert store.pointer("current") == V1
    assert store.load_state().pending == PendingInstall(V2, V1, "d2", "digits", "2.0.0")
    monkeypatch.undo()
    # A restarted agent: a new store object and installer over the same directory.
    restarted = ModelStore(store.root)
    with ManagedRuntime(profile="generic-x86_64") as runtime:
        installer = Installer(restarted, runtime)
        resume = installer.recover()
        assert resume is not None and resume.slot == V2 and resume.deployment_id == "d2"
        assert restarted.pointer("current") == V1 and runtime.bundle.manifest.version == "1.0.0"  # serving meanwhile
        outcome = installer.activate(resume)
        assert outcome.event == "committed" and runtime.bundle.manifest.version == "2.0.0"
    state = restarted.load_state()
    assert restarted.pointer("current") == V2 and state.committed == V2 and state.pending is None


def test_crash_after_switching_serves_the_previous_slot_until_checked_again(store, monkeypatch):
    assert Installer(store).install(V1).event == "committed"
    crash_at(monkeypatch, "after_switch")
    with pytest.raises(Crash):
        Installer(store).install(BAD)
    assert store.pointer("current") == BAD, "the crash came after the switch"
    monkeypatch.undo()
    installer = Installer(ModelStore(store.root))
    resume = installer.recover()
    assert resume is not None and store.pointer("current") == V1
    assert installer.activate(resume).event == "rolled_back"
    assert store.pointer("current") == V1 and store.load_state().committed == V1


def test_a_pending_install_whose_slot_never_got_a_name_is_dropped(store):
    assert Installer(store).install(V1).event == "committed"
    state = store.load_state()
    state.pending = PendingInstall("digits-9.0.0", V1)
    store.save_state(state)
    assert Installer(store).recover() is None
    assert store.pointer("current") == V1 and store.load_state().pending is None


def test_a_state_file_of_the_previous_agent_still_loads(store):
    """Before PendingInstall, the agent wrote the pending install as a plain JSON object; a device upgraded
    between recording and committing must still finish that install."""
    assert Installer(store).install(V1).event == "committed"
    (store.root / "state.json").write_text(json.dumps({
        "committed": V1, "seen": ["d1", "d2"],
        "pending": {"slot": V2, "previous": V1, "deployment_id": "d2", "name": "digits", "version": "2.0.0"}}))
    state = store.load_state()
    assert state.pending == PendingInstall(V2, V1, "d2", "digits", "2.0.0") and state.seen == ["d1", "d2"]
    store.save_state(state)
    assert json.loads((store.root / "state.json").read_text())["pending"] == {
        "slot": V2, "previous": V1, "deployment_id": "d2", "name": "digits", "version": "2.0.0", "judge_s": None}
    installer = Installer(store)
    resume = installer.recover()
    assert resume == state.pending and installer.activate(resume).event == "committed"
    assert store.pointer("current") == V2
