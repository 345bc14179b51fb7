"""The traffic ledger of a ManagedRuntime, on a fake clock: health checks left out, versions kept
apart across a swap, slots leaving the horizon, at most four versions, predict_async's paths
attributed."""

from __future__ import annotations

from edgesdk.agent.traffic_ledger import HORIZON_S, MAX_VERSIONS, SLOT_S, TrafficLedger, slot_of
from edgesdk.runtime.latency_histogram import bucket_of, total
from edgesdk.runtime.stats import LatencyStats


class Clock:
    def __init__(self, now: float = 1_700_000_010.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _serve(stats: LatencyStats, calls: int, ns: int = 200_000, errors: int = 0) -> None:
    for _ in range(calls):
        stats.record(ns)
    for _ in range(errors):
        stats.record_error()


def _version(ledger: TrafficLedger, version: str) -> dict:
    return ledger.document()["versions"][version]


def _sum(entry: dict, column: int) -> int:
    return sum(slot[column] for slot in entry["slots"])


def test_the_health_checks_calls_before_activation_are_not_counted():
    clock, stats = Clock(), LatencyStats()
    ledger = TrafficLedger(clock)
    _serve(stats, 11, ns=5_000_000)  # the health check: sample, warm-up, timed runs
    meter = ledger.activate("2.0.0", "digits", stats.counters)
    assert ledger.fold(meter) is False  # nothing served yet: nothing added
    _serve(stats, 120, errors=3)
    assert ledger.fold(meter) is True
    entry = _version(ledger, "2.0.0")
    assert (entry["model"], entry["activated"], ledger.session) == ("digits", clock.now, clock.now)
    assert entry["slots"] == [[slot_of(clock.now), 123, 3, 0, 0, [[bucket_of(200_000), 120]]]]


def test_two_versions_stay_apart_across_a_swap_and_the_retired_runtime_is_folded_last():
    clock = Clock()
    ledger = TrafficLedger(clock)
    old_stats, new_stats = LatencyStats(), LatencyStats()
    old = ledger.activate("1.0.0", "digits", old_stats.counters)
    _serve(old_stats, 50, ns=100_000)
    ledger.fold(old)
    clock.now += 5
    _serve(new_stats, 9)  # the new model's health check, before it serves
    new = ledger.activate("2.0.0", "digits", new_stats.counters)
    _serve(new_stats, 30, ns=900_000)
    _serve(old_stats, 2, ns=100_000, errors=1)  # requests in flight on the old model finish later
    ledger.fold(new)
    ledger.fold(old)  # the retired runtime, folded when it closes
    one, two = _version(ledger, "1.0.0"), _version(ledger, "2.0.0")
    assert (_sum(one, 1), _sum(one, 2), _sum(two, 1), _sum(two, 2)) == (53, 1, 30, 0)
    assert total(one["slots"][0][5]) == 52 and two["slots"][0][5] == [[bucket_of(900_000), 30]]
    assert two["activated"] == clock.now and one["activated"] == clock.now - 5


def test_slots_roll_out_of_the_horizon():
    clock, stats = Clock(), LatencyStats()
    ledger = TrafficLedger(clock)
    meter = ledger.activate("1.0.0", "digits", stats.counters)
    for minute in range(20):
        _serve(stats, minute + 1)
        ledger.fold(meter)
        clock.now += SLOT_S
    slots = _version(ledger, "1.0.0")["slots"]
    assert all(start + SLOT_S > clock.now - HORIZON_S for start, *_ in slots)
    assert [slot[1] for slot in slots] == list(range(6, 21))  # the last 15 minutes
    clock.now += HORIZON_S + SLOT_S
    assert ledger.document()["versions"] == {}  # nothing left in the horizon, activated before it


def test_at_most_four_versions_are_kept_the_ones_activated_last():
    clock = Clock()
    ledger = TrafficLedger(clock)
    for i in range(1, 7):
        stats = LatencyStats()
        meter = ledger.activate(f"{i}.0.0", "digits", stats.counters)
        _serve(stats, i)
        ledger.fold(meter)
        clock.now += 1
    assert list(ledger.document()["versions"]) == ["3.0.0", "4.0.0", "5.0.0", "6.0.0"]
    assert MAX_VERSIONS == 4
    again = ledger.activate("3.0.0", "digits", LatencyStats().counters)  # rolled back to
    assert again.activated == clock.now - 4  # it kept serving that version's first activation
    stats = LatencyStats()
    ledger.fold(ledger.activate("7.0.0", "digits", stats.counters))
    assert list(ledger.document()["versions"]) == ["5.0.0", "6.0.0", "3.0.0", "7.0.0"]


def test_predict_async_paths_count_for_the_version_served_when_folded():
    clock, stats = Clock(), LatencyStats()
    ledger = TrafficLedger(clock)
    totals = [0, 0]
    meter = ledger.activate("1.0.0", "digits", stats.counters)
    totals[:] = [7, 3]
    _serve(stats, 7)
    ledger.fold(meter, lambda: (totals[0], totals[1]))
    totals[:] = [7, 5]  # two more sent to the cloud, none run here
    assert ledger.fold(meter, lambda: (totals[0], totals[1])) is True
    slot = _version(ledger, "1.0.0")["slots"][0]
    assert slot[1:5] == [7, 0, 7, 5]
    changes = ledger.changes
    assert ledger.fold(meter, lambda: (totals[0], totals[1])) is False and ledger.changes == changes
