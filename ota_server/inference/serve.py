"""Run the inference endpoint: a registry over a repository, its app, uvicorn in a background thread, and the
gRPC service beside it when asked for."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError
from edgesdk.ota_server.repository import ModelRepository

from .config import InferenceConfig, ServedModel

__all__ = ["InferenceServer", "serve_inference", "parse_listen"]


def parse_listen(address: str, allow_any_port: bool = False) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; InputError naming the value otherwise (port 0 only if ``allow_any_port``)."""
    host, _, port = str(address).rpartition(":")
    if not port.isdigit() or not (0 if allow_any_port else 1) <= int(port) < 65536:
        raise InputError(f"listen address {address!r} must be HOST:PORT with a port 1-65535, e.g. 127.0.0.1:8081")
    return host or "127.0.0.1", int(port)


class InferenceServer:
    """A started endpoint: ``url`` (``http://HOST:PORT``), ``grpc_address`` (``HOST:PORT`` or None), its
    ``registry`` and ``metrics``; :meth:`stop` ends it."""

    def __init__(self, registry: Any, metrics: Any, http: Any, grpc: Any = None,
                 routes: Any = None) -> None:
        self.registry, self.metrics, self.http, self.grpc = registry, metrics, http, grpc
        #: The HTTP routes (:class:`~.app.InferenceRoutes`): their decode worker, body budget.
        self.routes = routes

    @property
    def url(self) -> str:
        """The endpoint's base URL (``/v2`` and ``/metrics`` are under it)."""
        return str(self.http.url)

    @property
    def grpc_address(self) -> str | None:
        """``HOST:PORT`` of the KServe V2 gRPC service, or None when it was not asked for."""
        return self.grpc.address if self.grpc is not None else None

    def stop(self) -> None:
        """Stop answering, then stop the batchers (requests already queued still run)."""
        if self.grpc is not None:
            self.grpc.stop()
        self.http.stop()
        if self.routes is not None:
            self.routes.close()
        self.registry.close()

    def __enter__(self) -> InferenceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_inference(repo: str | os.PathLike[str] | ModelRepository, listen: str, *,
                    models: Sequence[ServedModel] | None = None, threads: int | None = None,
                    config: InferenceConfig | None = None, grpc_listen: str | None = None) -> InferenceServer:
    """Serve the models of ``repo`` (a repository directory or object) over KServe V2 on ``listen`` (HOST:PORT).

    ``models`` None serves every model in the repository at its newest version with default
    batching; ``threads`` is ONNX Runtime's intra-op thread count per session. A full
    ``config`` overrides both. ``grpc_listen`` (HOST:PORT; port 0 picks a free one) adds the V2
    gRPC service on the same models, batchers and metrics (needs ``grpcio`` from the [server] extra).
    """
    from edgesdk.ota_server.admin.http_api import HttpServer

    from .app import InferenceRoutes
    from .metrics import InferenceMetrics
    from .models import ModelRegistry

    if config is None:
        config = InferenceConfig(models=None if models is None else tuple(models), threads=threads)
    if not isinstance(repo, ModelRepository):
        if not Path(repo).is_dir():
            raise InputError(f"model repository {str(repo)!r} is not a directory; pass the --repo of the OTA server")
        # Serving only reads: bundles were verified (and their signatures) when they were stored.
        repo = ModelRepository(repo, allow_unsigned=True)
    host, port = parse_listen(listen)
    metrics = InferenceMetrics()
    registry = ModelRegistry(repo, config, metrics)
    grpc = None
    if grpc_listen is not None:
        from .grpc_service import GrpcServer

        grpc_host, grpc_port = parse_listen(grpc_listen, allow_any_port=True)
        limits = registry.config
        grpc = GrpcServer(registry, metrics, grpc_host, grpc_port, workers=limits.grpc_workers,
                          max_concurrent_calls=limits.grpc_max_concurrent_calls,
                          max_send_bytes=limits.grpc_max_send_bytes).start()
    routes = InferenceRoutes(registry, metrics)
    http = HttpServer(routes.app(), host, port)
    try:
        http.start()
    except BaseException:
        if grpc is not None:
            grpc.stop()
        routes.close()
        raise
    return InferenceServer(registry, metrics, http, grpc, routes)
