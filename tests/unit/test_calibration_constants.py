"""The board-latency constants the converter ships are what the calibration's fit half gives, and
nothing else.

The fit (benchmarks/converter/calibration_fit.py) runs on the published figures and the instruction
counts recorded beside them (benchmarks/converter/data/calibration_counts.yaml, written by
`benchmarks/converter/calibration.py --record`): no emulation, so it is redone here on every run.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from benchmarks.converter.calibration_fit import (
    COUNT_REPEATABILITY,
    fit_all,
    proxy_ratio_band,
    slower_ratio_band,
    speedup_id,
    split,
    split_proxy,
    split_speedups,
)
from edgesdk import load_profile
from edgesdk.converters.board.calibration_constants import (
    CYCLES_PER_INSTRUCTION,
    DERIVED,
    PARALLEL_EFFICIENCY,
)
from edgesdk.converters.board.calibration_table import FIT
from edgesdk.converters.board.gpu_estimate import EFFICIENCY, PER_KERNEL_US

DATA_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "converter" / "data"


@pytest.fixture(scope="module")
def data() -> dict:
    return yaml.safe_load((DATA_DIR / "published_latency.yaml").read_text())


@pytest.fixture(scope="module")
def recorded() -> dict:
    return yaml.safe_load((DATA_DIR / "calibration_counts.yaml").read_text())


@pytest.fixture(scope="module")
def proxy() -> dict:
    return yaml.safe_load((DATA_DIR / "proxy_pairs.yaml").read_text())


def test_the_shipped_table_is_what_the_fit_half_gives(data, recorded, proxy):
    table, fit = fit_all(data, recorded, proxy)
    # Every CPU figure has its recorded count, except those the recording says it left out (none,
    # once every model is counted): the fit is over the figures the record names, never a silent
    # subset.
    assert fit["uncounted"] == recorded.get("uncounted", [])
    assert table == FIT
    # The GPU roofline's efficiency and per-kernel cost too (edgesdk.converters.board.gpu_estimate).
    assert (fit["gpu_efficiency"], fit["gpu_per_kernel_us"]) == (EFFICIENCY, PER_KERNEL_US)


def test_each_profile_carries_the_thread_efficiency_fitted_for_it():
    fitted = {k: v for k, v in FIT["parallel_efficiency"].items() if k != "default"}
    assert {
        "raspberry-pi-4/cortex-a72",
        "raspberry-pi-5/cortex-a76",
        "rk3588/cortex-a76",
        "rk3588/cortex-a55",
    } <= set(fitted)
    for key, efficiency in fitted.items():
        board, core = key.split("/")
        cluster = next(c for c in load_profile(board).clusters if c.microarchitecture == core)
        assert cluster.parallel_efficiency == efficiency, f"{board} cluster {cluster.name}"
    assert PARALLEL_EFFICIENCY == FIT["parallel_efficiency"]["default"]


def test_cycles_per_instruction_are_the_fitted_ones_and_fixed_ratios_of_them():
    for core, cpi in FIT["cpi"].items():
        assert CYCLES_PER_INSTRUCTION[core] == cpi
    for core, (base, ratio) in DERIVED.items():
        assert CYCLES_PER_INSTRUCTION[core] == round(FIT["cpi"][base] * ratio, 2)


def _scaled(data: dict, half_name: str, factor: float) -> dict:
    """``data`` with every figure and every 4-thread time of one half multiplied by ``factor``."""
    changed = copy.deepcopy(data)
    half, speed_half = split(changed["figures"]), split_speedups(changed["thread_speedups"])
    for f in changed["figures"]:
        if half[f["id"]] == half_name:
            f["latency_ms"] *= factor
    for p in changed["thread_speedups"]:
        if speed_half[speedup_id(p)] == half_name:
            p["threads_ms"] *= factor
    return changed


def test_the_proxy_ratio_band_is_the_held_out_models_measurement_shipped_one_sided(
    data, recorded, proxy
):
    # Whole models go to one half, alternately in name order: a model's variants share its layers.
    half = split_proxy(proxy["pairs"])
    models = sorted(half)
    assert len(models) >= 4
    assert [half[m] for m in models] == [["validation", "fit"][i % 2] for i in range(len(models))]
    band = proxy_ratio_band(proxy["pairs"])
    assert band is not None and round(band * 20, 9) == int(round(band * 20, 9))

    def scaled(which: str, factor: float) -> list[dict]:
        return [
            {**p, "time_ratio": p["time_ratio"] * (factor if half[p["model"]] == which else 1)}
            for p in proxy["pairs"]
        ]

    # The held-out models' times move the band; the fit half's do not (it fits nothing).
    assert proxy_ratio_band(scaled("fit", 1.5)) == band
    assert proxy_ratio_band(scaled("validation", 1.5)) != band
    # Shipped one-sided (calibration_fit's doc): the held-out understatement plus the count's
    # repeatability, on every emulated board and core with an absolute band.
    table, fit = fit_all(data, recorded, proxy)
    assert fit["slower_band"] == 0.1 and table == FIT
    assert set(FIT["ratio_bands"]["emulated"]) == set(FIT["bands"]["emulated"])
    assert set(FIT["ratio_bands"]["emulated"].values()) == {0.1}
    # Held-out times that make counts understate (times 1.5x: a count then says 1/1.5 of the
    # truth) widen it; overstating ones (times / 1.5) leave only the repeatability.
    assert slower_ratio_band(scaled("validation", 1.5)) > 0.1
    assert slower_ratio_band(scaled("validation", 1 / 1.5)) == COUNT_REPEATABILITY
    assert slower_ratio_band(scaled("fit", 1.5)) == 0.1
    widened, _ = fit_all(data, recorded, {**proxy, "pairs": scaled("validation", 1.5)})
    assert widened != FIT


def test_the_validation_half_moves_the_bands_and_never_a_constant(data, recorded):
    table, _ = fit_all(data, recorded)
    moved, _ = fit_all(_scaled(data, "validation", 1.5), recorded)
    for name in ("cpi", "runtime_factor", "parallel_efficiency"):
        assert moved[name] == table[name], name
    assert moved["bands"] != table["bands"]  # the bands are the validation half's own measurement
    # ... while the fit half does move the constants, so the equality test above can fail.
    refit, _ = fit_all(_scaled(data, "fit", 1.5), recorded)
    assert (
        refit["cpi"] != table["cpi"]
        and refit["parallel_efficiency"] != table["parallel_efficiency"]
    )


def test_bands_are_rounded_up_to_five_percent_and_cover_the_boards_with_figures():
    emulated = FIT["bands"]["emulated"]
    assert {"raspberry-pi-4/cortex-a72", "raspberry-pi-5/cortex-a76", "rk3588/cortex-a76"} <= set(
        emulated
    )
    for band in [
        *emulated.values(),
        *FIT["bands"]["roofline"].values(),
        *FIT["ratio_bands"]["emulated"].values(),
    ]:
        assert band > 0 and round(band * 20, 9) == int(round(band * 20, 9))
