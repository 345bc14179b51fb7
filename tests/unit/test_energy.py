"""Power sensors read from recorded boards (tests/data/power), and energy integrated from their traces."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import SensorError
from edgesdk.runtime.energy import (
    PowerSensor,
    Sampler,
    Trace,
    find_sensor,
    measure_energy,
    parse_pmic_adc,
    sensor_read_cost,
)
from edgesdk.runtime.profiles import load_profile

POWER = Path(__file__).resolve().parents[1] / "data" / "power"
#: The recorded `vcgencmd pmic_read_adc`: V x A summed over the twelve rails that have both.
PI5_PMIC_WATTS = 1.75046390083789


def test_jetson_nano_l4t32_iio_rail_by_profile_and_by_probing():
    for sensor in (find_sensor(load_profile("jetson-nano"), POWER / "jetson-nano-l4t32"),
                   find_sensor(None, POWER / "jetson-nano-l4t32")):
        assert sensor is not None and sensor.kind == "ina3221-iio" and sensor.scope == "module"
        assert sensor.read() == pytest.approx(1.342) and not sensor.cumulative
        assert "in_power0_input" in sensor.description


def test_orin_nano_jetpack6_hwmon_reads_the_vdd_in_channel():
    for sensor in (find_sensor(load_profile("jetson-orin-nano"), POWER / "orin-nano-jp6"),
                   find_sensor(None, POWER / "orin-nano-jp6")):
        assert sensor is not None and sensor.kind == "ina3221-hwmon"
        assert sensor.read() == pytest.approx(5.072 * 0.712)  # VDD_IN: 5072 mV x 712 mA
        assert "VDD_IN" in sensor.description


def test_pi5_pmic_sums_the_rails_that_have_a_current_and_a_voltage(tmp_path, monkeypatch):
    text = (POWER / "pi5-pmic_read_adc.txt").read_text()
    assert parse_pmic_adc(text) == pytest.approx(PI5_PMIC_WATTS)
    fake = tmp_path / "bin"
    fake.mkdir()
    shutil.copy(POWER / "vcgencmd", fake / "vcgencmd")
    monkeypatch.setenv("EDGESDK_PMIC_FILE", str(POWER / "pi5-pmic_read_adc.txt"))
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    sensor = find_sensor(load_profile("raspberry-pi-5"), tmp_path / "no-sysfs")
    assert sensor is not None and sensor.kind == "pmic-adc" and sensor.scope == "module"
    assert sensor.read() == pytest.approx(PI5_PMIC_WATTS)
    probed = find_sensor(None, tmp_path / "no-sysfs")  # found on PATH without a profile too
    assert probed is not None and probed.kind == "pmic-adc"


def test_pmic_output_that_is_not_the_pmic_is_refused_naming_the_line():
    with pytest.raises(SensorError, match=r"line 2 is not .*'garbage here'"):
        parse_pmic_adc("  VDD_CORE_A current(7)=0.7A\ngarbage here\n")
    with pytest.raises(SensorError, match="no rail with both a current and a volt"):
        parse_pmic_adc("  EXT5V_V volt(24)=5.1V\n")


def test_no_vcgencmd_means_no_pmic_sensor(tmp_path):
    assert find_sensor(load_profile("raspberry-pi-5"), tmp_path, vcgencmd=str(tmp_path / "missing")) is None
    assert find_sensor(None, tmp_path, vcgencmd=str(tmp_path / "missing")) is None


def test_a_profile_whose_sensor_is_not_on_this_board_finds_none(tmp_path):
    assert find_sensor(load_profile("jetson-nano"), POWER / "orin-nano-jp6") is None
    # The Pi 4 declares none: the known places are probed, and on a Pi 4 nothing is there.
    assert find_sensor(load_profile("raspberry-pi-4"), tmp_path, vcgencmd=str(tmp_path / "missing")) is None


def test_x86_rapl_counter_with_its_wrap_range():
    sensor = find_sensor(load_profile("generic-x86_64"), POWER / "x86-rapl")
    assert sensor is not None and sensor.kind == "rapl" and sensor.cumulative and sensor.scope == "package"
    assert sensor.read() == pytest.approx(262141.0) and sensor.wrap_j == pytest.approx(262143.32885)


def test_a_battery_is_read_only_while_it_discharges(tmp_path):
    sensor = find_sensor(None, POWER / "battery")
    assert sensor is not None and sensor.kind == "power-supply" and sensor.read() == pytest.approx(3.12)
    tree = tmp_path / "battery"
    shutil.copytree(POWER / "battery", tree)
    (tree / "class/power_supply/BAT0/power_now").unlink()  # gauges without power_now: current x voltage
    assert find_sensor(None, tree).read() == pytest.approx(0.409 * 7.624)
    (tree / "class/power_supply/BAT0/status").write_text("Charging\n")  # power_now is then the charge power
    assert find_sensor(None, tree) is None


def test_an_unreadable_sensor_file_is_a_sensor_error_naming_it(tmp_path):
    tree = tmp_path / "rapl"
    shutil.copytree(POWER / "x86-rapl", tree)
    counter = tree / "class/powercap/intel-rapl:0/energy_uj"
    counter.unlink()
    counter.mkdir()  # a read fails like an unreadable attribute (root ignores chmod 000)
    with pytest.raises(SensorError, match=r"cannot read .*energy_uj: .*the sensor went away or the path is wrong"):
        find_sensor(load_profile("generic-x86_64"), tree)
    counter.rmdir()
    counter.write_text("n/a\n")
    with pytest.raises(SensorError, match=r"energy_uj holds 'n/a', not a number"):
        find_sensor(None, tree)


def test_calibration_scales_and_offsets_the_reading(tmp_path):
    import dataclasses

    profile = load_profile("jetson-nano")
    spec = dataclasses.replace(profile.power.sensor, scale=1.1, offset_watts=0.25)
    calibrated = dataclasses.replace(profile, power=dataclasses.replace(profile.power, sensor=spec))
    sensor = find_sensor(calibrated, POWER / "jetson-nano-l4t32")
    assert sensor.read() == pytest.approx(1.342 * 1.1 + 0.25)


def _csv(name: str) -> np.ndarray:
    return np.loadtxt(POWER / name, delimiter=",", comments="#")


def test_a_rapl_trace_across_the_wrap_integrates_to_its_known_total():
    data = _csv("x86-rapl-trace.csv")
    trace = Trace(data[:, 0], data[:, 1] / 1e6, cumulative=True, wrap_j=262143328850 / 1e6)
    assert trace.energy_j() == pytest.approx(67.1, rel=1e-9)
    assert trace.median_watts(1.6, 3.0) == pytest.approx(31.0)
    with pytest.raises(SensorError, match="went back .* with no known range to wrap at"):
        Trace(data[:, 0], data[:, 1] / 1e6, cumulative=True).energy_j()


def test_a_power_trace_integrates_by_trapezoid_and_interpolates_at_the_window_edges():
    data = _csv("jetson-nano-power-trace.csv")
    trace = Trace(data[:, 0], data[:, 1] / 1e3)
    assert trace.energy_j() == pytest.approx(11.091075, rel=1e-9)
    whole = trace.energy_j(0.0, 4.0)
    halves = trace.energy_j(0.0, 1.234) + trace.energy_j(1.234, 4.0)
    assert halves == pytest.approx(whole, rel=1e-12)
    assert trace.median_watts(0.0, 0.9) == pytest.approx(1.34, abs=0.05)


class Replayed(PowerSensor):
    """A sensor whose power follows a recorded trace (piecewise linear) from the moment it is started."""

    kind = "replayed"

    def __init__(self, times: np.ndarray, watts: np.ndarray) -> None:
        super().__init__(scope="module")
        self.times, self.watts, self.t0 = times, watts, time.monotonic()

    @property
    def description(self) -> str:
        return "replayed trace"

    def raw(self) -> float:
        return float(np.interp(time.monotonic() - self.t0, self.times, self.watts))


def test_the_sampler_integrates_a_replayed_trace_to_its_known_total():
    data = _csv("jetson-nano-power-trace.csv")
    times, watts = data[:, 0] / 4, data[:, 1] / 1e3  # the 4 s trace in 1 s; its total is then a quarter
    sensor = Replayed(times, watts)
    with Sampler(sensor, interval_s=0.002) as sampler:
        time.sleep(1.05)
    trace = sampler.trace()
    start, end = sensor.t0, sensor.t0 + 1.0
    # Piecewise linear between the recorded samples: sampled at any times, the trapezoid stays close to exact.
    assert trace.energy_j(start, end) == pytest.approx(11.091075 / 4, rel=0.01)


def test_a_bounded_sampler_keeps_only_its_newest_samples():
    sensor = Replayed(np.array([0.0, 10.0]), np.array([1.0, 1.0]))
    with Sampler(sensor, interval_s=0.001, max_samples=5) as sampler:
        time.sleep(0.05)
    assert len(sampler.trace().times_s) == 5


def test_energy_per_inference_is_the_window_above_idle_over_the_inferences():
    busy = threading.Event()

    class Loaded(PowerSensor):
        kind = "loaded"

        @property
        def description(self) -> str:
            return "1.3 W idle, 3.3 W while an inference runs"

        def raw(self) -> float:
            return 3.3 if busy.is_set() else 1.3

    def infer() -> None:
        busy.set()
        time.sleep(0.02)
        busy.clear()

    result = measure_energy(Loaded(scope="module"), infer, inferences=10, idle_s=0.2, interval_s=0.002)
    assert result.idle_watts == pytest.approx(1.3)
    assert result.energy_per_inference_mj == pytest.approx(
        (result.window_j - result.idle_watts * result.window_s) / 10 * 1e3)
    # 2 W above idle for about 20 ms each: about 40 mJ (sampling edges and sleep overshoot blur it).
    assert 25 < result.energy_per_inference_mj < 60
    assert result.as_dict()["sensor"] == "loaded" and result.samples > 50


def test_a_sysfs_read_is_cheap_enough_to_sample_often():
    sensor = find_sensor(None, POWER / "jetson-nano-l4t32")
    assert sensor is not None and sensor_read_cost(sensor, reads=50) > 0
