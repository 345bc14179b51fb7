"""Run the inference endpoint: a registry over a repository, its app, uvicorn in a background thread."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError
from edgesdk.ota_server.repository import ModelRepository

from .config import InferenceConfig, ServedModel

__all__ = ["InferenceServer", "serve_inference", "parse_listen"]


def parse_listen(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; InputError naming the value otherwise."""
    host, _, port = str(address).rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"listen address {address!r} must be HOST:PORT with a port 1-65535, e.g. 127.0.0.1:8081")
    return host or "127.0.0.1", int(port)


class InferenceServer:
    """A started endpoint: ``url`` (``http://HOST:PORT``), its ``registry`` and ``metrics``; :meth:`stop` ends it."""

    def __init__(self, registry: Any, metrics: Any, http: Any) -> None:
        self.registry, self.metrics, self.http = registry, metrics, http

    @property
    def url(self) -> str:
        """The endpoint's base URL (``/v2`` and ``/metrics`` are under it)."""
        return str(self.http.url)

    def stop(self) -> None:
        """Stop answering, then stop the batchers (requests already queued still run)."""
        self.http.stop()
        self.registry.close()

    def __enter__(self) -> InferenceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_inference(repo: str | os.PathLike[str] | ModelRepository, listen: str, *,
                    models: Sequence[ServedModel] | None = None, threads: int | None = None,
                    config: InferenceConfig | None = None) -> InferenceServer:
    """Serve the models of ``repo`` (a repository directory or object) over KServe V2 on ``listen`` (HOST:PORT).

    ``models`` None serves every model in the repository at its newest version with default
    batching; ``threads`` is ONNX Runtime's intra-op thread count per session. A full
    ``config`` overrides both.
    """
    from edgesdk.ota_server.http_api import HttpServer

    from .app import create_inference_app
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
    http = HttpServer(create_inference_app(registry, metrics), host, port)
    http.start()
    return InferenceServer(registry, metrics, http)
