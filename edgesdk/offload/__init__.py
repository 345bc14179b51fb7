"""Cloud offload on the device: send what this device cannot serve in time to a KServe V2 endpoint.

::

    policy = edgesdk.OffloadPolicy("http://10.0.0.5:8000", "digits", latency_slo_ms=50)
    with edgesdk.Runtime("model.onnx", offload=policy) as rt:
        future = rt.predict_async(frame)          # local or cloud, by the rule of dispatcher.py
        scores = future.result()
        print(rt.stats().as_dict()["paths"])      # where requests ran

- :mod:`~edgesdk.offload.policy`: :class:`OffloadPolicy`, the settings (frozen, validated).
- :mod:`~edgesdk.offload.predictor`: recent local service time x requests ahead.
- :mod:`~edgesdk.offload.breaker`: errors and timeouts open it; it half-opens to probe.
- :mod:`~edgesdk.offload.client`: the V2 client on :mod:`http.client` (no new dependency).
- :mod:`~edgesdk.offload.dispatcher`: the bounded local queue, the routing rule, fallback, stats.
- :mod:`~edgesdk.offload.v2_codec`: the KServe V2 tensor codec (JSON and binary) the client and the endpoint share.

It builds on :mod:`edgesdk.runtime` (tensors, stats) and imports nothing from :mod:`edgesdk.fleet` or
:mod:`edgesdk.agent`; a runtime reaches it only through :mod:`edgesdk.runtime.async_predictions`.
The names below are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.lazy import lazy_exports

_EXPORTS = {
    "OffloadPolicy": "edgesdk.offload.policy",
    "LatencyPredictor": "edgesdk.offload.predictor",
    "CircuitBreaker": "edgesdk.offload.breaker",
    "V2Client": "edgesdk.offload.client",
    "Dispatcher": "edgesdk.offload.dispatcher",
}

__all__ = ["OffloadPolicy", "LatencyPredictor", "CircuitBreaker", "V2Client", "Dispatcher"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from edgesdk.offload.breaker import CircuitBreaker
    from edgesdk.offload.client import V2Client
    from edgesdk.offload.dispatcher import Dispatcher
    from edgesdk.offload.policy import OffloadPolicy
    from edgesdk.offload.predictor import LatencyPredictor
