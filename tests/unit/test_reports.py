"""Typed, bounded device reports (issue 36): what the real agent sends is accepted, each bad field refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.agent.app_traffic import TrafficReporter
from edgesdk.agent.config import AgentConfig
from edgesdk.agent.energy_account import NoEnergy
from edgesdk.agent.events import EventLog
from edgesdk.agent.state_report import device_state
from edgesdk.agent.store import ModelStore
from edgesdk.errors import ReportError, TransferError
from edgesdk.fleet.measurement import encode_result, parse_result
from edgesdk.fleet.records import AgentEvent
from edgesdk.fleet.reports import (
    DETAIL_FIELDS,
    MAX_REASON_CHARS,
    MAX_REPORT_BYTES,
    parse_chunk_request,
    parse_event,
    parse_state,
)
from edgesdk.ota_server.devices.report_reader import DETAIL_KEYS
from edgesdk.runtime.stats import LatencyStats


def _agent_state(tmp_path) -> dict:
    """The state document of the real agent's code (no runtime loaded: its statistics are added as it adds them)."""
    store = ModelStore(tmp_path / "store")
    (store.slots / "digits-1.0.0").mkdir(parents=True)
    config = AgentConfig(device_id="cam1", group="lab", broker="mqtt://127.0.0.1:1", store=tmp_path / "store")
    state = device_state(config, store, None, NoEnergy("no sensor"), session=1.7e9, connection=2,
                         traffic=TrafficReporter(store.root).report())
    state.update(model="digits", version="1.0.0", previous="digits-0.9.0")  # what an installed bundle's manifest says
    state["runtime"] = LatencyStats().snapshot().as_dict()
    state["energy"] = {"sensor": "ina3221", "scope": "board", "window_s": 5.0, "avg_watts": 3.2, "inferences": 10,
                       "idle_watts": 2.9, "idle_basis": "measured", "energy_per_inference_mj": 12.5}
    state["trust"] = {"root_version": 3, "root_expires": "2030-01-01T00:00:00Z", "root_expired": False,
                      "stale": False, "timestamp_version": 7, "timestamp_expires": "2030-01-01T00:00:00Z"}
    return json.loads(json.dumps(state))


def _refused(call, reason: str, field: str) -> ReportError:
    with pytest.raises(ReportError) as caught:
        call()
    assert (caught.value.reason, caught.value.field) == (reason, field), str(caught.value)
    assert isinstance(caught.value, TransferError)  # callers that catch transfer errors still do
    return caught.value


def test_the_real_agents_state_and_last_will_are_read_whole(tmp_path):
    state = _agent_state(tmp_path)
    report = parse_state("cam1", json.dumps(state).encode())
    assert (report.device, report.group, report.status) == ("cam1", "lab", "online")
    assert (report.model, report.version, report.slots) == ("digits", "1.0.0", ("digits-1.0.0",))
    assert (report.energy_mj, report.avg_watts, report.root_version, report.stale) == (12.5, 3.2, 3, False)
    assert (report.session, report.connection) == (1.7e9, 2) and report.updated == state["updated"]
    assert json.loads(report.details_json()) == {k: state[k] for k in DETAIL_FIELDS if k in state}
    config = AgentConfig(device_id="cam1", group="lab", broker="mqtt://127.0.0.1:1", store=tmp_path / "store")
    will = parse_state("cam1", config.offline_state(session=1.7e9, connection=2))
    assert (will.status, will.model, will.version, will.details) == ("offline", None, None, {})
    assert (will.session, will.connection) == (1.7e9, 2)
    assert set(DETAIL_FIELDS) == set(DETAIL_KEYS)  # the server keeps the details the parser checks


@pytest.mark.parametrize(("change", "reason", "field"), [
    ({"model": {"x": 1}}, "type", "model"),
    ({"model": "../etc"}, "id", "model"),
    ({"version": "latest"}, "id", "version"),
    ({"version": "1." * 40 + "0"}, "length", "version"),
    ({"version": 2}, "type", "version"),
    ({"group": "a/b"}, "id", "group"),
    ({"status": ["online"]}, "type", "status"),
    ({"trust": {"root_version": 2**70}}, "range", "trust.root_version"),
    ({"trust": {"root_version": 2**31}}, "range", "trust.root_version"),  # a 32-bit INTEGER column on PostgreSQL
    ({"trust": {"root_version": 0}}, "range", "trust.root_version"),
    ({"trust": {"root_version": "3"}}, "type", "trust.root_version"),
    ({"trust": {"stale": "no"}}, "type", "trust.stale"),
    ({"trust": [1]}, "type", "trust"),
    ({"slots": ["ok", {"x": 1}]}, "type", "slots"),
    ({"slots": ["x"] * 2000}, "length", "slots"),
    ({"chunk_slots": "digits-1.0.0"}, "type", "chunk_slots"),
    ({"energy": {"avg_watts": -1}}, "range", "energy.avg_watts"),
    ({"energy": {"energy_per_inference_mj": "12"}}, "type", "energy.energy_per_inference_mj"),
    ({"updated": -5}, "range", "updated"),
    ({"session": True}, "type", "session"),
    ({"connection": 0}, "range", "connection"),
    ({"connection": 2**31}, "range", "connection"),  # the store's column is a 32-bit INTEGER on PostgreSQL
    ({"connection": 1.5}, "type", "connection"),
    ({"runtime": {"count": 2**64}}, "range", "runtime.count"),
    ({"pinned": ["x" * 5000]}, "length", "pinned"),
    ({"disk": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": [1]}}}}}}}}}, "length", "disk.a.b.c.d.e.f.g.h"),
])
def test_each_bad_state_field_is_refused_by_name(tmp_path, change, reason, field):
    state = {**_agent_state(tmp_path), **change}
    _refused(lambda: parse_state("cam1", json.dumps(state).encode()), reason, field)


@pytest.mark.parametrize(("payload", "reason", "field"), [
    (b'{"status": "online", "updated": NaN}', "json", ""),
    (b'{"status": "online", "updated": 1e999}', "json", ""),
    (b'{"status": "online", "n": ' + b"9" * 5000 + b"}", "json", ""),
    (b"[" * 100_000, "length", ""),
    (b"[" * 60_000, "json", ""),
    (b"\xff\xfe", "json", ""),
    (b'["online"]', "type", ""),
    (b'{"group": "lab"}', "missing", "status"),
])
def test_a_state_that_is_not_bounded_json_is_refused(payload, reason, field):
    _refused(lambda: parse_state("cam1", payload), reason, field)


def test_the_device_id_comes_from_the_topic_and_is_checked():
    _refused(lambda: parse_state("cam/1", b'{"status": "online"}'), "id", "device id")
    assert len(json.dumps({"status": "online", "pad": "x" * MAX_REPORT_BYTES})) > MAX_REPORT_BYTES
    _refused(lambda: parse_state("cam1", json.dumps({"status": "online", "pad": "x" * MAX_REPORT_BYTES}).encode()),
             "length", "")


def test_the_real_agents_events_are_read_and_a_long_reason_is_cut_not_refused():
    published: list[bytes] = []
    log = EventLog("cam1", 10, published.append)
    log.record(None, AgentEvent.REJECTED, reason="command not signed by the pinned key")
    log.record(None, AgentEvent.FAILED, reason="x" * 50_000, apply_ms=12.5, bytes=1234, chunks=3, missing=0)
    first, second = (parse_event("cam1", p) for p in published)
    assert (first.kind, first.deployment_id, first.rollout_id) == ("rejected", "", None)
    assert second.reason is not None and len(second.reason) == MAX_REASON_CHARS and second.reason.endswith("…")
    assert second.payload["reason"] == second.reason and second.payload["bytes"] == 1234
    rollback = parse_event("cam1", json.dumps({"event": "committed", "deployment_id": "r1-rollback", "name": "digits",
                                               "version": "1.0.0", "time": 1.7e9}).encode())
    assert (rollback.rollout_id, rollback.name, rollback.version) == ("r1", "digits", "1.0.0")


@pytest.mark.parametrize(("event", "reason", "field"), [
    ({"deployment_id": "r1"}, "missing", "event"),
    ({"event": {"k": 1}}, "type", "event"),
    ({"event": "x" * 100}, "id", "event"),
    ({"event": "failed", "reason": {"why": 1}}, "type", "reason"),
    ({"event": "failed", "deployment_id": "a/b"}, "id", "deployment_id"),
    ({"event": "failed", "deployment_id": 5}, "type", "deployment_id"),
    ({"event": "failed", "name": "a b"}, "id", "name"),
    ({"event": "failed", "version": "v2"}, "id", "version"),
    ({"event": "failed", "time": "now"}, "type", "time"),
    ({"event": "failed", "bytes": -(2**64)}, "range", "bytes"),
    ({"event": "failed", "detail": "y" * 5000}, "length", "detail"),
    ({"event": "failed", **{f"k{i}": "y" * 4000 for i in range(12)}}, "length", "event"),
])
def test_each_bad_event_field_is_refused_by_name(event, reason, field):
    _refused(lambda: parse_event("cam1", json.dumps(event).encode()), reason, field)


def test_chunk_requests_as_the_agent_sends_them_and_bad_ones_by_field():
    request = parse_chunk_request("cam1", json.dumps({"transfer_id": "r1-w0", "chunks": list(range(32))}).encode())
    assert (request.transfer_id, request.chunks) == ("r1-w0", tuple(range(32)))
    many = parse_chunk_request("cam1", json.dumps({"transfer_id": "t", "chunks": list(range(1000))}).encode())
    assert many.chunks == tuple(range(256))  # the rest are asked for again
    for body, reason, field in [({"chunks": [1]}, "missing", "transfer_id"), ({"transfer_id": "t"}, "missing", "chunks"),
                                ({"transfer_id": "../t", "chunks": [1]}, "id", "transfer_id"),
                                ({"transfer_id": "t", "chunks": 5}, "type", "chunks"),
                                ({"transfer_id": "t", "chunks": [1, "2"]}, "type", "chunks"),
                                ({"transfer_id": "t", "chunks": [True]}, "type", "chunks"),
                                ({"transfer_id": "t", "chunks": [1.0]}, "type", "chunks"),
                                ({"transfer_id": "t", "chunks": [-1]}, "range", "chunks"),
                                ({"transfer_id": "t", "chunks": [2**31]}, "range", "chunks"),
                                ({"transfer_id": "t", "chunks": [0] * 2000}, "length", "chunks")]:
        _refused(lambda b=body: parse_chunk_request("cam1", json.dumps(b).encode()), reason, field)


def test_measurement_results_of_the_real_encoder_are_read_and_malformed_ones_refused_alike():
    done = parse_result(encode_result("m1", "done", figures={"latency_p50_ms": 1.5, "runs": 5, "energy": None,
                                                             "backend": "onnxruntime"},
                                      outputs={"y": np.ones((2, 3), np.float32)}))
    assert done["status"] == "done" and done["figures"]["runs"] == 5 and set(done["outputs"]) == {"y"}
    failed = parse_result(encode_result("m1", "failed", error=TransferError("e" * 5000)))
    assert failed["error_type"] == "TransferError" and len(failed["error"]) == MAX_REASON_CHARS
    assert parse_result(encode_result("m1", "accepted")) == {"measurement_id": "m1", "status": "accepted"}
    for message, reason, field in [
            ({"status": "done"}, "missing", "measurement_id"), ({"measurement_id": "m/1", "status": "done"}, "id",
                                                                "measurement_id"),
            ({"measurement_id": "m1", "status": "won"}, "range", "status"),
            ({"measurement_id": "m1", "status": 3}, "type", "status"),
            ({"measurement_id": "m1", "status": "failed"}, "missing", "error"),
            ({"measurement_id": "m1", "status": "failed", "error": ["x"]}, "type", "error"),
            ({"measurement_id": "m1", "status": "done", "figures": [], "outputs": {}}, "type", "figures"),
            ({"measurement_id": "m1", "status": "done", "figures": {"p": 2**64}, "outputs": {}}, "range", "figures.p"),
            ({"measurement_id": "m1", "status": "done", "figures": {}, "outputs": {"y": 1}}, "type", "outputs")]:
        _refused(lambda m=message: parse_result(json.dumps(m).encode()), reason, field)
    _refused(lambda: parse_result(b'{"measurement_id": "m1", "status": "done", "figures": {"p": Infinity}}'), "json", "")
