"""``OffloadPolicy``: where a runtime may send work it cannot serve in time, and the limits it keeps."""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import asdict, dataclass, fields
from typing import Any

from edgesdk.errors import BackendError, OffloadError

__all__ = ["OffloadPolicy"]


def _positive(name: str, value: Any, integer: bool = False, allow_zero: bool = False) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        what = "an integer" if integer else "a number"
        raise OffloadError(f"offload policy: {name} must be {what} {bound}, got {value!r}; fix the runtime's offload "
                           "settings")


@dataclass(frozen=True)
class OffloadPolicy:
    """How :meth:`edgesdk.Runtime.predict_async` shares work between this device and a KServe V2 endpoint.

    >>> policy = OffloadPolicy("http://10.0.0.5:8000", "digits", latency_slo_ms=50)   # doctest: +SKIP
    >>> rt = edgesdk.Runtime("model.onnx", offload=policy)                             # doctest: +SKIP

    A request runs locally while its predicted local latency (see
    :mod:`edgesdk.offload.predictor`) stays within ``latency_slo_ms`` and the local queue has
    room; otherwise it goes to the cloud when the cloud is predicted to meet the objective
    (its measured round trips: :mod:`edgesdk.offload.cloud_latency`), the circuit breaker is
    closed and fewer than ``max_cloud_inflight`` cloud requests are open. A cloud that answers
    too slowly gets no user request: such work is refused at once with
    :class:`~edgesdk.errors.OverloadedError` saying why. A cloud that is down or full leaves the
    device as it is without offload: local while the queue has room, else refused. The rule in
    full is in :mod:`edgesdk.offload.dispatcher`. Every bad value is an :class:`OffloadError`
    naming the field.
    """

    #: Base URL of the V2 server (``http://host:port``, optionally with a path prefix), without ``/v2``.
    url: str
    #: The model's name on the server.
    model: str
    #: A pinned model version on the server; None lets the server pick (its newest).
    version: str | None = None
    #: The latency a request should see (queueing included): beyond it work goes to the cloud. It is
    #: also each request's deadline, counted from submission: a cloud request carries what is left
    #: of it (the V2 ``timeout`` parameter) and waits no longer; one that can no longer make it is
    #: dropped.
    latency_slo_ms: float = 100.0
    #: Requests admitted locally and not finished (the running one included). At the bound work goes to the
    #: cloud, or is refused when the cloud is full too; bounded so latency cannot grow without limit.
    max_local_queue: int = 8
    #: Cloud requests open at once; each has its own keep-alive connection.
    max_cloud_inflight: int = 4
    #: The longest a cloud request waits for its answer, in all (sooner when its deadline is
    #: sooner), and what the probe waits for its measurement (keep it above the cloud's round trip).
    timeout_ms: float = 1000.0
    #: Timeout of opening a connection; short, so an unreachable cloud costs little.
    connect_timeout_ms: float = 300.0
    #: Requests whose inputs have at least this many bytes go to the cloud first (None: size never decides).
    heavy_input_bytes: int | None = None
    #: Consecutive cloud failures (errors or timeouts) that open the circuit breaker: all work stays local.
    breaker_failures: int = 3
    #: Seconds the breaker stays open before one out-of-band probe (one small inference) is sent;
    #: also how often a cloud too slow for the objective (or not measured) is measured again.
    breaker_reset_s: float = 10.0
    #: True: binary tensors; False: JSON tensors; None: binary when the server lists ``binary_tensor_data``.
    binary: bool | None = None
    #: Weight of the newest local service time in the predictor's moving average (0 < alpha <= 1).
    predictor_alpha: float = 0.2

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url) if isinstance(self.url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise OffloadError(f"offload policy: url {self.url!r} must be an http:// or https:// URL of a KServe V2 "
                               "server, e.g. http://10.0.0.5:8000")
        try:
            parsed.port  # noqa: B018 (raises on a malformed port)
        except ValueError:
            raise OffloadError(f"offload policy: url {self.url!r} has an invalid port; write e.g. "
                               "http://10.0.0.5:8000") from None
        if parsed.query or parsed.fragment:
            raise OffloadError(f"offload policy: url {self.url!r} must not have a query or fragment; give the base "
                               "URL of the server")
        if not isinstance(self.model, str) or not self.model or "/" in self.model:
            raise OffloadError(f"offload policy: model {self.model!r} must be the model's name on the server "
                               "(non-empty, no '/')")
        if self.version is not None and (not isinstance(self.version, str) or not self.version or "/" in self.version):
            raise OffloadError(f"offload policy: version {self.version!r} must be a non-empty string without '/', "
                               "or None for the server's choice")
        _positive("latency_slo_ms", self.latency_slo_ms)
        _positive("max_local_queue", self.max_local_queue, integer=True)
        _positive("max_cloud_inflight", self.max_cloud_inflight, integer=True)
        _positive("timeout_ms", self.timeout_ms)
        _positive("connect_timeout_ms", self.connect_timeout_ms)
        if self.heavy_input_bytes is not None:
            _positive("heavy_input_bytes", self.heavy_input_bytes, integer=True)
        _positive("breaker_failures", self.breaker_failures, integer=True)
        _positive("breaker_reset_s", self.breaker_reset_s)
        if self.binary is not None and not isinstance(self.binary, bool):
            raise OffloadError(f"offload policy: binary must be true, false or null (follow the server), got "
                               f"{self.binary!r}")
        _positive("predictor_alpha", self.predictor_alpha)
        if self.predictor_alpha > 1:
            raise OffloadError(f"offload policy: predictor_alpha must be in (0, 1], got {self.predictor_alpha!r}")

    @property
    def base_url(self) -> str:
        """``url`` without a trailing slash."""
        return self.url.rstrip("/")

    def to_dict(self) -> dict[str, Any]:
        """The policy as JSON (the agent's config file and state)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffloadPolicy:
        """A policy from :meth:`to_dict`'s JSON; missing fields take their defaults, unknown ones are an error."""
        if not isinstance(data, dict):
            raise OffloadError(f"offload policy must be a mapping of settings, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise OffloadError(f"offload policy: unknown setting(s) {unknown}; known settings are {sorted(known)}")
        missing = [name for name in ("url", "model") if name not in data]
        if missing:
            raise OffloadError(f"offload policy: missing {missing}; give at least url and model")
        return cls(**data)


def check_offload_arguments(offload: Any, max_local_queue: int | None) -> None:
    """What ``Runtime`` and ``ManagedRuntime`` check of their ``offload``/``max_local_queue`` arguments.

    BackendError when ``offload`` is not an :class:`OffloadPolicy`, or ``max_local_queue`` contradicts it.
    """
    if not isinstance(offload, OffloadPolicy):
        raise BackendError(f"offload must be an OffloadPolicy, got {type(offload).__name__}; build one with "
                           "edgesdk.OffloadPolicy(url, model, ...) or OffloadPolicy.from_dict(settings)")
    if max_local_queue is not None and max_local_queue != offload.max_local_queue:
        raise BackendError(f"max_local_queue={max_local_queue} contradicts the offload policy's "
                           f"max_local_queue={offload.max_local_queue}; set it in the policy only")
