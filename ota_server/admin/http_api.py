"""The authenticated admin API (Starlette, served by uvicorn; the ``[server]`` extra).

Every request needs ``Authorization: Bearer <token>``. Errors come back as
``{"error": message, "type": class}`` with 400 (bad request), 401, 404 (NotFoundError),
409 (ConflictError) or 413. Devices and rollouts are the JSON of the records in
:mod:`edgesdk.fleet.records`: times are ISO 8601 UTC strings, a group is ``group``, and a
rollout's ``stage`` (and each target's) is the stage number, from 1 (the canary), as the CLI and the console
number it; 0 before the first stage is sent.

    POST /api/bundles                          body: bundle tar -> {"name", "version", "stored"} (201; 200 if
                                               the identical bundle was stored already; 409 if other content)
    GET  /api/bundles                          {model: [versions]}
    POST /api/bundles/{name}/{version}/pin     {"pinned": true|false}
    POST /api/rollouts                         {"name", "version", "group", "policy": {...}, "replace": model,
                                               "allow_signature_change": bool} -> {"id", "plan", "check",
                                               "artifacts", "no_artifact"}; 409 ReleaseCheckError before
                                               anything is sent (another model, other inputs/outputs)
    GET  /api/rollouts                         list
    GET  /api/rollouts/{id}                    rollout with per-device targets and its "plan"
    POST /api/rollouts/{id}/promote|abort|rollback   rollback takes {"to": version,
                                               "all_at_once": bool}, both optional -> {"id"} of
                                               the rollback rollout (201); 409 when the rules
                                               refuse it (rollouts.analysis.rollback_rules)
    POST /api/rollouts/{id}/resume             a flagged release's catch-up goes on ->
                                               {"id", "flag": the reason it cleared}
    POST /api/groups/{group}/rollback          {"to": version, "all_at_once": bool} optional ->
                                               {"id"} (201)

A rollout's ``plan`` lists every stage its policy asked for over the group's devices at the start:
``[{"percent", "devices" (cumulative), "added", "collapsed"}]``; a collapsed wave added no device
and was merged into the stage before it (``stages`` holds the stages actually sent).
    GET  /api/devices?group=G                  devices and their state
    PUT  /api/devices/{id}/group               body: {"group": G} -> {"moved": [ids whose group changed]}
    GET  /api/groups                           each group's release (desired state) and how far its devices are
                                               from it: [GroupRelease JSON]
    GET  /api/provisioning?group=G             [{"device_id", "group", "source", "updated"}] by device id
    POST /api/provisioning                     body: {"devices": {id: group, ...}, "source": "devices file"}
                                               -> {"moved": [...], "provisioned": n}
    POST /api/measurements?device=D&mode=M&runs=N[&timeout=S]
                                               body: measurement tar (edgesdk.fleet.measurement.pack_measurement) -> {"id"}
    GET  /api/measurements/{id}                status; figures and outputs (base64 .npy) once done
    GET  /metrics                              Prometheus text (edgesdk.ota_server.admin.metrics); 404 if not enabled
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import threading
from typing import Any

from edgesdk.errors import EdgeSDKError, TransferError
from edgesdk.fleet.records import RolloutPolicy, TargetStatus, iso_time
from edgesdk.ota_server.admin.client_guard import LoginLimiter, Proxies
from edgesdk.ota_server.admin.errors import error_status
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.rollouts.stages import plan_json
from edgesdk.ota_server.server import OTAServer

__all__ = ["create_app", "HttpServer"]


def create_app(server: OTAServer, token: str, max_upload_bytes: int = 2 * 1024**3,
               metrics: ServerMetrics | None = None, console: bool = False, *, proxies: Proxies | None = None,
               limiter: LoginLimiter | None = None) -> Any:
    """The Starlette app of the admin API for ``server``, answering only requests that carry ``token``.

    ``metrics`` enables ``GET /metrics`` (same token: Prometheus sends it as ``authorization`` in
    its scrape config); without it that route answers 404. ``console`` mounts the operator
    console at ``/ui`` (:mod:`edgesdk.ota_server.console`; its login takes the same token).

    Wrong tokens count against the client (``proxies`` says who that is) in ``limiter``, the same
    :class:`~edgesdk.ota_server.admin.client_guard.LoginLimiter` the console's login uses when it is
    mounted with it: past its allowance a client is locked out of both (429 with ``Retry-After``,
    the right token included), so the console's lockout cannot be walked around through the API.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Mount, Route

    def error(status: int, exc: Exception | str) -> JSONResponse:
        return JSONResponse({"error": str(exc), "type": type(exc).__name__ if isinstance(exc, Exception) else "Error"},
                            status_code=status)

    proxies = proxies or Proxies()
    limiter = limiter or LoginLimiter()

    def locked_out(seconds: float) -> JSONResponse:
        wait = max(1, math.ceil(seconds))
        response = error(429, f"too many wrong tokens from your address: try again in {wait} s")
        response.headers["Retry-After"] = str(wait)
        return response

    def guarded(handler: Any) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            client = proxies.client(request)
            if (wait := limiter.retry_after(client)) > 0:  # refused unread: a locked-out client learns nothing
                return locked_out(wait)
            supplied = request.headers.get("authorization", "")
            if not hmac.compare_digest(supplied.encode(), f"Bearer {token}".encode()):
                if (wait := limiter.failed(client)) > 0:
                    return locked_out(wait)
                return error(401, "missing or wrong token; pass --token or set EDGESDK_TOKEN")
            limiter.succeeded(client)
            try:
                return await handler(request)
            except EdgeSDKError as exc:
                return error(error_status(exc), exc)
            except (ValueError, KeyError, TypeError) as exc:
                return error(400, f"malformed request: {exc}")
        return endpoint

    async def capped_body(request: Request, what: str) -> bytes | JSONResponse:
        size = int(request.headers.get("content-length") or 0)
        if size > max_upload_bytes:
            return error(413, f"{what} of {size} bytes is over the {max_upload_bytes}-byte cap")
        body = await request.body()
        if len(body) > max_upload_bytes:
            return error(413, f"{what} of {len(body)} bytes is over the {max_upload_bytes}-byte cap")
        return body

    async def upload(request: Request) -> JSONResponse:
        body = await capped_body(request, "bundle")
        if isinstance(body, JSONResponse):
            return body
        result = await run_in_threadpool(server.upload, body)
        return JSONResponse(result, status_code=201 if result["stored"] else 200)

    def number(request: Request, name: str, kind: type[int] | type[float], default: Any) -> Any:
        text = request.query_params.get(name)
        if text is None:
            return default
        try:
            return kind(text)
        except ValueError:
            raise TransferError(f"query parameter {name}={text!r} is not a {kind.__name__}") from None

    async def request_measurement(request: Request) -> JSONResponse:
        device, mode = request.query_params.get("device"), request.query_params.get("mode", "latency")
        if not device:
            raise TransferError("query parameter 'device' is missing; pass ?device=ID (see `edgesdk devices`)")
        runs, timeout = number(request, "runs", int, 50), number(request, "timeout", float, None)
        body = await capped_body(request, "measurement archive")
        if isinstance(body, JSONResponse):
            return body
        measurement_id = await run_in_threadpool(server.request_measurement, device, body, mode, runs, timeout)
        return JSONResponse({"id": measurement_id}, status_code=201)

    async def measurement(request: Request) -> JSONResponse:
        return JSONResponse(server.measurement(request.path_params["id"]))

    async def bundles(request: Request) -> JSONResponse:
        return JSONResponse({name: server.repo.versions(name) for name in server.repo.models()})

    async def pin(request: Request) -> JSONResponse:
        data = await request.json()
        server.repo.pin(request.path_params["name"], request.path_params["version"], bool(data.get("pinned", True)))
        return JSONResponse({"pinned": bool(data.get("pinned", True))})

    async def create_rollout(request: Request) -> JSONResponse:
        data = await request.json()
        policy = RolloutPolicy.from_dict(data.get("policy") or {})
        release = str(data["name"]), str(data["version"]), str(data["group"])
        replace = str(data["replace"]) if data.get("replace") else None
        allow = bool(data.get("allow_signature_change", False))
        rollout_id, check = await run_in_threadpool(lambda: server.start_release(*release, policy, replace=replace,
                                                                                 allow_signature_change=allow))
        started = await run_in_threadpool(server.status, rollout_id, targets=False)
        return JSONResponse({"id": rollout_id, "plan": plan_json(started), "check": check.to_json(),
                             "artifacts": server.repo.artifacts(release[0], release[1]),
                             "no_artifact": started.count(TargetStatus.NO_ARTIFACT)}, status_code=201)

    async def rollouts(request: Request) -> JSONResponse:
        return JSONResponse([r.to_json() for r in server.db.rollouts()])

    def page(request: Request) -> dict[str, Any]:
        """``limit`` (default and cap: a page of 1,000 / 10,000) and ``after`` of a paged list."""
        limit = number(request, "limit", int, _PAGE)
        if not 0 <= limit <= _MAX_PAGE:
            raise EdgeSDKError(f"limit={limit} must be 0..{_MAX_PAGE}; page with ?after=<last id>")
        return {"limit": limit, "after": request.query_params.get("after") or None}

    async def rollout(request: Request) -> JSONResponse:
        stage = request.query_params.get("stage")
        status = request.query_params.get("status")
        try:
            selection = {"stage": int(stage) - 1 if stage else None,
                         "status": TargetStatus(status) if status else None}
        except ValueError:
            raise EdgeSDKError(f"stage={stage!r} must be a stage number (1 is the canary) and status={status!r} one of "
                               f"{', '.join(s.value for s in TargetStatus)}") from None
        r = await run_in_threadpool(server.status, request.path_params["id"], **page(request), **selection)
        return JSONResponse({**r.to_json(), "plan": plan_json(r)})

    async def action(request: Request) -> JSONResponse:
        rollout_id, verb = request.path_params["id"], request.path_params["action"]
        if verb == "promote":
            await run_in_threadpool(server.promote, rollout_id)
            return JSONResponse({"id": rollout_id})
        if verb == "abort":
            await run_in_threadpool(server.abort, rollout_id)
            return JSONResponse({"id": rollout_id})
        if verb == "rollback":
            body = await request.json() if await request.body() else {}
            to, all_at_once = _rollback_request(body)
            new_id = await run_in_threadpool(server.rollback, rollout_id, to, all_at_once)
            return JSONResponse({"id": new_id}, status_code=201)
        if verb == "resume":
            flag = await run_in_threadpool(server.resume, rollout_id)
            return JSONResponse({"id": rollout_id, "flag": flag})
        return error(404, f"unknown action {verb!r}; use promote, abort, rollback or resume")

    async def group_rollback(request: Request) -> JSONResponse:
        to, all_at_once = _rollback_request(await request.json() if await request.body() else {})
        new_id = await run_in_threadpool(server.rollback_group, request.path_params["group"], to,
                                         all_at_once)
        return JSONResponse({"id": new_id}, status_code=201)

    async def devices(request: Request) -> JSONResponse:
        group, status = request.query_params.get("group"), request.query_params.get("status")
        paging = page(request)

        def read() -> dict[str, Any]:
            found = server.db.devices(group, status=status, after=paging["after"], limit=paging["limit"] + 1)
            more = len(found) > paging["limit"]
            found = found[:paging["limit"]]
            return {"devices": [d.to_json() for d in found], "total": server.db.device_total(group, status),
                    "next": found[-1].id if more and found else None}

        return JSONResponse(await run_in_threadpool(read))

    async def groups(request: Request) -> JSONResponse:
        return JSONResponse([g.to_json() for g in await run_in_threadpool(server.groups_status)])

    async def provisioning(request: Request) -> JSONResponse:
        found = await run_in_threadpool(server.db.provisioning, request.query_params.get("group") or None)
        return JSONResponse([{"device_id": p.device_id, "group": p.group, "source": p.source,
                              "updated": iso_time(p.updated)} for p in found])

    async def provision(request: Request) -> JSONResponse:
        data = await request.json()
        devices, source = _provisioning_request(data)
        moved = await run_in_threadpool(server.provision, devices, source)
        return JSONResponse({"moved": moved, "provisioned": len(devices)})

    async def set_group(request: Request) -> JSONResponse:
        data = await request.json()
        group = data.get("group") if isinstance(data, dict) else None
        if not isinstance(group, str):
            raise EdgeSDKError(f'the body must be {{"group": GROUP}}, got {str(data)[:200]}')
        moved = await run_in_threadpool(server.provision, {request.path_params["id"]: group})
        return JSONResponse({"moved": moved, "provisioned": 1})

    async def prometheus(request: Request) -> Response:
        if metrics is None:
            return error(404, "metrics are not enabled on this server; pass metrics=ServerMetrics(db) to create_app")
        body, content_type = await run_in_threadpool(metrics.render)
        return Response(body, media_type=content_type)

    routes: list[Any] = []
    if console:
        from edgesdk.ota_server.console import PREFIX, create_console

        routes.append(Mount(PREFIX, app=create_console(server, token, proxies=proxies, limiter=limiter)))
    return Starlette(routes=[
        *routes,
        Route("/api/bundles", guarded(upload), methods=["POST"]),
        Route("/api/bundles", guarded(bundles), methods=["GET"]),
        Route("/api/bundles/{name}/{version}/pin", guarded(pin), methods=["POST"]),
        Route("/api/rollouts", guarded(create_rollout), methods=["POST"]),
        Route("/api/rollouts", guarded(rollouts), methods=["GET"]),
        Route("/api/rollouts/{id}", guarded(rollout), methods=["GET"]),
        Route("/api/rollouts/{id}/{action}", guarded(action), methods=["POST"]),
        Route("/api/devices", guarded(devices), methods=["GET"]),
        Route("/api/devices/{id}/group", guarded(set_group), methods=["PUT"]),
        Route("/api/groups", guarded(groups), methods=["GET"]),
        Route("/api/groups/{group}/rollback", guarded(group_rollback), methods=["POST"]),
        Route("/api/provisioning", guarded(provisioning), methods=["GET"]),
        Route("/api/provisioning", guarded(provision), methods=["POST"]),
        Route("/api/measurements", guarded(request_measurement), methods=["POST"]),
        Route("/api/measurements/{id}", guarded(measurement), methods=["GET"]),
        Route("/metrics", guarded(prometheus), methods=["GET"]),
    ])


def _rollback_request(data: Any) -> tuple[str | None, bool]:
    """The version (None: the rules' default) and ``all_at_once`` of a rollback's body, or
    EdgeSDKError (400)."""
    to = data.get("to") if isinstance(data, dict) else None
    all_at_once = data.get("all_at_once", False) if isinstance(data, dict) else False
    if (not isinstance(data, dict) or (to is not None and not isinstance(to, str))
            or not isinstance(all_at_once, bool)):
        raise EdgeSDKError('the body must be {"to": VERSION, "all_at_once": true|false} (both '
                           f"optional) or empty, got {str(data)[:200]}")
    return to or None, all_at_once


def _provisioning_request(data: Any) -> tuple[dict[str, str], str]:
    """The devices (id -> group) and source of a ``POST /api/provisioning`` body, or EdgeSDKError (400) saying
    what is wrong with it; the ids themselves are checked by :meth:`OTAServer.provision`."""
    devices = data.get("devices") if isinstance(data, dict) else None
    source = data.get("source", "admin api") if isinstance(data, dict) else None
    if not isinstance(devices, dict) or not devices:
        raise EdgeSDKError('the body must be {"devices": {DEVICE_ID: GROUP, ...}, "source": TEXT} with at least one '
                           f"device, got {str(data)[:200]}")
    wrong = [f"{k!r}: {v!r}" for k, v in devices.items() if not isinstance(v, str)]
    if wrong:
        raise EdgeSDKError(f"each device's group must be a string, got {', '.join(wrong[:5])}")
    if not isinstance(source, str) or not 0 < len(source) <= _MAX_SOURCE:
        raise EdgeSDKError(f"source must be a text of 1-{_MAX_SOURCE} characters saying where the groups come from "
                           f"(e.g. \"devices file\"), got {str(source)[:100]!r}")
    return devices, source


#: The longest ``source`` a provisioning request may give (it is shown beside every device it placed).
_MAX_SOURCE = 64

#: Devices or targets in one answer unless ``?limit=`` asks otherwise, and the most one answer holds.
_PAGE, _MAX_PAGE = 1000, 10_000


def _quiet_server(config: Any) -> Any:
    """A uvicorn server whose housekeeping wakes once a second, not ten times (uvicorn's tick refreshes the Date
    header once a second and checks for exit; ten wake-ups a second were most of an idle server's HTTP thread), and
    at once when :meth:`HttpServer.stop` asks it to exit."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        wake: asyncio.Event | None = None
        loop: asyncio.AbstractEventLoop | None = None

        async def main_loop(self) -> None:
            self.wake, self.loop = asyncio.Event(), asyncio.get_running_loop()
            counter = 0  # on_tick refreshes the Date header at multiples of 10 (its tenths of a second)
            while not await self.on_tick(counter):
                counter = (counter + 10) % 864000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 1.0)

        def exit_soon(self) -> None:
            self.should_exit = True
            if self.loop is not None and self.wake is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed already
                    self.loop.call_soon_threadsafe(self.wake.set)

    return QuietServer(config)


class HttpServer:
    """uvicorn in a background thread (loopback by default)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8080) -> None:
        import uvicorn

        # proxy_headers off: uvicorn would believe X-Forwarded-* from any loopback peer; the console trusts only the
        # proxies named with --behind-proxy (edgesdk.ota_server.admin.client_guard).
        self._server = _quiet_server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                                    proxy_headers=False))
        self._thread = threading.Thread(target=self._server.run, name="admin-http", daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self, timeout: float = 10.0) -> HttpServer:
        """Serve in the background; returns once uvicorn listens (EdgeSDKError if it does not within ``timeout`` s)."""
        import time

        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise EdgeSDKError(f"admin HTTP server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for its thread."""
        self._server.exit_soon()
        self._thread.join(timeout=10)
