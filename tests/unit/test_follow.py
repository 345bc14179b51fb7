"""StoreFollower reports each committed slot of a real store once, by inotify or by polling, never a pending one."""

from __future__ import annotations

import os
import queue
import stat

import pytest

from edgesdk.agent.follow import StoreFollower
from edgesdk.agent.store import ModelStore, PendingInstall, StoreState, committed_slot
from edgesdk.errors import BundleError


@pytest.mark.parametrize("watch", ["inotify", "poll"])
def test_commits_are_followed_and_pending_installs_are_not(tmp_path, watch):
    store = ModelStore(tmp_path / "store")
    store.save_state(StoreState(committed="digits-1.0.0"))
    seen: queue.Queue = queue.Queue()
    follower = StoreFollower(store.root, seen.put, poll_s=0.05, watch=watch)
    assert follower.mode == watch
    follower.start(current=store.slots / "digits-1.0.0")
    try:
        # v2 recorded as pending (current may already point at it): not for the app yet.
        store.save_state(StoreState(committed="digits-1.0.0", pending=PendingInstall("digits-2.0.0", "digits-1.0.0")))
        store.save_state(StoreState(committed="digits-2.0.0"))
        assert seen.get(timeout=10) == store.slots / "digits-2.0.0"
        store.save_state(StoreState(committed="digits-1.0.0"))  # a rollback is a commit too
        assert seen.get(timeout=10) == store.slots / "digits-1.0.0"
    finally:
        follower.stop()
    assert seen.empty(), f"reported more than the two commits: {list(seen.queue)}"


def test_a_failing_callback_keeps_the_follower_alive(tmp_path):
    store = ModelStore(tmp_path / "store")
    calls: list = []

    def switch(slot):
        calls.append(slot)
        if slot.name == "digits-2.0.0":
            raise RuntimeError("health check failed in the app")

    follower = StoreFollower(store.root, switch, watch="poll")
    store.save_state(StoreState(committed="digits-2.0.0"))
    follower.check()
    follower.check()  # not retried for the same slot
    store.save_state(StoreState(committed="digits-3.0.0"))
    follower.check()
    assert [c.name for c in calls] == ["digits-2.0.0", "digits-3.0.0"]


def test_state_and_slots_are_readable_by_others_and_writable_only_by_the_agent(tmp_path):
    store = ModelStore(tmp_path / "store")
    store.save_state(StoreState(committed="x-1"))
    store.add_slot("x-1", lambda d: _tiny_bundle(d))
    for path in (store.root / "state.json", store.slots / "x-1", *(store.slots / "x-1").iterdir()):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode & stat.S_IROTH and not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{path}: {oct(mode)}"


def _tiny_bundle(directory):
    import numpy as np

    from edgesdk.runtime.bundle import BundleSpec
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.testing import random_mlp, write_mlp_onnx

    model = write_mlp_onnx(random_mlp([4, 2]), directory.parent / "tiny.onnx")
    bundle_from_model(directory / "b", model, BundleSpec("x", "1", "onnx-fp32", "generic-x86_64", "latency"),
                      {"input": np.zeros((1, 4), np.float32)})
    for f in (directory / "b").iterdir():
        f.rename(directory / f.name)
    (directory / "b").rmdir()


def test_an_unreadable_state_file_is_a_clear_error(tmp_path):
    assert committed_slot(tmp_path) is None
    (tmp_path / "state.json").write_text("{half")
    with pytest.raises(BundleError, match="state.json cannot be read"):
        committed_slot(tmp_path)
