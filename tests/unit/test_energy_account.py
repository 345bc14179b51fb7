"""The agent's energy per inference, window by window, with idle power measured on the board or from the profile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgesdk.agent.energy_account import EnergyAccount, NoEnergy, runtime_energy
from edgesdk.runtime.energy import PowerSensor
from edgesdk.runtime.profiles import load_profile

POWER = Path(__file__).resolve().parents[1] / "data" / "power"


class Board(PowerSensor):
    """1.3 W idle, 3.3 W while an inference runs."""

    kind = "test-board"

    def __init__(self) -> None:
        super().__init__(scope="module")
        self.busy = threading.Event()

    @property
    def description(self) -> str:
        return "1.3 W idle, 3.3 W busy"

    def raw(self) -> float:
        return 3.3 if self.busy.is_set() else 1.3


def _infer(board: Board, n: int) -> None:
    for _ in range(n):
        board.busy.set()
        time.sleep(0.02)
        board.busy.clear()
        time.sleep(0.01)


def test_idle_is_measured_in_windows_without_inferences_and_subtracted_from_busy_ones():
    board = Board()
    account = EnergyAccount(board, profile_idle_watts=2.8, interval_s=0.002)
    try:
        first = account.report(0)
        assert first.get("energy_per_inference_mj") is None  # no window before it to account for
        time.sleep(0.2)
        idle = account.report(0)  # nothing ran: this window's average is the board's idle power
        assert idle["inferences"] == 0 and idle["idle_basis"] == "measured"
        assert idle["idle_watts"] == pytest.approx(1.3) and idle["avg_watts"] == pytest.approx(1.3)
        _infer(board, 10)
        busy = account.report(10)
        assert busy["inferences"] == 10 and busy["idle_basis"] == "measured" and busy["sensor"] == "test-board"
        expected = (busy["avg_watts"] - 1.3) * busy["window_s"] / 10 * 1e3
        assert busy["energy_per_inference_mj"] == pytest.approx(expected, rel=0.02)
        # 2 W above idle for about 20 ms per inference: about 40 mJ (sleep overshoot and sampling edges blur it).
        assert 25 < busy["energy_per_inference_mj"] < 60
    finally:
        account.close()


def test_before_any_idle_window_the_profiles_idle_power_is_used_and_said():
    board = Board()
    account = EnergyAccount(board, profile_idle_watts=1.0, interval_s=0.002)
    try:
        account.report(0)
        _infer(board, 5)
        report = account.report(5)
        assert report["idle_basis"] == "profile" and report["idle_watts"] == 1.0
        assert report["energy_per_inference_mj"] > 0
    finally:
        account.close()


def test_a_board_without_a_sensor_or_an_agent_without_a_runtime_reports_why(tmp_path):
    assert runtime_energy(load_profile("raspberry-pi-4"), object(), str(tmp_path)).report(3) == {
        "sensor": None, "note": "no power sensor on raspberry-pi-4"}
    assert isinstance(runtime_energy(load_profile("jetson-nano"), None, str(POWER / "jetson-nano-l4t32")), NoEnergy)
    account = runtime_energy(load_profile("jetson-nano"), object(), str(POWER / "jetson-nano-l4t32"))
    try:
        assert isinstance(account, EnergyAccount) and account.sensor.kind == "ina3221-iio"
        assert account.profile_idle_watts == 1.1  # no runtime mode: the lowest idle of the profile's modes
    finally:
        account.close()
