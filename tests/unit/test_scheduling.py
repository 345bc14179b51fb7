import copy

import pytest

from edgesdk.errors import ProfileError, ScheduleError
from edgesdk.runtime.profiles import RuntimeMode, profile_from_dict
from edgesdk.runtime.scheduling import plan_cores

ALL8 = frozenset(range(8))

BIG_LITTLE = {
    "name": "rk-like",
    "description": "4x A55 + 4x A76",
    "arch": "aarch64",
    "cpu": {"clusters": [
        {"name": "little", "cores": [0, 1, 2, 3], "microarchitecture": "cortex-a55", "cpu_part": "0xd05",
         "max_mhz": 1800, "capacity": 530},
        {"name": "big", "cores": [4, 5, 6, 7], "microarchitecture": "cortex-a76", "cpu_part": "0xd0b",
         "max_mhz": 2400, "capacity": 1024},
    ]},
    "memory": {"ram_mb": 8192, "model_budget_mb": 1536},
    "power_modes": [
        {"name": "performance", "idle_watts": 1.0, "active_watts": {"big": 9.0},
             "clusters": ["big"], "serves": ["latency", "balanced"]},
        {"name": "efficiency", "idle_watts": 1.0, "active_watts": {"little": 4.0},
             "clusters": ["little"], "serves": ["power"]},
    ],
}


def _profile(**changes):
    data = copy.deepcopy(BIG_LITTLE)
    data.update(changes)
    return profile_from_dict(data)


def test_latency_runs_one_thread_per_big_core():
    plan = plan_cores(_profile(), "latency", available=ALL8)
    assert (plan.cores, plan.threads, plan.clusters, plan.power_mode) == ((4, 5, 6, 7), 4, ("big",), "performance")
    assert plan.notes == ()


def test_power_runs_on_the_little_cluster():
    plan = plan_cores(_profile(), RuntimeMode.POWER, available=ALL8)
    assert (plan.cores, plan.threads, plan.power_mode) == ((0, 1, 2, 3), 4, "efficiency")


def test_balanced_uses_half_the_threads_on_the_big_cores():
    plan = plan_cores(_profile(), "balanced", available=ALL8)
    assert (plan.cores, plan.threads) == ((4, 5, 6, 7), 2)


def test_online_cores_limit_the_core_set():
    modes = copy.deepcopy(BIG_LITTLE["power_modes"])
    modes[1]["online_cores"] = 2
    plan = plan_cores(_profile(power_modes=modes), "power", available=ALL8)
    assert plan.cores == (0, 1) and plan.threads == 2


def test_power_without_a_little_cluster_falls_back_to_half_the_cores_and_says_so():
    homogeneous = {
        "cpu": {"clusters": [{"name": "cpu", "cores": [0, 1, 2, 3], "microarchitecture": "cortex-a72",
                              "max_mhz": 1800, "capacity": 1024}]},
        "power_modes": [{"name": "performance", "idle_watts": 1.0, "active_watts": {"cpu": 6.4},
             "clusters": ["cpu"], "serves": ["latency"]}],
    }
    plan = plan_cores(_profile(**homogeneous), "power", available=ALL8)
    assert plan.cores == (0, 1) and plan.threads == 2
    assert "no little cluster" in plan.notes[0]
    balanced = plan_cores(_profile(**homogeneous), "balanced", available=ALL8)
    assert balanced.cores == (0, 1, 2, 3) and balanced.threads == 2
    assert "declares no power mode for 'balanced'" in balanced.notes[0]


def test_power_without_a_power_mode_on_big_little_takes_the_little_cluster():
    modes = [BIG_LITTLE["power_modes"][0]]
    plan = plan_cores(_profile(power_modes=modes), "power", available=ALL8)
    assert plan.cores == (0, 1, 2, 3) and "little cluster" in plan.notes[0]


def test_cores_missing_on_this_host_fall_back_to_usable_ones_and_say_so():
    plan = plan_cores(_profile(), "latency", available=frozenset({0, 1}))
    assert plan.cores == (0, 1) and plan.threads == 2
    assert "not usable on this host" in plan.notes[0]


def test_partially_usable_cores_keep_the_usable_part():
    plan = plan_cores(_profile(), "latency", available=frozenset({0, 4, 5}))
    assert plan.cores == (4, 5) and plan.threads == 2
    assert "[6, 7]" in plan.notes[0]


def test_thread_override_and_oversubscription_note():
    assert plan_cores(_profile(), "latency", threads=1, available=ALL8).threads == 1
    plan = plan_cores(_profile(), "latency", threads=6, available=ALL8)
    assert plan.threads == 6 and "share cores" in plan.notes[0]
    with pytest.raises(ScheduleError, match="threads must be >= 1, got 0"):
        plan_cores(_profile(), "latency", threads=0, available=ALL8)


def test_unknown_mode_names_the_choices():
    with pytest.raises(ProfileError, match="unknown mode 'turbo'.*latency, balanced, power"):
        plan_cores(_profile(), "turbo", available=ALL8)


def test_profile_dict_round_trip():
    from edgesdk.runtime.profile_json import profile_to_dict

    profile = _profile()
    assert profile_from_dict(profile_to_dict(profile)) == profile
