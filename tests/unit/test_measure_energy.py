"""A board's measurement (the child behind --measure-on) carries the energy its power sensor measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgesdk.runtime.measure_worker import EnergyRequest, measure_model
from edgesdk.runtime.profiles import load_profile

POWER = Path(__file__).resolve().parents[1] / "data" / "power"


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, Path]:
    from edgesdk.testing import write_sample

    folder = tmp_path_factory.mktemp("sample")
    write_sample(folder)
    np.savez(folder / "evaluation.npz", input=np.load(folder / "eval.npy")[:8])
    return folder / "model.onnx", folder / "evaluation.npz"


def test_the_measurement_carries_the_sensors_energy_per_inference(sample):
    model, evaluation = sample
    figures, outputs = measure_model(model, evaluation, load_profile("jetson-nano"), "latency", 10,
                                     energy=EnergyRequest(str(POWER / "jetson-nano-l4t32"), idle_s=0.1))
    assert figures.energy is not None and figures.energy["sensor"] == "ina3221-iio"
    assert figures.energy["scope"] == "module" and figures.energy["inferences"] == 10
    assert figures.energy["idle_watts"] == pytest.approx(1.342)  # the recorded tree's one reading
    assert figures.energy["energy_per_inference_mj"] == pytest.approx(0.0, abs=1e-6)
    assert figures.latency_p50_ms > 0 and len(next(iter(outputs.values()))) == 8


def test_without_a_sensor_the_figures_say_why_and_without_asking_there_is_no_energy(sample, tmp_path):
    model, evaluation = sample
    figures, _ = measure_model(model, evaluation, load_profile("raspberry-pi-4"), "latency", 5,
                               energy=EnergyRequest(str(tmp_path), idle_s=0.0))
    assert figures.energy == {"sensor": None, "note": "no power sensor found on raspberry-pi-4"}
    plain, _ = measure_model(model, evaluation, load_profile("raspberry-pi-4"), "latency", 5)
    assert plain.energy is None
