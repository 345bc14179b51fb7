"""Shared pieces of the benchmark scripts: host description, interleaved timing, goals, output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the JSON result."""
    print(message, file=sys.stderr, flush=True)


def host(libraries: tuple[str, ...] = ("edgesdk", "numpy", "onnxruntime", "ai-edge-litert")) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.lower().startswith(("model name", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in libraries:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "machine": platform.machine(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "python": platform.python_version(), "libraries": versions}


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int, calls: int, warmup: int = 20) -> dict[str, list[float]]:
    """Per-call seconds of each candidate, A B A B … so drift hits all of them alike.

    Which candidate runs first rotates every round (A B C, B C A, …): order effects are real here.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = candidates[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return samples


def summary(seconds: list[float], scale: float = 1e3) -> dict[str, float]:
    return {"min": min(seconds) * scale, "median": statistics.median(seconds) * scale, "max": max(seconds) * scale}


def goal(name: str, target: str, measured: float, met: bool) -> dict[str, Any]:
    return {"name": name, "target": target, "measured": round(measured, 4), "met": bool(met)}


def emit(benchmark: str, params: dict[str, Any], results: dict[str, Any], goals: list[dict[str, Any]]) -> None:
    print(json.dumps({"benchmark": benchmark, "host": host(), "params": params, "results": results, "goals": goals},
                     indent=2))
