"""A conversion ended with SIGTERM takes its emulated guests with it (issue 59's orphaned guests)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups and /proc")

_CONVERTER = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from edgesdk.converters.board.guest_process import GuestProcesses

    guests = GuestProcesses()
    started = threading.Event()

    def count():
        guests.run(["sleep", "600"], {}, 600, Path(sys.argv[1]))

    threading.Thread(target=count, daemon=True).start()
    while not guests._live:  # the guest is registered the moment it starts
        threading.Event().wait(0.01)
    print(next(iter(guests._live)).pid, flush=True)
    threading.Event().wait()  # a conversion busy elsewhere, until a signal ends it
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_sigterm_to_the_converter_kills_its_running_guest(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", _CONVERTER, str(tmp_path)],
                          stdout=subprocess.PIPE, text=True) as process:
        try:
            guest = int(process.stdout.readline())
            exited = os.pidfd_open(guest)  # readable once the guest has ended: an event, no polling
            assert _alive(guest)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
            ready, _, _ = select.select([exited], [], [], 60)
            os.close(exited)
            assert ready and not _alive(guest), f"guest {guest} outlived the converter"
        finally:
            if process.poll() is None:
                process.kill()
