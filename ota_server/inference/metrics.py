"""Prometheus metrics of the inference endpoint, in a registry of its own (two apps in one process never mix).

Labels are ``model`` and ``version`` (the version that ran); requests for a model the endpoint
does not know are counted under ``model="_unknown"`` so a client cannot grow the label set::

    edgesdk_inference_requests_total{model,version}            every infer request
    edgesdk_inference_failures_total{model,version,reason}     reason: bad_request, not_found, too_large,
                                                               queue_full, deadline (its timeout
                                                               passed before it ran), load_limit,
                                                               busy, error
    edgesdk_inference_request_seconds{model,version}           whole request, body read to response ready
    edgesdk_inference_queue_seconds{model,version}             time a request waited for its batch to start
    edgesdk_inference_compute_seconds{model,version}           one ONNX Runtime call (a whole batch)
    edgesdk_inference_batch_size{model,version}                requests' rows in one ONNX Runtime call
    edgesdk_inference_queue_depth{model,version}               requests waiting for the batcher now
    edgesdk_inference_refused_total{reason}                    HTTP requests refused by a transport
                                                               limit before a model was chosen:
                                                               in_flight, memory
"""

from __future__ import annotations

from typing import Any

__all__ = ["InferenceMetrics", "UNKNOWN_MODEL"]

#: The ``model`` label of requests for models the endpoint does not serve.
UNKNOWN_MODEL = "_unknown"

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)


class InferenceMetrics:
    """The endpoint's counters, histograms and gauge; :meth:`exposition` is the ``/metrics`` body."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model", "version")
        self.requests = Counter("edgesdk_inference_requests", "Inference requests received.", labels,
                                registry=self.registry)
        self.failures = Counter("edgesdk_inference_failures", "Inference requests answered with an error.",
                                (*labels, "reason"), registry=self.registry)
        self.request_seconds = Histogram("edgesdk_inference_request_seconds", "Inference request latency.", labels,
                                         buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_seconds = Histogram("edgesdk_inference_queue_seconds", "Time a request waited in the batch queue.",
                                       labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.compute_seconds = Histogram("edgesdk_inference_compute_seconds", "One ONNX Runtime call.", labels,
                                         buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("edgesdk_inference_batch_size", "Rows in one ONNX Runtime call.", labels,
                                    buckets=_BATCH_BUCKETS, registry=self.registry)
        self.refused = Counter("edgesdk_inference_refused",
                               "HTTP requests refused by a transport limit.", ("reason",),
                               registry=self.registry)
        self.queue_depth = Gauge("edgesdk_inference_queue_depth", "Requests waiting for the batcher.", labels,
                                 registry=self.registry)

    def model(self, name: str, version: str) -> ModelMetrics:
        """The metrics of one served model version, labels bound once."""
        return ModelMetrics(self, name, version)

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of every metric and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelMetrics:
    """One model version's children of :class:`InferenceMetrics`, for the batcher and the request path."""

    def __init__(self, metrics: InferenceMetrics, name: str, version: str) -> None:
        self._metrics, self.labels = metrics, (name, version)
        self.requests: Any = metrics.requests.labels(name, version)
        self.request_seconds: Any = metrics.request_seconds.labels(name, version)
        self.queue_seconds: Any = metrics.queue_seconds.labels(name, version)
        self.compute_seconds: Any = metrics.compute_seconds.labels(name, version)
        self.batch_size: Any = metrics.batch_size.labels(name, version)
        self.queue_depth: Any = metrics.queue_depth.labels(name, version)

    def failed(self, reason: str) -> None:
        """Count one failed request of this model version."""
        self._metrics.failures.labels(*self.labels, reason).inc()
