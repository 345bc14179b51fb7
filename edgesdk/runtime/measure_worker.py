"""Measuring a model in a child process with :class:`edgesdk.Runtime`.

Shared by the converter (:mod:`edgesdk.converters.board.measure`, figures on the host) and the
device agent (the OTA ``measure`` command, figures on the board). A fresh process per
model keeps the figures clean: its peak RSS is that model's alone (``VmHWM``, see
:mod:`edgesdk.runtime.memory`) and a crashing kernel cannot take the caller down.

The child loads the model under a profile and a mode, runs the evaluation inputs (batch 1
when an input has a fixed batch dim, else batches of up to 64) keeping every output by
name, then times ``runs`` single-sample predictions after the warm-up every measurement
uses (:func:`edgesdk.runtime.bench.time_predictions`), and reports load time, resident
memory before loading and at its peak, latency percentiles, threads, backend and
accelerator. Run as ``python -m edgesdk.runtime.measure_worker``: one JSON request on stdin, one
JSON line on stdout, the outputs in an ``.npz`` file the request names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import BackendError
from edgesdk.logs import is_verbose
from edgesdk.runtime.profile_json import profile_to_dict
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["ModelFigures", "EnergyRequest", "measure_model"]

_BATCH = 64


@dataclass(frozen=True)
class ModelFigures:
    """What one child process measured for one model."""

    size_bytes: int
    sha256: str
    load_ms: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    rss_before_mb: float
    peak_rss_mb: float
    threads: int
    backend: str
    accelerator: str
    profile: str
    mode: str
    runs: int
    #: What the board's power sensor measured (edgesdk.runtime.energy.EnergyResult.as_dict()), ``{"sensor": None, "note":
    #: ...}`` where it has none, or None when energy was not asked for.
    energy: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (what the child prints)."""
        return asdict(self)


@dataclass(frozen=True)
class EnergyRequest:
    """Where the measuring child finds the board's power sensor, and how long its idle baseline is."""

    sysfs_root: str = "/sys"
    idle_s: float = 2.0


def measure_model(model: Path, evaluation: Path, profile: DeviceProfile, mode: str, runs: int,
                  threads: int | None = None, timeout_s: float = 600,
                  energy: EnergyRequest | None = None) -> tuple[ModelFigures, dict[str, np.ndarray]]:
    """Measure ``model`` in a child process on the inputs in the ``evaluation`` ``.npz`` file.

    Returns the figures and every output on the evaluation data, by output name in the
    model's order. The outputs pass through a temporary file beside ``evaluation``. A
    child that fails or runs over ``timeout_s`` raises :class:`BackendError`. With
    ``energy``, the board's power sensor is read too (:func:`edgesdk.runtime.energy.measure_energy`:
    an idle baseline, then ``runs`` more single-sample predictions) and the figures' ``energy``
    holds the result, or why there is none.
    """
    with tempfile.TemporaryDirectory(prefix=".outputs-", dir=evaluation.parent) as tmp:
        out_path = Path(tmp) / "outputs.npz"
        request = {"model": str(model), "profile": profile_to_dict(profile), "mode": mode, "threads": threads,
                   "evaluation": str(evaluation), "outputs": str(out_path), "runs": runs,
                   "energy": None if energy is None else asdict(energy)}
        # The child's stderr (LiteRT's delegate lines, its own copy of edgesdk's warnings) is shown only
        # when verbose, or in the error when it fails.
        verbose = is_verbose()
        env = dict(os.environ) if verbose else {**os.environ, "PYTHONWARNINGS": "ignore"}
        try:
            done = subprocess.run([sys.executable, "-m", "edgesdk.runtime.measure_worker"], input=json.dumps(request),
                                  capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"measuring {model.name} took over {timeout_s:.0f} s; the variant is unusable here") \
                from exc
        if verbose and done.stderr:
            sys.stderr.write(done.stderr)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise BackendError(f"measuring {model.name} failed (exit {done.returncode}): {' | '.join(tail)}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        with np.load(out_path, allow_pickle=False) as data:
            outputs = {name: data[name] for name in result.pop("output_names")}
    return ModelFigures(**result), outputs


def _main() -> None:
    from edgesdk.runtime.memory import peak_rss_mb, rss_mb

    request = json.loads(sys.stdin.read())
    # Import everything a Runtime needs before the baseline, so the delta is the model's.
    import onnxruntime  # noqa: F401

    from edgesdk.runtime.backends.litert import import_litert
    from edgesdk.runtime.bench import time_predictions
    from edgesdk.runtime.profiles import profile_from_dict
    from edgesdk.runtime.runtime import Runtime
    from edgesdk.runtime.tensors import adapt_layout

    import_litert()
    profile = profile_from_dict(request["profile"], origin="<measure request>")
    with np.load(request["evaluation"], allow_pickle=False) as data:
        evaluation = {name: data[name] for name in data.files}
    before = rss_mb()
    started = time.perf_counter()
    with Runtime(request["model"], profile=profile, mode=request["mode"], threads=request["threads"]) as rt:
        load_ms = (time.perf_counter() - started) * 1e3
        feeds = adapt_layout(evaluation, rt.inputs)
        names = [spec.name for spec in rt.outputs]
        fixed_batch = any(s.shape and s.shape[0] is not None for s in rt.inputs)
        n = len(next(iter(feeds.values())))
        step = 1 if fixed_batch else _BATCH
        collected: dict[str, list[np.ndarray]] = {name: [] for name in names}
        for start in range(0, n, step):
            out = rt.predict({k: v[start:start + step] for k, v in feeds.items()})
            for name in names:
                collected[name].append(out if isinstance(out, np.ndarray) else out[name])
        single = {k: v[:1] for k, v in feeds.items()}
        timings = time_predictions(rt, single, int(request["runs"]))
        info = rt.info
        energy = _energy(rt, single, int(request["runs"]), request.get("energy"))
    np.savez(request["outputs"], **{name: np.concatenate(parts) for name, parts in collected.items()})  # type: ignore[arg-type]
    p50, p90, p95, p99 = timings.percentiles(50, 90, 95, 99)
    figures = ModelFigures(
        size_bytes=Path(request["model"]).stat().st_size, sha256=info.model_sha256, load_ms=load_ms,
        latency_p50_ms=p50, latency_p90_ms=p90, latency_p95_ms=p95, latency_p99_ms=p99, rss_before_mb=before,
        peak_rss_mb=peak_rss_mb(), threads=info.threads, backend=info.backend, accelerator=info.accelerator,
        profile=info.profile, mode=info.mode, runs=int(request["runs"]), energy=energy)
    print(json.dumps({**figures.as_dict(), "output_names": names}))


def _energy(rt: Any, feeds: Mapping[str, np.ndarray], runs: int, asked: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The board's energy per inference, after the timed runs so that sampling never touches them."""
    if asked is None:
        return None
    from edgesdk.errors import SensorError
    from edgesdk.runtime.energy import find_sensor, measure_energy

    try:
        sensor = find_sensor(rt.profile, asked["sysfs_root"])
        if sensor is None:
            return {"sensor": None, "note": f"no power sensor found on {rt.profile.name}"}
        return measure_energy(sensor, lambda: rt.predict(feeds), runs, float(asked["idle_s"])).as_dict()
    except SensorError as exc:  # the latency figures stand; the energy says why it is missing
        return {"sensor": None, "note": str(exc)}


if __name__ == "__main__":
    _main()
