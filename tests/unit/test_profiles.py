"""Shipped profiles load, and bad profile files get errors naming the file and the field."""

from __future__ import annotations

import copy

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.runtime.profiles import PROFILE_PATH_ENV, RuntimeMode, list_profiles, load_profile, profile_from_dict
from tests.unit.test_scheduling import BIG_LITTLE

SHIPPED = {"raspberry-pi-4", "raspberry-pi-5", "jetson-nano", "jetson-orin-nano", "rk3588", "generic-x86_64",
           "generic-aarch64"}


def test_every_required_board_ships_and_serves_every_mode():
    profiles = {p.name: p for p in list_profiles()}
    assert SHIPPED <= set(profiles)
    for p in profiles.values():
        assert all(p.power_mode_for(m) for m in RuntimeMode), p.name
        assert 0 < p.model_budget_mb <= p.ram_mb
        assert p.sources, f"{p.name} cites no source"


def test_published_facts_of_a_few_boards():
    rk = load_profile("rk3588")
    assert rk.is_heterogeneous and rk.cluster("big").microarchitecture == "cortex-a76"
    assert rk.cluster("little").cores == (0, 1, 2, 3) and rk.cluster("big").max_mhz == 2400
    orin = load_profile("jetson-orin-nano")
    assert len(orin.cores) == 6 and orin.accelerators[0].onnxruntime_providers[0] == "TensorrtExecutionProvider"
    nano = load_profile("jetson-nano")
    assert nano.power_mode_for("power").online_cores == 2
    assert load_profile("raspberry-pi-4").cluster("cpu").cpu_part == "0xd08"


def _write(tmp_path, data, name="board.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_missing_field_is_named(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    del data["cpu"]["clusters"][1]["max_mhz"]
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError, match=r"board.yaml: missing field 'cpu.clusters\[1\].max_mhz'"):
        load_profile(path)


def test_wrong_type_is_named_with_the_value(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["memory"]["ram_mb"] = "8 GB"
    with pytest.raises(ProfileError, match=r"board.yaml: field 'memory.ram_mb' must be int, got str '8 GB'"):
        load_profile(_write(tmp_path, data))


def test_boolean_is_not_a_number(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["idle_watts"] = True
    with pytest.raises(ProfileError, match="idle_watts' must be int or float, got bool"):
        load_profile(_write(tmp_path, data))


def test_the_old_watts_field_says_what_replaced_it(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["watts"] = 7.0
    with pytest.raises(ProfileError, match="'watts' was replaced by idle_watts .* and active_watts"):
        load_profile(_write(tmp_path, data))


def test_a_mode_without_active_power_for_its_cluster_is_refused(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["active_watts"] = {"little": 2.0}
    with pytest.raises(ProfileError, match=r"no active_watts for its cluster\(s\) \['big'\]"):
        load_profile(_write(tmp_path, data))


def test_active_power_of_an_unknown_unit_is_refused(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["active_watts"] = {"big": 9.0, "npu": 2.0}
    with pytest.raises(ProfileError, match=r"active_watts for \['npu'\], which is neither a cluster nor an accelerator"):
        load_profile(_write(tmp_path, data))


def test_power_sensor_and_sleep_figures_are_read_and_checked(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power"] = {"scope": "module", "sensor": {"kind": "ina3221-iio", "paths": ["bus/i2c/x/in_power0_input"],
                                                   "scope": "module", "unit": "mW", "scale": 1.05},
                     "sleep_watts": 0.05, "resume_s": 2, "resume_mj": 3000}
    profile = load_profile(_write(tmp_path, data))
    assert profile.power.scope == "module"
    assert profile.power.sensor is not None and profile.power.sensor.kind == "ina3221-iio"
    assert profile.power.sensor.scale == 1.05 and profile.power.resume_mj == 3000.0
    data["power"]["sensor"]["kind"] = "multimeter"
    with pytest.raises(ProfileError, match="power sensor kind 'multimeter' is not one of"):
        load_profile(_write(tmp_path, data))
    data["power"]["sensor"]["kind"] = "rapl"
    del data["power"]["resume_mj"]
    with pytest.raises(ProfileError, match="give sleep_watts, resume_s and resume_mj together"):
        load_profile(_write(tmp_path, data))


def test_every_shipped_profile_states_idle_and_active_power_with_sources():
    for profile in list_profiles():
        text = " ".join(profile.sources)
        assert "power" in text, profile.name
        for mode in profile.power_modes:
            assert mode.idle_watts > 0 and all(c in mode.active_watts for c in mode.clusters), (profile.name, mode)


def test_unknown_key_is_named(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][1]["wats"] = 3
    with pytest.raises(ProfileError, match=r"unknown field\(s\) \['power_modes\[1\].wats'\]"):
        load_profile(_write(tmp_path, data))


def test_power_mode_naming_a_missing_cluster(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["clusters"] = ["prime"]
    with pytest.raises(ProfileError, match=r"board.yaml: .*power mode 'performance' names clusters \['prime'\]"):
        load_profile(_write(tmp_path, data))


def test_unknown_runtime_mode_in_serves(tmp_path):
    data = copy.deepcopy(BIG_LITTLE)
    data["power_modes"][0]["serves"] = ["turbo"]
    with pytest.raises(ProfileError, match="'turbo' is not a runtime mode"):
        load_profile(_write(tmp_path, data))


def test_overlapping_clusters_and_bad_budget_are_refused():
    data = copy.deepcopy(BIG_LITTLE)
    data["cpu"]["clusters"][1]["cores"] = [3, 4, 5, 6]
    with pytest.raises(ProfileError, match="a core id appears in two clusters"):
        profile_from_dict(data)
    data = copy.deepcopy(BIG_LITTLE)
    data["memory"]["model_budget_mb"] = 99999
    with pytest.raises(ProfileError, match="model_budget_mb=99999 must be in 1..ram_mb=8192"):
        profile_from_dict(data)


def test_invalid_yaml_and_non_mapping(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match="must be a mapping, got list"):
        load_profile(tmp_path / "list.yaml")


def test_user_directory_adds_and_overrides_profiles(tmp_path, monkeypatch):
    mine = copy.deepcopy(BIG_LITTLE)
    mine["name"] = "my-board"
    _write(tmp_path, mine, "my-board.yaml")
    override = copy.deepcopy(BIG_LITTLE)
    override["name"], override["description"] = "rk3588", "my RK3588 with 16 GB"
    _write(tmp_path, override, "rk3588.yaml")
    monkeypatch.setenv(PROFILE_PATH_ENV, str(tmp_path))
    assert load_profile("my-board").name == "my-board"
    assert load_profile("rk3588").description == "my RK3588 with 16 GB"
    assert load_profile("my-board", profile_dirs=[tmp_path]).origin.endswith("my-board.yaml")


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ProfileError, match=r"no device profile named 'pi6'; known profiles: .*raspberry-pi-5"):
        load_profile("pi6")


def test_missing_profile_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_PATH_ENV, str(tmp_path / "nope"))
    with pytest.raises(ProfileError, match="does not exist"):
        list_profiles()


def test_accelerator_roofline_ceilings_are_optional_read_and_checked(tmp_path):
    orin = load_profile("jetson-orin-nano").accelerators[0]
    assert orin.peak_tflops["fp16"] == 10.0 and orin.memory_gbps == 68.0  # data sheet, see the profile's sources
    assert load_profile("rk3588").accelerators[0].peak_tflops == {}  # absent: the accelerator is not costed
    assert load_profile("rk3588").accelerators[0].memory_gbps is None
    from importlib import resources

    data = yaml.safe_load((resources.files("edgesdk.device_profiles") / "jetson-orin-nano.yaml").read_text())
    data["accelerators"][0]["peak_tflops"] = {"fp16": "fast"}
    with pytest.raises(ProfileError, match="peak_tflops and memory_gbps need numbers > 0"):
        load_profile(_write(tmp_path, data))
    data["accelerators"][0]["peak_tflops"] = {"fp16": 10.0}
    data["accelerators"][0]["memory_gbps"] = 0
    with pytest.raises(ProfileError, match="peak_tflops and memory_gbps need numbers > 0"):
        load_profile(_write(tmp_path, data))
