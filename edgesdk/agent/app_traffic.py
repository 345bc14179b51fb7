"""The agent's side of the apps' hand-off: read their files, merge per version, report.

Apps in other processes write ``STORE/apps/<app>-<pid>.json`` (:mod:`edgesdk.agent.app_stats`);
the agent's own ManagedRuntime, if it serves an app in its process, hands over its ledger
directly. :class:`TrafficReporter` makes the ``traffic`` object of the agent's state
(:mod:`edgesdk.fleet.traffic`) from all of them:

- ``STORE/apps`` is made mode ``1777`` (sticky, like ``/tmp``): an app running as another user
  writes its own file and cannot touch the others';
- each report reads the newest :data:`MAX_APP_FILES` files (by modification time) as hostile
  input: no symlinks or special files, at most 64 KiB, every field checked
  (:func:`edgesdk.agent.app_file.parse_app_file`); a bad file is skipped with one log line;
- :func:`merge_traffic` sums per version over the slots inside the horizon;
- files of processes gone (or not heard from for the horizon and a minute) are removed once
  nothing of theirs is in the horizon any more, as are bad files as old as that.

It also tells the apps how often to write while the device is judged (``apps/cadence.json``).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.app_file import (
    APPS_DIR,
    CADENCE_FILE,
    MAX_APP_FILE_BYTES,
    AppSession,
    AppSlot,
    AppVersion,
    parse_app_file,
    session_of,
)
from edgesdk.agent.traffic_ledger import HORIZON_S, SLOT_S, in_horizon
from edgesdk.errors import ReportError
from edgesdk.files import write_atomic
from edgesdk.fleet.traffic import MAX_TRAFFIC_VERSIONS, TRAFFIC_FORMAT, parse_traffic
from edgesdk.runtime.latency_histogram import merge, percentile

if TYPE_CHECKING:
    from edgesdk.agent.managed import ManagedRuntime

__all__ = ["TrafficReporter", "merge_traffic", "read_app_files", "MAX_APP_FILES", "AGENT_APP"]

log = logging.getLogger(__name__)

#: App files one report reads at most (the newest).
MAX_APP_FILES = 32
#: The app name the agent's own ManagedRuntime counts under.
AGENT_APP = "agent"
#: How far in the future an app's ``written`` may be (clock steps between processes).
_SKEW_S = 60.0

_Part = tuple[AppSession, AppVersion, list[AppSlot]]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_bounded(path: Path) -> bytes:
    """A regular file's bytes (no symlink, FIFO or device), refused unread above the size cap."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ReportError(f"{path.name} is not a regular file", reason="type")
        if info.st_size > MAX_APP_FILE_BYTES:
            raise ReportError(f"{path.name} has {info.st_size} bytes, over the "
                              f"{MAX_APP_FILE_BYTES}-byte cap of app files", reason="length")
        return file.read(MAX_APP_FILE_BYTES + 1)


def _candidates(directory: Path) -> list[tuple[Path, os.stat_result]]:
    """The directory's entries but the cadence file, newest first (vanished ones left out)."""
    entries = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if name == CADENCE_FILE:
            continue
        try:
            entries.append((directory / name, os.lstat(directory / name)))
        except OSError:
            continue
    return sorted(entries, key=lambda entry: entry[1].st_mtime_ns, reverse=True)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError as exc:
        log.debug("cannot remove %s: %s", path, exc)


def read_app_files(directory: Path, now: float, horizon_s: float = HORIZON_S,
                   on_bad: Callable[[Path, os.stat_result, Exception], None] | None = None,
                   ) -> list[AppSession]:
    """The app sessions in ``directory``'s newest :data:`MAX_APP_FILES` files, checked; files of
    processes gone (or silent) are removed once nothing of theirs is in the horizon, and so are
    bad files and leftovers as old as that. ``on_bad`` hears of each file skipped."""
    sessions, stale = [], now - horizon_s - SLOT_S
    for rank, (path, info) in enumerate(_candidates(directory)):
        if path.name.startswith(".") or not path.name.endswith(".json") or rank >= MAX_APP_FILES:
            if info.st_mtime < stale:
                _remove(path)  # a write a crash left half done, or a file never read
            continue
        try:
            session = parse_app_file(_read_bounded(path))
            if session.written > now + _SKEW_S:
                raise ReportError(f"written {session.written:.0f} is in the future", reason="range")
        except (OSError, ReportError) as exc:
            if info.st_mtime < stale:
                _remove(path)
            elif on_bad is not None:
                on_bad(path, info, exc)
            continue
        if session.written < now - horizon_s and (session.written < stale
                                                   or not _pid_alive(session.pid)):
            _remove(path)
            continue
        sessions.append(session)
    return sessions


def _parts(sessions: Iterable[AppSession], now: float, horizon_s: float) -> dict[str, list[_Part]]:
    """Per version, each session that served it in the window, with its slots in the horizon."""
    window, found = now - horizon_s, defaultdict(list)
    for session in sessions:
        for version, entry in session.versions.items():
            slots = [slot for slot in entry.slots if in_horizon(slot.start, now, horizon_s)]
            if slots or entry.activated >= window:
                found[version].append((session, entry, slots))
    return found


def _figures(parts: list[_Part], sessions: list[AppSession], window: float) -> dict[str, Any]:
    slots = [slot for _, _, session_slots in parts for slot in session_slots]
    histogram = merge(slot.histogram for slot in slots)
    figures: dict[str, Any] = {
        "from": min(max(part[2][0].start, part[1].activated) if part[2] else part[1].activated
                    for part in parts),
        "to": max(session.written for session, _, _ in parts),
        **{key: sum(getattr(slot, key) for slot in slots) for key in ("calls", "errors")}}
    for name, q in (("p50_ms", 50), ("p95_ms", 95), ("p99_ms", 99)):
        value = percentile(histogram, q)
        figures[name] = None if value is None else round(value, 6)
    figures["hist"] = histogram
    figures["local"] = sum(slot.local for slot in slots)
    figures["cloud"] = sum(slot.cloud for slot in slots)
    figures["apps"] = len(parts)
    figures["starts"] = sum(1 for _, entry, _ in parts if entry.activated >= window)
    figures["restarts"] = sum(1 for session, _, _ in parts if session.session >= window and any(
        other.app == session.app and other.session < session.session and other.written >= window
        for other in sessions))
    return figures


def merge_traffic(sessions: list[AppSession], now: float, horizon_s: float = HORIZON_S,
                  ) -> dict[str, Any]:
    """The ``traffic`` object (:mod:`edgesdk.fleet.traffic`) of app sessions, as of ``now``.

    Per version, over the slots in the horizon: ``from`` the earliest slot with data (never
    before that session activated the version), ``to`` the latest ``written``; counts summed;
    percentiles of the merged histogram; ``apps`` the sessions with the version in the window,
    ``starts`` those that activated it in the window, ``restarts`` those that began in the window
    while an earlier session of the same app was in it. The :data:`MAX_TRAFFIC_VERSIONS` versions
    heard of last are kept.
    """
    window = now - horizon_s
    versions = {version: _figures(parts, sessions, window)
                for version, parts in _parts(sessions, now, horizon_s).items()}
    newest = sorted(versions, key=lambda v: (versions[v]["to"], v), reverse=True)
    return {"format": TRAFFIC_FORMAT, "at": now, "horizon_s": horizon_s,
            "versions": {v: versions[v] for v in newest[:MAX_TRAFFIC_VERSIONS]}}


class TrafficReporter:
    """The agent's reader of its device's app traffic (module doc); thread-safe."""

    def __init__(self, store_root: Path, runtime: ManagedRuntime | None = None,
                 clock: Callable[[], float] = time.time, label: str = "") -> None:
        self.directory = Path(store_root) / APPS_DIR
        self.runtime, self._clock, self._label = runtime, clock, label
        self._lock = threading.Lock()
        self._logged: dict[str, tuple[int, int]] = {}
        self._refusal_logged = False
        self._until = 0.0
        self._make_directory()

    def _make_directory(self) -> None:
        """``STORE/apps`` with mode 1777 (chmod: mkdir's mode is cut by the umask)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if stat.S_IMODE(self.directory.stat().st_mode) != 0o1777:
            try:
                os.chmod(self.directory, 0o1777)
            except OSError as exc:
                log.warning("%s: cannot make %s writable for apps (chmod 1777: %s); apps "
                            "running as another user cannot hand over their traffic",
                            self._label, self.directory, exc)

    def _skipped(self, path: Path, info: os.stat_result, exc: Exception) -> None:
        key = (info.st_mtime_ns, info.st_size)
        if self._logged.get(path.name) != key:
            self._logged[path.name] = key
            log.warning("%s: skipping app file %s: %s", self._label, path, str(exc)[:300])

    def _own(self, now: float) -> AppSession | None:
        """The agent's own ManagedRuntime as a session, with the versions it served calls on (the
        agent's runtime of the CLI only runs health checks, which never count)."""
        runtime = self.runtime
        if runtime is None:
            return None
        runtime.fold_traffic()
        document = runtime.traffic.document()
        served = {v: entry for v, entry in document["versions"].items() if entry["slots"]}
        if document["session"] is None or not served:
            return None
        return session_of(AGENT_APP, os.getpid(), {**document, "versions": served}, now)

    def report(self) -> dict[str, Any]:
        """The ``traffic`` object of the device's state as of now."""
        with self._lock:
            now = self._clock()
            sessions = read_app_files(self.directory, now, on_bad=self._skipped)
            own = self._own(now)
            traffic = merge_traffic(sessions + ([own] if own is not None else []), now)
            try:
                parse_traffic(traffic)
            except ReportError as exc:  # e.g. apps together over the stated rate (refused too)
                if not self._refusal_logged:
                    log.warning("%s: the app traffic will be refused by the server: %s",
                                self._label, exc)
                self._refusal_logged = True
            return traffic

    def judge_until(self, until: float, every_s: float) -> None:
        """Ask the apps to write every ``every_s`` seconds until ``until`` (epoch seconds)."""
        with self._lock:
            if until <= self._until:
                return
            self._until = until
            body = json.dumps({"every_s": every_s, "until": until}).encode()
            try:
                write_atomic(self.directory / CADENCE_FILE, body, mode=0o644)
            except OSError as exc:
                log.warning("%s: cannot write %s (%s); apps write at their slow cadence",
                            self._label, self.directory / CADENCE_FILE, exc)
