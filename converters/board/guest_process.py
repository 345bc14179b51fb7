"""One emulated guest run as a child process that can always be ended whole.

Each count (:mod:`.emulate`) is a ``qemu-user`` process running the board's Python. It is started in
a process group of its own, so that a timeout, an :meth:`GuestProcesses.abort` (emulation turned off
while other counts still run) or this interpreter's exit kills every process of it, and none is left
behind to burn a core. The exit includes SIGTERM (what a service manager or ``timeout`` sends):
Python's default for it ends the interpreter without its exit handlers, so a guest counting for up
to its 900 s timeout outlived the conversion; the first :class:`GuestProcesses` made on the main
thread therefore ends the guests on SIGTERM and then dies of it, unless the program has a SIGTERM
handler of its own. :func:`signal_name` puts a native crash's return code in words.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GuestExit", "GuestProcesses", "signal_name"]

#: Every GuestProcesses alive in this interpreter, so that exiting it ends their guests too.
_ALL: weakref.WeakSet[GuestProcesses] = weakref.WeakSet()


@dataclass(frozen=True)
class GuestExit:
    """How a guest run ended: its return code (negative: killed by that signal), its stderr."""

    returncode: int
    stderr: str
    #: Killed after ``timeout_s``.
    timed_out: bool = False
    #: Killed by :meth:`GuestProcesses.abort`.
    aborted: bool = False


class GuestProcesses:
    """The guest runs in flight for one emulator, each in its own process group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[str]] = set()
        self._aborted: set[int] = set()
        _ALL.add(self)
        _end_all_on_sigterm()

    def run(self, command: Sequence[str], env: Mapping[str, str], timeout_s: float,
            cwd: Path) -> GuestExit:
        """Run ``command`` in ``cwd`` to its end, or kill its process group after ``timeout_s``.

        ``cwd`` should be a scratch directory: a guest that crashes may leave a core file there.
        """
        with self._lock:  # started and registered at once: an abort() meanwhile cannot miss it
            process = subprocess.Popen(list(command), env=dict(env), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True,
                                       cwd=cwd)
            self._live.add(process)
        try:
            try:
                _, stderr = process.communicate(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(process)
                _, stderr = process.communicate()
                timed_out = True
        finally:
            if process.poll() is None:  # interrupted here (KeyboardInterrupt): the guest goes too
                _kill_group(process)
                process.wait()
            with self._lock:
                self._live.discard(process)
                aborted = process.pid in self._aborted
                self._aborted.discard(process.pid)
        return GuestExit(process.returncode, stderr or "", timed_out, aborted)

    def abort(self) -> int:
        """Kill every guest in flight (their runs return ``aborted``); how many there were."""
        with self._lock:
            live = list(self._live)
            self._aborted.update(p.pid for p in live)
        for process in live:
            _kill_group(process)
        return len(live)


def signal_name(returncode: int) -> str:
    """``signal 11, SIGSEGV`` for a return code of -11 (a process killed by a signal)."""
    number = -returncode
    try:
        return f"signal {number}, {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # start_new_session: the group is the guest's own
    except ProcessLookupError:
        pass


@atexit.register
def _end_all() -> None:
    for guests in list(_ALL):
        guests.abort()


def _on_sigterm(signum: int, frame: object) -> None:
    _end_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # then die of it, as the default would have


def _end_all_on_sigterm() -> None:
    """Install :func:`_on_sigterm`, where Python lets us (the main thread) and nobody else has."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
