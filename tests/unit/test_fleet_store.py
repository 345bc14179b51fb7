"""The fleet store's contract on SQLite and PostgreSQL: migrations, paging, the engine's indexed queries, leases."""

from __future__ import annotations

import sqlite3

import pytest

from edgesdk.errors import ConflictError, EdgeSDKError
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.store.fleet_db import DeviceState, EventRow, FleetDB, TargetUpdate
from edgesdk.ota_server.store.sql import MIGRATIONS, open_database

POLICY = RolloutPolicy(analysis=False, canary=0.1, waves=(1.0,))


@pytest.fixture
def db(fleet_location):
    store = FleetDB(fleet_location)
    yield store
    store.close()


def _devices(db: FleetDB, n: int, group: str = "cams") -> list[str]:
    ids = [f"cam{i:05d}" for i in range(n)]
    db.upsert_devices([DeviceState(d, group, "online", "digits", "1.0.0", ("digits-1.0.0",), 1.0) for d in ids])
    return ids


def test_a_new_database_is_at_the_newest_schema_and_opening_it_again_changes_nothing(fleet_location):
    first = FleetDB(fleet_location)
    newest = MIGRATIONS[-1][0]
    assert first.sql.migrate() == newest
    first.close()
    again = FleetDB(fleet_location)
    versions = [r["version"] for r in again.sql.rows("SELECT version FROM schema_version ORDER BY version")]
    assert versions == [m[0] for m in MIGRATIONS]
    again.close()


def test_a_fleet_db_of_the_previous_release_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    for statement in MIGRATIONS[0][2]:  # the schema as releases before versioning created it, without schema_version
        old.execute(statement.format(real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT"))
    old.execute("INSERT INTO devices (id, grp, status, model, version, slots, last_seen) "
                "VALUES ('cam0', 'cams', 'online', 'digits', '1.0.0', '[]', 1.0)")
    old.commit()
    old.close()
    db = FleetDB(path)
    assert db.device("cam0").version == "1.0.0"
    assert {r["name"] for r in db.sql.rows("SELECT name FROM sqlite_master WHERE type = 'index'")} >= {
        "targets_by_stage", "one_running_rollout_per_group"}
    db.close()


def test_a_database_newer_than_this_release_is_refused(tmp_path):
    path = tmp_path / "fleet.db"
    FleetDB(path).close()
    newer = sqlite3.connect(path)
    newer.execute("INSERT INTO schema_version (version, description, applied) VALUES (99, 'future', 0)")
    newer.commit()
    newer.close()
    with pytest.raises(EdgeSDKError, match="schema version 99, newer than this edgesdk"):
        FleetDB(path)


def test_bad_locations_are_refused_with_the_fix(tmp_path):
    with pytest.raises(EdgeSDKError, match="neither a file path"):
        open_database("mysql://u:secret@127.0.0.1/fleet")
    with pytest.raises(EdgeSDKError, match=r"cannot reach PostgreSQL at postgresql://u:\*\*\*@127.0.0.1:9/x"):
        from edgesdk.ota_server.store.sql import PostgresDatabase

        PostgresDatabase("postgresql://u:secret@127.0.0.1:9/x", connect_timeout_s=0.5)
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(EdgeSDKError, match="not a usable SQLite fleet database"):
        FleetDB(corrupt)


def test_devices_page_by_id_and_count(db):
    ids = _devices(db, 25)
    db.upsert_device("lobby0", "lobby", "offline", None, None, [])
    first = db.devices("cams", limit=10)
    second = db.devices("cams", after=first[-1].id, limit=10)
    last = db.devices("cams", after=second[-1].id, limit=10)
    assert [d.id for d in first + second + last] == ids
    assert db.device_total("cams") == 25 and db.device_total(status="offline") == 1
    assert db.slots(["cam00003", "nobody"]) == {"cam00003": ("digits-1.0.0",)}
    assert db.versions_in_use() == {("digits", "1.0.0")}


def test_a_later_report_keeps_known_fields_and_a_last_will_keeps_the_slots(db):
    db.upsert_devices([DeviceState("cam0", "cams", "online", "digits", "1.0.0", ("digits-1.0.0",), 1.0),
                       DeviceState("cam0", "cams", "offline", None, None, (), 2.0)])
    device = db.device("cam0")
    assert (device.status, device.version, device.slots, device.last_seen) == ("offline", "1.0.0", ("digits-1.0.0",), 2.0)


def test_a_devices_details_are_kept_until_its_next_online_report(db):
    details = '{"runtime":{"p99_ms":12.5,"paths":{"local":{"count":9},"cloud":{"count":1}}},"disk":{"free_bytes":7}}'
    db.upsert_devices([DeviceState("cam1", "cams", "online", "digits", "1.0.0", (), 1.0, details=details)])
    db.upsert_devices([DeviceState("cam1", "cams", "offline", None, None, (), 2.0)])  # a last will: no details
    assert db.details(["cam1", "cam2"]) == {"cam1": {"runtime": {"p99_ms": 12.5, "paths": {"local": {"count": 9},
                                                                                          "cloud": {"count": 1}}},
                                                     "disk": {"free_bytes": 7}}}
    db.upsert_devices([DeviceState("cam1", "cams", "online", "digits", "1.0.0", (), 3.0, details='{"disk":{}}')])
    assert db.details(["cam1"]) == {"cam1": {"disk": {}}}


def test_one_running_rollout_per_group_is_enforced_by_the_database(db):
    _devices(db, 2)
    db.add_rollout("r1", "digits", "2.0.0", "cams", POLICY, [[("cam00000", "1.0.0")], [("cam00001", "1.0.0")]])
    with pytest.raises(ConflictError, match="already has a rollout running"):
        db.add_rollout("r2", "digits", "3.0.0", "cams", POLICY, [[("cam00000", "1.0.0")]])
    assert db.rollout("r2") is None, "the refused rollout left no targets behind"
    assert db.targets("r1") and not db.targets("r2")
    db.end_rollout("r1", RolloutState.COMPLETED, "done")
    db.add_rollout("r3", "digits", "3.0.0", "cams", POLICY, [[("cam00000", "2.0.0")]])


def test_the_engines_queries_return_only_what_needs_action(db):
    ids = _devices(db, 100)
    db.add_rollout("r1", "digits", "2.0.0", "cams", POLICY, [[(d, "1.0.0") for d in ids[:10]],
                                                              [(d, "1.0.0") for d in ids[10:]]])
    assert db.target_counts("r1") == {(0, TargetStatus.PENDING): 10, (1, TargetStatus.PENDING): 90}
    db.start_stage("r1", 0, sent_at=100.0)
    db.set_targets([TargetUpdate("r1", ids[0], TargetStatus.COMMITTED),
                    TargetUpdate("r1", ids[1], TargetStatus.DOWNLOADING),
                    TargetUpdate("r1", ids[2], TargetStatus.ROLLED_BACK, "health check failed")])
    assert db.due_for_resend("r1", 0, sent_before=100.0, stalled_before=100.0) == []
    assert db.due_for_resend("r1", 0, sent_before=103.0, stalled_before=90.0) == ids[3:10]
    assert db.due_for_resend("r1", 0, sent_before=103.0, stalled_before=112.0) == [ids[1], *ids[3:10]]
    db.mark_resent("r1", ids[3:10], 103.0)
    assert db.due_for_resend("r1", 0, sent_before=103.0, stalled_before=90.0) == [], "re-sent at 103: not due yet"
    assert db.time_out_targets("r1", 0, sent_before=100.0, reason="late") == 0
    assert db.time_out_targets("r1", 0, sent_before=400.0, reason="no report in 300 s") == 8
    counts = db.target_counts("r1")
    assert counts[(0, TargetStatus.TIMEOUT)] == 8 and counts[(0, TargetStatus.COMMITTED)] == 1
    (failed, *_) = db.failed_targets("r1", 3)
    assert failed.status.failed
    page = db.rollout("r1", stage=1, limit=5)
    assert len(page.targets) == 5 and page.targets_total == 100 and page.count(TargetStatus.PENDING) == 90
    assert db.rollout("r1", targets=False).targets == ()


def test_exactly_one_holder_drives_a_rollout_until_its_lease_expires(db):
    ids = _devices(db, 1)
    db.add_rollout("r1", "digits", "2.0.0", "cams", POLICY, [[(ids[0], "1.0.0")]])
    assert db.hold_lease("r1", "replica-a", now=100.0, lease_s=10)
    assert not db.hold_lease("r1", "replica-b", now=105.0, lease_s=10)
    assert db.hold_lease("r1", "replica-a", now=108.0, lease_s=10), "the holder renews"
    assert not db.hold_lease("r1", "replica-b", now=117.0, lease_s=10)
    assert db.hold_lease("r1", "replica-b", now=118.5, lease_s=10), "taken over once the renewal is overdue"
    assert db.rollout("r1", targets=False).driver == "replica-b" and not db.hold_lease("r1", "replica-a", now=119.0, lease_s=10)
    db.end_rollout("r1", RolloutState.COMPLETED, "done")
    assert db.release("cams").rollout_id == "r1"
    assert not db.hold_lease("r1", "replica-b", now=120.0, lease_s=10), "a completed rollout is not driven"
    assert [r.id for r in db.lease_releases("replica-b", now=120.0, lease_s=10)] == ["r1"], "leased as the release"
    assert db.lease_releases("replica-a", now=125.0, lease_s=10) == [], "one holder reconciles a release"
    db.add_rollout("r2", "digits", "3.0.0", "cams", POLICY, [[(ids[0], "2.0.0")]])
    assert db.lease_releases("replica-b", now=126.0, lease_s=10) == [], "nobody reconciles a group while a rollout runs"
    db.end_rollout("r2", RolloutState.COMPLETED, "done")
    assert [r.id for r in db.lease_releases("replica-a", now=131.0, lease_s=10)] == ["r2"], (
        "a superseded release is not leased; the new one is, its lease free")


def test_a_failed_batch_leaves_nothing_behind(db):
    _devices(db, 1)
    with pytest.raises(RuntimeError), db.transaction():
        db.log_many([EventRow("accepted", {"n": 1}, "cam00000", "r1")])
        db.upsert_device("cam00000", "cams", "online", "digits", "9.0.0", [])
        raise RuntimeError("the writer died mid-batch")
    assert db.events() == [] and db.device("cam00000").version == "1.0.0"
    assert db.size_bytes() > 0


def test_a_report_that_arrives_late_never_moves_a_target_back(db):
    """Two replicas write a device's 'downloaded' and 'committed' in either order: the target ends committed."""
    ids = _devices(db, 2)
    db.add_rollout("r1", "digits", "2.0.0", "cams", POLICY, [[(d, "1.0.0") for d in ids]])
    db.start_stage("r1", 0, sent_at=1.0)
    db.set_targets([TargetUpdate("r1", ids[0], TargetStatus.COMMITTED)])
    db.set_targets([TargetUpdate("r1", ids[0], TargetStatus.INSTALLING), TargetUpdate("r1", ids[0],
                                                                                      TargetStatus.DOWNLOADING)])
    db.time_out_targets("r1", 0, sent_before=2.0, reason="no report")
    db.set_targets([TargetUpdate("r1", ids[1], TargetStatus.COMMITTED)])
    statuses = {t.device_id: t.status for t in db.targets("r1")}
    assert statuses == {ids[0]: TargetStatus.COMMITTED, ids[1]: TargetStatus.COMMITTED}, \
        "a late device still counts once it answers"


def test_the_database_clock_is_the_hosts_and_moves(db):
    import time

    before = time.time()
    first = db.now()
    time.sleep(0.05)
    second = db.now()
    after = time.time()
    # Both databases run on this host here, so their clock is this host's (to the millisecond SQLite keeps).
    assert before - 0.01 <= first < second <= after + 0.01


def test_a_state_the_device_sent_before_the_stored_one_is_ignored(db):
    """Two replicas: the newer state written first, the older one after it (a late batch)."""
    def state(version, reported, seen, status="online"):
        return DeviceState("cam0", "cams", status, "digits", version, (f"digits-{version}",), seen,
                           reported=reported)

    db.upsert_devices([state("6.0.0", reported=200.0, seen=1000.0)])
    db.upsert_devices([state("2.0.0", reported=100.0, seen=1001.0)])
    assert db.device("cam0").version == "6.0.0"
    # A last will carries no time of its own: it always counts, and keeps the device's last reported time.
    db.upsert_devices([DeviceState("cam0", "cams", "offline", None, None, (), 1002.0)])
    assert db.device("cam0").status == "offline"
    db.upsert_devices([state("6.0.0", reported=150.0, seen=1003.0)])
    assert db.device("cam0").status == "offline", "still older than the newest state the device sent"
    db.upsert_devices([state("6.0.0", reported=201.0, seen=1004.0)])
    assert (db.device("cam0").status, db.device("cam0").version) == ("online", "6.0.0")
    # A device whose clock went back is believed again once nothing newer came from it for 10 minutes.
    db.upsert_devices([state("7.0.0", reported=50.0, seen=1004.0 + 601)])
    assert db.device("cam0").version == "7.0.0"


def test_an_earlier_runs_last_will_written_late_never_lists_a_device_that_came_back_as_offline(db):
    """Two replicas: the device's new run reported online, and the will of its previous run (its connection cut, or
    the agent killed) is written after it. Without a session the will would win: it has no time of its own."""
    def state(status, session, seen, reported=None):
        return DeviceState("cam0", "cams", status, "digits", "1.0.0", (), seen, reported=reported, session=session)

    db.upsert_devices([state("online", 100.0, 1000.0, reported=150.0)])
    db.upsert_devices([state("offline", 50.0, 1001.0)])  # the previous run's will, written late
    assert db.device("cam0").status == "online"
    db.upsert_devices([state("offline", 100.0, 1002.0)])  # this run's own will
    assert db.device("cam0").status == "offline"
    db.upsert_devices([state("online", 200.0, 1003.0, reported=250.0)])
    db.upsert_devices([state("offline", None, 1004.0)])  # an agent of an earlier release: no session, counts as before
    assert db.device("cam0").status == "offline"


def test_a_state_sent_before_its_connection_dropped_never_lists_the_device_online_after_its_will(db):
    """Two replicas: the device's last state goes to one, its will (the connection cut right after) to the other,
    which writes first. Seen in the chaos run (seed 1): the late state listed the device online for 50 s while it
    was gone, and the next rollout's command to it timed out as a failure instead of waiting for it."""
    def state(status, connection, seen, reported=None, session=100.0):
        return DeviceState("cam0", "cams", status, "digits", "5.0.0", (), seen, reported=reported, session=session,
                           connection=connection)

    db.upsert_devices([state("online", 1, 1000.0, reported=150.0)])
    db.upsert_devices([state("offline", 1, 1001.0)])  # the will of connection 1, written first
    db.upsert_devices([state("online", 1, 1000.9, reported=151.0)])  # sent on connection 1 before it dropped
    assert db.device("cam0").status == "offline"
    db.upsert_devices([state("online", 2, 1005.0, reported=155.0)])  # the reconnect's
    assert db.device("cam0").status == "online"
    db.upsert_devices([state("offline", 1, 1005.1)])  # connection 1's will again, written late: ignored
    assert db.device("cam0").status == "online"
    db.upsert_devices([state("offline", 2, 1006.0)])
    db.upsert_devices([state("online", 1, 1006.1, reported=160.0, session=200.0)])  # a new run of the agent
    assert db.device("cam0").status == "online"
    # A board without a real-time clock restarts with its clock behind: its new run's session is earlier than the
    # last run's, and still counts (only connections of one run are compared).
    db.upsert_devices([state("offline", 1, 1006.5, session=200.0)])
    db.upsert_devices([state("online", 1, 1006.6, reported=161.0, session=150.0)])
    assert db.device("cam0").status == "online"
    # An agent of an earlier release says no connection: a will and a reconnect in one run order as before.
    db.upsert_devices([state("offline", None, 1007.0, session=300.0)])
    db.upsert_devices([state("online", None, 1007.1, reported=170.0, session=300.0)])
    assert db.device("cam0").status == "online"
