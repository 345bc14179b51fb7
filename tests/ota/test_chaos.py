"""The chaos run, small and seed-fixed (issue 24): two replicas on PostgreSQL, a real mosquitto, 60 simulated
devices, six rollouts and every kind of fault; the checker passes on the product and fails on a planted bug."""

from __future__ import annotations

from benchmarks._chaos_run import FAULT_KINDS, SEQUENCE, ChaosConfig, run_chaos

SMALL = ChaosConfig(devices=60, seed=7, faults=10, horizon_s=30.0, settle_s=30.0)


def _explain(result) -> str:
    return "\n".join([f"seed {result.seed}: {len(result.violations)} violations",
                      *("\n".join(lines) for lines in result.minimal)])


def test_a_seeded_chaos_run_keeps_every_invariant(tmp_path):
    result = run_chaos(SMALL, tmp_path)
    assert not result.violations, _explain(result)
    # The run was what it claims: every kind of fault applied (none failed to apply), all six rollouts run,
    # and both an aborted canary and an operator's abort among them.
    assert sorted({f["kind"] for f in result.faults}) == sorted(FAULT_KINDS)
    assert [f for f in result.faults if "error" in f or "done_s" not in f] == []
    assert [(r["what"], r["version"]) for r in result.rollouts] == list(SEQUENCE)
    assert [r["state"] for r in result.rollouts] == ["completed", "aborted", "completed", "completed", "aborted",
                                                     "completed"]


def test_a_planted_bug_makes_the_checker_fail(tmp_path):
    """Replicas that never revert an aborted rollout: a later rollout hides it in the final versions, the checker
    still names the rollout whose devices were left on the aborted version."""
    result = run_chaos(ChaosConfig(devices=60, seed=7, faults=0, horizon_s=1.0, settle_s=10.0, plant="no-revert"),
                       tmp_path)
    aborted_by_operator = next(r["id"] for r in result.rollouts if r["what"] == "abort")
    assert [(v.invariant, v.subject) for v in result.violations] == [("not_reverted", aborted_by_operator)]
