"""The canary and wave sizes of a rollout (issue 37): the canary is ceil(fraction × devices) and at least 1; a wave
that adds no device is collapsed and reported, never silently dropped."""

from __future__ import annotations

import pytest

from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.rollouts.stages import collapsed, stage_plan, stage_sizes


@pytest.mark.parametrize(("canary", "n", "expected"), [
    (0.01, 3, 1),     # 1% of 3 is 0.03: at least one device
    (0.01, 1000, 10),
    (0.34, 3, 2),     # 1.02 -> ceil 2, never more
    (0.33, 3, 1),     # 0.99 -> 1
    (1.0, 3, 3),      # everything at once
    (1.0, 1, 1),
    (0.07, 100, 7),   # 0.07 * 100 is 7.000000000000001 in floating point: still 7, not 8
    (0.1, 30, 3),
])
def test_canary_is_ceil_of_fraction_and_at_least_one(canary: float, n: int, expected: int) -> None:
    plan = stage_plan(n, RolloutPolicy(canary=canary, waves=(1.0,)))
    assert plan[0].devices == expected
    assert stage_sizes(n, RolloutPolicy(canary=canary, waves=(1.0,)))[0] == expected


@pytest.mark.parametrize("canary", [0.01, 0.34, 0.5, 0.999])
def test_canary_never_exceeds_ceil_of_fraction(canary: float) -> None:
    import math

    for n in range(1, 200):
        size = stage_plan(n, RolloutPolicy(canary=canary, waves=(1.0,)))[0].devices
        assert 1 <= size <= max(1, math.ceil(round(canary * n, 9))), (canary, n, size)


def test_no_devices_makes_one_empty_stage_and_no_collapsed_wave() -> None:
    plan = stage_plan(0, RolloutPolicy(canary=0.1, waves=(0.5, 1.0)))
    assert [s.devices for s in plan] == [0, 0, 0]
    assert stage_sizes(0, RolloutPolicy()) == [0]
    assert collapsed(plan) == []


def test_a_wave_with_no_device_of_its_own_is_reported_as_collapsed() -> None:
    plan = stage_plan(3, RolloutPolicy(canary=0.1, waves=(0.67, 1.0)))
    assert [(s.devices, s.added) for s in plan] == [(1, 1), (3, 2), (3, 0)]
    assert [s.fraction for s in collapsed(plan)] == [1.0]
    assert stage_sizes(3, RolloutPolicy(canary=0.1, waves=(0.67, 1.0))) == [1, 3]
    assert plan[2].to_json() == {"percent": 100.0, "devices": 3, "added": 0, "collapsed": True}


def test_every_sent_stage_adds_a_device_and_the_last_holds_the_group() -> None:
    for n in range(1, 60):
        for policy in (RolloutPolicy(), RolloutPolicy(canary=0.01, waves=(0.02, 0.03, 1.0)),
                       RolloutPolicy(canary=0.5, waves=(1.0,)), RolloutPolicy(canary=1.0, waves=())):
            sizes = stage_sizes(n, policy)
            assert sizes[-1] == n and all(b > a for a, b in zip(sizes, sizes[1:])), (n, policy, sizes)
            assert len(sizes) + len(collapsed(stage_plan(n, policy))) == len(policy.stages)


def test_small_waves_are_pushed_up_one_device_rather_than_collapsed() -> None:
    # 1%, 2%, 3% of 10 devices: each adds a device (1, 2, 3), the last wave the rest.
    assert stage_sizes(10, RolloutPolicy(canary=0.01, waves=(0.02, 0.03, 1.0))) == [1, 2, 3, 10]
