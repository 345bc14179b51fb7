"""``edgesdk.Runtime``: load a model on the right backend, cores and accelerator, and run it."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendError, EdgeSDKError, InputError, ScheduleError
from edgesdk.runtime.async_predictions import AsyncPredictions
from edgesdk.runtime.backends import BackendKind, open_backend
from edgesdk.runtime.backends.tensorrt import TrtDeployment
from edgesdk.runtime.boards import GENERIC_PREFIX, fits
from edgesdk.runtime.bundle import Bundle, read_bundle
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.profiles import Accelerator, AcceleratorKind, DeviceProfile, RuntimeMode, load_profile
from edgesdk.runtime.scheduling import plan_cores
from edgesdk.runtime.stats import LatencyStats, StatsSnapshot
from edgesdk.runtime.tensors import TensorSpec, validate_inputs

if TYPE_CHECKING:
    from edgesdk.runtime.async_predictions import OffloadPolicy
    from edgesdk.runtime.power_modes import PowerModeResult

__all__ = ["Runtime", "RuntimeInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeInfo:
    """What the runtime actually set up, after every fallback."""

    model: str
    model_format: str
    #: SHA-256 of the model bytes that were loaded (matches bench figures to converter variants).
    model_sha256: str
    #: Name of the device profile in use.
    profile: str
    #: The runtime mode the cores were chosen for ("latency", "balanced", "power").
    mode: str
    #: The profile's power state serving that mode, or None when the profile declares none.
    power_mode: str | None
    backend: str
    backend_version: str
    #: The ``accelerator`` argument as given ("auto", "cpu", a name or a kind).
    requested_accelerator: str
    #: Delegate / execution provider actually running the model.
    accelerator: str
    threads: int
    #: CPU ids inference runs on.
    cores: tuple[int, ...]
    #: Every fallback taken, in order (also logged as warnings).
    fallbacks: tuple[str, ...]
    #: With ``apply_power_mode=True``: whether the board was put in ``power_mode`` (see ``Runtime.power``); else None.
    power_mode_applied: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields by name with tuples as lists, ready for JSON."""
        return {**self.__dict__, "cores": list(self.cores), "fallbacks": list(self.fallbacks)}


def _accelerators(profile: DeviceProfile, accelerator: str,
                  bundle: Bundle | None = None) -> tuple[tuple[Accelerator, ...], tuple[str, ...]]:
    """The profile's accelerators to try, and the fallback taken when the request names a kind the board lacks.

    A kind (``gpu``, ``npu``) the profile does not have falls back to the CPU, so one app
    runs across a mixed fleet; a name that matches nothing is a typo and an error. ``auto`` with a
    bundle converted for this profile takes the engine its plan was made for (the manifest's
    ``accelerator`` and ``provider``): the CPU, or that accelerator from that provider on.
    """
    planned = bundle.manifest if bundle is not None and bundle.manifest.target_profile == profile.name else None
    if accelerator == "auto" and planned is not None and planned.accelerator is not None:
        if planned.accelerator == "cpu":
            return (), ()
        for acc in profile.accelerators:
            if acc.name == planned.accelerator:
                providers = acc.onnxruntime_providers
                start = providers.index(planned.provider) if planned.provider in providers else 0
                return (replace(acc, onnxruntime_providers=providers[start:]),), ()
        return profile.accelerators, (f"the bundle was planned on {planned.accelerator!r}, which profile "
                                      f"{profile.name} lacks; trying its own accelerators",)
    if accelerator == "auto":
        return profile.accelerators, ()
    if accelerator == "cpu":
        return (), ()
    chosen = tuple(a for a in profile.accelerators if a.name == accelerator or a.kind.value == accelerator)
    if chosen:
        return chosen, ()
    if accelerator in {kind.value for kind in AcceleratorKind}:
        return (), (f"profile {profile.name} has no {accelerator} accelerator; running on CPU",)
    names = ["auto", "cpu", *(a.name for a in profile.accelerators), *(k.value for k in AcceleratorKind)]
    raise BackendError(f"profile {profile.name!r} has no accelerator {accelerator!r}; choose one of {names}")


def _other_board_note(target: str, profile: DeviceProfile, detected: bool) -> str | None:
    """What differs when a bundle planned for profile ``target`` runs under ``profile``; None when nothing does.

    The same profile name is the same board. A ``generic-<arch>`` bundle was planned for any
    board of that architecture, so it fits every profile whose ``arch`` is ``<arch>`` (a
    ``generic-x86_64`` bundle on any x86_64 host, a ``generic-aarch64`` one on any aarch64
    board). Any other name is another board, also when this host only detects as generic.
    """
    if fits(target, profile.name, profile.arch):
        return None
    generic_arch = target.removeprefix(GENERIC_PREFIX) if target.startswith(GENERIC_PREFIX) else None
    try:
        target_arch: str | None = generic_arch or load_profile(target).arch
    except EdgeSDKError:
        target_arch = None  # a profile this install does not ship: the names still differ
    here = "this host detects as" if detected else "this Runtime was given profile"
    arch = f" (CPU {target_arch} vs {profile.arch})" if target_arch not in (None, profile.arch) else ""
    return (f"latency and power figures in the bundle, and its threads and power mode, were planned for "
            f"{target}; {here} {profile.name}{arch}, so they do not describe this board; "
            f"convert with --profile {profile.name} for figures that do")


class Runtime(AsyncPredictions):
    """A model loaded for inference on this device.

    >>> with Runtime("model.tflite", mode="latency") as rt:   # doctest: +SKIP
    ...     scores = rt.predict(frame)

    ``model`` is a ``.tflite``/``.onnx`` file or a bundle directory (its hashes are checked;
    see :mod:`edgesdk.runtime.bundle`). ``profile`` is a profile name, a YAML path or a
    :class:`DeviceProfile`; None detects the board. ``mode`` picks cores by the big/little
    rule of :mod:`edgesdk.runtime.scheduling` (default: the bundle's power mode, else latency), and
    ``threads`` overrides its thread count (default, with the bundle's mode: the bundle's
    planned threads, when the converter chose them).
    ``accelerator`` is ``"auto"`` (the engine a bundle for this profile was planned on, else the profile's
    accelerators, then CPU), ``"cpu"``, an
    accelerator name from the profile, or a kind (``gpu``, ``npu``, ``dsp``). Every fallback
    to the CPU (no delegate/provider for this backend, a delegate that cannot load, a kind
    the board lacks) is logged as a warning and recorded in ``info.fallbacks``; a name that
    matches nothing is a :class:`BackendError`.

    :meth:`predict_async` queues requests on a bounded local queue (``max_local_queue``,
    default 8) and, with ``offload=OffloadPolicy(...)``, sends what the device cannot serve
    within the policy's latency SLO to a KServe V2 endpoint (see :mod:`edgesdk.offload`).
    The cloud model is checked against this one here: an unknown model or different inputs
    raise :class:`OffloadError`; an unreachable server logs one warning and the runtime runs
    locally until the endpoint answers.

    A bundle converted for another board than the profile in use (the detected one when
    ``profile`` is None) loads with one warning (logger ``edgesdk.runtime.runtime``) naming both
    profiles: its latency, power and thread figures were planned for that board. A
    ``generic-<arch>`` bundle is not for another board on any board of that architecture
    (``generic-x86_64`` on every x86_64 host, ``generic-aarch64`` on every aarch64 board).

    ``check_finite`` (default True) makes :meth:`predict` refuse NaN and Inf in floating
    inputs with :class:`InputError`: a camera or sensor feeding garbage should fail loudly,
    not return confident nonsense. The check, ``np.isfinite(x).all()``, costs about 30 µs
    per call for a 1x3x224x224 float32 input (timeit, best of 5 x 2000, on a 2-core x86_64
    host; not measured on an Arm board), small next to the milliseconds a model on such a
    frame takes, and it scales with the input, so small models pay little too. Pass False
    for models that expect non-finite values or when the caller already checks.

    ``apply_power_mode=True`` puts the board in the power mode the runtime runs in (the profile's
    cpufreq governor, clock cap and online cores under ``sysfs_root``, or ``nvpmodel -m`` on a
    Jetson; :mod:`edgesdk.runtime.power_modes`) and keeps the outcome in :attr:`power` and
    ``info.power_mode_applied``; where this process may not (not root, read-only sysfs, no
    nvpmodel), it logs the commands once and loads the model anyway. It is off by default: those
    settings are the whole board's, shared with every other process, survive this Runtime, and
    need root, which a library call should not take on its own. The device agent applies them
    for the bundles it installs (``edgesdk agent --apply-power-mode``).

    Where ONNX Runtime runs the model on TensorRT, the engine is built for the bundle's variant
    (FP16 or INT8 QDQ flags), with a workspace of half the profile's model budget, and cached
    with its timing cache in ``trt_cache/`` beside the model (the bundle's slot directory, where
    the agent's install health check builds it) or in ``trt_cache_dir``
    (:mod:`edgesdk.runtime.backends.tensorrt`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        profile: str | os.PathLike[str] | DeviceProfile | None = None,
        mode: str | RuntimeMode | None = None,
        backend: str = "auto",
        accelerator: str = "auto",
        threads: int | None = None,
        stats_window: int = 1000,
        offload: OffloadPolicy | None = None,
        max_local_queue: int | None = None,
        check_finite: bool = True,
        apply_power_mode: bool = False,
        sysfs_root: str = "/sys",
        trt_cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._check_offload_arguments(offload, max_local_queue)
        self.bundle: Bundle | None = None
        if Path(model).is_dir():
            self.bundle = read_bundle(model, verify_model=False)
            model_file = self.bundle.read_model()  # hashes the bytes it loads
        else:
            model_file = read_model(model)
        if mode is None:
            mode = self.bundle.manifest.power_mode if self.bundle else RuntimeMode.LATENCY
            if threads is None and self.bundle is not None:
                threads = self.bundle.manifest.threads  # what the converter planned (e.g. to meet a power budget)
        detected = profile is None
        if profile is None:
            from edgesdk.runtime.detect import detect_device

            profile = detect_device()
        self.profile = load_profile(profile)
        self.check_finite = check_finite
        #: Whether the bundle's figures describe this board (False without a bundle).
        self._bundle_fits = False
        if self.bundle is not None:
            note = _other_board_note(self.bundle.manifest.target_profile, self.profile, detected)
            if note:
                log.warning("bundle %s: %s", self.bundle.path, note)
            self._bundle_fits = note is None
        try:
            kind = BackendKind(backend)
        except ValueError:
            raise BackendError(f"unknown backend {backend!r}; use auto, litert or onnxruntime") from None
        try:
            parsed_mode = RuntimeMode(mode)
        except ValueError:
            raise ScheduleError(f"unknown mode {mode!r}; use latency, balanced or power") from None
        self.plan = plan_cores(self.profile, parsed_mode, threads)
        for note in self.plan.notes:
            log.warning("scheduling: %s", note)
        #: What ``apply_power_mode=True`` did (:class:`edgesdk.runtime.power_modes.PowerModeResult`); None when not asked.
        self.power: PowerModeResult | None = None
        if apply_power_mode:
            from edgesdk.runtime.power_modes import apply_power_mode as apply

            self.power = apply(self.profile, self.plan.power_mode or parsed_mode, sysfs_root)
        accelerators, missing = _accelerators(self.profile, accelerator, self.bundle)
        for note in missing:
            log.warning("accelerator fallback: %s", note)
        trt = TrtDeployment.for_model(model_file.path, self.bundle.manifest.variant if self.bundle else None,
                                      self.profile.model_budget_mb, trt_cache_dir)
        self._backend = open_backend(kind, model_file, self.plan, accelerators, self.profile.name, trt)
        backend_info = self._backend.info
        self.info = RuntimeInfo(
            model=str(model_file.path),
            model_format=model_file.format.value,
            model_sha256=model_file.sha256,
            profile=self.profile.name,
            mode=self.plan.mode.value,
            power_mode=self.plan.power_mode,
            backend=backend_info.backend,
            backend_version=backend_info.version,
            requested_accelerator=accelerator,
            accelerator=backend_info.accelerator,
            threads=backend_info.threads,
            cores=self.plan.cores,
            fallbacks=self.plan.notes + missing + backend_info.fallbacks,
            power_mode_applied=self.power.applied if self.power else None,
        )
        self._cores = frozenset(self.plan.cores)
        self._input_specs = self._backend.inputs
        self._output_names = [o.name for o in self._backend.outputs]
        self._stats = LatencyStats(stats_window)
        self._closed = False
        try:
            self._init_async(offload, max_local_queue, stats_window)
        except BaseException:
            self._backend.close()
            raise

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """What :meth:`predict` takes: each input's name, shape (None for a free dimension) and dtype, in model order."""
        return self._input_specs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """What :meth:`predict` returns, in model order (the keys of its dict for multi-output models)."""
        return self._backend.outputs

    @property
    def expected_latency_s(self) -> float | None:
        """The latency of one run the bundle measured for this board, in seconds; None without a bundle whose
        figures describe this board.

        The manifest's ``measured.board.latency_ms`` (the converter's figure for the target board),
        else ``measured.host.latency_p50_ms`` (measured where it was converted), when the bundle was
        made for this profile (or for any board of this architecture). ``predict_async`` seeds its
        latency predictor with it until the first local run ends (:mod:`edgesdk.offload.dispatcher`).
        """
        if self.bundle is None or not self._bundle_fits:
            return None
        measured = self.bundle.manifest.measured
        for section, key in (("board", "latency_ms"), ("host", "latency_p50_ms")):
            figures = measured.get(section)
            value = figures.get(key) if isinstance(figures, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
                return float(value) / 1e3
        return None

    def predict(self, inputs: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        """Run one inference.

        ``inputs`` is one array (single-input models) or ``{name: array}``; names, shapes and
        dtypes must match :attr:`inputs` exactly (no silent casts), else :class:`InputError`; so
        does NaN or Inf in a floating input unless the Runtime was made with ``check_finite=False``.
        Returns the output array for single-output models, else ``{name: array}``. A failure in
        the backend raises BackendError, also after :meth:`close`. Safe to call from several
        threads (LiteRT runs them one at a time); the calling thread runs on :attr:`info`'s cores
        for the duration of the call.
        """
        if self._closed:
            raise BackendError("this Runtime is closed; create a new one to run predictions")
        try:
            feeds = validate_inputs(self._input_specs, inputs, self.check_finite)
        except InputError:
            self._stats.record_error()
            raise
        # The calling thread joins the backend's thread pool, so it runs on the chosen cores too.
        previous = os.sched_getaffinity(0)
        repin = not previous <= self._cores
        start = time.perf_counter_ns()
        try:
            if repin:
                os.sched_setaffinity(0, self._cores)
            try:
                outputs = self._backend.run(feeds)
            finally:
                if repin:
                    os.sched_setaffinity(0, previous)
        except EdgeSDKError:
            self._stats.record_error()
            raise
        except Exception as exc:
            self._stats.record_error()
            raise BackendError(f"{self.info.backend} failed during inference: {type(exc).__name__}: {exc}") from exc
        self._stats.record(time.perf_counter_ns() - start)
        if len(outputs) == 1:
            return outputs[0]
        return dict(zip(self._output_names, outputs))

    def stats(self) -> StatsSnapshot:
        """Call and error counts since loading, and latency percentiles over the last ``stats_window`` successful calls.

        With :meth:`predict_async` in use it also says where requests ran (``paths``), how many
        were refused and fell back, and the offload breaker's state.
        """
        return self._with_paths(self._stats.snapshot())

    def counters(self) -> tuple[int, int, list[int]]:
        """Calls and failed calls since loading, and the latency histogram of the successful ones
        (a count per bucket of :mod:`edgesdk.runtime.latency_histogram`), read at once.

        Two readings' difference is what the runtime served in between
        (:meth:`edgesdk.runtime.stats.LatencyStats.counters`).
        """
        return self._stats.counters()

    def close(self) -> None:
        """Stop the predict_async workers (waiting requests fail with BackendError), then free the model. Safe twice."""
        if not self._closed:
            self._close_async()  # first: the request it is running still needs the model
            self._closed = True
            self._backend.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self.info
        return (f"Runtime({i.model!r}, backend={i.backend}, accelerator={i.accelerator}, "
                f"threads={i.threads}, cores={list(i.cores)})")
