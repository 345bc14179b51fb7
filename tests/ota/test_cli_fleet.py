"""From the command line: `edgesdk server` in its own process, 20 agents, push / rollout / devices."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ConflictError, RolloutError
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


def _cli(*args: str, exit_code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    return result.stdout


def test_canary_rollout_and_automatic_rollback_from_the_cli(server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i:02d}", broker.url) for i in range(N_AGENTS)]
    wait_for(lambda: json.loads(_cli("devices", "--group", "cams", "--json", *auth))["total"] == N_AGENTS,
             what="20 devices registered")

    out = _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--wait", "120", *auth)
    assert "completed" in out and "committed 20" in out, out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)

    started = time.monotonic()
    out = _cli("push", str(bundles["3.0.0-bad"]), "--group", "cams", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--max-failure-rate", "5%", "--wait", "120", *auth,
               exit_code=RolloutError.exit_code)  # an aborted rollout is a failed push, for every CI script
    assert "aborted" in out and "rolled_back 2" in out and "pending 18" in out, out
    assert "health check" in out
    assert time.monotonic() - started < 120
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    devices = json.loads(_cli("devices", "--group", "cams", "--json", *auth))["devices"]
    assert {d["version"] for d in devices} == {"1.0.0"} and len(devices) == N_AGENTS
    first = json.loads(_cli("devices", "--group", "cams", "--limit", "7", "--json", *auth))
    second = json.loads(_cli("devices", "--group", "cams", "--limit", "7", "--after", first["next"], "--json", *auth))
    assert first["total"] == N_AGENTS and [d["id"] for d in first["devices"] + second["devices"]] == sorted(
        d["id"] for d in devices)[:14], "two pages of 7 are the first 14 devices by id"
    assert f"showing 7 of {N_AGENTS} devices; the next page: --after {first['next']}" in _cli(
        "devices", "--group", "cams", "--limit", "7", *auth)
    listing = _cli("rollout", "status", *auth)
    assert listing.count("completed") == 1 and listing.count("aborted") == 1


def test_wrong_token_is_refused(server_process):
    result = CliRunner().invoke(cli, ["devices", "--server", server_process, "--token", "nope"])
    assert result.exit_code == 1 and "401" in result.output


def test_manual_promotion_abort_and_rollback_from_the_cli(server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(4)]
    wait_for(lambda: json.loads(_cli("devices", "--group", "cams", "--json", *auth))["total"] == 4, what="devices")
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--canary", "100%", "--health-window", "0s", "--wait",
         "60", *auth)
    started = json.loads(_cli("push", str(bundles["2.0.0"]), "--group", "cams", "--canary", "25%", "--waves", "100",
                              "--health-window", "0s", "--manual", "--json", *auth))
    rollout_id = started["id"]

    def status() -> dict:
        return json.loads(_cli("rollout", "status", rollout_id, "--json", *auth))

    wait_for(lambda: [t["status"] for t in status()["targets"] if t["stage"] == 0] == ["committed"], what="canary")
    # The canary stage settles and stays: that a manual rollout never promotes by itself is proven, with a
    # fake clock, in tests/unit/test_rollout_engine.py (waiting here could only pass, never prove it).
    wait_for(lambda: status()["stage_settled"] is not None, what="canary stage settled")
    assert status()["stage"] == 0
    assert "promote" in _cli("rollout", "promote", rollout_id, *auth)
    wait_for(lambda: status()["state"] == "completed", what="completion after promotion")
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)

    out = _cli("rollout", "rollback", rollout_id, "--to", "1.0.0", "--wait", "60", *auth)
    assert "completed" in out and "committed 4" in out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)

    third = json.loads(_cli("push", str(bundles["2.0.0"]), "--group", "cams", "--canary", "25%", "--waves", "100",
                            "--health-window", "0s", "--manual", "--json", *auth))["id"]
    wait_for(lambda: json.loads(_cli("rollout", "status", third, "--json", *auth))["targets"][0]["status"] != "pending",
             what="third rollout started")
    _cli("rollout", "abort", third, *auth)
    wait_for(lambda: json.loads(_cli("rollout", "status", third, "--json", *auth))["state"] == "aborted", what="abort")


def test_mosquitto_config_command_writes_passwords_acl_and_credentials(tmp_path):
    (tmp_path / "devices.txt").write_text("# id group\ncam-a cams\ncam-b lobby\n")
    result = CliRunner().invoke(cli, ["server", "mosquitto-config", "--devices", str(tmp_path / "devices.txt"),
                                      "--out", str(tmp_path / "broker"), "--port", "18830"])
    assert result.exit_code == 0, result.output
    acl = (tmp_path / "broker" / "acl").read_text()
    assert "user cam-a\ntopic read edgesdk/devices/cam-a/cmd" in acl
    assert "topic read edgesdk/groups/lobby/chunks/#" in acl.split("user cam-b")[1]
    passwd = (tmp_path / "broker" / "passwd").read_text().splitlines()
    assert [line.split(":")[0] for line in passwd] == ["edgesdk-server", "cam-a", "cam-b"]
    assert all(line.split(":", 1)[1].startswith("$7$101$") for line in passwd)
    creds = json.loads((tmp_path / "broker" / "credentials" / "cam-b.json").read_text())
    assert creds["group"] == "lobby" and (tmp_path / "broker" / "credentials" / "cam-b.json").stat().st_mode & 0o777 == 0o600
    bad = CliRunner().invoke(cli, ["server", "mosquitto-config", "--devices", str(tmp_path / "acl.txt"),
                                   "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0


def test_versions_are_immutable_and_what_a_group_runs_is_not_pushed_again(server_process, broker, make_agent,
                                                                           bundles, keys, tmp_path):
    from tests.ota.conftest import make_bundle

    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 2, what="devices")
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--canary", "100%", "--health-window", "0s", "--wait", "60",
         *auth)
    impostor = make_bundle(tmp_path / "impostor", "1.0.0", keys, seed=99)  # same name and version, other weights
    out = CliRunner().invoke(cli, ["push", str(impostor), "--group", "cams", *auth])
    assert out.exit_code == ConflictError.exit_code, out.output
    assert "other content" in out.output and "sha256" in out.output and "higher --version" in out.output
    again = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", *auth])
    assert again.exit_code == ConflictError.exit_code, again.output
    assert "already stored" in again.output and "already installed on all 2 devices" in again.output
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    assert len(json.loads(_cli("rollout", "status", "--json", *auth))) == 1, "no rollout may start for either push"


def test_wave_lists_must_increase_to_100_before_anything_is_sent(bundles):
    # The server URL answers nothing: the policy is refused before any request.
    for waves in ("100,50", "50", "50,50,100"):
        out = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--waves", waves,
                                       "--server", "http://127.0.0.1:9", "--token", "t"])
        assert out.exit_code == 1 and "must increase and end at 100%" in out.output, (waves, out.output)


def test_tables_json_words_iso_times_and_follow(server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    make_agent("cam0", broker.url)
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 1, what="device")
    table = _cli("devices", *auth).splitlines()
    assert table[0].split() == ["device", "group", "status", "model", "version", "last", "seen"]
    assert table[1].split()[:5] == ["cam0", "cams", "online", "none", "none"]
    (device,) = json.loads(_cli("devices", "--json", *auth))["devices"]
    assert "grp" not in device and device["group"] == "cams"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", device["last_seen"]), device["last_seen"]
    rollout_id = json.loads(_cli("push", str(bundles["1.0.0"]), "--group", "cams", "--canary", "100%",
                                 "--health-window", "0s", "--json", *auth))["id"]
    result = CliRunner().invoke(cli, ["rollout", "status", rollout_id, "--follow", "--json", *auth])
    assert result.exit_code == 0, result.output
    final = json.loads(result.stdout)
    assert final["state"] == "completed" and final["group"] == "cams" and final["created"].endswith("Z")
    assert "stage 1 of 1" in result.stderr and "committed 1" in result.stderr
    listing = _cli("rollout", "status", *auth).splitlines()
    assert listing[0].split()[:5] == ["rollout", "model", "version", "group", "state"]
