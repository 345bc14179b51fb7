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
"""

from __future__ import annotations

from edgesdk.offload.breaker import CircuitBreaker
from edgesdk.offload.client import V2Client
from edgesdk.offload.dispatcher import Dispatcher
from edgesdk.offload.policy import OffloadPolicy
from edgesdk.offload.predictor import LatencyPredictor

__all__ = ["OffloadPolicy", "LatencyPredictor", "CircuitBreaker", "V2Client", "Dispatcher"]
