"""Issue 37: push's policy options are usage errors (exit 2), a collapsed wave is reported, and `edgesdk rollout
rollback --group G` rolls a group back with no rollout id, staged as the release was and never forward (issue 58)
(real server process, real broker, real agents)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.records import RolloutPolicy
from tests.ota.conftest import wait_for
from tests.ota.test_cli_fleet import _cli, server_process  # noqa: F401 (a fixture, used by name)

NOWHERE = ["--server", "http://127.0.0.1:9", "--token", "t"]  # answers nothing: a request would exit 1


def state_policy(state: dict) -> RolloutPolicy:
    """The policy of a rollout, from its JSON."""
    return RolloutPolicy.from_dict(state["policy"])


def test_every_policy_option_out_of_range_exits_2_before_any_request(bundles):
    for options, says in ((["--waves", "100,50"], "must increase and end at 100%"),
                          (["--canary", "0%"], "percentages in (0, 100]"),
                          (["--canary", "ten"], "is not a percentage"),
                          (["--waves", "50,x"], "is not a percentage"),
                          (["--max-failure-rate", "100%"], "max failure rate"),
                          (["--deploy-timeout", "0s"], "timeout > 0"),
                          (["--health-window", "soon"], "--health-window"),
                          (["--max-late-failure-rate", "150%"], "max late failure rate")):
        out = CliRunner().invoke(cli, ["push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", *options, *NOWHERE])
        assert out.exit_code == 2 and says in out.output, (options, out.output)


def test_rollback_takes_a_rollout_id_or_a_group_not_both_nor_neither():
    for args, says in ((["rollout", "rollback", "r1", "--group", "cams"], "a ROLLOUT_ID or --group GROUP, not both"),
                       (["rollout", "rollback"], "--group GROUP to roll the group back")):
        out = CliRunner().invoke(cli, [*args, *NOWHERE])
        assert out.exit_code == 2 and says in out.output, (args, out.output)


def test_a_collapsed_wave_is_reported_and_a_group_rolls_back_without_a_rollout_id(server_process, broker,  # noqa: F811
                                                                                 make_agent, bundles):
    auth = ["--server", server_process, "--token", "s3cret"]
    agents = [make_agent(f"cam{i}", broker.url) for i in range(3)]
    wait_for(lambda: json.loads(_cli("devices", "--group", "cams", "--json", *auth))["total"] == 3, what="devices")
    # No canary analysis: these agents serve no app traffic to judge (a rollback is staged with the same policy).
    _cli("push", str(bundles["1.0.0"]), "--group", "cams", "--no-analysis", "--canary", "100%", "--health-window", "0s",
         "--wait", "60", *auth)
    # 67% of 3 devices is all 3: the 100% wave adds none, and push says so (stderr) as the plan in the JSON does.
    pushed = CliRunner().invoke(cli, ["push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary",
                                      "34%", "--waves",
                                      "67,100", "--health-window", "0s", "--wait", "60", "--json",
                                      *auth])
    assert pushed.exit_code == 0, pushed.output
    assert "warning: group cams has 3 devices" in pushed.stderr and "wave 100% (3 devices, 0 new)" in pushed.stderr
    state = json.loads(pushed.stdout)
    assert state["stages"] == [2, 3]  # 34% of 3 is 1.02: a canary of ceil = 2
    assert [(s["percent"], s["devices"], s["collapsed"]) for s in state["plan"]] == [
        (34.0, 2, False), (67.0, 3, False), (100.0, 3, True)]
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)

    client = AdminClient(server_process, "s3cret")
    rollback_id = client.rollback_group("cams")  # to the version it ran before, 1.0.0, staged as 2.0.0 was
    out = _cli("rollout", "status", rollback_id, "--follow", *auth)
    assert "completed" in out and "committed 3" in out, out
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    back = client.rollout(rollback_id)
    assert back.rollback and back.stage_sizes == (2, 3) and back.policy == state_policy(state)

    # From the shell, with --to: a rollback never goes forward (2.0.0 is a push now), and says where it may go.
    forward = CliRunner().invoke(cli, ["rollout", "rollback", "--group", "cams", "--to", "2.0.0", *auth])
    assert forward.exit_code != 0 and "digits 2.0.0 is newer than 1.0.0, the version group 'cams' runs now" in \
        forward.output and "it ran no version of digits older than 1.0.0" in forward.output, forward.output
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)
    unknown = CliRunner().invoke(cli, ["rollout", "rollback", "--group", "nobody", *auth])
    assert unknown.exit_code != 0 and "group 'nobody' has no rollout to roll back" in unknown.output, unknown.output
