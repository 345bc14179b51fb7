"""The exit codes scripts rely on: 18 when --wait runs out, 20 for a downgrade that devices would refuse."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ConflictError, RolloutTimeoutError
from tests.ota.conftest import wait_for
from tests.ota.test_cli_fleet import _cli, server_process  # noqa: F401 (a fixture, used by name)


def test_a_wait_that_runs_out_exits_18_with_the_state_and_a_downgrade_is_refused(server_process, broker,  # noqa: F811
                                                                                  make_agent, bundles, keys, tmp_path):
    from tests.ota.conftest import make_bundle

    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: len(json.loads(_cli("devices", "--json", *auth))) == 2, what="devices")
    _cli("push", str(bundles["2.0.0"]), "--group", "cams", "--canary", "100%", "--health-window", "0s", "--wait", "60",
         *auth)
    older = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", *auth])
    assert older.exit_code == ConflictError.exit_code, older.output
    assert "newer than 1.0.0" in older.output and "rollout rollback" in older.output
    # A manual rollout waits for `promote` after its canary: a 2 s wait ends while it is still running.
    newer = make_bundle(tmp_path / "2.1.0", "2.1.0", keys, seed=21)
    result = CliRunner().invoke(cli, ["push", str(newer), "--group", "cams", "--canary", "50%", "--waves", "100",
                                      "--health-window", "0s", "--manual", "--wait", "2", "--json", *auth])
    assert result.exit_code == RolloutTimeoutError.exit_code, result.output
    state = json.loads(result.stdout)
    assert state["state"] == "running" and "still running" in result.stderr and "--follow" in result.stderr
    assert {a.current_version() for a in agents} >= {("digits", "2.0.0")}
