"""The chaos run, small and seed-fixed (issue 24): two replicas on PostgreSQL, a real mosquitto, 60 simulated
devices, six rollouts and every kind of fault, each of which must take effect; the checker passes on the product
and fails on a planted bug (issue 35: one that skips reconciliation, one without the compare-and-set)."""

from __future__ import annotations

from benchmarks.fleet.chaos_run import FAULT_KINDS, SEQUENCE, ChaosConfig, run_chaos

SMALL = ChaosConfig(devices=60, seed=7, faults=len(FAULT_KINDS), horizon_s=12.0, settle_s=30.0, converge_s=10.0)


def _explain(result) -> str:
    return "\n".join([f"seed {result.seed}: {len(result.violations)} violations",
                      *("\n".join(lines) for lines in result.minimal)])


def test_a_seeded_chaos_run_keeps_every_invariant(tmp_path):
    result = run_chaos(SMALL, tmp_path)
    assert not result.violations, _explain(result)
    # The run was what it claims: every kind of fault applied and took effect (a crash happened, a chunk was
    # refused, the kill hit the lease holder of a running rollout, the claimed group was refused...), all six
    # rollouts run, and both an aborted canary and an operator's abort among them.
    assert sorted({f["kind"] for f in result.faults}) == sorted(FAULT_KINDS)
    assert result.ineffective == [], result.ineffective
    assert [(r["what"], r["version"]) for r in result.rollouts] == list(SEQUENCE)
    assert [r["state"] for r in result.rollouts] == ["completed", "aborted", "completed", "completed", "aborted",
                                                     "completed"]
    assert result.history is not None and len(result.history.final) == 60 + SMALL.join


def test_a_server_that_skips_reconciliation_leaves_late_devices_behind(tmp_path):
    """Devices offline at the last push and devices provisioned during it never get the release: each is named."""
    config = ChaosConfig(devices=60, seed=7, faults=2, kinds=("offline_at_push", "join"), horizon_s=1.0,
                         settle_s=10.0, converge_s=10.0, plant="no-reconcile")
    result = run_chaos(config, tmp_path)
    late = {d for f in result.faults for d in f["ids"]}
    assert len(late) > SMALL.join and result.ineffective == []
    assert {v.invariant for v in result.violations} == {"convergence"}, _explain(result)
    assert {v.subject for v in result.violations} == late


def test_two_drivers_without_the_compare_and_set_send_a_stage_twice(tmp_path):
    """Both replicas drive every rollout (the lease lies) and nothing fences their moves: the checker sees a stage
    sent twice. The same lying lease with the compare-and-set in place is harmless (benchmarks/fleet/chaos.py shows it)."""
    result = run_chaos(ChaosConfig(devices=60, seed=7, faults=0, horizon_s=1.0, settle_s=10.0, converge_s=10.0,
                                   plant="no-fence"), tmp_path)
    twice = [v for v in result.violations if v.invariant == "database" and "sent more than once" in v.detail]
    assert twice, _explain(result)


def test_a_server_that_never_reverts_is_named(tmp_path):
    """Replicas that never revert an aborted rollout: a later rollout hides it in the final versions, the checker
    still names the rollout whose devices were left on the aborted version."""
    result = run_chaos(ChaosConfig(devices=60, seed=7, faults=0, horizon_s=1.0, settle_s=10.0, converge_s=10.0,
                                   plant="no-revert"), tmp_path)
    aborted_by_operator = next(r["id"] for r in result.rollouts if r["what"] == "abort")
    assert [(v.invariant, v.subject) for v in result.violations] == [("not_reverted", aborted_by_operator)]
