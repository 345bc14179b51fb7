"""The operator console over HTTP: login, pages from a real server with real agents, CSRF, actions, live progress."""

from __future__ import annotations

import html
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request

from edgesdk.fleet.records import RolloutPolicy, TargetStatus
from edgesdk.ota_server.console.display import board
from edgesdk.ota_server.console.session import COOKIE, Sessions
from edgesdk.ota_server.store.fleet_db import DeviceState
from tests.ota.conftest import wait_for
from tests.ota.console_client import TOKEN, ConsoleClient


def canary_rollout(server) -> str:
    """digits 2.0.0 to one of the three ``cams`` devices, held there (an hour's health window): its id."""
    return server.start_rollout("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.3, waves=(1.0,),
                                                                         health_window_s=3600))


def logged_in(running) -> ConsoleClient:
    client = ConsoleClient(running.url)
    assert client.login(TOKEN).url.endswith("/ui/")
    return client


def test_a_wrong_token_is_refused_and_every_page_needs_the_session(console_fleet):
    running, _ = console_fleet
    client = ConsoleClient(running.url)
    assert client.get("/ui/").url.endswith("/ui/login")  # sent to the login page
    refused = client.login("not-the-token")
    assert refused.status == 401 and "wrong or missing admin token" in refused.html and client.cookie(COOKIE) is None
    assert client.get("/ui/rollouts/x/live").status == 403
    # The login form's double-submit token: a login posted from elsewhere (no cookie) is refused even with the token.
    assert ConsoleClient(running.url).post("/ui/login", {"login": "guess", "token": TOKEN}).status == 401
    client.login(TOKEN)
    cookie = client.cookie(COOKIE)
    assert cookie is not None and cookie.has_nonstandard_attr("HttpOnly") and cookie.path == "/ui"
    raw = urllib.request.urlopen(urllib.request.Request(f"{running.url}/ui/login"))
    assert "frame-ancestors 'none'" in raw.headers["Content-Security-Policy"]


def test_the_session_cookie_is_signed_expires_and_is_revoked_at_logout():
    clock = [1000.0]
    sessions = Sessions("tok", lifetime_s=60, clock=lambda: clock[0])
    assert sessions.login("wrong") is None
    cookie = sessions.login("tok")
    nonce = sessions.nonce(cookie)
    assert nonce and sessions.csrf_ok(nonce, sessions.csrf(nonce)) and not sessions.csrf_ok(nonce, "x" * 64)
    expires, rest = cookie.split(".", 1)
    assert sessions.nonce(f"{int(expires) + 3600}.{rest}") is None  # a lengthened expiry breaks the signature
    assert Sessions("other-token").nonce(cookie) is None  # a new admin token ends every session
    clock[0] += 61
    assert sessions.nonce(cookie) is None
    clock[0] -= 61
    sessions.logout(nonce)
    assert sessions.nonce(cookie) is None


def test_fleet_device_rollout_and_repository_pages_show_the_real_fleet(console_fleet):
    running, _ = console_fleet
    client = logged_in(running)
    home = client.get("/ui/")
    assert home.status == 200 and "cams" in home.html and "lobby" in home.html
    assert "digits 1.0.0: 3" in home.html and "online 3" in home.html and "Devices (4)" in home.html
    lobby = client.get("/ui/?group=lobby")
    assert "door" in lobby.html and "cam0" not in lobby.html.split("Devices in lobby")[1]
    device = client.get("/ui/devices/cam1")
    assert device.status == 200 and "digits 1.0.0" in device.html and "committed" in device.html
    assert "MB free" in device.html  # the disk figures of its state report, kept as its details
    assert client.get("/ui/devices/nobody").status == 404
    rollouts = client.get("/ui/rollouts")
    assert rollouts.html.count("completed") >= 2
    repository = client.get("/ui/repository")
    assert "2.0.0" in repository.html and "1.0.0" in repository.html and "onnx-fp32" in repository.html
    assert "unsigned" not in repository.html  # the bundles carry the converter's signature


def test_a_devices_runtime_figures_and_offload_paths_are_shown_even_when_some_are_missing(console_fleet):
    running, _ = console_fleet
    details = {"runtime": {"count": 120, "errors": 1, "p50_ms": 21.5, "p99_ms": 48.25,
                           "paths": {"local": {"count": 100, "errors": 0, "p99_ms": 47.0}, "cloud": {"count": 20}},
                           "refused": 2, "fallbacks": 1, "breaker": "closed"}}
    running.ota.db.upsert_devices([DeviceState("cam9", "cams", "online", "digits", "1.0.0", (), time.time(),
                                               details=json.dumps(details))])
    page = logged_in(running).get("/ui/devices/cam9")
    assert page.status == 200 and "48.25" in page.html and "47.0" in page.html and "breaker closed" in page.html
    assert "Refused 2, cloud fallbacks 1" in page.html


def test_a_rollout_page_compares_latency_and_offload_share_per_version_on_its_devices(console_fleet):
    running, _ = console_fleet
    server = running.ota
    rollout = canary_rollout(server)
    wait_for(lambda: server.db.device("cam0").version and len({d.version for d in server.db.devices("cams")}) == 2,
             timeout=60, what="the canary on 2.0.0 and the others on 1.0.0")
    figures = {"1.0.0": (40.0, 90, 10), "2.0.0": (30.0, 75, 25)}  # p99 ms, local and cloud requests
    states = [DeviceState(d.id, "cams", "online", "digits", d.version, (), time.time(), details=json.dumps(
        {"runtime": {"p99_ms": figures[d.version][0] + i, "paths": {"local": {"count": figures[d.version][1]},
                                                                    "cloud": {"count": figures[d.version][2]}}}}))
              for i, d in enumerate(server.db.devices("cams"))]
    server.db.upsert_devices(states)
    table = logged_in(running).get(f"/ui/rollouts/{rollout}").html.split('id="versions-heading"')[1]
    rows = {cells[0]: cells[1:] for cells in (re.findall(r"<td>([^<]*)</td>", row)
                                              for row in re.findall(r"<tr><td>.*?</tr>", table))}
    old_p99 = statistics.median(s.details and json.loads(s.details)["runtime"]["p99_ms"] for s in states
                                if s.version == "1.0.0")
    new_p99 = next(json.loads(s.details)["runtime"]["p99_ms"] for s in states if s.version == "2.0.0")
    # version: devices, reporting, median p99, offload share (cloud / all requests of its devices)
    assert rows["1.0.0"] == ["2", "2", f"{round(old_p99, 2)}", "10%"]
    assert rows["2.0.0"] == ["1", "1", f"{round(new_p99, 2)}", "25%"]


def _row(html: str, marker: str) -> list[str]:
    """The text of each cell of the table row that carries ``marker`` (tags dropped, spaces squeezed)."""
    row = re.search(rf"<tr {re.escape(marker)}.*?</tr>", html, flags=re.S).group(0)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def _live_progress(running, client: ConsoleClient, rollout: str) -> dict:
    request = urllib.request.Request(f"{running.url}/ui/rollouts/{rollout}/live",
                                     headers={"Cookie": f"{COOKIE}={client.cookie(COOKIE).value}"})
    with urllib.request.urlopen(request, timeout=30) as stream:
        for raw in stream:
            if raw.startswith(b"data: "):
                return json.loads(raw[len(b"data: "):])
    raise AssertionError("the stream ended")


#: The groups page's Per board cell of a group of three agents on this host: the release's bundle for its board.
PER_BOARD = "generic-x86_64 (x86_64): generic-x86_64 bundle, {}/3"


def test_the_groups_view_and_a_rollout_page_show_deferred_late_and_flagged_releases(console_fleet, make_agent, broker):
    running, agents = console_fleet
    server = running.ota
    client = logged_in(running)
    groups = client.get("/ui/groups")
    assert groups.status == 200 and 'href="/ui/groups"' in groups.html
    # group, release, devices, converged, behind online, behind offline, running now, since
    assert _row(groups.html, 'data-group="cams"')[:8] == ["cams", "digits 1.0.0", PER_BOARD.format(3), "3", "3", "0",
                                                          "0", ""]
    assert _row(groups.html, 'data-group="lobby"')[:5] == ["lobby", "digits 1.0.0",
                                                           "generic-x86_64 (x86_64): generic-x86_64 bundle, 1/1", "1", "1"]
    assert "flagged" not in groups.html.split("<h1>")[1].split("<table")[0]

    agents[2].stop()  # cam2 is away for the push: deferred, not failed
    wait_for(lambda: server.db.device("cam2").status == "offline", what="cam2 offline")
    push = server.start_rollout("digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,),
                                                                         health_window_s=0))
    wait_for(lambda: server.status(push, targets=False).state == "completed", timeout=60, what="the push")
    groups = client.get("/ui/groups")
    assert _row(groups.html, 'data-group="cams"')[:7] == ["cams", "digits 2.0.0", PER_BOARD.format(2), "3", "2", "0",
                                                          "1"]
    page = client.get(f"/ui/rollouts/{push}")
    assert re.search(r'<dd id="deferred"[^>]*>1</dd>', page.html) and '<dd id="late">none</dd>' in page.html
    assert re.search(r'id="flagged" hidden', page.html), "no banner for a release nobody flagged"
    live = _live_progress(running, client, push)
    assert live["deferred"] == 1 and live["late"] == {} and live["flagged"] is None

    make_agent("cam2", broker.url)  # back: it gets the release late
    wait_for(lambda: server.status(push, targets=False).late_counts.get(TargetStatus.COMMITTED) == 1, timeout=60,
             what="cam2's late commit")
    reason = "3 of 4 late installs failed (> 20%); each device rolled back on its own"
    assert server.db.flag_release(push, reason)  # as the reconciler flags a release
    page = client.get(f"/ui/rollouts/{push}")
    assert re.search(r'<dd id="deferred"[^>]*>0</dd>', page.html) and "committed 1" in page.html.split('id="late"')[1]
    assert not re.search(r'id="flagged" hidden', page.html) and html.escape(reason) in page.html
    assert _live_progress(running, client, push)["flagged"] == reason
    groups = client.get("/ui/groups")
    assert _row(groups.html, 'data-group="cams"')[:7] == ["cams", "digits 2.0.0 flagged", PER_BOARD.format(3), "3",
                                                          "3", "0", "0"]
    assert "cams: release digits 2.0.0 flagged." in groups.html and html.escape(reason) in groups.html


def test_a_forged_post_without_the_csrf_token_is_refused_and_changes_nothing(console_fleet):
    running, _ = console_fleet
    server = running.ota
    rollout = canary_rollout(server)
    client = logged_in(running)
    forged = client.post(f"/ui/rollouts/{rollout}/abort", {"confirm": "yes"})
    assert forged.status == 403 and "CSRF" in forged.html
    wrong = client.post(f"/ui/rollouts/{rollout}/abort", {"confirm": "yes", "csrf": "0" * 64})
    assert wrong.status == 403
    assert server.status(rollout, targets=False).state == "running"


def test_abort_from_the_console_asks_first_then_takes_the_apis_path_and_devices_roll_back(console_fleet):
    running, agents = console_fleet
    server = running.ota
    rollout = canary_rollout(server)
    wait_for(lambda: sum(a.current_version() == ("digits", "2.0.0") for a in agents) == 1, timeout=60,
             what="the canary on 2.0.0")
    client = logged_in(running)
    page = client.get(f"/ui/rollouts/{rollout}")
    assert "canary" in page.html and "running" in page.html
    action = f"/ui/rollouts/{rollout}/abort"
    confirm = client.post(action, {"csrf": page.field("csrf", action)})
    assert confirm.status == 200 and "Yes, abort" in confirm.html
    assert server.status(rollout, targets=False).state == "running"  # nothing happens before the confirmation
    done = client.post(action, {"csrf": confirm.field("csrf", action), "confirm": "yes"})
    assert done.status == 200 and done.url.endswith(f"/ui/rollouts/{rollout}")
    assert server.status(rollout, targets=False).state == "aborted"
    wait_for(lambda: all(a.current_version() == ("digits", "1.0.0") for a in agents[:3]), timeout=60,
             what="the canary back on 1.0.0")
    assert "aborted from the console" in client.get(f"/ui/rollouts/{rollout}").html


def test_the_live_view_streams_a_stage_change_as_it_happens(console_fleet):
    running, agents = console_fleet
    server = running.ota
    rollout = canary_rollout(server)
    client = logged_in(running)
    cookie = client.cookie(COOKIE)
    request = urllib.request.Request(f"{running.url}/ui/rollouts/{rollout}/live",
                                     headers={"Cookie": f"{COOKIE}={cookie.value}"})
    with urllib.request.urlopen(request, timeout=30) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")

        def next_progress() -> dict:
            for raw in stream:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    return json.loads(line[len("data: "):])
            raise AssertionError("the stream ended")

        first = next_progress()
        assert first["state"] == "running"
        server.promote(rollout)  # the second stage goes out: the stream says so without being asked again
        seen = first
        while not (seen["stage"] == 1 and seen["stages"][1]["sent"]):
            seen = next_progress()
    assert seen["stages"][0]["size"] == 1 and seen["stages"][1]["size"] == 2


def test_the_console_is_not_imported_unless_it_is_enabled():
    code = ("import sys, edgesdk.ota_server.app, edgesdk.ota_server.admin.http_api, edgesdk.cli.server; "
            "print(sorted(m for m in sys.modules if m.startswith('edgesdk.ota_server.console') or m == 'jinja2'))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_edgesdk_server_with_ui_serves_the_console_from_the_command_line(tmp_path, keys):
    import os
    import signal
    from pathlib import Path

    from edgesdk.ota_server.broker import free_port

    port = free_port()
    with open(tmp_path / "server.log", "ab") as log:
        process = subprocess.Popen([str(Path(sys.executable).parent / "edgesdk"), "server", "--embedded-broker",
                                    "--repo", str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"),
                                    "--key", str(keys["dir"] / "server.key"), "--allow-unsigned",
                                    "--http", f"127.0.0.1:{port}", "--token", TOKEN, "--ui"],
                                   stdout=log, stderr=log, env={k: v for k, v in os.environ.items()
                                                                if k != "PYTHONWARNINGS"})
    try:
        client = ConsoleClient(f"http://127.0.0.1:{port}")

        def answering() -> bool:
            try:
                return client.get("/ui/login").status == 200
            except OSError:
                return False

        wait_for(answering, timeout=30, what="the console of `edgesdk server --ui`")
        assert client.login(TOKEN).url.endswith("/ui/") and "No device has reported yet" in client.get("/ui/").html
        assert "No group yet" in client.get("/ui/groups").html
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert f"console http://127.0.0.1:{port}/ui/" in (tmp_path / "server.log").read_text()


def _visible(page_html: str) -> str:
    """The page's text as a reader sees it: tags and their attributes dropped, the script and style left out."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page_html, flags=re.S)
    return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", body).split()))


ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def test_every_time_on_every_page_is_relative_with_its_iso_utc_time_on_hover(console_fleet):
    running, _ = console_fleet
    rollout = canary_rollout(running.ota)
    client = logged_in(running)
    for path in ("/ui/", "/ui/devices/cam1", "/ui/groups", "/ui/rollouts", f"/ui/rollouts/{rollout}"):
        page = client.get(path).html
        times = re.findall(r"<time ([^>]*)>([^<]*)</time>", page)
        assert times, f"{path} shows no time"
        for attributes, words in times:
            assert re.fullmatch(rf'datetime="({ISO})" title="\1"', attributes), (path, attributes)
            assert re.fullmatch(r"\d+ (s|min|h|d) ago", words), (path, words)
        text = _visible(page)
        assert not re.search(r"\d{4}-\d\d-\d\d", text), f"{path} shows a date as text"
        assert not re.search(r"\d:\d\d(:\d\d)?\s*(AM|PM|UTC)?", text), f"{path} shows a clock time"


def test_the_login_page_says_where_the_admin_token_is(console_fleet):
    running, _ = console_fleet
    page = ConsoleClient(running.url).get("/ui/login")
    hint = _visible(page.html.split('id="token-where"')[1].split("</p>")[0])
    # As `edgesdk server` takes it (edgesdk/cli/server.py): --token / EDGESDK_TOKEN, else --token-file, by default
    # admin.token beside a SQLite --db.
    for where in ("--token", "EDGESDK_TOKEN", "--token-file", "admin.token", "--db"):
        assert where in hint, where
    assert 'aria-describedby="token-where"' in page.html


def test_an_events_detail_never_repeats_its_event_on_a_device_page(console_fleet):
    running, _ = console_fleet
    page = logged_in(running).get("/ui/devices/cam1").html
    table = page.split('Last events')[1].split("</table>")[0]
    rows = [[" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr><td>.*?</tr>", table, re.S)]
    assert rows and all(len(r) == 4 for r in rows)
    assert any(event == "committed" for _, event, _, _ in rows)
    for _, event, _, detail in rows:
        assert detail != event and not detail.startswith(event), (event, detail)


def _rollout_row(client: ConsoleClient, rollout: str) -> list[str]:
    return _row(client.get("/ui/rollouts").html, f'data-rollout="{rollout}"')


def _actions(client: ConsoleClient, rollout: str) -> tuple[list[str], str]:
    page = client.get(f"/ui/rollouts/{rollout}").html
    section = page.split('id="actions-heading"')[1].split("</section>")[0]
    note = re.search(r'<p class="muted" id="no-rollback">(.*?)</p>', section, re.S)
    return re.findall(r'<button type="submit" class="(\w+)"', section), html.unescape(note.group(1)) if note else ""


def test_the_rollouts_list_marks_rollbacks_and_reasons_and_rollback_is_offered_only_where_it_undoes_something(
        console_fleet):
    from tests.ota.conftest import rollout_to

    running, agents = console_fleet
    server = running.ota
    client = logged_in(running)
    first = next(r.id for r in server.db.rollouts() if r.group == "cams")  # the fixture's 1.0.0 to cams
    second = rollout_to(server, "2.0.0").id
    assert _actions(client, second) == (["rollback"], "")  # the group's release, committed: undoing it does something
    buttons, why = _actions(client, first)
    assert buttons == [] and f"moved on to digits 2.0.0 (rollout {second})" in why

    back = server.rollback(second)
    wait_for(lambda: server.status(back, targets=False).state == "completed", timeout=60, what="the rollback")
    assert _rollout_row(client, back)[0] == f"{back} rollback" and _rollout_row(client, second)[0] == second
    buttons, why = _actions(client, back)  # the group ran nothing older than 1.0.0; 2.0.0 is forward (a push)
    nothing_older = "it ran no version of digits older than 1.0.0 that the repository holds"
    assert buttons == [] and nothing_older in why
    page = client.get(f"/ui/rollouts/{back}")
    refused = client.post(f"/ui/rollouts/{back}/rollback", {"csrf": page.field("csrf", "/ui/logout")})
    assert refused.status == 409 and nothing_older in html.unescape(refused.html)
    assert len(server.db.rollouts()) == 4  # nothing started

    aborted = canary_rollout(server)
    wait_for(lambda: sum(a.current_version() == ("digits", "2.0.0") for a in agents) == 1, timeout=60,
             what="the canary on 2.0.0")
    server.abort(aborted, "p99 regression seen by the operator")
    wait_for(lambda: server.status(aborted, targets=False).count(TargetStatus.REVERTED) == 1, timeout=60,
             what="the canary reverted")
    row = _rollout_row(client, aborted)
    assert row[4] == "aborted" and row[5] == "1 of 2" and row[7] == "p99 regression seen by the operator"
    buttons, why = _actions(client, aborted)
    assert buttons == [] and "aborted and its updated devices were sent back" in why
    assert client.post(f"/ui/rollouts/{aborted}/rollback",
                       {"csrf": page.field("csrf", "/ui/logout")}).status == 409


def test_a_rollout_page_numbers_stages_from_one_and_shows_its_verdict_statuses_artifacts_and_boards(console_fleet):
    running, _ = console_fleet
    server = running.ota
    rollout = canary_rollout(server)
    wait_for(lambda: server.status(rollout, targets=False).count(TargetStatus.COMMITTED) == 1, timeout=60,
             what="the canary committed")
    client = logged_in(running)
    page = client.get(f"/ui/rollouts/{rollout}").html
    assert _row(page, 'data-stage="0"')[0] == "1 of 2 (canary)"
    assert _row(page, 'data-stage="1"')[0] == "2 of 2 (not sent yet)"
    record = server.status(rollout)
    for t in record.targets:  # each target: its device's board, stage k of 2, status, the artifact it gets
        cells = _row(page, f'data-device="{t.device_id}"')
        assert cells[2] == f"{t.stage + 1} of 2" and cells[3] == t.status.value and cells[4] == (t.artifact or "—")
        found = server.db.device(t.device_id)
        assert cells[1] == board(found.profile, found.arch)
    assert 'id="verdict"' not in page or "Canary verdict, stage 1 of 2" in page  # the engine's own, if judged

    verdict = {"stage": 1, "version": "2.0.0", "passed": False, "reason": "p99 17.6 ms is 3.27x the baseline (> 1.5x)",
               "canary": {"devices": 1, "p99_ms": 17.6, "error_rate": 0.0},
               "baseline": {"devices": 2, "p99_ms": 5.39, "error_rate": 0.0, "source": "live"},
               "checks": [{"name": "p99_ratio", "value": 3.27, "canary": 17.6, "baseline": 5.39, "limit": 1.5,
                           "passed": False}], "limits": {"max_p99_ratio": 1.5}}
    assert server.db.set_verdict(rollout, 0, verdict, None)
    later = [t.device_id for t in record.targets if t.stage == 1]
    server.db.set_target(rollout, later[0], TargetStatus.NO_ARTIFACT)
    server.db.set_target(rollout, later[1], TargetStatus.FAILED, "health check failed")
    page = client.get(f"/ui/rollouts/{rollout}").html
    section = page.split('id="verdict"')[1].split("</section>")[0]
    assert "Canary verdict, stage 1 of 2" in _visible(section) and 'id="verdict-result">failed<' in section
    assert html.escape(verdict["reason"]) in section
    figures = {name: (canary, baseline) for name, canary, baseline in
               re.findall(r'<th scope="row">(\w+)</th><td>([^<]*)</td><td>([^<]*)</td>', section)}
    assert figures["p99_ms"] == ("17.6", "5.39") and figures["devices"] == ("1", "2")
    assert "1.5" in section.split('id="verdict-checks"')[1] and "max_p99_ratio 1.5" in section
    stage_two = _row(page, 'data-stage="1"')
    assert "no artifact 1" in stage_two[3] and "failed 1" in stage_two[3]
    failures = page.split('id="failures"')[1].split("</table>")[0]
    assert re.search(rf">{later[1]}</a></td><td>2 of 2</td>", failures) and later[0] not in failures
    assert '>0</td>' not in failures


def test_devices_show_their_board_and_unknown_while_the_agent_has_not_said(console_fleet):
    running, _ = console_fleet
    server = running.ota
    server.db.upsert_devices([
        DeviceState("pi5", "yard", "online", "digits", "1.0.0", (), time.time(), profile="raspberry-pi-5",
                    arch="aarch64"),
        DeviceState("old-agent", "yard", "online", "digits", "1.0.0", (), time.time())])
    client = logged_in(running)
    fleet = client.get("/ui/?group=yard").html
    # device, group, status, board, model, version, last seen
    assert _row(fleet, 'data-device="pi5"')[3] == "raspberry-pi-5 (aarch64)"
    assert _row(fleet, 'data-device="old-agent"')[3] == "unknown"
    assert '<dd id="board">raspberry-pi-5 (aarch64)</dd>' in client.get("/ui/devices/pi5").html
    assert '<dd id="board">unknown</dd>' in client.get("/ui/devices/old-agent").html
