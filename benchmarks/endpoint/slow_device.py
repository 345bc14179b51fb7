"""How much slower a Raspberry Pi 4 runs a model than this host, and the CPU quota that reproduces it.

:func:`pi4_factor` takes the Pi 4's single-thread latency from the converter's own estimate:
the instructions one inference retires on an emulated Cortex-A72 (:mod:`edgesdk.converters.board.emulate`,
cached per model), turned into milliseconds at the profile's clock; when the emulator is not
installed, the profiles' performance model (``perf``) scales this host's time instead. Either
way the basis is printed with the figure.

:func:`calibrate` compares two ways to slow the device down and keeps the one closest to a
core that is uniformly ``factor`` times slower:

- **a CPU quota** (:class:`CpuQuota`) at each candidate period. Throttling has costs of its
  own (a thread that wakes in a spent period waits for the next; caches go cold), so a share
  of exactly ``1 / factor`` slows requests by more than ``factor`` at short periods: each
  period is corrected once (its share scaled by measured p50 / target p50) and measured again.
  A quota also leaves a request that follows an idle spell fast: the period's quota is unspent;
- **the model run k times** (:func:`k_fold_model`, k = round(factor)): one ONNX graph holding k
  copies of the model, averaged, so every request costs k times the compute at any load. Only
  the model is slowed; the device's other work (the offload client) runs at this host's speed.

Each is measured back to back (p50, p99) and isolated (requests 2 target-latencies apart,
p50), and scored by the sum of absolute log ratios to ``factor`` x the unthrottled figures.

:class:`MidRunSlowdown` makes the chosen device ``by`` (1.5) times slower in the middle of a run,
by the same means: the k-fold model's runs go to one with ``round(by x k)`` copies (a
:class:`SlowableRuntime` sends ``predict`` there while it is set), or the quota's share of the
CPU is divided by ``by``. Either hits every queued run at once, as throttling or a neighbour does.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.endpoint.cpu_quota import MIN_QUOTA_US, V1, V2, CpuQuota, QuotaUnavailable, periods
from benchmarks.shared.common import log
from edgesdk import Runtime

__all__ = ["BOARD", "Slowdown", "pi4_factor", "call_latencies", "k_fold_model", "calibrate",
           "SlowableRuntime", "MidRunSlowdown"]

BOARD = "raspberry-pi-4"


def pi4_factor(model_path: Path, sample: np.ndarray, input_name: str, host_ms: float) -> dict[str, Any]:
    """The Pi 4's single-thread latency of the model, its basis, and ``factor`` = that / ``host_ms``."""
    from edgesdk.converters.board.board_latency import LatencyModel, target_point
    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.profiles import load_profile

    board = load_profile(BOARD)
    cluster = board.clusters[0]
    try:
        from edgesdk.converters.board.emulate import Emulator, board_latency_ms

        count = Emulator().count(model_path, {input_name: sample}, cluster.emulated_cpu or "cortex-a72")
        board_ms = board_latency_ms(count, cluster.microarchitecture, cluster.max_mhz, threads=1)
        basis = f"{count.label}: {count.instructions:.4g} instructions x CPI at {cluster.max_mhz:g} MHz, one thread"
    except EdgeSDKError as exc:
        model = LatencyModel.estimated(host_ms, load_profile("generic-x86_64"), 1)
        board_ms, basis = model.at(board, target_point(board, "latency", 1))
        basis = f"{basis} (perf model; the emulator is not available here: {exc})"
    factor = max(1.0, board_ms / host_ms)
    log(f"device: {BOARD} one thread {board_ms:.1f} ms ({basis}); this host {host_ms:.2f} ms -> factor {factor:.2f}")
    return {"board": BOARD, "board_ms": board_ms, "host_ms": host_ms, "factor": factor, "basis": basis}


def call_latencies(runtime: Any, inputs: list[np.ndarray], count: int) -> list[float]:
    """Seconds of each of ``count`` sequential ``predict`` calls."""
    out = []
    for i in range(count):
        started = time.perf_counter()
        runtime.predict(inputs[i % len(inputs)])
        out.append(time.perf_counter() - started)
    return out


def _percentiles(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(seconds, 50)) * 1e3, "p99_ms": float(np.percentile(seconds, 99)) * 1e3}


@dataclass
class Slowdown:
    """The chosen slow-down: run the device's runtimes on ``model_path`` inside :meth:`context`."""

    kind: str
    model_path: Path
    quota: CpuQuota | None = None
    #: Copies of the model in ``model_path`` (the k-fold slow-down), and the model they copy.
    k: int = 1
    base_path: Path | None = None

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The quota, or nothing to enter."""
        return self.quota if self.quota is not None else contextlib.nullcontext()

    @property
    def label(self) -> str:
        return self.quota.label if self.quota is not None else self.kind


def k_fold_model(model_path: Path, k: int, out: Path) -> Path:
    """The model k times over in one graph: each copy reads its input plus a distinct tiny constant (1e-38 x i,
    lost in float32 rounding, so outputs are unchanged) that keeps ONNX Runtime from merging the copies as
    common subexpressions; each output is the Mean of the copies'."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    nodes, extra = [], []
    for copy in range(k):
        def rename(name: str, copy: int = copy) -> str:
            if not name or name in initializers:
                return name
            return f"copy{copy}/{name}"

        for name in inputs:
            constant = f"copy{copy}/{name}/nudge"
            extra.append(numpy_helper.from_array(np.array(1e-38 * (copy + 1), np.float32), constant))
            nodes.append(helper.make_node("Add", [name, constant], [rename(name)]))
        for number, node in enumerate(graph.node):
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = f"copy{copy}/{number}/{node.name}"
            clone.input[:] = [rename(n) for n in node.input]
            clone.output[:] = [rename(n) for n in node.output]
            nodes.append(clone)
    for output in graph.output:
        nodes.append(helper.make_node("Mean", [f"copy{c}/{output.name}" for c in range(k)], [output.name]))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(extra)
    onnx.save(model, str(out))
    return out


def _measure(runtime: Any, inputs: list[np.ndarray], context: contextlib.AbstractContextManager[Any], calls: int,
             isolated_gap_s: float) -> dict[str, float]:
    with context:
        measured = _percentiles(call_latencies(runtime, inputs, calls))
        isolated = []
        for i in range(max(5, calls // 4)):
            time.sleep(isolated_gap_s)
            isolated += call_latencies(runtime, inputs[i:] + inputs[:i], 1)
    return {**measured, "isolated_p50_ms": float(np.percentile(isolated, 50)) * 1e3}


def _error(measured: dict[str, float], target: dict[str, float]) -> float:
    return sum(abs(math.log(measured[k] / target[k])) for k in ("p50_ms", "p99_ms")) + \
        abs(math.log(measured["isolated_p50_ms"] / target["p50_ms"]))


def calibrate(make_runtime: Callable[[Path], Any], model_path: Path, inputs: list[np.ndarray], factor: float,
              calls: int, work: Path, use_quota: bool = True) -> tuple[Slowdown, dict[str, Any]]:
    """The slow-down closest to a ``factor`` times slower core, and the figures of every candidate."""
    runtime = make_runtime(model_path)
    unthrottled = _percentiles(call_latencies(runtime, inputs, calls * 3))
    target = {k: v * factor for k, v in unthrottled.items()}
    figures: dict[str, Any] = {"unthrottled": unthrottled, "target": target}
    gap = 2 * target["p50_ms"] / 1e3
    candidates: list[dict[str, Any]] = []
    k = max(1, round(factor))
    slowed = k_fold_model(model_path, k, work / f"k{k}-{model_path.name}")
    k_runtime = make_runtime(slowed)
    measured = _measure(k_runtime, inputs, contextlib.nullcontext(), calls, gap)
    k_runtime.close()
    candidates.append({"kind": f"model run {k} times", "k": k, **measured, "error": _error(measured, target)})
    log(f"device: model x{k}: p50 {measured['p50_ms']:.1f} p99 {measured['p99_ms']:.1f} isolated "
        f"{measured['isolated_p50_ms']:.1f} ms (target {target['p50_ms']:.1f} / {target['p99_ms']:.1f})")
    if use_quota:
        for period in periods(factor):
            try:
                first = _measure(runtime, inputs, CpuQuota(factor, period), calls, gap)
                # The factor that lands p50 on target, within what the period allows (quota >= MIN_QUOTA_US).
                share = max(1.0, min(factor * target["p50_ms"] / first["p50_ms"], period / MIN_QUOTA_US))
                quota = CpuQuota(share, period)
                measured = _measure(runtime, inputs, quota, calls, gap)
            except QuotaUnavailable as exc:
                log(f"device: no CPU quota ({exc})")
                figures["quota_unavailable"] = str(exc)
                break
            candidates.append({"kind": quota.label, "period_us": period, "quota_factor": share, "first": first,
                               **measured, "error": _error(measured, target)})
            log(f"device: {quota.label}: p50 {measured['p50_ms']:.1f} p99 {measured['p99_ms']:.1f} isolated "
                f"{measured['isolated_p50_ms']:.1f} ms (first at 1/{factor:.2f}: p50 {first['p50_ms']:.1f})")
    runtime.close()
    best = min(candidates, key=lambda c: c["error"])
    if "period_us" in best:
        slowdown = Slowdown(best["kind"], model_path, CpuQuota(best["quota_factor"], best["period_us"]))
    else:
        slowdown = Slowdown(best["kind"], slowed, k=k, base_path=model_path)
    figures.update(candidates=candidates, chosen=best["kind"],
                   p50_over_unthrottled=best["p50_ms"] / unthrottled["p50_ms"],
                   p99_over_unthrottled=best["p99_ms"] / unthrottled["p99_ms"],
                   isolated_p50_over_unthrottled=best["isolated_p50_ms"] / unthrottled["p50_ms"])
    log(f"device: slowed by {best['kind']}")
    return slowdown, figures


class SlowableRuntime(Runtime):
    """A Runtime whose ``predict`` (also the local runs of ``predict_async``) goes to ``slower``,
    another Runtime of the same model's inputs and outputs, while that is set."""

    slower: Any = None

    def predict(self, inputs: Any) -> Any:  # type: ignore[override]
        """The slower runtime's answer while it is set, else this one's."""
        slower = self.slower
        return slower.predict(inputs) if slower is not None else super().predict(inputs)


class MidRunSlowdown:
    """The device ``by`` times slower between :meth:`engage` and :meth:`release` (see the module
    doc); ``factor`` is the slow-down it really applies (copies are whole)."""

    def __init__(self, slowdown: Slowdown, by: float, work: Path,
                 make_runtime: Callable[[Path], Any], sample: np.ndarray) -> None:
        self.slowdown, self._runtime = slowdown, None
        self._device: SlowableRuntime | None = None
        if slowdown.quota is not None:
            quota = slowdown.quota
            self._slow_quota_us = max(MIN_QUOTA_US, int(round(quota.quota_us / by)))
            self.factor = quota.quota_us / self._slow_quota_us
            self.label = (f"quota {quota.quota_us} -> {self._slow_quota_us} us per "
                          f"{quota.period_us} us")
            return
        if slowdown.base_path is None:
            raise ValueError("a k-fold slow-down needs the model it copies (Slowdown.base_path)")
        copies = max(slowdown.k + 1, round(by * slowdown.k))
        self.factor = copies / slowdown.k
        self.label = f"model run {slowdown.k} -> {copies} times"
        base = slowdown.base_path
        path = k_fold_model(base, copies, work / f"k{copies}-{base.name}")
        self._runtime = make_runtime(path)
        self._runtime.predict(sample)  # the session's first run is slow; not in a measured run

    @property
    def slower(self) -> Any:
        """The slower model's runtime (k-fold), or None (the quota's share is changed instead)."""
        return self._runtime

    def _quota_file(self, quota_us: int) -> tuple[Path, str]:
        quota = self.slowdown.quota
        assert quota is not None
        if (V1 / quota.name).exists():
            return V1 / quota.name / "cpu.cfs_quota_us", str(quota_us)
        return V2 / quota.name / "cpu.max", f"{quota_us} {quota.period_us}"

    def engage(self, device: SlowableRuntime) -> None:
        """From now on the device is ``factor`` times slower (inside the slow-down's context)."""
        if self._runtime is not None:
            device.slower, self._device = self._runtime, device
            return
        path, value = self._quota_file(self._slow_quota_us)
        path.write_text(value)

    def release(self) -> None:
        """The device at its calibrated speed again."""
        if self._device is not None:
            self._device.slower, self._device = None, None
        elif self.slowdown.quota is not None:
            path, value = self._quota_file(self.slowdown.quota.quota_us)
            path.write_text(value)

    def close(self) -> None:
        """Release, and close the slower model's runtime."""
        self.release()
        if self._runtime is not None:
            self._runtime.close()
