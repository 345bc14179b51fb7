"""Issue 58's fleet rules on a real server (admin API and console), a real mosquitto and real agents: the rollback
rules refuse alike through the CLI and the console, an allowed rollback goes out all at once when asked, and a
flagged release sends nothing to a device that comes back until the operator resumes it from the CLI."""

from __future__ import annotations

import html
import json

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ConflictError
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy, TargetStatus
from tests.ota.conftest import wait_for
from tests.ota.console_client import TOKEN, ConsoleClient

#: One stage to the whole group, analysis off: these agents serve no app traffic to judge.
ONE_STAGE = RolloutPolicy(canary=1.0, waves=(1.0,), health_window_s=0, analysis=False)


@pytest.fixture
def fleet(broker, start_server, make_agent, bundles):
    """A server with its admin API and console, agents cam0 and cam1 in ``cams``, bundles 1.0.0 and 2.0.0 stored."""
    running = start_server(broker.url, token=TOKEN, console=True)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: running.ota.db.device_total(status="online") == 2, what="2 devices online")
    for version in ("1.0.0", "2.0.0"):
        running.ota.upload(pack_bundle(bundles[version]))
    return running, agents


def _push(server, version):
    rollout_id = server.start_rollout("digits", version, "cams", ONE_STAGE)
    wait_for(lambda: server.status(rollout_id, targets=False).state != "running", timeout=60, what=version)
    return server.status(rollout_id, targets=False)


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def _actions(client: ConsoleClient, rollout_id: str) -> tuple[list[str], str]:
    import re

    section = client.get(f"/ui/rollouts/{rollout_id}").html.split('id="actions-heading"')[1].split("</section>")[0]
    note = re.search(r'<p class="muted" id="no-rollback">No rollback: (.*?)\.</p>', section, re.S)
    return re.findall(r'<button type="submit" class="(\w+)"', section), html.unescape(note.group(1)) if note else ""


def test_a_rollback_the_rules_refuse_is_refused_with_the_same_words_by_the_cli_and_the_console(fleet):
    running, agents = fleet
    server = running.ota
    first, second = _push(server, "1.0.0"), _push(server, "2.0.0")
    assert second.state == "completed" and all(a.current_version() == ("digits", "2.0.0") for a in agents)
    auth = ["--server", running.url, "--token", TOKEN]
    never_ran = ("group 'cams' never ran digits 9.9.9: a rollback goes only to a version the group ran; it may go "
                 "to digits 1.0.0")
    out = _invoke("rollout", "rollback", second.id, "--to", "9.9.9", *auth)
    assert out.exit_code == ConflictError.exit_code and never_ran in out.output, out.output

    client = ConsoleClient(running.url)
    assert client.login(TOKEN).url.endswith("/ui/")
    action = f"/ui/rollouts/{second.id}/rollback"
    confirm = client.post(action, {"csrf": client.get(f"/ui/rollouts/{second.id}").field("csrf", action)})
    assert confirm.status == 200 and "Yes, rollback" in confirm.html, "the release may be rolled back"
    refused = client.post(action, {"csrf": confirm.field("csrf", action), "confirm": "yes", "to": "9.9.9"})
    assert refused.status == 409 and html.unescape(refused.html).count(never_ran) == 1, refused.html

    # A rollback of the superseded 1.0.0: the console's note is the API's refusal, word for word.
    buttons, why = _actions(client, first.id)
    assert "rollback" not in buttons and "is no longer group 'cams''s release" in why
    with pytest.raises(ConflictError) as api:
        AdminClient(running.url, TOKEN).act(first.id, "rollback")
    assert str(api.value) == f"server answered 409: {why}"
    newer = _invoke("rollout", "rollback", "--group", "cams", "--to", "2.0.0", *auth)
    assert newer.exit_code != 0 and "digits 2.0.0 is the version group 'cams' runs now" in newer.output
    assert len(server.db.rollouts()) == 2, "nothing refused started anything"

    out = _invoke("rollout", "rollback", "--group", "cams", "--all-at-once", "--wait", "60", "--json", *auth)
    assert out.exit_code == 0, out.output
    back = json.loads(out.stdout)
    assert (back["version"], back["rollback"], back["stages"], back["policy"]["analysis"]) == ("1.0.0", True, [2],
                                                                                               False)
    assert all(a.current_version() == ("digits", "1.0.0") for a in agents)


def test_a_flagged_release_sends_nothing_to_a_device_back_online_until_resumed_from_the_cli(fleet, make_agent,
                                                                                           broker):
    running, agents = fleet
    server = running.ota
    _push(server, "1.0.0")
    agents[1].stop()  # away for the push: deferred
    wait_for(lambda: server.db.device("cam1").status == "offline", what="cam1 offline")
    push = _push(server, "2.0.0")
    reason = "3 of 4 late installs failed (> 20%); each device rolled back on its own"
    assert server.db.flag_release(push.id, reason)  # as the reconciler flags a release
    client = ConsoleClient(running.url)
    client.login(TOKEN)
    assert "resume" in _actions(client, push.id)[0], "the console offers Resume on a flagged release"

    back = make_agent("cam1", broker.url)  # comes back on 1.0.0
    wait_for(lambda: server.db.device("cam1").status == "online" and not server.db.to_reconcile("cams", 10),
             what="cam1 back and passed over")
    target = next(t for t in server.status(push.id).targets if t.device_id == "cam1")
    assert target.status == TargetStatus.DEFERRED and back.current_version() == ("digits", "1.0.0")

    auth = ["--server", running.url, "--token", TOKEN]
    out = _invoke("rollout", "resume", push.id, *auth)
    assert out.exit_code == 0 and f"catch-up goes on (it was flagged: {reason})" in out.output, out.output
    wait_for(lambda: server.status(push.id, targets=False).late_counts.get(TargetStatus.COMMITTED) == 1, timeout=60,
             what="cam1's late commit")
    assert back.current_version() == ("digits", "2.0.0")
    status = json.loads(_invoke("rollout", "status", push.id, "--json", *auth).stdout)
    assert status["flagged"] is None and status["late"] == {"committed": 1}, status
    assert [e.payload["flag"] for e in server.db.events(push.id) if e.type == "release_resumed"] == [reason]
    assert "resume" not in _actions(client, push.id)[0]
    again = _invoke("rollout", "resume", push.id, *auth)
    assert again.exit_code != 0 and f"rollout {push.id} is not flagged" in again.output
