"""The cloud side of offload: a KServe V2 (Open Inference Protocol) endpoint over the OTA model repository.

Devices that are saturated send requests here (:mod:`edgesdk.offload`); any V2 client works,
e.g. the official ``tritonclient.http``. The endpoint serves the ONNX bundles of the same
:class:`~edgesdk.ota_server.repository.ModelRepository` the rollouts use: a request without a
version runs the newest stored version (looked up per request, so a pushed version is served
without a restart) or the version pinned in its :class:`ServedModel`; ``/versions/{v}`` runs v.

- JSON tensors and the binary tensor data extension (``Inference-Header-Content-Length``,
  ``binary_data_size``, ``binary_data`` / ``binary_data_output``), encoded and decoded by
  :mod:`edgesdk.offload.v2_codec`, the same codec the device client uses.
- Dynamic batching per model (:class:`BatchingConfig`) when its first dim is dynamic; a
  bounded queue that answers 503 when full.
- Prometheus metrics at ``/metrics`` (:mod:`.metrics` lists them).
- Every bad request gets a 4xx with ``{"error": "..."}``; bodies over the cap are refused
  with 413 before they are read whole.

Run it with ``edgesdk server ... --inference HOST:PORT``, ``edgesdk server inference --repo DIR
--listen HOST:PORT``, or from Python::

    with serve_inference("repo", "127.0.0.1:8081", models=[ServedModel("digits")]) as endpoint:
        print(endpoint.url)     # http://127.0.0.1:8081

Modules: ``config`` (what is served), ``models`` (registry and ORT sessions), ``batcher``,
``metrics``, ``app`` (the HTTP routes), ``serve`` (running it). Needs the ``[server]`` extra;
importing this package imports none of starlette, onnxruntime or prometheus_client.
"""

from __future__ import annotations

from .config import BatchingConfig, InferenceConfig, ServedModel, load_inference_config
from .serve import InferenceServer, parse_listen, serve_inference

__all__ = ["BatchingConfig", "InferenceConfig", "ServedModel", "load_inference_config", "InferenceServer",
           "serve_inference", "parse_listen"]
