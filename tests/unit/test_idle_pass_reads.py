"""A converged fleet costs the database little: an engine tick over a group that is on its release runs one statement
that reads a few rows, and the pass that keeps the release's lease a few more, not every target of the release.

Counted on PostgreSQL, from the plans of the very statements a tick runs (``EXPLAIN ANALYZE``, rolled back): rows
returned and rows filtered out by every scan. A count, not a time, so the test is steady on a busy machine.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.rollouts.engine import RolloutEngine
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

DEVICES = 3000
#: Rows one idle tick may read: a handful per statement (the rollouts, the release, the lease), whatever the fleet.
MOST_ROWS = 100


class _Quiet:
    """A dispatcher with nothing to send: the fleet is on its release."""

    def busy(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: []


def _converged(db: FleetDB, away: int) -> None:
    """``DEVICES`` on the release of a completed three-stage rollout (2.0.0): a third of them came late, and the last
    ``away`` are offline still on 1.0.0, their targets deferred."""
    now = time.time()
    ids = [f"cam{i:05d}" for i in range(DEVICES)]
    here, gone = ids[:DEVICES - away], ids[DEVICES - away:]
    db.upsert_devices([DeviceState(d, "cams", "online", "digits", "2.0.0", (), now) for d in here]
                      + [DeviceState(d, "cams", "offline", "digits", "1.0.0", (), now) for d in gone])
    stages = [[(d, "1.0.0") for d in part] for part in (ids[:30], ids[30:300], ids[300:])]
    db.add_rollout("r1", "digits", "2.0.0", "cams", RolloutPolicy(analysis=False, canary=0.01, waves=(0.1, 1.0)), stages)
    db.sql.execute("UPDATE targets SET status = ?, sent = ?, last_sent = ?, late = CASE WHEN device_id >= ? "
                   "THEN 1 ELSE 0 END", (TargetStatus.COMMITTED.value, now, now, ids[DEVICES // 2]))
    if gone:
        db.sql.execute("UPDATE targets SET status = ?, late = 0 WHERE device_id >= ?",
                       (TargetStatus.DEFERRED.value, gone[0]))
    db.sql.execute("UPDATE rollouts SET wave = 2")
    assert db.end_rollout("r1", RolloutState.COMPLETED, "every stage committed")


def _rows_read(plan: dict[str, Any]) -> int:
    """Rows the scans of a plan produced or threw away (over every loop)."""
    read = 0
    if "Scan" in plan["Node Type"]:
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                 + plan.get("Rows Removed by Index Recheck", 0)) * loops
    return read + sum(_rows_read(child) for child in plan.get("Plans", ()))


def _tick_reads(db: FleetDB, engine: RolloutEngine) -> dict[str, int]:
    """One engine tick: statement -> rows its scans read."""
    ran: list[tuple[str, tuple[Any, ...]]] = []
    run = db.sql._run  # type: ignore[attr-defined]
    db.sql._run = lambda sql, args: ran.append((sql, tuple(args))) or run(sql, args)  # type: ignore[attr-defined]
    try:
        engine.tick()
    finally:
        db.sql._run = run  # type: ignore[attr-defined]
    conn = db.sql._conn  # type: ignore[attr-defined]
    reads: dict[str, int] = {}
    for sql, args in ran:
        with conn.transaction(force_rollback=True):
            (row,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + db.sql._native(sql),  # type: ignore[attr-defined]
                                  args).fetchall()
        reads[sql] = reads.get(sql, 0) + _rows_read(next(iter(row.values()))[0]["Plan"])
    return reads


def _few(reads: dict[str, int], what: str) -> None:
    worst = max(reads, key=reads.__getitem__)
    assert sum(reads.values()) <= MOST_ROWS, (
        f"{what} read {sum(reads.values())} rows for {DEVICES} devices; most: {reads[worst]} by {worst}")


@pytest.mark.parametrize("away", [0, DEVICES // 3], ids=["all-here", "a-third-away"])
def test_an_idle_tick_over_a_converged_release_reads_a_few_rows_not_its_targets(postgres_url, away):
    """With a third of the devices away (their targets deferred), as much as with all of them on the release: the
    idle tick asks the store what there is to do, in one statement; the pass that keeps the release's lease (every
    ``lease_s / 2``) reads a few rows more."""
    db = FleetDB(postgres_url)
    clock = [1000.0]
    try:
        _converged(db, away)
        engine = RolloutEngine(db, _Quiet(), clock=lambda: clock[0], holder="h", reconcile_s=1.0, lease_s=10.0)
        for _ in range(DEVICES // 500 + 2):  # the reports queued every device: compare each with the release once
            clock[0] += 1.0
            engine.tick()
        assert db.to_reconcile("cams", 10) == []
        db.sql.execute("VACUUM ANALYZE")  # as autovacuum leaves a table that stopped changing

        clock[0] += 1.0
        idle = _tick_reads(db, engine)
        assert len(idle) == 1 and not any("group_releases" in sql for sql in idle), (
            f"an idle tick ran {len(idle)} statements: {list(idle)}")
        _few(idle, f"an idle tick ({away} away)")

        clock[0] += 5.0
        renewal = _tick_reads(db, engine)
        assert any("group_releases" in sql for sql in renewal), "no pass kept the release's lease after lease_s / 2"
        _few(renewal, f"the lease-keeping pass ({away} away)")
    finally:
        db.close()
