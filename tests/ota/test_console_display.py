"""How the console writes times, stages, statuses, boards and a canary verdict (ota_server/console/display.py), and
what an event's Detail column says: pure functions, no server."""

from __future__ import annotations

import re
from pathlib import Path

from edgesdk.fleet.records import TargetStatus, iso_time
from edgesdk.ota_server.console import display
from edgesdk.ota_server.console.views import _event_detail

NOW = 1_790_000_000.0
STATIC = Path(display.__file__).resolve().parent / "static"


def test_one_time_style_relative_words_with_the_iso_utc_time_on_hover():
    assert [display.ago(s) for s in (0, 37, 59, 60, 3 * 60 + 59, 7200, 3 * 86400)] == [
        "0 s ago", "37 s ago", "59 s ago", "1 min ago", "3 min ago", "2 h ago", "3 d ago"]
    assert display.ago(-30) == "in 30 s"
    iso = iso_time(NOW - 37)
    expected = f'<time datetime="{iso}" title="{iso}">37 s ago</time>'
    assert str(display.when(NOW - 37, NOW)) == expected  # epoch seconds ...
    assert str(display.when(iso, NOW)) == expected  # ... or the API's ISO text: the same element
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", iso)
    assert [str(display.when(v, NOW)) for v in (None, "yesterday", float("nan"), True)] == ["—"] * 4


def test_the_live_script_writes_times_as_the_pages_do_never_as_a_local_clock():
    script = (STATIC / "console.js").read_text()
    assert "toLocaleTimeString" not in script and "toLocaleString" not in script
    assert 'time.dateTime = iso' in script and 'time.title = iso' in script


def test_stages_read_one_based_of_n_the_canary_being_stage_one():
    assert [display.stage_label(i, 3) for i in range(3)] == ["1 of 3", "2 of 3", "3 of 3"]
    assert display.stage_label(-1, 2) == "1 of 2"  # before the first stage went out
    assert display.stage_label(4, 2) == "5 of 5"  # never "5 of 2" when the record lacks its sizes


def test_skipped_and_no_artifact_read_as_words_with_their_meaning_and_not_as_failures():
    skipped = str(display.status_pill("skipped", 2))
    no_artifact = str(display.status_pill("no_artifact", 1))
    assert skipped.startswith('<span class="pill skipped" title="never sent') and skipped.endswith(">skipped 2</span>")
    assert ">no artifact 1</span>" in no_artifact and "board" in no_artifact
    assert not TargetStatus.SKIPPED.failed and not TargetStatus.NO_ARTIFACT.failed
    css = (STATIC / "console.css").read_text()
    failure_rule = next(line for line in css.splitlines() if ".pill.failed" in line)
    assert ".skipped" not in failure_rule and ".no_artifact" not in failure_rule
    assert re.search(r"\.pill\.skipped, \.pill\.no_artifact[^{]*\{[^}]*var\(--muted\)", css)
    assert set(display.STATUS_TEXT) == {s.value for s in TargetStatus}


def test_a_board_is_profile_and_arch_or_unknown():
    assert display.board("raspberry-pi-5", "aarch64") == "raspberry-pi-5 (aarch64)"
    assert display.board(None, None) == "unknown"
    assert display.board(None, "x86_64") == "unknown (x86_64)"
    assert display.board(["not", "text"], 7) == "unknown"


def test_a_verdict_of_any_shape_becomes_a_result_a_reason_and_a_table_of_figures():
    engine_shape = {"stage": 1, "version": "1.1.0", "passed": False, "judged_at": "2026-11-26T10:00:00Z",
                    "reason": "p99 17.6 ms is 3.27x the baseline's 5.39 ms (> 1.5x)",
                    "canary": {"devices": 2, "p99_ms": 17.6, "error_rate": 0.0, "versions": ["1.1.0"]},
                    "baseline": {"devices": 1, "p99_ms": 5.39, "error_rate": 0.0, "source": "live"},
                    "checks": [{"name": "p99_ratio", "value": 3.265, "canary": 17.6, "baseline": 5.39, "limit": 1.5,
                                "passed": False}],
                    "limits": {"max_p99_ratio": 1.5, "max_error_rate": 0.05}}
    view = display.verdict_view(engine_shape)
    assert view["passed"] is False and view["stage"] == 1 and view["reason"].startswith("p99 17.6 ms")
    assert view["columns"] == ["canary", "baseline"]
    rows = {r["figure"]: r["cells"] for r in view["rows"]}
    assert rows["p99_ms"] == ["17.6", "5.39"] and rows["devices"] == ["2", "1"] and rows["source"] == ["", "live"]
    assert view["checks"] == [{"name": "p99_ratio", "value": "3.265", "canary": "17.6", "baseline": "5.39",
                               "limit": "1.5", "passed": "failed"}]
    assert ("max_p99_ratio", "1.5") in view["limits"]
    assert rows["versions"] == ["1.1.0", ""]  # a list of names reads as text, not JSON

    flat = display.verdict_view({"passed": True, "canary_p99_ms": 5.1, "baseline_p99_ms": 5.0, "devices": 3})
    assert flat["passed"] is True and flat["columns"] == ["canary", "baseline", "value"]
    assert {r["figure"]: r["cells"] for r in flat["rows"]} == {"p99_ms": ["5.1", "5", ""], "devices": ["", "", "3"]}

    odd = display.verdict_view({"passed": "yes", "stage": True, "checks": "all", "p99_ms": float("inf"),
                                "limits": [1, 2], "nested": {"deep": {"x": 1}}})
    assert odd["passed"] is None and odd["stage"] is None and odd["checks"] == [] and odd["limits"] == []
    assert odd["columns"] == ["value", "nested"]
    assert {r["figure"]: r["cells"] for r in odd["rows"]} == {"p99_ms": ["—", ""], "deep": ["", '{"x": 1}']}
    long_reason = "p99 regression: " + "figures " * 40
    assert display.verdict_view({"passed": False, "reason": long_reason})["reason"] == long_reason  # never cut at 120
    assert display.verdict_view(None) is None and display.verdict_view({}) is None and display.verdict_view([1]) is None


def test_an_events_detail_adds_to_its_event_column_and_never_repeats_it():
    committed = {"event": "committed", "time": NOW, "deployment_id": "r1", "name": "digits", "version": "2.0.0"}
    assert _event_detail("committed", committed) == "digits 2.0.0"
    assert _event_detail("committed", {"event": "committed", "time": NOW}) == ""
    assert _event_detail("failed", {**committed, "event": "failed", "reason": "health check failed"}) == \
        "health check failed"
    assert _event_detail("downloaded", {"event": "downloaded", "bytes": 1234, "name": "digits", "version": "2.0.0"}) \
        == "digits 2.0.0, bytes 1234"
    assert _event_detail("rollout_started", "not a dict") == ""
