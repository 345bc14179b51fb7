"""How an app in another process hands its traffic to the device agent: a file in the store.

An app that follows the agent's store (:meth:`edgesdk.ManagedRuntime.follow`) has no broker
connection of its own. Its :class:`AppExporter` folds the ManagedRuntime's traffic ledger
(:mod:`edgesdk.agent.traffic_ledger`) about every second and writes it, atomically, to
``STORE/apps/<app>-<pid>.json`` (:mod:`edgesdk.agent.app_file`), which the agent reads when it
reports (:mod:`edgesdk.agent.app_traffic`).

Bounded in size (a file is at most 64 KiB) and in disk writes: a write happens only when
something changed, and at most every ``every_s`` seconds: :data:`SLOW_EVERY_S`, or what the
agent asks in ``STORE/apps/cadence.json`` (``{"every_s": 10, "until": epoch}``) while the device
is being judged in a rollout. The app stats that file once per tick and reads it only when its
modification time changed. Each activation of a model is written at once, so an app that
crashes right after loading still shows as a start. A directory the app cannot write to (no
agent started yet, permissions) logs one warning saying what to do; the app keeps serving.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.agent.app_file import APPS_DIR, CADENCE_FILE, app_file_name, encode_app_file
from edgesdk.files import write_atomic
from edgesdk.fleet.protocol import check_id

if TYPE_CHECKING:
    from edgesdk.agent.managed import ManagedRuntime

__all__ = ["AppExporter", "default_app_name", "SLOW_EVERY_S", "TICK_S"]

log = logging.getLogger(__name__)

#: How often an app writes its file when the agent asks for nothing faster (seconds).
SLOW_EVERY_S = 60.0
#: How often the exporter folds the ledger and looks at the cadence file (seconds).
TICK_S = 1.0


def default_app_name() -> str:
    """The name an app's file carries when it gives none: its script's name, else ``app``."""
    stem = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip("._-").replace("..", "_")[:64]
    return name or "app"


class AppExporter:
    """Writes a ManagedRuntime's traffic ledger to ``STORE/apps/<app>-<pid>.json`` (module doc).

    ``app`` is checked with :func:`~edgesdk.fleet.protocol.check_id` (a TransferError names a
    bad one). ``clock`` is wall-clock seconds; :meth:`tick` is what the background thread
    :meth:`start` runs every ``tick_s`` seconds, so tests drive it without the thread.
    """

    def __init__(self, managed: ManagedRuntime, store: str | os.PathLike[str],
                 app: str | None = None, clock: Callable[[], float] = time.time,
                 tick_s: float = TICK_S) -> None:
        self.app = check_id(app if app is not None else default_app_name(), "app name")
        self.pid = os.getpid()
        self.directory = Path(store) / APPS_DIR
        #: The file this process writes.
        self.path = self.directory / app_file_name(self.app, self.pid)
        self._managed, self._clock, self.tick_s = managed, clock, tick_s
        self._lock = threading.Lock()
        self._written_changes = -1
        self._last_write = -float("inf")
        self._cadence_mtime: int | None = None
        self._fast: tuple[float, float] | None = None  # (every_s, until) the agent asked for
        self._warned = False
        #: Files written so far.
        self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"app-stats-{self.app}", daemon=True)

    def start(self) -> AppExporter:
        """Write the file now (the model loaded so far is a start), then every tick as needed."""
        self.write()
        self._thread.start()
        return self

    def every_s(self) -> float:
        """How often the file may be written now: the agent's fast cadence until its end, else
        :data:`SLOW_EVERY_S`."""
        self._read_cadence()
        fast = self._fast
        if fast is not None and fast[1] > self._clock():
            return fast[0]
        return SLOW_EVERY_S

    def _read_cadence(self) -> None:
        """Re-read ``cadence.json`` when its modification time changed (one stat otherwise)."""
        path = self.directory / CADENCE_FILE
        try:
            info = path.stat()
        except OSError:
            self._cadence_mtime, self._fast = None, None
            return
        if info.st_mtime_ns == self._cadence_mtime:
            return
        self._cadence_mtime, self._fast = info.st_mtime_ns, None
        try:
            if info.st_uid not in (0, self.directory.stat().st_uid):
                raise ValueError(f"owned by uid {info.st_uid}, not by the agent")
            data = json.loads(path.read_bytes()[:4096])
            every, until = float(data["every_s"]), float(data["until"])
            if not (every > 0 and until == until):
                raise ValueError(f"every_s {every!r} or until {until!r} is not usable")
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.debug("ignoring %s: %s", path, exc)
            return
        self._fast = (max(every, self.tick_s), until)

    def tick(self) -> bool:
        """Fold the ledger; write the file if it changed and ``every_s`` passed (whether it did)."""
        self._managed.fold_traffic()
        every = self.every_s()
        if self._managed.traffic.changes == self._written_changes:
            return False
        if self._clock() - self._last_write < every:
            return False
        return self.write()

    def activated(self) -> None:
        """A model started serving: write now, whatever the cadence."""
        self.write()

    def write(self) -> bool:
        """Fold and write the file now; False (with one warning) when it cannot be written."""
        with self._lock:
            self._managed.fold_traffic()
            ledger = self._managed.traffic
            if ledger.session is None:  # no model served yet: nothing to hand over
                return False
            changes = ledger.changes
            now = self._clock()
            data = encode_app_file(self.app, self.pid, ledger.document(), now)
            try:
                if not self.directory.is_dir():
                    raise FileNotFoundError(f"{self.directory} does not exist")
                write_atomic(self.path, data, mode=0o644)
            except OSError as exc:
                self._warn(exc)
                return False
            if self._warned:
                log.info("app %s: handing its traffic to the agent again (%s)", self.app, self.path)
                self._warned = False
            self._written_changes, self._last_write = changes, now
            self.writes += 1
            return True

    def _warn(self, exc: OSError) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning("app %s cannot hand its traffic to the device agent: %s cannot be written "
                    "(%s). The agent creates it, mode 1777, when it starts: start the agent on "
                    "this store first, or run `mkdir -p %s && chmod 1777 %s` as the agent's user. "
                    "The app keeps serving; rollouts cannot judge this device's traffic meanwhile.",
                    self.app, self.directory, exc, self.directory, self.directory)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 (the app keeps serving; the next tick tries again)
                log.exception("app %s: handing its traffic to the agent failed", self.app)

    def stop(self) -> None:
        """Stop the thread and write the last figures (the file stays for the agent to read)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._managed.fold_traffic()
        if self._managed.traffic.changes != self._written_changes:
            self.write()
