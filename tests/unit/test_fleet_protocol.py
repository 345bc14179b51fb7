"""The fleet vocabulary: wire values of the enums, the records' API JSON both ways, and FleetDB returning records."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import (
    AgentEvent,
    DeviceRecord,
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    RolloutSummary,
    TargetStatus,
    iso_time,
    parse_duration,
    parse_percent,
    parse_time,
)
from edgesdk.ota_server.store.fleet_db import EventRecord, FleetDB

ROOT = Path(__file__).resolve().parents[2]
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_enum_values_are_the_strings_on_the_wire_in_the_database_and_in_json():
    assert [s.value for s in TargetStatus] == ["pending", "sent", "downloading", "installing", "committed", "failed",
                                               "rolled_back", "rejected", "timeout", "deferred", "reverting", "reverted",
                                               "revert_failed", "no_artifact", "skipped", "ahead"]
    assert [s.value for s in RolloutState] == ["running", "completed", "aborted"]
    assert {e.value for e in AgentEvent} == {"accepted", "progress", "downloaded", "committed", "failed", "rolled_back",
                                             "rejected"}
    assert json.dumps([TargetStatus.ROLLED_BACK, RolloutState.RUNNING]) == '["rolled_back", "running"]'
    assert f"{TargetStatus.REVERT_FAILED}" == str(TargetStatus.REVERT_FAILED) == "revert_failed"
    assert TargetStatus.COMMITTED == "committed"


def test_terminal_and_failed_statuses_are_defined_on_the_enum():
    assert {s.value for s in TargetStatus if s.terminal} == {"committed", "failed", "rolled_back", "rejected",
                                                             "timeout"}
    assert {s.value for s in TargetStatus if s.failed} == {"failed", "rolled_back", "rejected", "timeout"}


def test_policy_and_its_parsers():
    assert parse_percent("10%") == parse_percent("10") == parse_percent(0.1) == 0.1
    assert parse_duration("2m") == 120 and parse_duration("250ms") == 0.25 and parse_duration(3) == 3.0
    with pytest.raises(EdgeSDKError, match="not a duration"):
        parse_duration("soon")
    policy = RolloutPolicy(canary=0.1, waves=(0.5, 1.0))
    assert policy.stages == (0.1, 0.5, 1.0) and RolloutPolicy.from_dict(policy.to_dict()) == policy
    with pytest.raises(EdgeSDKError, match="must increase and end at 100%"):
        RolloutPolicy(canary=0.1, waves=(1.0, 0.5))


def test_the_database_returns_records_whose_json_is_the_api_shape(fleet_location):
    db = FleetDB(fleet_location)
    db.upsert_device("cam0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
    db.upsert_device("cam1", "cams", "online", None, None, [])
    (device, _) = db.devices("cams")
    assert isinstance(device, DeviceRecord) and device.group == "cams" and device.slots == ("digits-1.0.0",)
    shown = device.to_json()
    assert set(shown) == {"id", "group", "status", "model", "version", "slots", "last_seen", "profile", "arch"}
    assert ISO.fullmatch(shown["last_seen"]) and DeviceRecord.from_json(shown).to_json() == shown

    policy = RolloutPolicy(canary=0.5, waves=(1.0,))
    db.add_rollout("r1", "digits", "2.0.0", "cams", policy, [[("cam0", "1.0.0")], [("cam1", None)]])
    (summary,) = db.rollouts(RolloutState.RUNNING)
    assert isinstance(summary, RolloutSummary) and summary.stage == -1 and summary.group == "cams"
    assert summary.to_json()["stage"] == 0  # the API numbers stages from 1, the canary: 0 is "none sent yet"
    assert set(summary.to_json()) == {"id", "model", "version", "group", "state", "stage", "reason", "created",
                                      "rollback"}
    assert RolloutSummary.from_json(summary.to_json()).to_json() == summary.to_json()

    db.start_stage("r1", 0, time.time())
    db.set_target("r1", "cam0", TargetStatus.COMMITTED)
    assert not db.settle_stage("r1", 1.0, stage=1)  # compare-and-set: stage 0 runs
    assert db.settle_stage("r1", 1.0, stage=0) and not db.settle_stage("r1", 2.0, stage=0)  # settled once
    r = db.rollout("r1")
    assert isinstance(r, RolloutRecord) and r.policy == policy and r.stage == 0 and r.stage_count == 2
    assert r.stage_sizes == (1, 2) and r.counts == {TargetStatus.COMMITTED: 1, TargetStatus.PENDING: 1}
    assert [t.status for t in r.in_stage(0)] == [TargetStatus.COMMITTED] and r.in_stage(1)[0].sent is None
    shown = r.to_json()
    assert set(shown) == {"id", "model", "version", "group", "policy", "state", "stage", "stage_started",
                          "stage_settled", "reason", "created", "updated", "rollback", "stages", "counts",
                          "targets_total", "driver", "deferred", "late", "flagged", "phase", "verdict", "targets"}
    assert shown["phase"] == "health_window" and shown["verdict"] is None
    assert shown["state"] == "running" and shown["rollback"] is False and shown["stage_settled"] == iso_time(1.0)
    assert shown["targets"][0] | {"sent": None, "updated": None} == {
        "rollout_id": "r1", "device_id": "cam0", "stage": 1, "status": "committed", "reason": None,
        "previous_version": "1.0.0", "sent": None, "updated": None, "late": False, "artifact": None}
    assert RolloutRecord.from_json(shown).to_json() == shown
    db.end_rollout("r1", RolloutState.ABORTED, "aborted by operator")
    assert db.rollouts(RolloutState.RUNNING) == [] and db.rollout("r1").state == RolloutState.ABORTED

    db.log("committed", {"time": 1.5}, device_id="cam0", rollout_id="r1")
    (event,) = db.events("r1")
    assert isinstance(event, EventRecord) and event.type == "committed" and event.payload == {"time": 1.5}
    assert parse_time(iso_time(1700000000.0)) == 1700000000.0
    db.close()


def test_the_operator_side_depends_on_the_protocol_not_on_the_server_package():
    for path in ("edgesdk/cli/fleet.py", "edgesdk/cli/devices.py", "edgesdk/fleet/admin_client.py",
                 "edgesdk/fleet/records.py"):
        tree = ast.parse((ROOT / path).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in imported if m.startswith("edgesdk.ota_server")], (path, imported)
