"""`edgesdk bench --energy` on recorded sensor trees: the energy of a real model run, or a board without a sensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli

POWER = Path(__file__).resolve().parents[1] / "data" / "power"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from edgesdk.testing import write_sample

    folder = tmp_path_factory.mktemp("sample")
    write_sample(folder)
    return folder / "model.onnx"


def _bench(model: Path, *args: str):
    return CliRunner().invoke(cli, ["bench", str(model), "--runs", "20", "--warmup", "2", "--energy", "--idle-s", "0.2",
                                    *args])


def test_bench_energy_reads_the_boards_sensor_through_an_idle_baseline_and_an_active_window(model):
    result = _bench(model, "--profile", "jetson-nano", "--sysfs-root", str(POWER / "jetson-nano-l4t32"), "--json")
    assert result.exit_code == 0, result.output
    energy = json.loads(result.stdout)["energy"]
    assert (energy["sensor"], energy["scope"], energy["inferences"]) == ("ina3221-iio", "module", 20)
    # The recorded tree holds one reading (1342 mW): idle and active power are that, and nothing is above idle.
    assert energy["idle_watts"] == pytest.approx(1.342) and energy["active_watts"] == pytest.approx(1.342)
    assert energy["energy_per_inference_mj"] == pytest.approx(0.0, abs=1e-6)
    assert energy["samples"] >= 2 and energy["idle_s"] >= 0.2
    table = _bench(model, "--profile", "jetson-nano", "--sysfs-root", str(POWER / "jetson-nano-l4t32"))
    assert table.exit_code == 0 and "mJ per inference above idle; idle 1.342 W" in table.output


def test_a_board_without_a_sensor_says_so_and_still_measures_latency(model, tmp_path):
    result = _bench(model, "--profile", "raspberry-pi-4", "--sysfs-root", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["energy"]["sensor"] is None and "no power sensor found on raspberry-pi-4" in data["energy"]["note"]
    assert data["p50_ms"] > 0


def test_without_energy_nothing_is_sampled(model):
    result = CliRunner().invoke(cli, ["bench", str(model), "--runs", "5", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["energy"] is None
