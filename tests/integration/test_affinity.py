"""Inference threads really run on the cores the power mode chose (read from /proc/self/task)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime  # noqa: F401  (imported before the thread snapshot: its import may start threads)
import pytest
from ai_edge_litert import interpreter  # noqa: F401

from edgesdk import Runtime


def _cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _task_masks() -> dict[int, set[int]]:
    masks = {}
    for status in Path("/proc/self/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended between the listing and the read
            continue
        for line in lines:
            if line.startswith("Cpus_allowed_list:"):
                masks[int(status.parent.name)] = _cpu_list(line.split(":", 1)[1].strip())
    return masks


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
@pytest.mark.parametrize("mode", ["latency", "power"])
def test_worker_threads_are_confined_to_the_chosen_cluster(wide_mlp, host_big_little, fmt, mode):
    weights, onnx_path, tflite_path = wide_mlp
    before = set(_task_masks())
    caller_mask = os.sched_getaffinity(0)
    x = np.ones((32, weights.n_inputs), np.float32)
    with Runtime(onnx_path if fmt == "onnx" else tflite_path, profile=host_big_little, mode=mode, threads=2) as rt:
        rt.predict(x)
        expected = set(rt.info.cores)
        new_threads = {tid: mask for tid, mask in _task_masks().items() if tid not in before}
        assert new_threads, f"{fmt} started no worker thread with threads=2"
        assert all(mask == expected for mask in new_threads.values()), (expected, new_threads)
        # The caller joins the pool only during run(); afterwards its own mask is back.
        assert os.sched_getaffinity(0) == caller_mask
    cluster = "big" if mode == "latency" else "little"
    assert expected == set(host_big_little.cluster(cluster).cores)


def test_calling_thread_is_pinned_while_it_runs_inference(wide_mlp, host_big_little):
    weights, onnx_path, _ = wide_mlp
    caller = threading.get_native_id()
    seen: set[frozenset[int]] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            mask = _task_masks().get(caller)
            if mask is not None:
                seen.add(frozenset(mask))

    x = np.ones((64, weights.n_inputs), np.float32)
    with Runtime(onnx_path, profile=host_big_little, mode="power", threads=1) as rt:
        little = frozenset(rt.info.cores)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 5
        while little not in seen and time.monotonic() < deadline:
            rt.predict(x)
        stop.set()
        watcher.join()
    assert little in seen, f"never saw the caller on {set(little)} during inference; saw {seen}"
