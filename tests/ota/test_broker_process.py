"""The local mosquitto's process: its descriptor limit is raised and its pid is mosquitto's own."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from edgesdk.ota_server.broker import LocalMosquitto


def _soft_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def test_a_broker_for_a_big_fleet_runs_with_the_open_files_it_asked_for(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 4096 if os.geteuid() == 0 or hard == resource.RLIM_INFINITY or hard >= 4096 else hard
    broker = LocalMosquitto(tmp_path / "broker", max_open_files=4096)
    try:
        assert broker.process is not None
        # The shell that raises the limit execs mosquitto, so terminate() reaches the broker itself.
        assert os.path.basename(os.readlink(f"/proc/{broker.process.pid}/exe")) == "mosquitto"
        assert _soft_open_files(broker.process.pid) == expected
        broker.restart(down_s=0.0)
        assert _soft_open_files(broker.process.pid) == expected
    finally:
        broker.stop()
    assert broker.process.poll() is not None
