"""The calibration's fit: every constant the converter ships for board latency, from the fit half
only.

Pure arithmetic on recorded data, no emulation, so that a unit test can redo it and fail when a
shipped constant (``edgesdk.converters.board.calibration_table``) differs from what the fit half
gives:

* the **split** (:func:`split`): per (board, core, runtime family), each source's figures
  alternately to the fit and validation halves; the thread speed-up pairs the same way, per (board,
  core);
* **thread efficiency** per board cluster (:func:`fit_thread_efficiency`): the median, over the
  cluster's fit-half pairs, of ``(t1 / tN - 1) / (N - 1)``; clusters with no published pair get the
  median of all fit-half pairs. The median is the rule because one noisy published run (the yaml
  names two) must not set a board's figure; nothing here looks at the validation half;
* **CPI** per core and a time factor per runtime family (:func:`fit_cpi`): least squares of log
  error on the fit half, with each figure's own board's fitted thread efficiency;
* **bands** (:func:`bands`): what the validation half then says, per board and core: the 90th
  percentile of ``|estimate / published - 1|`` (the *absolute* band), and of the error of the
  *ratio* of two figures of the same source, core and thread count (the *ratio* band: what a
  comparison of two variants counted on the same core is off by, their shared CPI error cancelling;
  ONNX Runtime pairs only, :func:`_ratio_errors`). The 90th percentile, because a band a user reads
  as "the figure is within this" should hold for nearly every figure, while the worst of 3 to 8
  figures is one source's quirk; numpy's linear interpolation, rounded up to the next 5%, so that no
  band claims a precision the data lacks. A band is a measurement of the held-out half, never a
  choice tuned on it.
* the **proxy's ratio band** (:func:`proxy_ratio_band`): the published half has no ONNX Runtime
  pair on any board, so the ratio of two counts is checked where both counts and times exist, on
  this host (``data/proxy_pairs.yaml``, recorded by ``proxy_record.py``: real models' variants
  counted under ``qemu-x86_64 -cpu Haswell`` and timed on this CPU); whole models go alternately
  to the halves. Its two-sided 90th percentile (60%, reported) follows the kernels, not the
  counting: FP16 and dynamic INT8 pairs are within 5%, while counts *overstate* INT8 static's
  time by up to 74%, consistent with the emulated core running ONNX Runtime's AVX2 int8 kernels
  and this CPU its AVX-512 VNNI ones, a mismatch Arm's emulation (the board's own kernels, qemu
  setting the core's own features) does not have.
  **Shipped** as the emulated ratio band of every board and core with an absolute band
  (:func:`slower_ratio_band`): a tie between two counted variants guards one mistake, shipping
  a variant the count calls faster that is really slower; only a count that *understates* a
  variant's time relative to FP32 makes it (negative error). So the band is the held-out models'
  90th percentile of the understatement (0 for an overstated pair), rounded up to 5%, plus
  :data:`COUNT_REPEATABILITY`, what one count moved when counted beside another (up to 3.7%
  measured, rounded up). Its limit: measured on x86, where it stands for Arm only as the same
  method (counts of the same runtime's kernels) and on five models.

Every number is rounded as shipped (CPI and efficiency to 2 decimals, bands up to 5%).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from itertools import combinations
from typing import Any

import numpy as np

__all__ = [
    "family",
    "split",
    "split_speedups",
    "fit_thread_efficiency",
    "fit_cpi",
    "predict",
    "cpu_estimate",
    "bands",
    "band_of",
    "fit_gpu",
    "gpu_estimate",
    "shipped_table",
    "split_proxy",
    "proxy_errors",
    "proxy_ratio_band",
    "slower_ratio_band",
    "COUNT_REPEATABILITY",
    "BAND_PERCENTILE",
]

#: The percentile of held-out |error| a band is (module doc).
BAND_PERCENTILE = 90


def family(figure: Mapping[str, Any]) -> str:
    """The runtime a figure was measured with: ``onnxruntime`` (what the converter counts), ``ncnn``
    or ``tensorrt``."""
    runtime = str(figure["runtime"]).lower()
    return next(
        (n for n in ("onnxruntime", "ncnn", "tensorrt") if runtime.startswith(n)),
        runtime.split()[0],
    )


def _alternate(
    strata: Mapping[Any, Mapping[str, list[dict]]], key: Callable[[dict], str]
) -> dict[str, str]:
    half = {}
    for by_source in strata.values():
        sizes = {"validation": 0, "fit": 0}
        for source in sorted(by_source):
            first = "validation" if sizes["validation"] <= sizes["fit"] else "fit"
            other = "fit" if first == "validation" else "validation"
            for i, f in enumerate(sorted(by_source[source], key=key)):
                half[key(f)] = first if i % 2 == 0 else other
                sizes[half[key(f)]] += 1
    return half


def split(figures: Iterable[dict]) -> dict[str, str]:
    """id -> "fit" | "validation", fixed before any estimate is made.

    Per (board, core, runtime family), each source's figures (sorted by id; sources in name order)
    go alternately to
    the two halves, starting with the half that is smaller so far (validation on a tie)."""
    strata: dict[tuple[str, str, str], dict[str, list[dict]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for f in figures:
        strata[(f["board"], f["core"], family(f))][f["source"]].append(f)
    return _alternate(strata, lambda f: f["id"])


def speedup_id(pair: Mapping[str, Any]) -> str:
    """``rk3588/cortex-a55/ncnn-rk3588-android-2022/resnet18``."""
    return f"{pair['board']}/{pair['core']}/{pair['source']}/{pair['model']}"


def split_speedups(pairs: Iterable[dict]) -> dict[str, str]:
    """speedup_id -> half: per (board, core), each source's pairs by model name alternately, as
    :func:`split`."""
    strata: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for p in pairs:
        strata[(p["board"], p["core"])][p["source"]].append(p)
    return _alternate(strata, speedup_id)


def pair_efficiency(pair: Mapping[str, Any]) -> float:
    """What one published pair says each extra thread adds: ``(t1 / tN - 1) / (N - 1)``."""
    return (pair["one_thread_ms"] / pair["threads_ms"] - 1) / (pair["threads"] - 1)


def fit_thread_efficiency(pairs: list[dict], half: Mapping[str, str]) -> dict[str, float]:
    """``board/core`` -> efficiency (the median of its fit-half pairs), and ``default`` (the median
    of all)."""
    fit = [p for p in pairs if half[speedup_id(p)] == "fit"]
    by_key: dict[str, list[float]] = defaultdict(list)
    for p in fit:
        by_key[f"{p['board']}/{p['core']}"].append(pair_efficiency(p))
    out = {k: round(float(np.median(v)), 2) for k, v in sorted(by_key.items())}
    out["default"] = round(float(np.median([pair_efficiency(p) for p in fit])), 2)
    return out


def efficiency_for(efficiency: Mapping[str, float], board: str, core: str) -> float:
    """The fitted efficiency of ``board``'s ``core`` cluster, else the default."""
    return efficiency.get(f"{board}/{core}", efficiency["default"])


def cpu_estimate(
    instructions: float, cpi: float, mhz: float, threads: int, efficiency: float
) -> float:
    """Milliseconds: ``board_latency_ms``'s formula with an explicit CPI and thread efficiency."""
    return instructions * cpi / (mhz * 1e3) / (1 + efficiency * (max(threads, 1) - 1))


def fit_cpi(
    rows: list[dict], efficiency: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per core, the CPI of the converter's counts (ONNX Runtime's), and per runtime family its time
    relative to ONNX Runtime's: least squares of log error over ``rows`` (each with
    ``instructions``), rounded to 2 decimals.

    ``log(published / (count / clock / parallel)) = log CPI[core] + log factor[runtime]``,
    ``factor[onnxruntime] = 1``;
    a family's factor is fitted only when the rows hold ONNX Runtime figures too (else 1)."""
    cores = sorted({r["core"] for r in rows})
    families = sorted({family(r) for r in rows} - {"onnxruntime"})
    fitted = families if any(family(r) == "onnxruntime" for r in rows) else []
    design = np.zeros((len(rows), len(cores) + len(fitted)))
    target = np.zeros(len(rows))
    for i, r in enumerate(rows):
        design[i, cores.index(r["core"])] = 1.0
        if family(r) in fitted:
            design[i, len(cores) + fitted.index(family(r))] = 1.0
        e = efficiency_for(efficiency, r["board"], r["core"])
        target[i] = math.log(
            r["latency_ms"] / cpu_estimate(r["instructions"], 1.0, r["mhz"], r["threads"], e)
        )
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    cpis = {core: round(math.exp(solution[i]), 2) for i, core in enumerate(cores)}
    factors = {
        "onnxruntime": 1.0,
        **{f: 1.0 for f in families},
        **{f: round(math.exp(solution[len(cores) + i]), 2) for i, f in enumerate(fitted)},
    }
    return cpis, factors


def predict(
    r: Mapping[str, Any],
    cpis: Mapping[str, float],
    factors: Mapping[str, float],
    efficiency: Mapping[str, float],
) -> float:
    """The calibrated estimate of a CPU figure, in ms."""
    return cpu_estimate(
        r["instructions"],
        cpis[r["core"]] * factors.get(family(r), 1.0),
        r["mhz"],
        r["threads"],
        efficiency_for(efficiency, r["board"], r["core"]),
    )


def fit_gpu(rows: list[dict]) -> tuple[float, float]:
    """(efficiency, per-kernel µs) minimising the fit-half rows' squared log error (grid search;
    each row has
    ``roofline_ms`` and ``kernels``)."""
    best = (math.inf, 1.0, 0.0)
    for e_step in range(1, 101):
        efficiency = e_step / 100
        for kernel_us in (k * 0.5 for k in range(0, 101)):
            loss = sum(
                math.log(gpu_estimate(r, efficiency, kernel_us) / r["latency_ms"]) ** 2
                for r in rows
            )
            if loss < best[0]:
                best = (loss, efficiency, kernel_us)
    return best[1], best[2]


def gpu_estimate(row: Mapping[str, Any], efficiency: float, kernel_us: float) -> float:
    """``gpu_estimate.estimate_ms`` from a row's recorded roofline and kernel count."""
    return row["roofline_ms"] / efficiency + row["kernels"] * kernel_us / 1e3


def band_of(errors: Iterable[float]) -> float | None:
    """The :data:`BAND_PERCENTILE` of ``|errors|``, rounded up to the next 5% (None without any)."""
    values = [abs(e) for e in errors]
    if not values:
        return None
    return math.ceil(round(float(np.percentile(values, BAND_PERCENTILE)) * 20, 6)) / 20


def _ratio_errors(rows: list[dict]) -> list[float]:
    """Errors of the ratio of two estimates against the ratio of their published figures, over pairs
    of ONNX Runtime rows of the same source, core and thread count (the shared CPI and thread rule
    cancel).

    Only ONNX Runtime's: the planner compares two ONNX Runtime variants, while the ratio of two ncnn
    figures also carries ncnn's own kernel choices per model (Winograd 3x3 convolutions, FP16
    storage on Armv8.2), which the
    counts of ONNX Runtime's kernels cannot follow; those pairs would measure the runtimes'
    difference instead."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if family(r) != "onnxruntime":
            continue
        groups[
            (
                r["source"],
                r["core"],
                family(r),
                r.get("threads", 1),
                r.get("mhz"),
                r.get("gpu_mode"),
            )
        ].append(r)
    errors = []
    for members in groups.values():
        for a, b in combinations(sorted(members, key=lambda r: r["id"]), 2):
            ratio = (a["estimated_ms"] / b["estimated_ms"]) / (a["latency_ms"] / b["latency_ms"])
            errors.append(max(ratio, 1 / ratio) - 1)
    return errors


def bands(validation: list[dict]) -> dict[str, dict[str, float]]:
    """``{"absolute": {board/core: band}, "ratio": {board/core: band}}`` from validation rows with
    ``error`` and
    ``estimated_ms``; a key without a ratio pair has no ratio band."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    for r in validation:
        by_key[f"{r['board']}/{r['core']}"].append(r)
    absolute = {k: band_of(r["error"] for r in rows) for k, rows in sorted(by_key.items())}
    ratio = {k: band_of(_ratio_errors(rows)) for k, rows in sorted(by_key.items())}
    return {
        "absolute": {k: v for k, v in absolute.items() if v is not None},
        "ratio": {k: v for k, v in ratio.items() if v is not None},
    }


def split_proxy(pairs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """model -> "fit" | "validation" for the proxy pairs: whole models (a model's variants share its
    layers, so they are not independent) alternately, in name order, as :func:`split` does with one
    source's figures."""
    models = [{"model": m} for m in sorted({p["model"] for p in pairs})]
    return _alternate({"this host": {"proxy": models}}, lambda m: m["model"])


def proxy_errors(pairs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each pair with its ``half`` and ``error`` (``count_ratio / time_ratio - 1``)."""
    listed = list(pairs)
    half = split_proxy(listed)
    return [
        {**p, "half": half[p["model"]], "error": p["count_ratio"] / p["time_ratio"] - 1}
        for p in listed
    ]


#: How far one variant's count moved when counted beside another (side by side on the host's
#: cores): up to 3.7% measured (``benchmarks/converter/parallel_counts.py``), rounded up to 5%.
COUNT_REPEATABILITY = 0.05


def slower_ratio_band(pairs: Iterable[Mapping[str, Any]]) -> float | None:
    """The shipped emulated ratio band (module doc): the held-out models' 90th percentile of how
    far a count ratio understated the time ratio, rounded up to 5%, plus
    :data:`COUNT_REPEATABILITY`; None without held-out pairs."""
    held_out = [r["error"] for r in proxy_errors(pairs) if r["half"] == "validation"]
    understated = band_of(max(0.0, -e) for e in held_out)
    return None if understated is None else round(understated + COUNT_REPEATABILITY, 2)


def proxy_ratio_band(pairs: Iterable[Mapping[str, Any]]) -> float | None:
    """The ratio band the held-out models' pairs give (:func:`band_of`); the fit half fits nothing
    (a count ratio has no constant) and is kept out so that the band stays a held-out figure."""
    return band_of(r["error"] for r in proxy_errors(pairs) if r["half"] == "validation")


def shipped_table(
    cpis: Mapping[str, float],
    factors: Mapping[str, float],
    efficiency: Mapping[str, float],
    emulated: Mapping[str, Any],
    roofline: Mapping[str, Any],
    slower_band: float | None = None,
) -> dict[str, Any]:
    """What ``edgesdk.converters.board.calibration_table.FIT`` must equal; ``slower_band`` (the
    proxy's, :func:`slower_ratio_band`) is the ratio band of every emulated board and core that
    has an absolute band and no published ratio pair."""
    ratio = dict(emulated["ratio"])
    if slower_band is not None:
        ratio = {**{k: slower_band for k in emulated["absolute"]}, **ratio}
    return {
        "cpi": dict(sorted(cpis.items())),
        "runtime_factor": dict(sorted(factors.items())),
        "parallel_efficiency": dict(efficiency),
        "bands": {"emulated": dict(emulated["absolute"]), "roofline": dict(roofline["absolute"])},
        "ratio_bands": {"emulated": dict(sorted(ratio.items()))},
    }


def count_key(figure: Mapping[str, Any]) -> str:
    """How a CPU figure's recorded count is keyed: ``mobilenet_v2@224/cortex-a76`` (model, input,
    emulated core)."""
    return f"{figure['model']}@{figure['input']}/{figure['core']}"


def fit_all(
    data: Mapping[str, Any],
    recorded: Mapping[str, Any],
    proxy: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the shipped table, the rows and checks behind it) from the published figures and the
    recorded counts.

    ``recorded`` is ``{"cpu": {count_key: instructions}, "gpu": {figure id: {"roofline_ms",
    "kernels"}}}``;
    figures without a recorded count are left out (and listed). ``proxy`` is
    ``data/proxy_pairs.yaml`` (``{"pairs": [...]}``): its ratio band is measured and reported,
    not shipped (module doc)."""
    figures = data["figures"]
    half = split(figures)
    pairs = data.get("thread_speedups", [])
    speed_half = split_speedups(pairs)
    efficiency = fit_thread_efficiency(pairs, speed_half)
    cpu = [
        {**f, "half": half[f["id"]], "instructions": recorded["cpu"][count_key(f)]}
        for f in figures
        if count_key(f) in recorded.get("cpu", {})
    ]
    uncounted = [
        f["id"]
        for f in figures
        if f["core"] != "ampere-gpu" and count_key(f) not in recorded.get("cpu", {})
    ]
    cpis, factors = fit_cpi([r for r in cpu if r["half"] == "fit"], efficiency)
    for r in cpu:
        r["estimated_ms"] = predict(r, cpis, factors, efficiency)
        r["error"] = r["estimated_ms"] / r["latency_ms"] - 1
    gpu = [
        {**f, "half": half[f["id"]], **recorded["gpu"][f["id"]]}
        for f in figures
        if f["id"] in recorded.get("gpu", {})
    ]
    gpu_efficiency, kernel_us = (
        fit_gpu([r for r in gpu if r["half"] == "fit"]) if gpu else (1.0, 0.0)
    )
    for r in gpu:
        r["estimated_ms"] = gpu_estimate(r, gpu_efficiency, kernel_us)
        r["error"] = r["estimated_ms"] / r["latency_ms"] - 1
    emulated = bands([r for r in cpu if r["half"] == "validation"])
    roofline = bands([r for r in gpu if r["half"] == "validation"])
    threads = [
        {
            **p,
            "half": speed_half[speedup_id(p)],
            "published_speedup": p["one_thread_ms"] / p["threads_ms"],
            "estimated_speedup": 1
            + efficiency_for(efficiency, p["board"], p["core"]) * (p["threads"] - 1),
        }
        for p in pairs
    ]
    for p in threads:
        p["error"] = p["estimated_speedup"] / p["published_speedup"] - 1
    proxy_rows = proxy_errors(proxy["pairs"]) if proxy else []
    proxy_band = proxy_ratio_band(proxy["pairs"]) if proxy else None
    slower_band = slower_ratio_band(proxy["pairs"]) if proxy else None
    table = shipped_table(cpis, factors, efficiency, emulated, roofline, slower_band)
    return table, {
        "proxy": proxy_rows,
        "proxy_band": proxy_band,
        "slower_band": slower_band,
        "cpu": cpu,
        "gpu": gpu,
        "threads": threads,
        "uncounted": uncounted,
        "gpu_efficiency": gpu_efficiency,
        "gpu_per_kernel_us": kernel_us,
    }
