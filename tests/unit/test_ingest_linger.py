"""Group commit: reports that trickle in share a transaction while they keep coming (within ``linger_s`` of the
oldest, with no gap of ``quiet_s``), a lone report waits only ``quiet_s``, and a report that already waited
``linger_s`` is not held back again."""

from __future__ import annotations

import threading
import time

from edgesdk.ota_server.devices.ingest import LINGER_BELOW, Ingest
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB


def _state(device: str) -> DeviceState:
    return DeviceState(device, "lab", "online", "digits", "1.0.0", (), time.time())


def _trickle(tmp_path, linger_s: float, quiet_s: float | None = None, reports: int = 5,
             gap_s: float = 0.03) -> tuple[int, int]:
    """``reports`` reports ``gap_s`` apart: the batches and reports the writer made of them."""
    db = FleetDB(tmp_path / f"fleet-{linger_s}-{quiet_s}.db")
    ingest = Ingest(db, linger_s=linger_s, quiet_s=quiet_s)
    try:
        for i in range(reports):
            ingest.put(_state(f"cam{i}"))
            time.sleep(gap_s)
        assert ingest.flush()
        assert len(db.devices("lab")) == reports
        return ingest.batches, ingest.written
    finally:
        ingest.stop()
        db.close()


def test_reports_trickling_in_share_one_transaction_within_the_linger(tmp_path):
    assert _trickle(tmp_path, linger_s=1.0) == (1, 5)


def test_reports_that_keep_coming_are_gathered_past_the_quiet_gap_up_to_the_linger(tmp_path):
    """Twelve reports 30 ms apart (360 ms in all) with a 200 ms quiet gap: one transaction, not one per gap."""
    assert _trickle(tmp_path, linger_s=1.5, quiet_s=0.2, reports=12, gap_s=0.03) == (1, 12)


def test_a_pause_longer_than_the_quiet_gap_ends_the_wait(tmp_path):
    """Reports 500 ms apart with a 100 ms quiet gap: each is written before the next comes, however long the
    linger."""
    batches, written = _trickle(tmp_path, linger_s=3.0, quiet_s=0.1, reports=3, gap_s=0.5)
    assert (batches, written) == (3, 3), "the writer held reports past a pause longer than its quiet gap"


def test_without_a_linger_each_trickling_report_is_its_own_transaction(tmp_path):
    batches, written = _trickle(tmp_path, linger_s=0.0)
    assert written == 5 and batches > 1, "reports 30 ms apart all waited for each other without a linger"


def test_a_report_is_written_within_the_linger_of_its_arrival(tmp_path):
    db = FleetDB(tmp_path / "fleet.db")
    ingest = Ingest(db, linger_s=0.3)
    try:
        started = time.monotonic()
        ingest.put(_state("cam0"))
        assert ingest.flush(timeout=5.0)
        waited = time.monotonic() - started
        assert waited >= 0.25, f"written after {waited:.2f} s, not held for the linger"
        assert ingest.batches == 1
    finally:
        ingest.stop()
        db.close()


def test_a_lone_report_waits_the_quiet_gap_not_the_whole_linger(tmp_path):
    db = FleetDB(tmp_path / "fleet.db")
    ingest = Ingest(db, linger_s=3.0, quiet_s=0.1)
    try:
        started = time.monotonic()
        ingest.put(_state("cam0"))
        assert ingest.flush(timeout=5.0)
        waited = time.monotonic() - started
        assert 0.08 <= waited < 2.0, f"a lone report was written after {waited:.2f} s (quiet gap 0.1 s, linger 3 s)"
    finally:
        ingest.stop()
        db.close()


class _SlowStore(FleetDB):
    """A store whose first write takes ``slow_s``: reports queue up behind it, as under load."""

    slow_s = 0.5
    writing: threading.Event  # set when the slow write begins

    def upsert_devices(self, states):
        if self.slow_s:
            self.writing.set()
            time.sleep(self.slow_s)
            self.slow_s = 0.0
        return super().upsert_devices(states)


def test_under_load_the_writer_does_not_linger(tmp_path):
    """Reports that queued up while the writer wrote are written at once: a linger there holds back the answers a
    rollout waits for."""
    db = _SlowStore(tmp_path / "fleet.db")
    db.writing = threading.Event()
    ingest = Ingest(db, linger_s=2.0)
    try:
        ingest.put(_state("first"))  # lingers 2 s, then its write takes 0.5 s
        assert db.writing.wait(10.0), "the first report was never written"
        started = time.monotonic()
        for i in range(LINGER_BELOW + 10):  # a crowd queues behind that write
            ingest.put(_state(f"cam{i}"))
        assert ingest.flush(timeout=10.0)
        waited = time.monotonic() - started
        assert waited < 1.5, f"a crowd queued behind a write waited {waited:.1f} s: the writer lingered under load"
        assert ingest.batches == 2 and ingest.written == LINGER_BELOW + 11
    finally:
        ingest.stop()
        db.close()


def test_a_trickle_filling_a_batch_per_linger_is_not_split_into_lone_reports(tmp_path):
    """Reports trickling in at more than ``LINGER_BELOW`` per linger share one transaction per linger. A rule judging by
    the last batch's size wrote every other batch at once, mostly a single report: twice the transactions."""
    started = time.monotonic()
    batches, written = _trickle(tmp_path, linger_s=0.4, reports=8 * LINGER_BELOW, gap_s=0.005)
    took = time.monotonic() - started
    assert written == 8 * LINGER_BELOW
    assert batches <= took / 0.4 + 1.5, f"{written} reports over {took:.1f} s, with a linger of 0.4 s, took {batches} " \
                                        "transactions"
