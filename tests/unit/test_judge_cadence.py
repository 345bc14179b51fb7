"""``judge_s`` in the signed command, and the agent's cadence: fast (``traffic_every_s``) after
committing a judged command until it passes, with the apps told to write as often; the low default
otherwise."""

from __future__ import annotations

import base64
import json
import math
import time

import pytest
from click.testing import CliRunner

from edgesdk.agent.agent import DeviceAgent
from edgesdk.agent.app_file import APPS_DIR, CADENCE_FILE
from edgesdk.agent.config import AgentConfig
from edgesdk.agent.report_cadence import ReportCadence
from edgesdk.agent.store import PendingInstall
from edgesdk.cli.agent import agent as agent_command
from edgesdk.errors import EdgeSDKError, TransferError
from edgesdk.fleet.protocol import MAX_JUDGE_S, ArchiveInfo, Command, parse_command, sign_command
from edgesdk.fleet.records import AgentEvent
from edgesdk.runtime.signing import (
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    sign,
)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge-keys")
    generate_keypair(folder, "server")
    return load_private_key(folder / "server.key"), load_public_key(folder / "server.pub")


def _deploy(keys, judge_s=None) -> Command:
    envelope = sign_command(keys[0], type="deploy", deployment_id="d2", transfer_id="t2",
                            name="digits", version="2.0.0", group="cams",
                            archive=ArchiveInfo.of(b"x" * 100, chunk_size=64), judge_s=judge_s)
    command = parse_command(envelope, keys[1])
    assert isinstance(command, Command)
    return command


def test_judge_s_travels_signed_in_the_command(keys):
    assert _deploy(keys, 330).judge_s == 330.0
    assert _deploy(keys).judge_s is None


@pytest.mark.parametrize("value", [0, -5.0, MAX_JUDGE_S + 1, math.nan, math.inf, True, "600"])
def test_an_out_of_range_judge_s_is_refused_when_signing_and_when_parsing(keys, value):
    with pytest.raises(TransferError, match="judge_s .* is out of range"):
        _deploy(keys, value)
    body = json.loads(base64.b64decode(json.loads(sign_command(
        keys[0], type="deploy", deployment_id="d3", transfer_id="t3", name="digits",
        version="2.0.0", group="cams",
        archive=ArchiveInfo.of(b"y" * 100, chunk_size=64)))["manifest"]))
    body["judge_s"] = value
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()  # NaN, Infinity as is
    envelope = json.dumps({"manifest": base64.b64encode(raw).decode(),
                           "signature": base64.b64encode(sign(keys[0], raw)).decode(),
                           "key_id": key_id(keys[1])}).encode()
    with pytest.raises(TransferError, match="judge_s .* is out of range"):
        parse_command(envelope, keys[1])


class Clocks:
    """Wall clock and monotonic clock, moved together by the test."""

    def __init__(self) -> None:
        self.now, self.mono = 1_700_000_000.0, 100.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


def test_the_cadence_is_low_then_fast_while_judged_then_low_again():
    clocks, told = Clocks(), []
    cadence = ReportCadence(300.0, 10.0, lambda until, every: told.append((until, every)),
                            clocks.wall, clocks.monotonic)
    assert cadence.every() == 300.0 and not cadence.due()
    clocks.advance(300)
    assert cadence.due() and not cadence.due()  # the next one is 300 s away
    clocks.advance(5)
    cadence.judge(None)  # a command without judge_s: nothing changes
    assert cadence.every() == 300.0 and told == []
    cadence.judge(60)
    assert cadence.every() == 10.0 and told == [(clocks.now + 60, 10.0)]
    clocks.advance(10)
    assert cadence.due()  # not 300 s after the last one: 10 s after the commit
    clocks.advance(5)
    cadence.judge(20)  # a shorter window cuts nothing and tells nobody
    assert len(told) == 1 and not cadence.due()
    published = 0
    for _ in range(60):
        clocks.advance(1)
        published += cadence.due()
    assert published == 5 and cadence.every() == 300.0  # 10 s apart, the last as the window ended
    clocks.advance(284)
    assert not cadence.due()
    clocks.advance(1)
    assert cadence.due()  # then 300 s apart again
    assert ReportCadence(None, 10.0, None, clocks.wall, clocks.monotonic).every() is None


@pytest.fixture
def agent(tmp_path):
    config = AgentConfig(device_id="cam0", group="cams", broker="mqtt://127.0.0.1:1",
                         store=tmp_path / "store", allow_unsigned=True)
    return DeviceAgent(config)  # not started: no broker needed to decide the cadence


def test_the_defaults_are_a_low_cadence_and_ten_seconds_while_judged(agent):
    assert (agent.config.state_interval_s, agent.config.traffic_every_s) == (300.0, 10.0)
    assert agent.reporter.cadence.every() == 300.0
    assert not (agent.store.root / APPS_DIR / CADENCE_FILE).exists()
    with pytest.raises(EdgeSDKError, match="traffic_every_s=0 is out of range"):
        AgentConfig(device_id="cam0", group="cams", broker="mqtt://127.0.0.1:1",
                    store=agent.store.root, traffic_every_s=0)


def test_the_agents_commit_of_a_judged_command_makes_it_report_fast_and_tells_the_apps(agent, keys):
    cadence_file = agent.store.root / APPS_DIR / CADENCE_FILE
    agent._event(_deploy(keys, 600), AgentEvent.FAILED, reason="x")  # only a commit is judged
    agent._event(_deploy(keys), AgentEvent.COMMITTED)  # not a judged command
    assert agent.reporter.cadence.every() == 300.0 and not cadence_file.exists()
    before = time.time()
    # A command for the version the device runs already: committed at once, and judged.
    agent._event(_deploy(keys, 120), AgentEvent.COMMITTED, already_installed=True)
    until = agent.reporter.cadence.judged_until
    assert before + 120 <= until <= time.time() + 120 and agent.reporter.cadence.every() == 10.0
    assert json.loads(cadence_file.read_text()) == {"every_s": 10.0, "until": until}


def test_an_install_keeps_judge_s_so_its_commit_after_a_restart_is_judged(agent):
    pending = PendingInstall("digits-2.0.0", "digits-1.0.0", "d2", "digits", "2.0.0", 90.0)
    assert PendingInstall.from_json(json.loads(json.dumps(pending.to_json()))) == pending
    assert PendingInstall.from_json({"slot": "digits-2.0.0", "previous": None}).judge_s is None
    agent._event(pending, AgentEvent.COMMITTED, apply_ms=12.0)  # the resumed install's outcome
    assert agent.reporter.cadence.judged_until >= time.time() + 80


def test_the_cli_says_both_cadences():
    text = CliRunner().invoke(agent_command, ["--help"], terminal_width=200).output
    assert "--traffic-every S" in text and "[default: 10.0;" in text
    assert "--state-every S" in text and "[default: 300.0;" in text
