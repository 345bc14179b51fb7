"""The dispatcher's cloud side: configuring the client, measuring the cloud, and whether it may
take a request.

**Whether the cloud may take a request** (:meth:`CloudSide._cloud_fits`, asked with the
dispatcher's lock held) is one of three verdicts:

- *fits*: offload configured and not disabled by a configuration error, fewer than
  ``max_cloud_inflight`` requests open, the circuit breaker closed, and the cloud *predicted to
  meet the objective*: the tail of :class:`~edgesdk.offload.cloud_latency.CloudLatency` (p99 of
  recent round trips, at least the age of the oldest request in flight) within ``latency_slo_ms``;
- *slow*: it answers, but that tail is beyond the objective. It gets no user request at all,
  and work the device cannot serve within the objective either is refused at once (the
  dispatcher says why): a cloud that answers is there, and the objective holds;
- *unavailable*: down (breaker open or half-open), disabled, full, or a first measurement in
  flight. The device then behaves as it would without offload (its bounded queue), which is
  what a cloud outage should cost.

**Measuring.** The cloud is measured by one small real inference, the *probe*: the model's
inputs as zeros (free dimensions 1), or a copy of the first real input once there is one, sent
with the request id ``edgesdk-probe-N`` so a server can tell it from user work, waiting up to
``timeout_ms``. Its round trip feeds the prediction like a user request's. The probe is sent

- at construction, right after the model's metadata is checked (so the first overflow is
  judged on a measurement, not on hope);
- out of band when the breaker half-opens: its success alone closes the breaker (a
  straggler's late success never does; :mod:`edgesdk.offload.breaker`), its failure reopens
  it. A probe that answers slowly still closes the breaker (the cloud works), and the measured
  latency keeps user work away: an overloaded-but-ready cloud no longer makes the breaker flap
  (the readiness call alone said "ready" and the user requests it let through timed out);
- out of band every ``breaker_reset_s`` while the cloud is judged too slow or is not measured,
  so a cloud that recovers is seen again without sending it user work.

**Not measured yet** (the first measurement failed at once, or the model was replaced): at most
``UNMEASURED_INFLIGHT`` user request is in flight to it at a time while a probe measures it;
each such request carries its deadline, so it costs at most its own objective.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from itertools import count
from typing import TYPE_CHECKING

import numpy as np

from edgesdk.errors import BackendError, OffloadError
from edgesdk.offload.breaker import CircuitBreaker
from edgesdk.offload.client import V2Client
from edgesdk.offload.cloud_latency import CloudLatency
from edgesdk.offload.policy import OffloadPolicy

if TYPE_CHECKING:
    from edgesdk.offload.dispatcher import LocalModel

__all__ = [
    "CloudSide",
    "PROBE_ID",
    "UNMEASURED_INFLIGHT",
    "timed_out",
    "FITS",
    "SLOW",
    "UNAVAILABLE",
]

log = logging.getLogger("edgesdk.offload.dispatcher")

#: The V2 request id prefix of the probe's inferences.
PROBE_ID = "edgesdk-probe"
#: The cloud's verdicts on a request (:meth:`CloudSide._cloud_fits`).
FITS, SLOW, UNAVAILABLE = "fits", "slow", "unavailable"
#: User requests in flight at once to a cloud whose latency is not measured yet.
UNMEASURED_INFLIGHT = 1


def timed_out(exc: BaseException) -> bool:
    """Whether a cloud failure was a timeout (the answer did not come in time), not a refusal or
    reset."""
    return isinstance(exc.__cause__, (TimeoutError, socket.timeout))


def _zeros(model: LocalModel) -> dict[str, np.ndarray]:
    return {
        spec.name: np.zeros(tuple(1 if d is None else d for d in spec.shape), spec.dtype)
        for spec in model.inputs
    }


class CloudSide:
    """Mixin of :class:`~edgesdk.offload.dispatcher.Dispatcher`: the cloud's configuration, probe
    and verdict.

    The dispatcher sets the attributes below before calling anything here.
    """

    _model: Callable[[], LocalModel]
    policy: OffloadPolicy | None
    breaker: CircuitBreaker | None
    cloud_latency: CloudLatency
    _client: V2Client | None
    _retired_clients: list[V2Client]
    _lock: threading.Condition
    _configure_lock: threading.Lock
    _cloud_inflight: int
    _closed: bool
    _disabled: str | None
    _clock: Callable[[], float]

    if TYPE_CHECKING:  # declared for the type checker only: the dispatcher defines it

        def close(self) -> None:
            """Stop the dispatcher's workers and close the clients."""

    def _init_cloud(self) -> None:
        self._probe: threading.Thread | None = None
        self._probe_feeds: dict[str, np.ndarray] | None = None
        self._probes = count(1)
        #: Probe inferences sent so far (a running total; the paths count user requests).
        self.probes_sent = 0
        self._probe_sent: float | None = (
            None  # when the last background probe was sent (the dispatcher's clock)
        )

    @property
    def breaker_reset_s(self) -> float:
        """Seconds between probes of an open breaker (0 without offload)."""
        return self.policy.breaker_reset_s if self.policy else 0.0

    # --- configuration ----------------------------------------------------------------------------

    def _configure_at_start(self) -> None:
        """Check the cloud model against the local one and measure it once (see the module doc)."""
        assert self._client is not None and self.breaker is not None
        try:
            model = self._model()
            inputs, outputs = model.inputs, model.outputs
        except BackendError:
            # no model yet (a ManagedRuntime before its first install): the first cloud request
            # configures
            return
        try:
            self._client.configure(inputs, outputs)
            self._measure()
        except OffloadError as exc:
            if not exc.transient and not self._client.configured:
                self.close()
                raise
            self.breaker.trip()
            log.warning(
                "offload: %s cannot be reached or measured (%s); running locally, retrying in %g s",
                self._client.model_label,
                exc,
                self.breaker_reset_s,
            )

    def model_changed(self, policy: OffloadPolicy | None = None) -> None:
        """The local model was replaced: check the cloud model against it again before the next
        cloud request.

        ``policy`` retargets the cloud side (e.g. the version of the endpoint that matches the new
        local
        model); it must keep the queue and concurrency settings. Cloud requests in flight finish on
        the old
        client. The cloud's latency is measured again (another model may run at another speed
        there).
        """
        if policy is not None and self.policy is not None and policy != self.policy:
            if (policy.max_local_queue, policy.max_cloud_inflight) != (
                self.policy.max_local_queue,
                self.policy.max_cloud_inflight,
            ):
                raise OffloadError(
                    "a retargeted offload policy must keep max_local_queue and max_cloud_inflight"
                )
            if self._client is not None:
                # closed in close(): requests may still be using it
                self._retired_clients.append(self._client)
            self.policy, self._client = policy, V2Client(policy)
        if self._client is not None:
            self._client.configured = False
            # a model that did not match the cloud's may have been replaced by one that does
            self._disabled = None
            with self._lock:
                self._probe_feeds = None
                self.cloud_latency = CloudLatency(self._clock)

    def _ensure_configured(self) -> None:
        assert self._client is not None
        if self._client.configured:
            return
        with self._configure_lock:
            if self._client.configured:
                return
            model = self._model()
            try:
                self._client.configure(model.inputs, model.outputs)
            except OffloadError as exc:
                if not exc.transient:
                    self._disabled = str(exc)
                    log.error("offload disabled: %s", exc)
                raise
            log.info(
                "offload: %s configured (binary tensors: %s)",
                self._client.model_label,
                self._client.binary,
            )

    # --- the verdict ------------------------------------------------------------------------------

    def _cloud_fits(self, slo_s: float, claim: bool) -> tuple[str, str]:
        """Whether a request may go to the cloud now (``FITS``), the cloud answers but is predicted
        to miss
        the objective (``SLOW``), or it cannot take work (``UNAVAILABLE``: no policy, disabled,
        full, breaker
        not closed, or a measurement already in flight), and why (for a refusal's message); lock
        held.

        ``claim`` lets this call start a probe that is due (see the module doc).
        """
        if self.breaker is None or self.policy is None:
            return UNAVAILABLE, "no offload policy"
        if self._disabled is not None:
            return UNAVAILABLE, f"offload disabled ({self._disabled})"
        if self._cloud_inflight >= self.policy.max_cloud_inflight:
            return (
                UNAVAILABLE,
                f"{self._cloud_inflight}/{self.policy.max_cloud_inflight} cloud requests open",
            )
        if not self.breaker.allow():
            if claim and not self._closed and not self._probe_out() and self.breaker.claim_probe():
                self._start_probe(half_open=True)
            return UNAVAILABLE, f"cloud breaker {self.breaker.state}"
        prediction = self.cloud_latency.predict()
        if prediction.tail_s is not None and prediction.tail_s > slo_s:
            self._remeasure_if_due(claim)
            return SLOW, prediction.describe()
        if prediction.samples == 0:  # not measured: a trickle while the probe measures
            self._remeasure_if_due(claim)
            if self._cloud_inflight < UNMEASURED_INFLIGHT:
                return FITS, prediction.describe()
            return (
                UNAVAILABLE,
                f"{prediction.describe()} ({self._cloud_inflight} request measuring it)",
            )
        return FITS, prediction.describe()

    def _remeasure_if_due(self, claim: bool) -> None:
        """Start a measuring probe when none was sent nor answered for ``breaker_reset_s`` (breaker
        closed); lock held."""
        last = max(
            (t for t in (self.cloud_latency.measured_at, self._probe_sent) if t is not None),
            default=None,
        )
        if (
            claim
            and not self._closed
            and (last is None or self._clock() - last >= self.breaker_reset_s)
        ):
            self._start_probe(half_open=False)

    # --- the probe --------------------------------------------------------------------------------

    def _probe_out(self) -> bool:
        return self._probe is not None and self._probe.is_alive()

    def _start_probe(self, half_open: bool) -> None:
        """Send the probe in the background unless one is out; lock held."""
        if self._probe_out():
            return
        self._probe_sent = self._clock()
        self._probe = threading.Thread(
            target=self._run_probe, args=(half_open,), name="edgesdk-offload-probe", daemon=True
        )
        self._probe.start()

    def _probe_input(self) -> dict[str, np.ndarray]:
        feeds = self._probe_feeds
        return feeds if feeds is not None else _zeros(self._model())

    def _keep_probe_input(self, feeds: dict[str, np.ndarray]) -> None:
        """The first real input is what later probes send (a copy: the caller may reuse its
        buffers)."""
        if self._probe_feeds is None:
            self._probe_feeds = {name: np.array(value, copy=True) for name, value in feeds.items()}

    def _measure(self) -> float:
        """One small real inference, timed into the cloud's latency; its round trip in seconds."""
        assert self._client is not None
        latency = self.cloud_latency
        self.probes_sent += 1
        token = latency.begin()
        try:
            deadline = time.monotonic() + self._client.policy.timeout_ms / 1e3
            self._client.infer(
                self._probe_input(), deadline, request_id=f"{PROBE_ID}-{next(self._probes)}"
            )
        except OffloadError as exc:
            if timed_out(exc):
                latency.end_censored(token)
            else:
                latency.end(token, answered=False)
            raise
        except BaseException:
            latency.end(token, answered=False)
            raise
        return latency.end(token, answered=True)

    def _run_probe(self, half_open: bool) -> None:
        """The probe (see the module doc): the model's metadata check if due, then one small
        inference."""
        assert self._client is not None and self.breaker is not None
        try:
            self._ensure_configured()
            took = self._measure()
        except (
            Exception
        ) as exc:  # any failure keeps (or counts toward) the breaker open; logged once per probe
            if half_open:
                self.breaker.probe_failure()
            else:
                self.breaker.failure()
            log.info(
                "offload: probe of %s failed (%s); all work local for %g s more",
                self._client.model_label,
                exc,
                self.breaker_reset_s,
            )
            return
        if half_open:
            self.breaker.probe_success()
            log.info(
                "offload: %s answers again (%.1f ms); circuit breaker closed",
                self._client.model_label,
                took * 1e3,
            )
        else:
            self.breaker.success()

    def _join_probe(self) -> None:
        probe = self._probe
        if probe is not None and probe is not threading.current_thread():
            probe.join()  # within the client's timeout
