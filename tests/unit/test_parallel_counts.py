"""The pool that runs emulated counts side by side (issue 59, item 5): at most `workers` at once,
each waited for alone or all together, with the time left estimated from the finished ones. Counts
here are plain functions that block on events, so what runs when is decided by the test, not by a
clock."""

from __future__ import annotations

import threading

import pytest

from edgesdk.converters.board.parallel_counts import CountPool, progress_line, time_left
from edgesdk.errors import EmulatorError


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_left_shares_the_mean_of_the_finished_counts_over_the_workers():
    # mean 90 s; one running for 30 s has 60 s left; two queued, 90 s each: 240 s on 2 workers
    assert time_left([60.0, 120.0], [30.0], 2, workers=2) == pytest.approx(120.0)
    assert time_left([60.0], [90.0], 0, workers=2) == 0.0  # past the mean: nothing left to say
    assert time_left([60.0], [], 3, workers=8) == pytest.approx(60.0)  # 3 lanes busy, not 8
    assert time_left([], [5.0], 1, workers=2) is None  # no count finished: no basis
    assert time_left([], [], 0, workers=2) == 0.0


def test_the_progress_line_says_how_many_are_done_and_labels_the_time_left_an_estimate():
    assert progress_line(3, 7, 240.0, 2) == (
        "counting on the board's emulated cores (2 at a time): 3/7 variants, about 4 min left "
        "(estimated from the counts done)")
    assert progress_line(6, 7, 40.0, 2).endswith(
        "6/7 variants, about 40 s left (estimated from the counts done)")
    assert progress_line(0, 7, None, 2).endswith(
        "0/7 variants, time left not known until a count finishes")
    assert progress_line(7, 7, 0.0, 2).endswith(": 7/7 variants")


def test_no_more_than_workers_counts_run_at_once_and_the_next_starts_when_one_ends():
    pool = CountPool(workers=2)
    started = {label: threading.Event() for label in "abc"}
    release = {label: threading.Event() for label in "abc"}

    def count(label: str):  # type: ignore[no-untyped-def]
        def work() -> str:
            started[label].set()
            release[label].wait()
            return label.upper()
        return work

    for label in "abc":
        pool.submit(label, count(label))
    assert started["a"].wait(10) and started["b"].wait(10)
    assert not started["c"].is_set(), "both workers are busy: the third count must wait"
    release["b"].set()
    assert pool.result("b") == "B"
    assert started["c"].wait(10)
    release["a"].set()
    release["c"].set()
    lines: list[tuple[str, int, int]] = []
    pool.wait_all(lambda line, done, total: lines.append((line, done, total)))
    assert [pool.result(label) for label in "abc"] == ["A", "B", "C"] and lines[-1][1:] == (3, 3)
    pool.close()


def test_a_counts_error_is_raised_to_whoever_waits_for_it_and_the_others_are_unaffected():
    pool = CountPool(workers=1)

    def fails() -> None:
        raise EmulatorError("qemu went away")

    pool.submit("bad", fails)
    pool.submit("good", lambda: 42)
    with pytest.raises(EmulatorError, match="qemu went away"):
        pool.result("bad")
    assert pool.result("good") == 42
    pool.close()


def test_the_time_left_comes_from_the_counts_finished_so_far():
    clock = FakeClock()
    pool = CountPool(workers=1, clock=clock)
    gate = threading.Event()

    def takes(seconds: float):  # type: ignore[no-untyped-def]
        def work() -> None:
            clock.now += seconds  # the fake clock moves as if the count took that long
        return work

    def blocked() -> None:
        gate.wait()

    pool.submit("a", takes(120.0))
    pool.submit("b", blocked)
    pool.submit("c", takes(10.0))
    pool.result("a")
    # a took 120 s; b has just started (0 s run), c is queued: 240 s of work on one worker
    assert pool.progress_line().endswith(
        "1/3 variants, about 4 min left (estimated from the counts done)")
    gate.set()
    pool.wait_all()
    pool.close()


def test_stop_drops_the_queued_counts_and_kills_the_running_ones_before_it_returns():
    pool = CountPool(workers=1)
    running, killed = threading.Event(), threading.Event()

    def long_count() -> None:
        running.set()
        if not killed.wait(10):
            raise AssertionError("never killed")
        raise EmulatorError("killed")

    pool.submit("running", long_count)
    pool.submit("queued", lambda: "never")
    assert running.wait(10)
    pool.stop(killed.set)
    assert killed.is_set()
    with pytest.raises(EmulatorError, match="killed"):
        pool.result("running")
    from concurrent.futures import CancelledError

    with pytest.raises(CancelledError):
        pool.result("queued")
    pool.close()


def test_a_worker_count_below_one_is_refused():
    with pytest.raises(EmulatorError, match="workers=0: counts need at least one worker"):
        CountPool(workers=0)
