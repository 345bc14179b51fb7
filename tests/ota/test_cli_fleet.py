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


def start_server_process(tmp_path: Path, broker, keys, *options: str) -> tuple[str, subprocess.Popen]:
    """`edgesdk server` in its own process (admin token ``s3cret``, extra ``options``), once its admin API answers:
    its URL and process."""
    port = free_port()
    with open(tmp_path / "server.log", "ab") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "edgesdk"), "server", "--broker", broker.url, "--repo",
             str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"), "--key", str(keys["dir"] / "server.key"),
             "--bundle-key", str(keys["dir"] / "converter.pub"), "--http", f"127.0.0.1:{port}", "--token", "s3cret",
             *options],
            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"edgesdk server exited {process.returncode}: {(tmp_path / 'server.log').read_text()}")
        try:
            urllib.request.urlopen(f"{url}/api/devices", timeout=1)
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # answering, and refusing a request without a token
        except OSError:
            return False
        return False

    wait_for(up, timeout=30, what="edgesdk server")
    return url, process


@pytest.fixture
def server_process(tmp_path, broker, keys):
    url, process = start_server_process(tmp_path, broker, keys)
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

    out = _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--wait", "120", *auth)
    assert "completed" in out and "committed 20" in out, out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)

    started = time.monotonic()
    out = _cli("push", str(bundles["3.0.0-bad"]), "--group", "cams", "--no-analysis", "--canary", "10%", "--waves", "50,100",
               "--health-window", "0.5s", "--max-failure-rate", "5%", "--wait", "120", *auth,
               exit_code=RolloutError.exit_code)  # an aborted rollout is a failed push, for every CI script
    assert "aborted" in out and "rolled_back 2" in out and "skipped 18" in out, out
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
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%", "--health-window",
         "0s", "--wait", "60", *auth)
    started = json.loads(_cli("push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "25%",
                              "--waves", "100", "--health-window", "0s", "--manual", "--json", *auth))
    rollout_id = started["id"]

    def status() -> dict:
        return json.loads(_cli("rollout", "status", rollout_id, "--json", *auth))

    wait_for(lambda: [t["status"] for t in status()["targets"] if t["stage"] == 1] == ["committed"], what="canary")
    # The canary stage settles and stays: that a manual rollout never promotes by itself is proven, with a
    # fake clock, in tests/unit/test_rollout_engine.py (waiting here could only pass, never prove it).
    wait_for(lambda: status()["stage_settled"] is not None, what="canary stage settled")
    assert status()["stage"] == 1
    assert "promote" in _cli("rollout", "promote", rollout_id, *auth)
    wait_for(lambda: status()["state"] == "completed", what="completion after promotion")
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)

    # A rollback is staged with the policy of the rollout it undoes (here manual); --all-at-once is the emergency path.
    out = _cli("rollout", "rollback", rollout_id, "--to", "1.0.0", "--all-at-once", "--wait", "60", *auth)
    assert "completed" in out and "committed 4" in out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)

    third = json.loads(_cli("push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "25%",
                            "--waves", "100", "--health-window", "0s", "--manual", "--json", *auth))["id"]
    wait_for(lambda: json.loads(_cli("rollout", "status", third, "--json", *auth))["targets"][0]["status"] != "pending",
             what="third rollout started")
    _cli("rollout", "abort", third, *auth)
    wait_for(lambda: json.loads(_cli("rollout", "status", third, "--json", *auth))["state"] == "aborted", what="abort")
    listing = _cli("rollout", "status", "--group", "cams", *auth)  # rollbacks and reasons in the list (issue 37)
    assert re.search(r"1\.0\.0\s+cams\s+rollback\s+completed", listing), listing
    assert re.search(rf"{third}\s+digits\s+2\.0\.0\s+cams\s+push\s+aborted\s+\S+\s+aborted by operator", listing), listing


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
    # The devices file is read as `devices provision --file` and `server --devices` read it: one parser.
    (tmp_path / "twice.txt").write_text("cam-a cams  # bench\ncam-a lobby\n")
    twice = CliRunner().invoke(cli, ["server", "mosquitto-config", "--devices", str(tmp_path / "twice.txt"),
                                     "--out", str(tmp_path / "y")])
    assert twice.exit_code == 2 and "twice.txt:2: device cam-a is in group cams" in twice.output, twice.output
    assert not (tmp_path / "y").exists()


def test_versions_are_immutable_and_what_a_group_runs_is_not_pushed_again(server_process, broker, make_agent,
                                                                           bundles, keys, tmp_path):
    from tests.ota.conftest import make_bundle

    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 2, what="devices")
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%",
         "--health-window", "0s", "--wait", "60",
         *auth)
    impostor = make_bundle(tmp_path / "impostor", "1.0.0", keys, seed=99)  # same name and version, other weights
    out = CliRunner().invoke(cli, ["push", str(impostor), "--group", "cams", "--no-analysis", *auth])
    assert out.exit_code == ConflictError.exit_code, out.output
    assert "other content" in out.output and "sha256" in out.output and "higher --version" in out.output
    again = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", *auth])
    assert again.exit_code == ConflictError.exit_code, again.output
    assert "already stored" in again.output and "already installed on all 2 devices" in again.output
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    assert len(json.loads(_cli("rollout", "status", "--json", *auth))) == 1, "no rollout may start for either push"


def test_wave_lists_must_increase_to_100_before_anything_is_sent(bundles):
    # The server URL answers nothing: the policy is refused before any request.
    for waves in ("100,50", "50", "50,50,100"):
        out = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--waves", waves,
                                       "--server", "http://127.0.0.1:9", "--token", "t"])
        assert out.exit_code == 2 and "must increase and end at 100%" in out.output, (waves, out.output)


def test_tables_json_words_iso_times_and_follow(server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    make_agent("cam0", broker.url)
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 1, what="device")
    table = _cli("devices", *auth).splitlines()
    assert table[0].split() == ["device", "group", "status", "board", "arch", "model", "version", "last", "seen"]
    assert table[1].split()[:7] == ["cam0", "cams", "online", "generic-x86_64", "x86_64", "none", "none"]
    (device,) = json.loads(_cli("devices", "--json", *auth))["devices"]
    assert "grp" not in device and device["group"] == "cams" and device["profile"] == "generic-x86_64"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", device["last_seen"]), device["last_seen"]
    rollout_id = json.loads(_cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%",
                                 "--health-window", "0s", "--json", *auth))["id"]
    result = CliRunner().invoke(cli, ["rollout", "status", rollout_id, "--follow", "--json", *auth])
    assert result.exit_code == 0, result.output
    final = json.loads(result.stdout)
    assert final["state"] == "completed" and final["group"] == "cams" and final["created"].endswith("Z")
    assert "stage 1 of 1" in result.stderr and "committed 1" in result.stderr
    listing = _cli("rollout", "status", *auth).splitlines()
    assert listing[0].split()[:6] == ["rollout", "model", "version", "group", "kind", "state"]


def _rollout_id(stderr: str) -> str:
    return re.search(r"started rollout (\S+)", stderr).group(1)


def test_a_push_completes_without_an_offline_device_which_converges_when_it_returns(server_process, broker, make_agent,
                                                                                     bundles):
    from edgesdk.errors import RolloutTimeoutError

    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 2, what="devices")
    agents[1].stop()  # asleep, out of coverage: it misses the push
    wait_for(lambda: json.loads(_cli("devices", "--status", "offline", "--json", *auth))["total"] == 1,
             what="cam1 offline")
    once = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%",
                                    "--health-window", "0s", "--max-late-failure-rate", "10%", "--wait", "60", *auth])
    assert once.exit_code == 0, once.output  # every reachable device updated: done, the offline one deferred
    assert "completed" in once.stdout and "devices: committed 1, deferred 1" in once.stdout
    assert "deferred: 1 (offline when their stage went out; each gets 1.0.0 when it reports again)" in once.stdout
    assert "1 deferred (offline) get 1.0.0 when they report" in once.stderr
    first = json.loads(_cli("rollout", "status", _rollout_id(once.stderr), "--json", *auth))
    assert first["deferred"] == 1 and first["policy"]["max_late_failure_rate"] == 0.1 and first["flagged"] is None
    (cams,) = json.loads(_cli("groups", "--json", *auth))
    assert (cams["group"], cams["version"], cams["devices"], cams["converged"], cams["behind_offline"]) == (
        "cams", "1.0.0", 2, 1, 1) and cams["rollout_id"] == first["id"] and cams["running"] is None
    table = _cli("groups", *auth).splitlines()
    assert table[0].split()[:4] == ["group", "release", "devices", "converged"]
    assert table[1].split()[:7] == ["cams", "digits", "1.0.0", "2", "1", "0", "1"]

    # Waiting for the deferred device too: it stays away, so the wait runs out (the "still running" exit code).
    waited = CliRunner().invoke(cli, ["push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%",
                                      "--health-window", "0s", "--wait", "60", "--wait-deferred", "2s", "--json",
                                      *auth])
    assert waited.exit_code == RolloutTimeoutError.exit_code, waited.output
    assert json.loads(waited.stdout)["state"] == "completed" and json.loads(waited.stdout)["deferred"] == 1
    assert "1 deferred (offline) have not updated yet" in waited.stderr
    second = _rollout_id(waited.stderr)

    make_agent("cam1", broker.url)  # back, on 1.0.0 or nothing: the group's release reaches it late
    followed = CliRunner().invoke(cli, ["rollout", "status", "--group", "cams", "--follow", "--wait-deferred", "60s",
                                        "--json", *auth])
    assert followed.exit_code == 0, followed.output
    final = json.loads(followed.stdout)
    assert final["id"] == second and final["deferred"] == 0 and final["late"] == {"committed": 1}
    assert [t["late"] for t in final["targets"] if t["device_id"] == "cam1"] == [True]
    assert "late: committed 1" in _cli("rollout", "status", second, *auth)
    # The first rollout's deferred target stays deferred (the second one's release reached cam1): waiting on it
    # ends at once, saying so, instead of running out.
    superseded = CliRunner().invoke(cli, ["rollout", "status", first["id"], "--follow", "--wait-deferred", "60s",
                                          *auth])
    assert superseded.exit_code == 0, superseded.output
    assert f"group cams's release is digits 2.0.0 (rollout {second}); its 1 deferred (offline) get that one" in \
        superseded.stderr
    assert "committed (late)" in _cli("rollout", "status", second, *auth)
    (cams,) = json.loads(_cli("groups", "--json", *auth))
    assert (cams["version"], cams["converged"], cams["behind_online"], cams["behind_offline"]) == ("2.0.0", 2, 0, 0)
    assert [r["id"] for r in json.loads(_cli("rollout", "status", "--group", "cams", "--json", *auth))] == [
        first["id"], second]
    assert "no rollouts yet in group lobby" in _cli("rollout", "status", "--group", "lobby", *auth)


def test_a_push_to_devices_only_provisioned_is_planned_over_them_and_each_converges_on_first_report(
        server_process, broker, make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    _cli("devices", "provision", "cam0", "cams", *auth)
    # Analysis off (the agent serves no traffic): the canary, planned over the provisioned device, passes deferred.
    pushed = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--health-window", "0s",
                                      "--wait", "60", *auth])
    assert pushed.exit_code == 0, pushed.output  # was refused: "group 'cams' has no device"
    assert "devices: deferred 1" in pushed.output and "1 deferred (offline) get 1.0.0 when they report" in \
        pushed.output, pushed.output
    (cams,) = json.loads(_cli("groups", "--json", *auth))
    assert (cams["group"], cams["version"], cams["devices"], cams["converged"]) == ("cams", "1.0.0", 1, 0)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: agent.current_version() == ("digits", "1.0.0"), timeout=60, what="cam0 on its first report")
    wait_for(lambda: json.loads(_cli("groups", "--json", *auth))[0]["converged"] == 1, what="the group converged")


def test_devices_are_provisioned_from_the_command_line_and_the_api_checks_what_it_is_given(server_process, tmp_path):
    from edgesdk.errors import TransferError

    auth = ["--server", server_process, "--token", "s3cret"]
    devices = tmp_path / "devices.txt"
    devices.write_text("# id group\ncam-a cams\n\ncam-b lobby   # the door camera\n")
    assert _cli("devices", "provision", "--file", str(devices), *auth).strip() == "provisioned 2 devices"
    moved = CliRunner().invoke(cli, ["devices", "provision", "cam-b", "cams", *auth])
    assert moved.exit_code == 0 and "provisioned 1 device; moved to another group: cam-b -> cams" in moved.stdout
    assert "restart each moved device's agent with its new --group" in moved.stderr
    listing = json.loads(_cli("devices", "provisioned", "--json", *auth))
    assert [(p["device_id"], p["group"], p["source"]) for p in listing] == [("cam-a", "cams", "devices file"),
                                                                             ("cam-b", "cams", "admin api")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["updated"]) for p in listing)
    assert "no device is provisioned in group lobby yet" in _cli("devices", "provisioned", "--group", "lobby", *auth)
    assert _cli("devices", "provisioned", "--group", "cams", *auth).splitlines()[1].split()[:3] == [
        "cam-a", "cams", "devices"]
    again = json.loads(_cli("devices", "provision", "--file", str(devices), "--json", *auth))
    assert again == {"provisioned": 2, "moved": ["cam-b"]}, "the file puts cam-b back in lobby"

    # Refused before any request: a line that is not 'DEVICE_ID GROUP', a device in two groups, an unsafe id.
    for text, says in (("cam-a\n", "devices.txt:1: expected 'DEVICE_ID GROUP'"),
                       ("cam-a cams\ncam-a lobby\n", "devices.txt:2: device cam-a is in group cams"),
                       ("cam/a cams\n", "devices.txt:1: device id 'cam/a' must be")):
        devices.write_text(text)
        bad = CliRunner().invoke(cli, ["devices", "provision", "--file", str(devices), *auth])
        assert bad.exit_code == 2 and says in bad.output, bad.output
    refused = CliRunner().invoke(cli, ["devices", "provision", "cam.c", "no/such", *auth])
    assert refused.exit_code == TransferError.exit_code and "400" in refused.output and "group 'no/such'" in refused.output
    assert CliRunner().invoke(cli, ["devices", "provision", "cam-a", *auth]).exit_code == 2

    def call(method: str, path: str, body: object = None, token: str = "s3cret") -> tuple[int, object]:
        request = urllib.request.Request(f"{server_process}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert call("PUT", "/api/devices/cam-a/group", {"group": "lobby"}) == (200, {"moved": ["cam-a"], "provisioned": 1})
    assert call("GET", "/api/provisioning?group=lobby")[1][0]["device_id"] == "cam-a"
    assert call("POST", "/api/provisioning", {"devices": {"cam-z": "yard"}, "source": "inventory sync"}) == (
        200, {"moved": [], "provisioned": 1})
    assert call("GET", "/api/provisioning?group=yard")[1][0]["source"] == "inventory sync"
    for body in ({"devices": {}}, {"devices": ["cam-a"]}, {"devices": {"cam-a": 3}}, {"devices": {"cam-a": "x"},
                                                                                      "source": ""}, [1]):
        status, answer = call("POST", "/api/provisioning", body)
        assert status == 400 and answer["type"] == "EdgeSDKError", (body, answer)
    assert call("PUT", "/api/devices/cam-a/group", {"grp": "lobby"})[0] == 400
    assert call("PUT", "/api/devices/a..b/group", {"group": "lobby"}) == (400, {
        "error": "device id 'a..b' must be 1-64 of letters, digits, '.', '_', '-'", "type": "TransferError"})
    assert call("GET", "/api/groups", token="wrong")[0] == 401
    assert call("POST", "/api/provisioning", {"devices": {"cam-y": "yard"}}, token="wrong")[0] == 401
    assert call("GET", "/api/provisioning?group=yard")[1][0]["device_id"] == "cam-z", "a refused request wrote nothing"


def test_edgesdk_server_with_a_devices_file_refuses_the_unprovisioned_by_default(tmp_path, broker, keys, make_agent):
    """Issue 60: with a devices file the first report still picked an unknown device's group unless
    --require-provisioning was given; the file names every device there is, so now the others are refused."""
    (tmp_path / "devices.txt").write_text("cam0 cams\n")
    url, process = start_server_process(tmp_path, broker, keys, "--devices", str(tmp_path / "devices.txt"),
                                        "--max-catch-up", "7")
    try:
        auth = ["--server", url, "--token", "s3cret"]
        assert [(p["device_id"], p["group"], p["source"]) for p in json.loads(
            _cli("devices", "provisioned", "--json", *auth))] == [("cam0", "cams", "devices file")]
        make_agent("stranger", broker.url)  # nobody provisioned it: its reports are refused
        make_agent("cam0", broker.url)
        wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 1, what="cam0 registered")
        request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": "Bearer s3cret"})
        def refused() -> float:
            metrics = urllib.request.urlopen(request, timeout=10).read().decode()
            assert "edgesdk_ota_catch_up_limit 7.0" in metrics
            return float(re.search(r'edgesdk_ota_states_refused_group_total\{reason="unprovisioned"\} (\S+)',
                                   metrics).group(1))

        wait_for(lambda: refused() >= 1, what="the stranger's refusal")
        assert [d["id"] for d in json.loads(_cli("devices", "--json", *auth))["devices"]] == ["cam0"]
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert "provisioned 1 devices from the devices file" in (tmp_path / "server.log").read_text()


def test_wait_and_follow_options_are_checked_before_any_request(bundles):
    nowhere = ["--server", "http://127.0.0.1:9", "--token", "t"]  # answers nothing: a request would exit 1
    for args, says in ((["rollout", "status", "--follow"], "--follow needs a rollout ID (or --group GROUP"),
                       (["rollout", "status", "--wait-deferred", "1m"], "--wait-deferred goes with --follow"),
                       (["rollout", "status", "r1", "--group", "cams"], "a ROLLOUT_ID or --group, not both"),
                       (["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--wait-deferred", "0s"],
                        "'0s' must be a positive duration")):
        out = CliRunner().invoke(cli, [*args, *nowhere])
        assert out.exit_code == 2 and says in out.output, (args, out.output)
