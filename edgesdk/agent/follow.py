"""Follow an agent's store from another process: the app runs what the agent committed.

On a real device the agent runs as a service (``examples/systemd/edgesdk-agent.service``)
and the app is a separate process. :class:`StoreFollower` watches the store's ``state.json``
(inotify where the kernel has it, a cheap ``stat`` poll otherwise) and calls back with the
committed slot whenever it changes. Only committed versions are followed: the agent points
``current`` at a new slot *before* its health check, but records it as committed only after,
so a version that fails its check on the device is never loaded by the app, and a rollback
is followed like any other commit. :meth:`edgesdk.ManagedRuntime.follow` builds on it
(:func:`follow_store`), and hands what the app serves to the agent
(:class:`edgesdk.agent.app_stats.AppExporter`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.store import STATE_FILE, committed_slot

if TYPE_CHECKING:
    from edgesdk.agent.managed import ManagedRuntime
    from edgesdk.offload.policy import OffloadPolicy

__all__ = ["StoreFollower", "follow_store"]

log = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE, _IN_NONBLOCK, _IN_CLOEXEC = 0x8, 0x80, 0x100, 0o4000, 0o2000000


class _Inotify:
    """A watch on one directory through libc's inotify; ``wait`` returns when an entry named ``name`` changed."""

    def __init__(self, directory: Path, name: str) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(self._fd, str(directory).encode(), _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE) < 0:
            errno = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(errno, f"inotify_add_watch({directory}) failed")
        self._name = name.encode()

    def wait(self, timeout: float) -> bool:
        """Whether ``name`` changed within ``timeout`` seconds (other entries' events are read and dropped)."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return False
        data = os.read(self._fd, 64 * 1024)
        offset, hit = 0, False
        while offset + 16 <= len(data):
            _, _, _, length = struct.unpack_from("iIII", data, offset)
            hit = hit or data[offset + 16:offset + 16 + length].rstrip(b"\0") == self._name
            offset += 16 + length
        return hit

    def close(self) -> None:
        """Drop the watch."""
        os.close(self._fd)


class StoreFollower:
    """Calls ``on_commit(slot_dir)`` in a background thread each time the store commits another slot.

    ``watch`` is ``"auto"`` (inotify, else polling), ``"inotify"`` or ``"poll"``; polling stats
    ``state.json`` every ``poll_s`` seconds, and with inotify the same interval is a safety net.
    A callback that raises is logged and not retried for that slot (the next commit is followed).
    """

    def __init__(self, store: str | os.PathLike[str], on_commit: Callable[[Path], object], poll_s: float = 1.0,
                 watch: str = "auto") -> None:
        if watch not in ("auto", "inotify", "poll"):
            raise ValueError(f"watch={watch!r}: use auto, inotify or poll")
        self.store = Path(store)
        self._on_commit, self.poll_s = on_commit, poll_s
        self._inotify: _Inotify | None = None
        if watch != "poll":
            try:
                self._inotify = _Inotify(self.store, STATE_FILE)
            except (OSError, AttributeError) as exc:  # no inotify (not Linux, limits reached)
                if watch == "inotify":
                    raise
                log.info("following %s by polling every %g s (no inotify: %s)", self.store, poll_s, exc)
        #: How changes are noticed: "inotify" or "poll".
        self.mode = "inotify" if self._inotify else "poll"
        self.followed: Path | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-follower", daemon=True)

    def start(self, current: Path | None = None) -> StoreFollower:
        """Start watching; ``current`` is the slot the app already runs (not reported again)."""
        self.followed = current
        self._thread.start()
        return self

    def check(self) -> Path | None:
        """Look now: report a newly committed slot to the callback; returns the slot followed."""
        try:
            slot = committed_slot(self.store)
        except Exception as exc:  # noqa: BLE001 (a half-set-up store: try again on the next change)
            log.warning("cannot read %s: %s", self.store, exc)
            return self.followed
        if slot is not None and slot != self.followed:
            self.followed = slot
            try:
                self._on_commit(slot)
            except Exception as exc:  # noqa: BLE001 (the app keeps serving its model; the next commit is followed)
                log.warning("could not switch to %s: %s", slot.name, exc)
        return self.followed

    def _run(self) -> None:
        self.check()
        while not self._stop.is_set():
            if self._inotify is not None:
                self._inotify.wait(self.poll_s)
            else:
                self._stop.wait(self.poll_s)
            if not self._stop.is_set():
                self.check()

    def stop(self) -> None:
        """Stop watching and wait for the thread (a callback in progress finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None


def follow_store(cls: type[ManagedRuntime], store: str | os.PathLike[str], poll_s: float,
                 watch: str, app: str | None, offload: OffloadPolicy | None = None,
                 **options: Any) -> ManagedRuntime:
    """What :meth:`edgesdk.ManagedRuntime.follow` does: a ``cls`` on the store's committed slot,
    a :class:`StoreFollower` that swaps it on each commit, and the exporter of its traffic."""
    from edgesdk.agent.app_stats import AppExporter
    from edgesdk.fleet.protocol import check_id

    if app is not None:
        check_id(app, "app name")  # before loading anything
    slot = committed_slot(store)
    from_store = offload is None
    if from_store and slot is not None:
        offload = _store_policy(store, slot.name, None)
    managed = cls(slot, offload=offload, **options)

    def switch(slot_dir: Path) -> None:
        managed.swap(slot_dir)
        if from_store and managed.offload is not None:
            policy = _store_policy(store, slot_dir.name, managed.offload)
            if policy is not None:
                managed._model_changed(policy)

    try:
        managed.exporter = AppExporter(managed, store, app).start()
        follower = StoreFollower(store, switch, poll_s=poll_s, watch=watch)
        managed.follower = follower.start(current=slot)
    except BaseException:
        managed.close()
        raise
    return managed


def _store_policy(store: str | os.PathLike[str], slot: str,
                  base: OffloadPolicy | None) -> OffloadPolicy | None:
    """The offload policy for the endpoint the server named for ``slot`` (None when it named none).

    ``base`` gives the tuning (SLO, queues, timeouts) of a policy already in use; the endpoint's
    URL, model and version replace its own.
    """
    from dataclasses import replace

    from edgesdk.agent.store import offload_endpoint
    from edgesdk.offload.policy import OffloadPolicy

    endpoint = offload_endpoint(store, slot)
    if endpoint is None:
        return None
    url, model, version = endpoint["url"], endpoint["model"], endpoint["version"]
    if base is None:
        return OffloadPolicy(url=url, model=model, version=version)
    return replace(base, url=url, model=model, version=version)
