"""Board latencies carry a basis label and the band the calibration's held-out half supports; ties
within a band go to
the more accurate variant, then the smaller."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk import load_profile
from edgesdk.cli.convert import _table
from edgesdk.converters.board.board_latency import (
    Band,
    BoardCost,
    basis_label,
    comparison_band,
    latency_band,
)
from edgesdk.converters.board.calibration_constants import MEASURED_BAND
from edgesdk.converters.board.calibration_table import FIT
from edgesdk.converters.board.emulate import InstructionCount
from edgesdk.converters.board.measure import Measurement
from edgesdk.converters.planning.planner import CLEAR_GAIN, Candidate, choose, estimate_on_board
from edgesdk.converters.report import ConversionReport
from edgesdk.runtime.bundle import BundleSpec, HealthCheck
from edgesdk.runtime.bundling import bundle_from_model

PI5 = load_profile("raspberry-pi-5")
HOST = load_profile("generic-x86_64")
A76 = "emulated cortex-a76"


def _measurement(size_mb: float, host_ms: float = 5.0) -> Measurement:
    return Measurement(
        size_bytes=int(size_mb * 2**20),
        sha256=f"{size_mb}",
        load_ms=1.0,
        latency_p50_ms=host_ms,
        latency_p95_ms=host_ms,
        rss_before_mb=50.0,
        peak_rss_mb=60.0,
        threads=2,
        backend="onnxruntime",
        accelerator="CPUExecutionProvider",
        outputs=np.zeros((1, 1)),
    )


def _emulated(
    name: str,
    board_ms: float,
    drop: float = 0.0,
    size_mb: float = 1.0,
    precision: str = "int8_static",
) -> Candidate:
    count = InstructionCount("cortex-a76", board_ms * 1e6, 0.0, 0.0, 0.0, 1, "test")
    estimate = estimate_on_board(
        5.0, HOST, 2, PI5, "latency", emulated=BoardCost(board_ms, (count,))
    )
    return Candidate(name, "onnx", f"{name}.onnx", precision, _measurement(size_mb), drop, estimate)


def _ms(c: Candidate) -> float:
    assert c.power is not None
    return c.power.latency_ms


def test_each_source_has_its_own_label_and_band():
    assert [
        basis_label(b)
        for b in ("measured on board", A76, "estimated", "estimated GPU roofline (TensorRT fp16)")
    ] == ["measured", "emulated", "scaled", "roofline"]
    assert latency_band("raspberry-pi-5", A76) == Band(
        "emulated", FIT["bands"]["emulated"]["raspberry-pi-5/cortex-a76"]
    )
    assert latency_band("raspberry-pi-5", "measured on board").relative == MEASURED_BAND
    # Nothing validates a host timing scaled to a board, a board figure moved to another point, or a
    # board with no published figures: no band is invented for them.
    for board, basis in (
        ("raspberry-pi-5", "estimated"),
        ("raspberry-pi-5", "measured on board, scaled to x1"),
        ("jetson-nano", "emulated cortex-a57"),
    ):
        assert (
            latency_band(board, basis).relative is None
            and latency_band(board, basis).text == "unvalidated"
        )
    assert Band("emulated", 0.3).describe(12.345) == "12 ms +/-30%"
    assert Band("measured", 0.05).describe(12.345) == "12.3 ms +/-5%"


def test_variants_counted_on_one_core_are_compared_by_the_ratio_band():
    absolute = FIT["bands"]["emulated"]["raspberry-pi-5/cortex-a76"]
    ratio = FIT["ratio_bands"]["emulated"].get("raspberry-pi-5/cortex-a76", absolute)
    assert comparison_band("raspberry-pi-5", A76, A76) == ratio
    # Two bases: within the sum of their absolute bands.
    assert comparison_band("raspberry-pi-5", A76, "measured on board") == pytest.approx(
        absolute + MEASURED_BAND
    )
    assert comparison_band("raspberry-pi-5", A76, "estimated") is None


def _tolerance() -> float:
    return max(comparison_band("raspberry-pi-5", A76, A76) or 0.0, 1 / CLEAR_GAIN - 1)


def test_within_the_band_the_more_accurate_wins_even_when_slower_and_larger():
    tolerance = _tolerance()
    fp32 = _emulated("fp32", 40.0, precision="fp32", size_mb=4.0)
    fast = _emulated("int8-fast", 20.0, drop=0.4, size_mb=1.0)
    careful = _emulated("int8-careful", 20.0 * (1 + 0.8 * tolerance), drop=0.1, size_mb=1.5)
    for order in ([fp32, fast, careful], [fp32, careful, fast]):
        plan = choose(order, PI5, "latency", 0.5)
        assert plan.chosen.name == "int8-careful"
        assert plan.reason.startswith("within ") and "of int8-fast" in plan.reason
        assert (
            "chose the more accurate (accuracy, then size)" in plan.reason
            and "emulated" in plan.reason
        )


def test_equally_accurate_ties_go_to_the_smaller():
    tolerance = _tolerance()
    big = _emulated("int8-big", 20.0, drop=0.1, size_mb=2.0)
    small = _emulated("int8-small", 20.0 * (1 + 0.5 * tolerance), drop=0.1, size_mb=1.0)
    plan = choose(
        [_emulated("fp32", 40.0, precision="fp32", size_mb=4.0), big, small], PI5, "latency", 0.5
    )
    assert plan.chosen.name == "int8-small" and "chose the smaller" in plan.reason


def test_outside_the_band_the_faster_wins():
    tolerance = _tolerance()
    fast = _emulated("int8-fast", 20.0, drop=0.4, size_mb=2.0)
    careful = _emulated("int8-careful", 20.0 * (1 + 1.3 * tolerance), drop=0.1, size_mb=1.0)
    plan = choose(
        [_emulated("fp32", 40.0, precision="fp32", size_mb=4.0), careful, fast], PI5, "latency", 0.5
    )
    assert plan.chosen.name == "int8-fast" and plan.reason.startswith(
        "fastest variant within budget ("
    )
    by_name = {c.name: c for c in plan.candidates}
    assert _ms(by_name["int8-careful"]) > _ms(by_name["int8-fast"]) * (1 + tolerance)


def _report(tmp_path, digits_onnx, digits) -> ConversionReport:
    spec = BundleSpec(
        "digits",
        "1.0.0",
        "fp32",
        "raspberry-pi-5",
        "latency",
        health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=50.0),
        measured={"size_bytes": digits_onnx.stat().st_size},
    )
    bundle = bundle_from_model(tmp_path / "bundle", digits_onnx, spec, {"input": digits.x_test[:1]})
    measured = Candidate(
        "measured",
        "onnx",
        "m.onnx",
        "fp16",
        _measurement(2.0),
        0.0,
        estimate_on_board(5.0, HOST, 2, PI5, "latency", measured_ms=30.0),
    )
    scaled = Candidate(
        "scaled",
        "onnx",
        "s.onnx",
        "int8_dynamic",
        _measurement(1.0),
        0.0,
        estimate_on_board(5.0, HOST, 2, PI5, "latency"),
    )
    plan = choose(
        [_emulated("fp32", 40.0, precision="fp32", size_mb=4.0), measured, scaled],
        PI5,
        "latency",
        0.5,
    )
    return ConversionReport(
        "raspberry-pi-5", "latency", "agreement", "points", 0.5, plan, bundle, None, None
    )


def test_the_json_and_the_table_show_each_rows_basis_and_band(tmp_path, digits_onnx, digits):
    data = json.loads(json.dumps(_report(tmp_path, digits_onnx, digits).to_dict()))
    rows = {v["name"]: v for v in data["variants"]}
    assert {n: (r["board_basis"], r["board_band"]) for n, r in rows.items()} == {
        "fp32": ("emulated", FIT["bands"]["emulated"]["raspberry-pi-5/cortex-a76"]),
        "measured": ("measured", MEASURED_BAND),
        "scaled": ("scaled", None),
    }
    assert rows["scaled"]["board_band_text"] == "unvalidated"
    table = _table(data).splitlines()
    assert "board latency" in table[0] and "basis" in table[0]
    line = {n: next(t for t in table if f" {n} " in t) for n in rows}
    fp32 = Band("emulated", FIT["bands"]["emulated"]["raspberry-pi-5/cortex-a76"])
    assert (
        fp32.describe(rows["fp32"]["power"]["latency_ms"]) in line["fp32"]
        and " emulated " in line["fp32"]
    )
    assert "30.0 ms +/-5%" in line["measured"] and " measured " in line["measured"]
    assert "ms unvalidated" in line["scaled"] and " scaled " in line["scaled"]


def test_int8_at_three_quarters_of_fp32_wins_on_speed_and_at_095_ties_with_it():
    """With the shipped emulated ratio band (10% on the Pi 5's A76), an INT8 variant counted at
    0.75x FP32 is faster beyond the band and is chosen; one at 0.95x is inside it, a tie that the
    more accurate FP32 wins."""
    assert FIT["ratio_bands"]["emulated"]["raspberry-pi-5/cortex-a76"] == 0.1
    fp32 = _emulated("fp32", 40.0, precision="fp32", size_mb=4.0)
    quick = choose([fp32, _emulated("int8", 30.0, drop=0.5, size_mb=1.0)], PI5, "latency", 1.0)
    assert quick.chosen.name == "int8"
    close = choose([fp32, _emulated("int8", 38.0, drop=0.5, size_mb=1.0)], PI5, "latency", 1.0)
    assert close.chosen.name == "fp32" and "chose the more accurate" in close.reason
