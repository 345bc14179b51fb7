"""NNCF's ``quantize_with_accuracy_control`` as a peer for the quantization benchmark (issue 20, item 5).

:func:`nncf_accuracy_control` runs, from edgesdk's environment, NNCF's post-training quantization
with accuracy control on an FP32 ONNX model, with the same calibration and validation data and
the same bound as edgesdk's ``convert()``, and returns the quantized model's path with NNCF's
figures and timings (:class:`NncfResult`).

**Its own virtualenv.** NNCF pulls in scikit-learn, scipy, networkx, pydot, ninja, rich and
openvino-telemetry; none of that belongs in edgesdk's environment, so :class:`NncfEnv` keeps
NNCF in ``$EDGESDK_NNCF_VENV``, by default ``~/.cache/edgesdk/venvs/nncf-<version>``, created on
first use with the Python that runs edgesdk and ``pip install`` of :data:`REQUIREMENTS`: NNCF
pinned, and onnx, onnxruntime and numpy pinned to the versions of edgesdk's development
environment, so both sides run the same onnxruntime kernels. It is a :class:`_peer_venv.PeerVenv`:
built aside, checked (``import nncf, onnx, onnxruntime``), marked and renamed into place under a
lock, rebuilt when :data:`REQUIREMENTS` change. It needs PyPI (or the pip index settings).

**The worker.** ``nncf_worker.py`` runs inside that environment as a subprocess (its own
process group, killed on timeout), reads the inputs this module writes to a temporary
directory (``.npz``/``.npy``), and writes the quantized model and a JSON result; see its
docstring for the request, the built-in metrics and ``metric_file``. NNCF's telemetry is never
imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from benchmarks.shared.peer_venv import VENVS, PeerVenv, clean_env, log_tail
from edgesdk.converters.formats.onnx2tf_tool import (
    run_logged,  # the onnx2tf tool's runner: log file, process group killed on timeout
)

__all__ = ["NNCF_VERSION", "REQUIREMENTS", "NncfEnv", "NncfError", "NncfResult", "nncf_accuracy_control"]

NNCF_VERSION = "3.4.0"
#: What the environment holds: NNCF, and the onnx/onnxruntime/numpy of edgesdk's own development environment.
REQUIREMENTS = (f"nncf=={NNCF_VERSION}", "onnx==1.23.2", "onnxruntime==1.32.0", "numpy==2.4.6")
VENV_ENV = "EDGESDK_NNCF_VENV"
WORKER = Path(__file__).resolve().with_name("nncf_worker.py")
_NNCF_ENV = {"NNCF_CI": "1"}  # one of NNCF's switches that turn its telemetry into a stub


class NncfError(RuntimeError):
    """The NNCF environment could not be installed, or the worker failed or timed out (the message has its output's tail)."""

    def __init__(self, message: str, *, timed_out: bool = False, log_tail: str = "") -> None:
        super().__init__(f"{message}\n{log_tail}" if log_tail else message)
        self.timed_out = timed_out  # the worker ran out of time (NNCF's restorer can take long: see nncf_options)
        self.log_tail = log_tail


def _default_location() -> Path:
    return Path(os.environ.get(VENV_ENV) or VENVS / f"nncf-{NNCF_VERSION}")


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: no edgesdk packages mixed in, NNCF's telemetry a stub."""
    return clean_env({**_NNCF_ENV, **(extra or {})})


@dataclass(frozen=True)
class NncfEnv(PeerVenv):
    """The virtualenv holding NNCF (see the module docstring and :class:`PeerVenv`)."""

    location: Path = field(default_factory=_default_location)
    requirements: tuple[str, ...] = REQUIREMENTS
    check: str = "import nncf, onnx, onnxruntime, numpy"
    extra_env: Mapping[str, str] = field(default_factory=lambda: dict(_NNCF_ENV))
    error: ClassVar[type[Exception]] = NncfError


@dataclass(frozen=True)
class NncfResult:
    """One NNCF run: the quantized model and what the worker reported (``raw`` has all of it)."""

    path: Path
    wall_s: float  # the worker process, start to exit (Python start-up, imports, NNCF, final check, save)
    quantize_s: float  # the quantize_with_accuracy_control call alone
    nncf_version: str
    metric: str
    max_drop: float
    initial_metric: float | None  # FP32, as NNCF's validation saw it
    quantized_metric: float | None  # every quantizer NNCF inserts, before any is reverted
    final_metric: float  # the returned model, re-measured on every validation sample
    final_drop: float | None
    within_bound: bool | None
    restorer_ran: bool  # the fully quantized model missed the bound, so NNCF reverted operations to float
    reverted_operations: tuple[str, ...]  # node names NNCF put back to float (none unless the restorer ran)
    quantized_operations: int | None  # how many NNCF had quantized, as its restorer logs it (None if it did not run)
    quantize_linear: int
    install_s: float | None  # this call's venv install, None when it was cached
    raw: dict[str, Any]


def _builtin_metrics() -> tuple[str, ...]:
    """The worker's metric names (the worker module imports only numpy until it runs)."""
    spec = importlib.util.spec_from_file_location("_nncf_worker_names", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.METRICS)


def _save_targets(targets: Any, folder: Path) -> dict[str, Any]:
    if targets is None:
        return {"targets": None}
    if isinstance(targets, Mapping):
        path = folder / "targets.npz"
        np.savez(path, **{str(k): np.asarray(v) for k, v in targets.items()})
        return {"targets": str(path), "targets_dict": True}
    if isinstance(targets, (list, tuple)):
        path = folder / "targets.npz"
        keys = [f"t{i}" for i in range(len(targets))]
        np.savez(path, **{k: np.asarray(v) for k, v in zip(keys, targets)})
        return {"targets": str(path), "targets_keys": keys}
    path = folder / "targets.npy"
    np.save(path, np.asarray(targets), allow_pickle=False)
    return {"targets": str(path)}


def nncf_accuracy_control(fp32_path: str | Path, calibration: Mapping[str, np.ndarray],
                          validation: Mapping[str, np.ndarray], targets: Any, metric: str, max_drop: float,
                          out_path: str | Path, timeout_s: float = 1800, *, metric_file: str | Path | None = None,
                          nncf_options: Mapping[str, Any] | None = None, env: NncfEnv | None = None,
                          install_timeout_s: float = 1800) -> NncfResult:
    """Quantize ``fp32_path`` with NNCF's accuracy control into ``out_path``, within ``max_drop`` of ``metric``.

    ``calibration`` and ``validation`` map input names to arrays whose axis 0 is the sample (each sample is
    fed with batch 1). ``targets``: None (the FP32 model's outputs), labels or a reference output (an
    array), or several arrays (a list or dict), axis 0 the sample. ``metric``: ``"top1_agreement"``, or,
    with ``metric_file`` (a Python file defining ``validate(session_outputs_list, targets) -> float``,
    higher is better), the label for that metric. ``max_drop`` is absolute, in the metric's units.
    ``nncf_options``: see ``nncf_worker.py``. ``timeout_s`` bounds the worker; the first call also
    installs the environment (bounded by ``install_timeout_s``). Raises :class:`NncfError`.
    """
    if metric_file is None and metric not in _builtin_metrics():
        raise ValueError(f"unknown metric {metric!r}: built in are {sorted(_builtin_metrics())}; "
                         "pass metric_file for others")
    env = env or NncfEnv()
    install_s = env.ensure(install_timeout_s)
    out_path = Path(out_path).resolve()
    with tempfile.TemporaryDirectory(prefix="edgesdk-nncf-") as tmp:
        folder = Path(tmp)
        np.savez(folder / "calibration.npz", **{k: np.asarray(v) for k, v in calibration.items()})
        np.savez(folder / "validation.npz", **{k: np.asarray(v) for k, v in validation.items()})
        request = {"model": str(Path(fp32_path).resolve()), "out": str(out_path), "result": str(folder / "result.json"),
                   "calibration": str(folder / "calibration.npz"), "validation": str(folder / "validation.npz"),
                   "metric": metric, "metric_file": None if metric_file is None else str(Path(metric_file).resolve()),
                   "max_drop": float(max_drop), "nncf_options": dict(nncf_options or {}),
                   **_save_targets(targets, folder)}
        (folder / "request.json").write_text(json.dumps(request, indent=1))
        log_path = folder / "worker.log"
        command = [str(env.python), str(WORKER), str(folder / "request.json")]
        started = time.perf_counter()
        try:
            code = run_logged(command, folder, log_path, timeout_s, _clean_env({"PYTHONWARNINGS": "ignore"}))
        except subprocess.TimeoutExpired as exc:
            raise NncfError(f"NNCF accuracy control on {fp32_path} did not finish within {timeout_s:g} s (raise timeout_s, "
                            "or bound the restorer with nncf_options={'max_num_iterations': N}); worker output:",
                            timed_out=True, log_tail=log_tail(log_path)) from exc
        wall_s = time.perf_counter() - started
        if code != 0 or not (folder / "result.json").exists():
            raise NncfError(f"NNCF accuracy control on {fp32_path} failed (exit {code}); worker output:",
                            log_tail=log_tail(log_path))
        raw = json.loads((folder / "result.json").read_text())
    raw["peer_wall_s"] = round(wall_s, 3)
    return NncfResult(path=out_path, wall_s=round(wall_s, 3), quantize_s=raw["quantize_s"],
                      nncf_version=raw["nncf_version"], metric=metric, max_drop=float(max_drop),
                      initial_metric=raw["initial_metric"], quantized_metric=raw["quantized_metric"],
                      final_metric=raw["final_metric"], final_drop=raw["final_drop"], within_bound=raw["within_bound"],
                      restorer_ran=raw["restorer_ran"], reverted_operations=tuple(raw["reverted_operations"]),
                      quantized_operations=raw["quantized_operations"], quantize_linear=raw["quantize_linear"],
                      install_s=None if install_s is None else round(install_s, 1), raw=raw)
