"""The endpoint benchmark's goals (benchmarks/endpoint/endpoint.py): like for like, and client-bound runs not counted."""

from __future__ import annotations

import pytest


@pytest.fixture
def endpoint_bench():
    from benchmarks.endpoint import endpoint

    return endpoint


def run(rps: float, p99: float, client_cpu: float = 0.5) -> dict:
    return {"throughput_rps": rps, "latency_ms": {"p50": p99 / 2, "p99": p99}, "client_cpu_per_s": client_cpu,
            "server_cpu_ms_per_request": 0.6, "failed": 0}


def results(bench, grpc_client_cpu: float = 0.5) -> dict:
    figures = bench._figures
    tiny = {"json_8": {"edgesdk": figures([run(1600, 9)]), "mlserver": figures([run(1000, 12)])},
            "binary_8": {"edgesdk": figures([run(1700, 8)]), "pytriton": figures([run(450, 20)]),
                         "mlserver": {"refused": "422"}},
            "grpc_8": {"edgesdk": figures([run(1800, 7, grpc_client_cpu), run(1750, 7.5, grpc_client_cpu)]),
                       "mlserver": figures([run(1100, 10)])}}
    orientation = {"json_8": {"edgesdk": figures([run(40, 200)]), "mlserver": figures([run(40, 230)])}}
    return {"models": {"tiny": {"cases": tiny}, "orientation": {"cases": orientation}},
            "grpc_vs_http": {"ratio": 0.97},
            "json_parse": {"fast_ms": {"median": 7.0}, "standard_ms": {"median": 16.0}, "ratio": 0.44}}


def by_name(goals: list[dict], *words: str) -> list[dict]:
    return [g for g in goals if all(w in g["name"] for w in words) and g["target"] != "report"]


def test_the_binary_goals_compare_like_for_like(endpoint_bench):
    goals = endpoint_bench.goals_of(results(endpoint_bench))
    grpc = by_name(goals, "tiny, gRPC", "mlserver")
    assert [g["met"] for g in grpc] == [True, True] and grpc[0]["measured"] == pytest.approx(1775 / 1100, abs=1e-3)
    http = by_name(goals, "tiny, HTTP binary", "pytriton")
    assert [g["met"] for g in http] == [True, True] and http[0]["measured"] == pytest.approx(1700 / 450, abs=1e-3)
    (orientation,) = by_name(goals, "orientation, JSON", "p99")
    assert orientation["met"] and orientation["measured"] == 200 and orientation["target"] == "<= 230.00"
    assert by_name(goals, "gRPC p50 / HTTP binary p50")[0]["met"]


def test_a_client_bound_side_counts_toward_no_goal(endpoint_bench):
    goals = endpoint_bench.goals_of(results(endpoint_bench, grpc_client_cpu=0.95))
    grpc = by_name(goals, "tiny, gRPC", "mlserver")
    assert len(grpc) == 2 and all(not g["met"] and "client-bound (edgesdk)" in g["name"] for g in grpc)
    figures = results(endpoint_bench, grpc_client_cpu=0.95)["models"]["tiny"]["cases"]["grpc_8"]["edgesdk"]
    assert figures["client_bound"] and figures["client_bound_runs"] == 2
    assert all(r["client_bound"] for r in figures["runs"])


def test_medians_leave_out_the_client_bound_runs(endpoint_bench):
    figures = endpoint_bench._figures([run(1000, 10, 0.95), run(1500, 8), run(1600, 6)])
    assert not figures["client_bound"] and figures["client_bound_runs"] == 1
    assert figures["median_throughput_rps"] == 1550 and figures["median_p99_ms"] == 7
