"""The offload latency predictor on a simulated clock: out-of-sample calibration free of host noise.

**What is measured.** The real :class:`~edgesdk.offload.predictor.LatencyPredictor` drives one
simulated FIFO worker: Poisson arrivals, each admitted locally when its predicted tail is within
the SLO and the queue (``--max-local-queue``) has room (the dispatcher's local rule; the rest
would go to the cloud, which is not simulated). Service times are ``base x slowdown(t) x
lognormal(0, sigma)``: independent noise per run, times a factor that every run shares at a
given moment (a slowdown hits the whole queue). The predictor reads the simulated clock, so its
figures are counts, the same on every machine (BENCHMARKS.md: deterministic figures where time
cannot be trusted). benchmarks/endpoint/offload.py measures the same share on real runs.

Per scenario and seed: the share of local requests, after the predictor's warm-up, that took
longer than the tail they were admitted on (a p99 margin means about 1%), and the share of
arrivals run locally (what a wider margin costs). Two margin rules side by side on the same
arrivals and service times: the predictor's (residual / runs, linear in the runs, with the depth
bucket's own p99) and the previous one (residual / sqrt(runs), independent errors).

Scenarios (SLO 4 service times unless said): 1x and 2x capacity; a step from 1x to 2x; a 1.5x
slowdown half-way at 1x; slow spells (1.3x for 2 s in every 10 s) at 2x with the SLO at 12
service times (deep queues); and light load (0.6x) that turns into 2x with a 1.3x slowdown at
SLO 12x, where the residuals were learned at shallow depths.

    python benchmarks/endpoint/predictor_sim.py [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk.offload.predictor import TAIL_PERCENTILE, LatencyPredictor  # noqa: E402

BASE_S = 0.100  # the service time: capacity 10/s
SIGMA = 0.08  # independent log-normal noise per run
HANDOFF_S = 0.0005  # between a run's end and the next one's start
CAPACITY = 1 / BASE_S


class SqrtMargin(LatencyPredictor):
    """The previous margin rule on the same residuals: p99 of residual / sqrt(runs), times
    sqrt(runs) (errors independent from run to run)."""

    def _margin(self, runs: int) -> tuple[float, str]:
        margin, basis = super()._margin(runs)
        if basis != "residuals":
            return margin * math.sqrt(runs) / runs, basis  # the deviation margin was sqrt too
        scaled = [z * math.sqrt(n) for z, n in self._residuals]  # z = residual / n
        return float(np.percentile(scaled, TAIL_PERCENTILE)) * math.sqrt(runs), basis


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(predictor_class: type[LatencyPredictor], rate: Callable[[float], float],
             slowdown: Callable[[float], float], span_s: float, seed: int, slo_runs: float,
             bound: int) -> dict[str, Any]:
    """One run: arrivals for ``span_s`` seconds; the predictor's calibration after warm-up."""
    rng = np.random.default_rng(seed)
    clock = _Clock()
    predictor = predictor_class(0.2, clock)
    arrivals, t = [], 0.0
    while True:
        t += rng.exponential(1 / rate(t))
        if t > span_s:
            break
        arrivals.append(t)
    noise = rng.lognormal(0, SIGMA, len(arrivals))
    events = [(at, 1, i) for i, at in enumerate(arrivals)]
    heapq.heapify(events)
    queue: list[tuple[int, float, Any]] = []
    running: list[Any] = []
    slo_s, local, settled, over = slo_runs * BASE_S, 0, 0, 0

    def start(now: float) -> None:
        if not running and queue:
            job = queue.pop(0)
            predictor.begin()
            took = BASE_S * slowdown(now) * noise[job[0]]
            running.append(job)
            heapq.heappush(events, (now + took + HANDOFF_S, 0, job[0]))

    while events:
        now, kind, index = heapq.heappop(events)
        clock.now = now
        if kind == 1:
            prediction = predictor.predict(len(queue))
            if len(queue) + len(running) < bound and prediction.tail_s <= slo_s:
                queue.append((index, now, prediction))
                local += 1
                start(now)
            continue
        predictor.end()
        _, admitted, prediction = running.pop()
        predictor.settle(prediction, now - admitted)
        if prediction.basis == "residuals":  # admitted on a calibrated margin: out of sample
            settled += 1
            over += int(now - admitted > prediction.tail_s)
        start(now)
    return {"arrivals": len(arrivals), "local_share": local / max(len(arrivals), 1),
            "requests_after_warmup": settled, "over_after_warmup": over}


Scenario = tuple[Callable[[float], float], Callable[[float], float], float, int]


def scenarios(span_s: float) -> dict[str, Scenario]:
    """name -> (rate(t), slowdown(t), SLO in service times, queue bound)."""
    half = span_s / 2

    def spells(t: float) -> float:
        return 1.3 if t % 10 < 2 else 1.0

    return {
        "1x": (lambda t: CAPACITY, lambda t: 1.0, 4, 8),
        "2x": (lambda t: 2 * CAPACITY, lambda t: 1.0, 4, 8),
        "step_1x_to_2x": (lambda t: CAPACITY if t < half else 2 * CAPACITY, lambda t: 1.0, 4, 8),
        "slowdown_1.5x_at_1x": (lambda t: CAPACITY, lambda t: 1.0 if t < half else 1.5, 4, 8),
        "slow_spells_2x_slo_12": (lambda t: 2 * CAPACITY, spells, 12, 16),
        "light_then_2x_slowed_slo_12": (lambda t: 0.6 * CAPACITY if t < half else 2 * CAPACITY,
                                        lambda t: 1.0 if t < half else 1.3, 12, 16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, two seeds")
    args = parser.parse_args()
    span_s, seeds = (60.0, 2) if args.quick else (300.0, 6)
    results: dict[str, Any] = {}
    goals = []
    for name, (rate, slowdown, slo_runs, bound) in scenarios(span_s).items():
        row: dict[str, Any] = {}
        for label, cls in (("linear_depth", LatencyPredictor), ("sqrt", SqrtMargin)):
            runs = [simulate(cls, rate, slowdown, span_s, seed, slo_runs, bound)
                    for seed in range(seeds)]
            requests = sum(r["requests_after_warmup"] for r in runs)
            over = sum(r["over_after_warmup"] for r in runs)
            row[label] = {"over_tail_after_warmup": over / requests if requests else None,
                          "over": over, "requests": requests,
                          "local_share": float(np.mean([r["local_share"] for r in runs]))}
        results[name] = row
        ours, before = row["linear_depth"], row["sqrt"]
        log(f"{name}: over tail {ours['over']}/{ours['requests']} (sqrt rule {before['over']}/"
            f"{before['requests']}), local share {ours['local_share']:.3f} "
            f"({before['local_share']:.3f})")
        goals.append(goal(
            f"simulated {name}: local requests over their admitted tail after warm-up, margin "
            f"linear in the runs (sqrt(runs) rule: {before['over_tail_after_warmup']:.4f}; local "
            f"share {ours['local_share']:.3f} vs {before['local_share']:.3f})",
            "report", ours["over_tail_after_warmup"] or 0.0, True))
    params = {"quick": args.quick, "span_s": span_s, "seeds": seeds, "base_s": BASE_S,
              "sigma": SIGMA, "alpha": 0.2, "clock": "simulated"}
    emit("predictor_sim", params, results, goals)


if __name__ == "__main__":
    main()
