"""examples/grafana/edgesdk.json: a Grafana dashboard whose every query names a metric the server or endpoint exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.inference.metrics import InferenceMetrics
from edgesdk.ota_server.store.fleet_db import FleetDB

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "edgesdk.json"
#: The sample names each kind of metric family is exposed under.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("", "_sum", "_count", "_created"), "unknown": ("",)}


def exported(registries) -> set[str]:
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def test_every_panel_queries_metrics_the_server_and_the_endpoint_export(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    db = FleetDB(tmp_path / "fleet.db")
    db.upsert_device("cam-1", "lab", "online", "digits", "1.0", [])
    db.add_rollout("r1", "digits", "2.0", "lab", RolloutPolicy(), [[("cam-1", "1.0")]])  # a running rollout's series
    try:
        names = exported([ServerMetrics(db).registry, InferenceMetrics().registry])
    finally:
        db.close()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            used = set(re.findall(r"\bedgesdk_[a-z0-9_]+", target["expr"]))
            assert used, f"panel {panel['title']!r} queries no edgesdk metric: {target['expr']}"
            assert used <= names, f"panel {panel['title']!r} queries {sorted(used - names)}, which nothing exports"
            queried |= used
    # The list: fleet by status and version, rollout progress, event latency, inference rate, latency, batch.
    for needed in ("edgesdk_ota_devices", "edgesdk_ota_rollout_targets", "edgesdk_ota_event_handling_seconds_bucket",
                   "edgesdk_inference_requests_total", "edgesdk_inference_request_seconds_bucket",
                   "edgesdk_inference_batch_size_sum"):
        assert needed in queried, needed
    assert [v["type"] for v in dashboard["templating"]["list"]] == ["datasource"]
