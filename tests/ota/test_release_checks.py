"""Checks before anything is sent (issue 37): another model needs --replace, other inputs or outputs need
--allow-signature-change, and one push takes a release's bundles for several boards (real server with its admin
API, real broker, real agents, the CLI as an operator runs it)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ReleaseCheckError
from edgesdk.testing import random_mlp
from tests.ota.conftest import FAST, make_bundle, rollout_to, wait_for

POLICY = ["--canary", "100%", "--health-window", "0s", "--max-failure-rate", "0%"]


@pytest.fixture(scope="module")
def others(tmp_path_factory, keys):
    """Bundles a group running digits 1.0.0 must not get by accident: another model with the same inputs and
    outputs, and digits 2.0.0 with 5 outputs instead of 10; and digits 2.0.0 for two boards."""
    folder = tmp_path_factory.mktemp("release-checks")
    return {"faces": make_bundle(folder / "faces", "1.0.0", keys, seed=4, name="faces"),
            "five": make_bundle(folder / "five", "2.0.0", keys, weights=random_mlp([64, 32, 5], seed=5)),
            "x86": make_bundle(folder / "x86", "2.0.0", keys, seed=2),
            "pi5": make_bundle(folder / "pi5", "2.0.0", keys, seed=2, profile="raspberry-pi-5")}


@pytest.fixture
def fleet(broker, start_server, make_agent, bundles):
    """A server with its admin API and three agents on digits 1.0.0 (two detect this host, one is a Pi 5)."""
    running = start_server(broker.url, token="t")
    running.ota.repo.add(bundles["1.0.0"])
    agents = [make_agent("cam01", broker.url), make_agent("cam02", broker.url),
              make_agent("cam03", broker.url, profile="raspberry-pi-5")]
    wait_for(lambda: len(running.ota.db.devices("cams")) == 3, what="three devices")
    # 1.0.0 has only a generic-x86_64 bundle: the Pi 5 (aarch64) is left without (no_artifact).
    first = rollout_to(running.ota, "1.0.0")
    assert first.state == "completed", first.reason
    return running, agents


def _push(running, *args: str):
    return CliRunner().invoke(cli, ["push", *args, "--group", "cams", "--no-analysis", *POLICY, "--server", running.url,
                                    "--token", "t"])


def test_another_model_is_refused_without_replace_and_nothing_is_sent(fleet, others):
    running, agents = fleet
    before = len(running.ota.db.rollouts())

    refused = _push(running, str(others["faces"]))

    assert refused.exit_code == ReleaseCheckError.exit_code, refused.output
    assert "group 'cams' runs model digits 1.0.0" in refused.output and "--replace digits" in refused.output
    assert len(running.ota.db.rollouts()) == before
    assert _push(running, str(others["faces"]), "--replace", "other").exit_code == ReleaseCheckError.exit_code
    replaced = _push(running, str(others["faces"]), "--replace", "digits", "--wait", "60")
    assert replaced.exit_code == 0, replaced.output
    assert {a.current_version() for a in agents[:2]} == {("faces", "1.0.0")}


def test_other_outputs_are_refused_without_allow_signature_change_and_the_push_prints_the_difference(fleet, others):
    running, agents = fleet

    refused = _push(running, str(others["five"]))

    assert refused.exit_code == ReleaseCheckError.exit_code, refused.output
    assert "output probabilities: float32[?, 10] -> float32[?, 5]" in refused.output, refused.output
    assert "--allow-signature-change" in refused.output
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents[:2])
    allowed = _push(running, str(others["five"]), "--allow-signature-change", "--wait", "60")
    assert allowed.exit_code == 0, allowed.output
    assert "signature change (allowed): output probabilities: float32[?, 10] -> float32[?, 5]" in allowed.stderr


def test_one_push_of_two_boards_bundles_sends_each_board_its_own(fleet, others):
    running, agents = fleet
    assert agents[2].current_version() is None  # 1.0.0 has no Pi 5 artifact: the Pi 5 was left alone

    pushed = CliRunner().invoke(cli, ["push", str(others["x86"]), str(others["pi5"]), "--group", "cams", "--no-analysis", *POLICY,
                                      "--wait", "60", "--json", "--server", running.url, "--token", "t"])

    assert pushed.exit_code == 0, pushed.output
    assert "for generic-x86_64" in pushed.stderr and "for raspberry-pi-5" in pushed.stderr
    done = running.ota.status(json.loads(pushed.stdout)["id"])
    assert {t.device_id: t.artifact for t in done.targets} == {"cam01": "generic-x86_64", "cam02": "generic-x86_64",
                                                               "cam03": "raspberry-pi-5"}
    assert all(a.current_version() == ("digits", "2.0.0") for a in agents)
    groups = CliRunner().invoke(cli, ["groups", "--server", running.url, "--token", "t"])
    assert ("cams digits 2.0.0 per board: generic-x86_64 (x86_64): generic-x86_64 bundle, 2/2 on it; "
            "raspberry-pi-5 (aarch64): raspberry-pi-5 bundle, 1/1 on it") in groups.output, groups.output


def test_bundles_of_two_releases_are_one_push_too_many(others):
    out = CliRunner().invoke(cli, ["push", str(others["x86"]), str(others["faces"]), "--group", "cams", "--no-analysis",
                                   "--server", "http://127.0.0.1:9", "--token", "t"])
    assert out.exit_code == 2 and "push one name and version at a time" in out.output, out.output


def test_replace_naming_a_model_the_group_does_not_run_is_refused(fleet):
    running, _ = fleet
    assert running.ota.release_check("digits", "1.0.0", "cams").running_model == "digits"
    with pytest.raises(ReleaseCheckError, match="group 'empty' runs no model yet, so there is nothing named digits"):
        running.ota.start_rollout("digits", "1.0.0", "empty", FAST, replace="digits")
