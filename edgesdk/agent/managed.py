"""``ManagedRuntime``: serve predictions while models are swapped underneath.

Requests in flight finish on the model they started on; new requests go to the new one;
the old runtime is closed when its last request returns. With ``swap_order="unload-first"``
(memory-tight boards) the old model is closed before the new one loads and requests
arriving in between wait instead of failing. ``"auto"`` picks unload-first when two models
would not fit the profile's model budget together.

Before a new model takes traffic it must pass its bundle's health check: the sample input
must give the expected output within the manifest's tolerance, and the median latency of
a few runs (after the usual warm-up, :func:`edgesdk.runtime.bench.time_predictions`) must be within
``max_latency_ms``.

With ``offload=OffloadPolicy(...)``, :meth:`ManagedRuntime.predict_async` routes between the
active model and a KServe V2 endpoint (:mod:`edgesdk.offload`). There is one dispatcher for
the ManagedRuntime's lifetime: its local runs go to whichever model is active, so the queue,
the breaker and the statistics survive swaps; after a swap the cloud model is checked again
against the new model before the next cloud request.

Every ManagedRuntime keeps a traffic ledger (``traffic``,
:class:`~edgesdk.agent.traffic_ledger.TrafficLedger`): what each model version served, per minute,
health checks left out. In the agent's process the agent reads it when it reports; an app that
follows the agent's store from another process (:meth:`ManagedRuntime.follow`) hands it over
through a file (:mod:`edgesdk.agent.app_stats`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.agent.traffic_ledger import Meter, TrafficLedger
from edgesdk.errors import BackendError, HealthCheckError
from edgesdk.runtime.async_predictions import AsyncPredictions
from edgesdk.runtime.bench import time_predictions
from edgesdk.runtime.bundle import Bundle, read_bundle
from edgesdk.runtime.profiles import DeviceProfile, load_profile
from edgesdk.runtime.runtime import Runtime
from edgesdk.runtime.stats import StatsSnapshot
from edgesdk.runtime.tensors import TensorSpec

if TYPE_CHECKING:
    from edgesdk.agent.app_stats import AppExporter
    from edgesdk.agent.follow import StoreFollower
    from edgesdk.offload.policy import OffloadPolicy

__all__ = ["ManagedRuntime", "HealthReport", "health_check"]


@dataclass(frozen=True)
class HealthReport:
    """What a passed health check found: the worst output error, the median latency and the load time (ms)."""

    max_abs_error: float
    latency_ms: float
    load_ms: float


def health_check(runtime: Runtime, bundle: Bundle, runs: int = 5) -> HealthReport:
    """Run the bundle's sample; raise HealthCheckError saying which output or gate failed.

    The latency gate is the median of ``runs`` timed predictions of the sample, after the
    warm-up every measurement uses. ``load_ms`` of the report is left 0 (the caller times the load).
    """
    check = bundle.manifest.health_check
    if check is None:
        raise HealthCheckError(f"{bundle.path}: the bundle has no health check; refusing to activate it")
    inputs, expected = bundle.health_sample()
    outputs = runtime.predict(inputs)
    got = outputs if isinstance(outputs, dict) else {runtime.outputs[0].name: outputs}
    worst = 0.0
    for name, want in expected.items():
        have = np.asarray(got[name], dtype=np.float64)
        if have.shape != want.shape:
            raise HealthCheckError(f"health check: output {name!r} has shape {have.shape}, expected {want.shape}")
        error = float(np.max(np.abs(have - want))) if have.size else 0.0
        worst = max(worst, error)
        if not np.allclose(have, want, atol=check.atol, rtol=check.rtol):
            raise HealthCheckError(f"health check: output {name!r} differs from the expected sample output by up to "
                                   f"{error:.3g} (atol {check.atol:g}, rtol {check.rtol:g})")
    latency = time_predictions(runtime, inputs, runs).median_ms
    if check.max_latency_ms is not None and latency > check.max_latency_ms:
        raise HealthCheckError(f"health check: median latency {latency:.2f} ms exceeds the bundle's gate of "
                               f"{check.max_latency_ms:g} ms")
    return HealthReport(worst, latency, 0.0)


class _Active:
    """A runtime plus the count of requests running on it, and its meter in the traffic ledger."""

    def __init__(self, runtime: Runtime, bundle: Bundle, meter: Meter) -> None:
        self.runtime, self.bundle, self.meter = runtime, bundle, meter
        self.inflight = 0
        self.retired = False


class ManagedRuntime(AsyncPredictions):
    """A Runtime whose model can be replaced while it serves (see the module doc).

    Further keyword options (``backend``, ``accelerator``, ``threads``, ``check_finite``, ...) go to
    every :class:`Runtime` it loads, the first model and each swap alike.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, profile: str | DeviceProfile | None = None,
                 mode: str | None = None, swap_order: str = "auto", wait_timeout_s: float = 30.0,
                 offload: OffloadPolicy | None = None, max_local_queue: int | None = None,
                 **runtime_options: Any) -> None:
        if swap_order not in ("auto", "load-first", "unload-first"):
            raise BackendError(f"swap_order {swap_order!r} must be auto, load-first or unload-first")
        self._check_offload_arguments(offload, max_local_queue)
        if profile is None:
            from edgesdk.runtime.detect import detect_device

            profile = detect_device()
        self.profile = load_profile(profile)
        self.mode, self.swap_order, self.wait_timeout_s = mode, swap_order, wait_timeout_s
        self._options = runtime_options
        #: Whether inputs with NaN or Inf are refused (a Runtime option, on by default), also before offloading.
        self.check_finite: bool = bool(runtime_options.get("check_finite", True))
        self._cond = threading.Condition()
        self._active: _Active | None = None
        self._swap_lock = threading.Lock()
        self.swaps = 0
        #: Set by :meth:`follow`: what watches the agent's store.
        self.follower: StoreFollower | None = None
        #: What each model version served, per minute (health checks left out; see the module doc).
        self.traffic = TrafficLedger()
        #: Set by :meth:`follow`: what hands :attr:`traffic` to the agent (edgesdk.agent.app_stats).
        self.exporter: AppExporter | None = None
        self._closed = False
        if model is not None:
            bundle = read_bundle(model)
            self._active = self._serve(self._load(bundle), bundle)
        try:
            self._init_async(offload, max_local_queue)
        except BaseException:
            self.close()
            raise

    def _current(self) -> Runtime:
        with self._cond:
            if self._active is None:
                raise BackendError("no model is active; install one first")
            return self._active.runtime

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The active model's inputs (BackendError while none is active)."""
        return self._current().inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The active model's outputs (BackendError while none is active)."""
        return self._current().outputs

    def stats(self) -> StatsSnapshot:
        """The active model's statistics plus where predict_async requests ran (across swaps); see Runtime.stats."""
        with self._cond:
            active = self._active
        return self._with_paths(active.runtime.stats() if active else StatsSnapshot(0, 0, 0, None, None, None, None))

    def _serve(self, runtime: Runtime, bundle: Bundle) -> _Active:
        """``runtime`` as the one to serve: the ledger takes its zero point now (after its health
        check, so those calls never count)."""
        manifest = bundle.manifest
        meter = self.traffic.activate(manifest.version, manifest.name, runtime.counters)
        return _Active(runtime, bundle, meter)

    def _close_runtime(self, active: _Active) -> None:
        """Close a retired runtime, its last calls folded into its own version."""
        self.traffic.fold(active.meter)
        active.runtime.close()

    def _activated(self) -> None:
        """A model started serving: an exporter writes now (so a crash right after still shows)."""
        exporter = self.exporter
        if exporter is not None:
            exporter.activated()

    def fold_traffic(self) -> bool:
        """Fold what the active model served since the last fold into :attr:`traffic`.

        Returns whether it added anything. The exporter calls it every second; the agent, for its
        own ManagedRuntime, before each report.
        """
        with self._cond:
            active = self._active
        return active is not None and self.traffic.fold(active.meter, self._path_totals)

    def _load(self, bundle: Bundle) -> Runtime:
        return Runtime(bundle.path, profile=self.profile, mode=self.mode, **self._options)

    def _load_checked(self, bundle: Bundle) -> tuple[Runtime, HealthReport]:
        """A runtime for ``bundle`` that passed its health check (closed again if it did not)."""
        runtime = self._load(bundle)
        try:
            return runtime, health_check(runtime, bundle)
        except Exception:
            runtime.close()
            raise

    @property
    def bundle(self) -> Bundle | None:
        """The bundle serving new requests now, or None before the first model is loaded."""
        with self._cond:
            return self._active.bundle if self._active else None

    @property
    def expected_latency_s(self) -> float | None:
        """The active bundle's measured latency of one run on this board (seconds; see
        :attr:`Runtime.expected_latency_s`), None before an install or without one: what
        ``predict_async`` seeds its predictor with."""
        with self._cond:
            return self._active.runtime.expected_latency_s if self._active else None

    def predict(self, inputs: Any) -> Any:
        """Like :meth:`Runtime.predict`; waits (up to ``wait_timeout_s``) while no model is active."""
        with self._cond:
            if self._active is None and not self._cond.wait_for(lambda: self._active is not None, self.wait_timeout_s):
                raise BackendError(f"no model is active after {self.wait_timeout_s:g} s; install one first")
            active = self._active
            assert active is not None
            active.inflight += 1
        try:
            return active.runtime.predict(inputs)
        finally:
            with self._cond:
                active.inflight -= 1
                if active.retired and active.inflight == 0:
                    self._close_runtime(active)
                    self._cond.notify_all()

    def _unload_first(self, bundle: Bundle) -> bool:
        if self.swap_order != "auto":
            return self.swap_order == "unload-first"
        measured = bundle.manifest.measured.get("host", {}).get("peak_memory_mb")
        size_mb = bundle.manifest.files[bundle.manifest.model_file].size / 2**20
        per_model = float(measured) if measured else 2 * size_mb
        return 2 * per_model > self.profile.model_budget_mb

    def _retire(self, old: _Active | None) -> None:
        """Called with the condition held."""
        if old is None:
            return
        old.retired = True
        if old.inflight == 0:
            self._close_runtime(old)

    def swap(self, bundle_dir: str | os.PathLike[str] | Path) -> HealthReport:
        """Load the bundle, health-check it, and make it serve; on failure the old model keeps serving."""
        with self._swap_lock:
            bundle = read_bundle(bundle_dir, verify_model=False)  # the Runtime hashes the model as it loads it
            if self._unload_first(bundle):
                return self._swap_unload_first(bundle)
            started = time.perf_counter()
            runtime, report = self._load_checked(bundle)
            with self._cond:
                old = self._active
                if old is not None:  # predict_async's requests so far were the old model's
                    self.traffic.fold(old.meter, self._path_totals)
                self._active = self._serve(runtime, bundle)
                self._retire(old)
                self._cond.notify_all()
            self.swaps += 1
            self._activated()
            self._model_changed()
            return HealthReport(report.max_abs_error, report.latency_ms, (time.perf_counter() - started) * 1e3)

    def _swap_unload_first(self, bundle: Bundle) -> HealthReport:
        started = time.perf_counter()
        with self._cond:
            old, self._active = self._active, None  # new requests wait from here
            if old is not None:
                self.traffic.fold(old.meter, self._path_totals)
                old.retired = True
                self._cond.wait_for(lambda: old.inflight == 0)
                self._close_runtime(old)
        try:
            runtime, report = self._load_checked(bundle)
        except Exception:
            if old is not None:  # bring the old model back before reporting the failure
                with self._cond:
                    self._active = self._serve(self._load(old.bundle), old.bundle)
                    self._cond.notify_all()
                self._activated()
            raise
        with self._cond:
            self._active = self._serve(runtime, bundle)
            self._cond.notify_all()
        self.swaps += 1
        self._activated()
        self._model_changed()
        return HealthReport(report.max_abs_error, report.latency_ms, (time.perf_counter() - started) * 1e3)

    def _model_changed(self, policy: OffloadPolicy | None = None) -> None:
        if policy is not None:
            self.offload = policy
        dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.model_changed(policy)

    @classmethod
    def follow(cls, store: str | os.PathLike[str], profile: str | DeviceProfile | None = None, mode: str | None = None,
               offload: OffloadPolicy | None = None, poll_s: float = 1.0, watch: str = "auto",
               app: str | None = None, **options: Any) -> ManagedRuntime:
        """Serve the model an agent in another process committed in ``store``, and each one it commits next.

        The app starts on the store's committed slot (or waits, as :meth:`predict` does, until the
        agent's first install) and swaps, with the usual no-failed-request guarantee, when the agent
        commits another: a version still pending its health check is never loaded, and a rollback is
        followed too (:class:`edgesdk.agent.follow.StoreFollower`; ``follower.mode`` says whether
        inotify or polling noticed). Without ``offload``, the endpoint the server named for the
        committed version (if any) is used, pinned to that version and retargeted on each commit.

        What the app serves reaches the agent, per model version, through a file,
        ``STORE/apps/<app>-<pid>.json`` (:class:`edgesdk.agent.app_stats.AppExporter`, in
        :attr:`exporter`): ``app`` names this app there (default: the script's name), so the agent
        tells two apps apart and sees one restarting.
        """
        from edgesdk.agent.follow import follow_store

        return follow_store(cls, store, poll_s, watch, app, profile=profile, mode=mode,
                            offload=offload, **options)

    def close(self) -> None:
        """Stop the predict_async workers (waiting requests fail), then release the model once requests finish."""
        self._closed = True
        if self.follower is not None:
            self.follower.stop()
        self._close_async()
        with self._cond:
            active, self._active = self._active, None
            if active is not None:
                self.traffic.fold(active.meter, self._path_totals)
            self._retire(active)
        if self.exporter is not None:
            self.exporter.stop()  # the last figures reach the agent

    def __enter__(self) -> ManagedRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

