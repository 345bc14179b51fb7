"""From the command line: `edgesdk server` in its own process, 20 agents, push / rollout / devices."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.ota_server.broker import free_port
from tests.ota.conftest import wait_for

N_AGENTS = 20


@pytest.fixture
def server_process(tmp_path, broker, keys):
    port = free_port()
    with open(tmp_path / "server.log", "ab") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "edgesdk"), "server", "--broker", broker.url, "--repo",
             str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"), "--key", str(keys["dir"] / "server.key"),
             "--bundle-key", str(keys["dir"] / "converter.pub"), "--http", f"127.0.0.1:{port}", "--token", "s3cret"],
            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            urllib.request.urlopen(f"{url}/api/devices", timeout=1)
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # answering, and refusing a request without a token
        except OSError:
            return False
        return False

    wait_for(up, timeout=30, what="edgesdk server")
    yield url
    process.terminate()
    process.wait(timeout=20)


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_canary_rollout_and_automatic_rollback_from_the_cli(server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i:02d}", broker.url) for i in range(N_AGENTS)]
    wait_for(lambda: len(json.loads(_cli("devices", "--group", "cams", "--json", *auth))) == N_AGENTS,
             what="20 devices registered")

    out = _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--wait", "120", *auth)
    assert "completed" in out and "committed 20" in out, out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)

    started = time.monotonic()
    out = _cli("push", str(bundles["3.0.0-bad"]), "--group", "cams", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--max-failure-rate", "5%", "--wait", "120", *auth)
    assert "aborted" in out and "rolled_back 2" in out and "pending 18" in out, out
    assert "health check" in out
    assert time.monotonic() - started < 120
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    devices = json.loads(_cli("devices", "--group", "cams", "--json", *auth))
    assert {d["version"] for d in devices} == {"1.0.0"} and len(devices) == N_AGENTS
    listing = _cli("rollout", "status", *auth)
    assert listing.count("completed") == 1 and listing.count("aborted") == 1


def test_wrong_token_is_refused(server_process):
    result = CliRunner().invoke(cli, ["devices", "--server", server_process, "--token", "nope"])
    assert result.exit_code == 1 and "401" in result.output
