"""The constants that turn an instruction count into board milliseconds, and how far to trust the
result.

Every number here comes from :mod:`.calibration_table`, which ``benchmarks/converter/calibration.py
--write`` generates from the **fit half** of ``benchmarks/converter/data/published_latency.yaml``
(and the instruction counts recorded beside it); ``tests/unit/test_calibration_constants.py`` redoes
the fit and fails when a shipped number differs. The rules
(``benchmarks/converter/calibration_fit.py``):

* :data:`CYCLES_PER_INSTRUCTION`: board cycles per instruction ONNX Runtime's kernels retire, per
  core. **Fitted** for the Cortex-A76, A72 and A55 (least squares of log error on the fit half; the
  A55 counted on its stand-in ``cortex-a55``). Almost every published CPU figure is ncnn's: a
  runtime factor is fitted from the only ONNX Runtime figures (Ultralytics' Pi 5 table) and assumed
  equal on every core; ncnn computes in FP16 on Armv8.2 cores and not on the A72, so the A72's CPI
  may be overstated. **Derived** (no figures): the other cores keep a fixed ratio to the fitted core
  of their family (:data:`DERIVED`, set before any fit and never tuned); x86_64 (this host, checked
  against real timings by ``benchmarks/converter/quantization.py``) is a fixed 0.5.
* Thread efficiency (what each thread beyond the first adds, as a share of one): **per board
  cluster**, fitted from published 1- and 4-thread runs of the same models (the median of the
  fit-half pairs), and written into each profile's cluster as ``parallel_efficiency``;
  :data:`PARALLEL_EFFICIENCY` is the median of all fit-half pairs, for profiles with no published
  pair. The Pis' published runs scale 1.5-2x on 4 threads, the RK3588's 3-3.7x: one constant for all
  boards was wrong for both.
* Bands: the held-out (validation half) 90th percentile of ``|estimate / published - 1|``, per board
  and core, for the emulated and GPU-roofline bases (:func:`absolute_band`), and of the ratio of two
  figures of one source on one core (:func:`ratio_band`).
"""

from __future__ import annotations

from edgesdk.converters.board.calibration_table import FIT

__all__ = [
    "CYCLES_PER_INSTRUCTION",
    "PARALLEL_EFFICIENCY",
    "DERIVED",
    "MEASURED_BAND",
    "HOST_NOISE",
    "absolute_band",
    "ratio_band",
    "thread_efficiency",
]

#: Cores with no published figures: (the fitted core of their family, their CPI relative to it). The
#: ratios are per-clock throughput assumptions of the microarchitectures (wider or narrower cores of
#: one family), fixed.
DERIVED = {
    "cortex-a53": ("cortex-a55", 1.2),
    "cortex-a57": ("cortex-a72", 1.14),
    "cortex-a73": ("cortex-a72", 1.0),
    "cortex-a75": ("cortex-a76", 1.1),
    "cortex-a77": ("cortex-a76", 0.9),
    "cortex-a78": ("cortex-a76", 0.9),
    "cortex-a78ae": ("cortex-a76", 0.9),
    "neoverse-n1": ("cortex-a76", 1.0),
}
CYCLES_PER_INSTRUCTION: dict[str, float] = {
    **dict(FIT["cpi"]),
    **{core: round(FIT["cpi"][base] * ratio, 2) for core, (base, ratio) in DERIVED.items()},
    "x86_64": 0.5,
}
#: Thread efficiency for a cluster whose profile sets none (module doc).
PARALLEL_EFFICIENCY: float = FIT["parallel_efficiency"]["default"]
#: The band of a latency measured on the board at the point it is reported for: the run-to-run noise
#: of a median over timed runs (about 3% on a quiet board, the figure the planner's ``CLEAR_GAIN``
#: is built on), rounded up to 5%. A board figure scaled to another point takes no band (the scaling
#: is unvalidated).
MEASURED_BAND = 0.05
#: Relative noise between two timings of this host (the planner's ``CLEAR_GAIN``: 0.95).
HOST_NOISE = 0.05


def thread_efficiency(board: str, core: str) -> float | None:
    """The efficiency fitted for ``board``'s ``core`` cluster (None: no published pair covers it)."""
    return FIT["parallel_efficiency"].get(f"{board}/{core}")


def absolute_band(kind: str, board: str, cores: tuple[str, ...]) -> float | None:
    """The held-out band of a ``kind`` ("emulated", "roofline") figure on ``board``'s ``cores`` (the
    widest of
    them); None when one of them has no validated band."""
    table = FIT["bands"].get(kind, {})
    found = [table.get(f"{board}/{core}") for core in cores]
    return (
        None
        if not found or any(b is None for b in found)
        else max(b for b in found if b is not None)
    )


def ratio_band(kind: str, board: str, cores: tuple[str, ...]) -> float | None:
    """The held-out band of the ratio of two ``kind`` figures on the same ``cores`` of ``board``
    (None: not
    validated)."""
    table = FIT["ratio_bands"].get(kind, {})
    found = [table.get(f"{board}/{core}") for core in cores]
    return (
        None
        if not found or any(b is None for b in found)
        else max(b for b in found if b is not None)
    )
