"""One place that wires the OTA server: model repository + fleet store + rollout server + admin HTTP API.

The command line (``edgesdk server``), the examples and the tests all build the server
here, so a new part (a different fleet store, an offload endpoint) is wired once::

    setup = ServerSetup(ServerConfig("mqtt://127.0.0.1:1883"), repo="repo", db="fleet.db",
                        signing_key=load_private_key("keys/server.key"),
                        bundle_key=load_public_key("keys/edgesdk.pub"), http="127.0.0.1:8080", token=token)
    with build_server(setup) as running:
        print(running.url)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.server import OTAServer, ServerConfig
from edgesdk.ota_server.store.fleet_db import FleetDB

__all__ = ["ServerSetup", "RunningServer", "build_server"]

log = logging.getLogger("edgesdk.ota_server.server")


@dataclass(frozen=True)
class ServerSetup:
    """Everything a server needs: where its state lives, which keys it trusts and signs with, where it answers."""

    server: ServerConfig
    repo: str | os.PathLike[str]
    #: The fleet store: a SQLite file path, or ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (needed by replicas).
    db: str | os.PathLike[str]
    #: Ed25519 private key the server signs device commands with.
    signing_key: Any
    #: Public key uploaded bundles must be signed with (None only together with allow_unsigned).
    bundle_key: Any = None
    allow_unsigned: bool = False
    keep_latest: int = 5
    #: Repository chunk size in bytes (None: the repository's default).
    chunk_size: int | None = None
    #: ``HOST:PORT`` of the admin API, or None for no HTTP API (library use, tests).
    http: str | None = None
    #: Bearer token of the admin API (required with ``http``).
    token: str | None = None
    #: The server class to start: OTAServer, or a subclass (the fault-injection tests damage chunks with one).
    server_class: type[OTAServer] = OTAServer
    #: ``HOST:PORT`` of the KServe V2 inference endpoint (cloud offload), or None for none. No auth: data plane.
    inference: str | None = None
    #: Serve the operator console at ``/ui`` on the admin API's address (needs ``http``).
    console: bool = False
    #: The reverse proxies in front of the console (IPs or networks, comma-separated, or ``*``; ``edgesdk server
    #: --behind-proxy``): only their ``X-Forwarded-Proto``/``-For`` are believed. None: no proxy is trusted.
    behind_proxy: str | None = None
    #: ``HOST:PORT`` of the KServe V2 gRPC service beside it (needs ``inference``), or None for HTTP only.
    inference_grpc: str | None = None
    #: What the inference endpoint serves (None: every model, newest version, batching on; see
    #: :class:`edgesdk.ota_server.inference.InferenceConfig`).
    inference_config: Any = None
    #: The fleet's root metadata document (``edgesdk keys init``/``rotate``), published retained at start.
    root: bytes | None = None
    #: The ``timestamp`` role's private key: with it the server publishes signed timestamps (freshness).
    timestamp_key: Any = None
    #: Devices to provision before the server takes any report (device id -> group; ``edgesdk server --devices``),
    #: recorded with the source ``devices file``. None: only what the store holds already.
    devices: Mapping[str, str] | None = None


class RunningServer:
    """A started server: ``ota`` (rollouts, fleet state), its ``repository`` and, if asked for, ``http`` (admin API)
    and ``inference`` (the KServe V2 endpoint, an :class:`~edgesdk.ota_server.inference.InferenceServer`)."""

    def __init__(self, ota: OTAServer, repository: ModelRepository, http: Any = None, inference: Any = None) -> None:
        self.ota, self.repository, self.http, self.inference = ota, repository, http, inference

    @property
    def url(self) -> str | None:
        """The admin API's base URL, or None without one."""
        return self.http.url if self.http is not None else None

    @property
    def inference_url(self) -> str | None:
        """The inference endpoint's base URL (``/v2`` is under it), or None without one."""
        return self.inference.url if self.inference is not None else None

    def stop(self) -> None:
        """Stop the HTTP APIs first (no request may reach a stopped server), then the server."""
        if self.inference is not None:
            self.inference.stop()
        if self.http is not None:
            self.http.stop()
        self.ota.stop()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_server(setup: ServerSetup) -> RunningServer:
    """Open the repository and fleet store, start the server, the admin API when ``setup.http`` is set and the
    inference endpoint when ``setup.inference`` is set."""
    extra = {"chunk_size": setup.chunk_size} if setup.chunk_size is not None else {}
    repository = ModelRepository(Path(setup.repo), keep_latest=setup.keep_latest, signer_key=setup.bundle_key,
                                 allow_unsigned=setup.allow_unsigned, **extra)
    if setup.http is not None and not setup.token:
        raise EdgeSDKError("an admin API needs a token: set ServerSetup.token (edgesdk server: --token/--token-file)")
    db = FleetDB(setup.db)
    if setup.server.share_group and db.dialect != "postgresql":
        db.close()
        raise EdgeSDKError(f"replicas share their fleet state through PostgreSQL, not the SQLite file {setup.db}: "
                           "pass --db postgresql://USER:PASSWORD@HOST:PORT/DATABASE to every replica")
    config = setup.server
    if config.require_provisioning is None:  # a devices file names every device there is: refuse the others
        config = replace(config, require_provisioning=bool(setup.devices))
    ota = setup.server_class(config, repository, db, setup.signing_key, root=setup.root,
                             timestamp_key=setup.timestamp_key)
    if setup.devices:
        try:
            moved = ota.provision(dict(setup.devices), "devices file")
        except BaseException:
            db.close()
            raise
        log.info("provisioned %d devices from the devices file (%d moved to another group)", len(setup.devices),
                 len(moved))
    ota.start()
    running = RunningServer(ota, repository)
    try:
        if setup.inference is not None:
            from edgesdk.ota_server.inference import serve_inference

            running.inference = serve_inference(repository, setup.inference, config=setup.inference_config,
                                                grpc_listen=setup.inference_grpc)
        if setup.http is not None:
            from edgesdk.ota_server.admin.client_guard import LoginLimiter, Proxies
            from edgesdk.ota_server.admin.http_api import HttpServer, create_app
            from edgesdk.ota_server.inference import parse_listen

            assert setup.token
            host, port = parse_listen(setup.http)
            # One wrong-token count per client for the API and the console: a lockout holds on both.
            proxies, limiter = Proxies(setup.behind_proxy or ""), LoginLimiter()
            app = create_app(ota, setup.token, metrics=ota.metrics, proxies=proxies, limiter=limiter)
            if setup.console:
                from edgesdk.ota_server.console import PREFIX, create_console

                app.mount(PREFIX, create_console(ota, setup.token, proxies=proxies, limiter=limiter))
            running.http = HttpServer(app, host, port).start()
    except BaseException:
        running.stop()
        raise
    return running
