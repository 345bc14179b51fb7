"""The exit codes scripts rely on: 17 with the final state for an aborted rollout, 18 when --wait runs out, 20 for
a downgrade that devices would refuse."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ConflictError, RolloutError, RolloutTimeoutError
from tests.ota.conftest import wait_for
from tests.ota.test_cli_fleet import _cli, server_process  # noqa: F401 (a fixture, used by name)


def test_a_wait_that_runs_out_exits_18_with_the_state_and_a_downgrade_is_refused(server_process, broker,  # noqa: F811
                                                                                  make_agent, bundles, keys, tmp_path):
    from tests.ota.conftest import make_bundle

    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 2, what="devices")
    _cli("push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%", "--health-window", "0s",
         "--wait", "60", *auth)
    older = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", *auth])
    assert older.exit_code == ConflictError.exit_code, older.output
    assert "newer than 1.0.0" in older.output and "rollout rollback" in older.output
    # The canary's health window lasts a minute: a 2 s wait ends while it is still running (a manual rollout that
    # reached waiting_for_promote exits 0 instead: tests/ota/test_canary_analysis.py).
    newer = make_bundle(tmp_path / "2.1.0", "2.1.0", keys, seed=21)
    result = CliRunner().invoke(cli, ["push", str(newer), "--group", "cams", "--no-analysis", "--canary", "50%", "--waves", "100",
                                      "--health-window", "60s", "--manual", "--wait", "2", "--json", *auth])
    assert result.exit_code == RolloutTimeoutError.exit_code, result.output
    state = json.loads(result.stdout)
    assert state["state"] == "running" and "still running" in result.stderr and "--follow" in result.stderr
    assert {a.current_version() for a in agents} >= {("digits", "2.0.0")}


def test_an_aborted_rollout_exits_17_with_its_final_state_and_an_operator_abort_waits_for_the_reverts(
        server_process, broker, make_agent, bundles):  # noqa: F811
    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: json.loads(_cli("devices", "--json", *auth))["total"] == 2, what="devices")
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%", "--health-window", "0s",
         "--wait", "60", *auth)
    bad = CliRunner().invoke(cli, ["push", str(bundles["3.0.0-bad"]), "--group", "cams", "--no-analysis", "--canary", "100%",
                                   "--health-window", "0s", "--wait", "60", "--json", *auth])
    assert bad.exit_code == RolloutError.exit_code, bad.output
    state = json.loads(bad.stdout)  # the final state on stdout; the id, progress and error on stderr
    assert state["state"] == "aborted" and state["version"] == "3.0.0" and "health check" in state["reason"]
    assert sorted(t["status"] for t in state["targets"]) == ["rolled_back", "rolled_back"]
    assert f"started rollout {state['id']}" in bad.stderr and "stage 1 of 1" in bad.stderr
    assert "error: rollout" in bad.stderr and "aborted" in bad.stderr
    followed = CliRunner().invoke(cli, ["rollout", "status", state["id"], "--follow", *auth])
    assert followed.exit_code == RolloutError.exit_code and "aborted" in followed.output, followed.output

    started = json.loads(_cli("push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "50%",
                              "--waves", "100",
                              "--health-window", "0s", "--manual", "--json", *auth))["id"]
    wait_for(lambda: [t["status"] for t in json.loads(_cli("rollout", "status", started, "--json", *auth))["targets"]
                      if t["stage"] == 1] == ["committed"], what="the canary")
    aborted = CliRunner().invoke(cli, ["rollout", "abort", started, "--wait", "60", "--json", *auth])
    assert aborted.exit_code == 0, aborted.output
    final = json.loads(aborted.stdout)
    assert final["state"] == "aborted"
    assert [t["status"] for t in final["targets"] if t["stage"] == 1] == ["reverted"]
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    again = CliRunner().invoke(cli, ["rollout", "promote", started, "--wait", "5", *auth])
    assert again.exit_code == ConflictError.exit_code and "is aborted, not running" in again.output
