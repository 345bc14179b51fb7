"""Worker process for :mod:`edgesdk.converters.measure`: reads one JSON request on stdin,
prints one JSON result line on stdout. Not a public interface."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from edgesdk.memory import peak_rss_mb, rss_mb


def main() -> None:
    request = json.loads(sys.stdin.read())
    # Import everything a Runtime needs before the baseline, so the delta is the model's.
    import onnxruntime  # noqa: F401

    from edgesdk.backends.litert import import_litert
    from edgesdk.converters.measure import adapt_layout
    from edgesdk.profiles import profile_from_dict
    from edgesdk.runtime import Runtime

    import_litert()
    profile = profile_from_dict(request["profile"], origin="<converter>")
    with np.load(request["evaluation"], allow_pickle=False) as data:
        evaluation = {name: data[name] for name in data.files}
    before = rss_mb()
    started = time.perf_counter()
    with Runtime(request["model"], profile=profile, mode=request["mode"], threads=request["threads"]) as rt:
        load_ms = (time.perf_counter() - started) * 1e3
        feeds = adapt_layout(evaluation, rt.inputs)
        fixed_batch = any(s.shape and s.shape[0] is not None for s in rt.inputs)
        n = len(next(iter(feeds.values())))
        step = 1 if fixed_batch else 64
        outputs = []
        for start in range(0, n, step):
            out = rt.predict({k: v[start:start + step] for k, v in feeds.items()})
            outputs.append(out if isinstance(out, np.ndarray) else next(iter(out.values())))
        one = {k: v[:1] for k, v in feeds.items()}
        for _ in range(5):
            rt.predict(one)
        latencies = []
        for _ in range(request["runs"]):
            t0 = time.perf_counter_ns()
            rt.predict(one)
            latencies.append((time.perf_counter_ns() - t0) / 1e6)
        info = rt.info
    np.save(request["outputs"], np.concatenate(outputs).astype(np.float32))
    print(json.dumps({
        "size_bytes": Path(request["model"]).stat().st_size, "sha256": info.model_sha256, "load_ms": load_ms,
        "latency_p50_ms": float(np.percentile(latencies, 50)), "latency_p95_ms": float(np.percentile(latencies, 95)),
        "rss_before_mb": before, "peak_rss_mb": peak_rss_mb(), "threads": info.threads, "backend": info.backend,
        "accelerator": info.accelerator,
    }))


if __name__ == "__main__":
    main()
