"""The ``traffic`` object of a device's state: what the agent writes is accepted whole, each lie or
bug refused by name, and a refused one does not refuse the state (the judge is told why)."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest

from edgesdk.agent.app_traffic import TrafficReporter
from edgesdk.errors import ReportError
from edgesdk.fleet.reports import parse_state
from edgesdk.fleet.traffic import MAX_CALLS_PER_S, MAX_TRAFFIC_VERSIONS, parse_traffic
from tests.unit.test_app_traffic import GONE, App, Clock


@pytest.fixture
def agent_traffic(tmp_path) -> dict:
    """What the agent's reporter publishes for two apps (one restarted) on two versions, as JSON."""
    clock = Clock()
    reporter = TrafficReporter(tmp_path / "store", clock=clock)
    App(reporter.directory, clock, "camera", GONE).serve("1.0.0", 300, ns=150_000, errors=4).write()
    clock.now += 40
    restarted = App(reporter.directory, clock, "camera", os.getpid()).serve("1.0.0", 20)
    restarted.serve("2.0.0", 90, ns=900_000, errors=1).write()
    App(reporter.directory, clock, "door", os.getppid()).serve("2.0.0", 10, errors=10).write()
    return json.loads(json.dumps(reporter.report()))


def test_what_the_agent_publishes_is_accepted_as_it_is(agent_traffic):
    assert parse_traffic(agent_traffic) == agent_traffic
    one, two = agent_traffic["versions"]["1.0.0"], agent_traffic["versions"]["2.0.0"]
    assert (one["calls"], one["errors"], one["apps"], one["restarts"]) == (324, 4, 2, 1)
    assert (two["calls"], two["errors"], two["apps"], two["starts"]) == (111, 11, 2, 2)


def _bad(traffic: dict, version: str, **fields) -> dict:
    """``traffic`` with ``fields`` of ``version`` changed (its histogram dropped when the calls no longer match it)."""
    bad = copy.deepcopy(traffic)
    if {"calls", "errors"} & fields.keys() and "hist" not in fields:
        bad["versions"][version].pop("hist", None)
    bad["versions"][version].update(fields)
    return bad


@pytest.mark.parametrize(("change", "reason", "field", "says"), [
    ({"calls": -1}, "range", "calls", "-1"),
    ({"errors": -3}, "range", "errors", "never negative"),
    ({"restarts": 1.5}, "type", "restarts", "whole number"),
    ({"local": True}, "type", "local", "whole number"),
    ({"cloud": 2**53}, "range", "cloud", "2**53"),
    ({"errors": 325}, "range", "errors", "more than its 324 calls"),
    ({"p99_ms": math.nan}, "range", "p99_ms", "nan"),
    ({"p95_ms": math.inf}, "range", "p95_ms", "inf"),
    ({"p50_ms": -0.1}, "range", "p50_ms", "-0.1"),
    ({"p50_ms": 9.0}, "range", "p99_ms", "do not hold"),
    ({"p99_ms": None}, "missing", "p99_ms", "320 calls succeeded"),
    ({"from": 2e9}, "range", "from", "is after"),
    ({"to": "soon"}, "type", "to", "'soon'"),
    ({"calls": 10**9, "errors": 0}, "range", "calls", f"{MAX_CALLS_PER_S} calls/s"),
    ({"hist": [[130, 320], [129, 0]]}, "range", "hist", "buckets increase"),
    ({"hist": [[130, 300]]}, "range", "hist", "holds 300 calls, not the 320 that succeeded"),
    ({"hist": [[360, 320]]}, "range", "hist", "0..359"),
    ({"hist": [[130, 320.0]]}, "type", "hist", "[bucket, count]"),
    ({"hist": "many"}, "type", "hist", "'many'"),
    ({"calls": 2**70}, "range", "calls", "2**53"),
    ({"hist": [[130, 2**70]]}, "range", "hist", "not the 320 that succeeded"),
    ({"p99_ms": "x" * 10_000_000}, "type", "p99_ms", "must be a number"),
    ({"apps": "x" * 10_000_000}, "type", "apps", "whole number"),
])
def test_each_bad_figure_is_refused_naming_its_field_and_value(agent_traffic, change, reason, field,
                                                               says):
    with pytest.raises(ReportError) as caught:
        parse_traffic(_bad(agent_traffic, "1.0.0", **change))
    assert (caught.value.reason, caught.value.field) == (reason, f"traffic.versions.1.0.0.{field}")
    message = str(caught.value)
    assert says in message and "traffic.versions.1.0.0" in message, message[:300]
    assert len(message) < 400, "a refusal quotes a hostile value cut short, never whole"


def test_calls_beyond_what_the_window_allows_at_the_stated_rate_are_refused(agent_traffic):
    entry = agent_traffic["versions"]["2.0.0"]
    seconds = entry["to"] - entry["from"]
    most = int((seconds + 1) * MAX_CALLS_PER_S)
    failing = {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    parse_traffic(_bad(agent_traffic, "2.0.0", calls=most, errors=most, **failing))
    with pytest.raises(ReportError, match=r"traffic.versions.2.0.0.calls .* calls/s") as caught:
        parse_traffic(_bad(agent_traffic, "2.0.0", calls=most + 1, errors=most + 1, **failing))
    assert caught.value.field == "traffic.versions.2.0.0.calls"


@pytest.mark.parametrize(("mangle", "field", "says"), [
    (lambda t: t["versions"].update({f"{i}.0.9": t["versions"]["1.0.0"]
                                     for i in range(MAX_TRAFFIC_VERSIONS)}),
     "traffic.versions", "at most 8"),
    (lambda t: t["versions"].update({"latest": t["versions"].pop("1.0.0")}),
     "traffic.versions.latest", "dotted integers"),
    (lambda t: t["versions"]["2.0.0"].update({"p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0,
                                              "errors": 111}),
     "traffic.versions.2.0.0.p50_ms", "no successful call"),
    (lambda t: t["versions"]["2.0.0"].update({"from": t["versions"]["2.0.0"]["to"] - 5000}),
     "traffic.versions.2.0.0.to", "twice the 900 s horizon"),
    (lambda t: t["versions"]["2.0.0"].pop("apps"), "traffic.versions.2.0.0.apps", "has no apps"),
    (lambda t: t.update(format=2), "traffic.format", "not 1"),
    (lambda t: t.update(horizon_s=-1), "traffic.horizon_s", "-1"),
    (lambda t: t.update(versions=[]), "traffic.versions", "must be an object"),
])
def test_each_bad_shape_is_refused_naming_its_field(agent_traffic, mangle, field, says):
    bad = copy.deepcopy(agent_traffic)
    mangle(bad)
    with pytest.raises(ReportError, match=says) as caught:
        parse_traffic(bad)
    assert caught.value.field == field


def test_a_state_with_refused_traffic_is_kept_and_says_why(agent_traffic):
    state = {"status": "online", "group": "cams", "model": "digits", "version": "2.0.0",
             "traffic": agent_traffic}
    good = parse_state("cam0", json.dumps(state).encode())
    assert good.details["traffic"] == agent_traffic
    state["traffic"] = _bad(agent_traffic, "1.0.0", errors=999)
    refused = parse_state("cam0", json.dumps(state).encode())
    assert (refused.model, refused.version) == ("digits", "2.0.0")
    assert refused.details["traffic"] == {
        "refused": "traffic.versions.1.0.0.errors 999 is more than its 324 calls"}
    state["traffic"] = "lots"
    details = parse_state("cam0", json.dumps(state).encode()).details
    assert details["traffic"]["refused"].startswith("traffic 'lots'")
