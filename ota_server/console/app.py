"""The console's Starlette app, mounted at ``/ui`` on the admin address (``create_app(..., console=True)``).

Server-rendered Jinja2 pages, a stylesheet and one small script (the live rollout view's
``EventSource``), all served from the package: no CDN, no build step.

    GET  /ui/login, POST /ui/login, POST /ui/logout     the admin token in, a session cookie out
    GET  /ui/                                          fleet: groups, counts, a page of devices
    GET  /ui/groups                                    each group's release, devices converged and behind, flagged
    GET  /ui/devices/{id}                              one device
    GET  /ui/rollouts, /ui/rollouts/{id}               rollouts; one rollout's stages, failures, versions
    GET  /ui/rollouts/{id}/live                        server-sent events: the rollout's progress as it changes
    POST /ui/rollouts/{id}/{promote|abort|rollback|resume}
                                                       a confirmation page, then the action (the
                                                       API's code path); a rollback the rules
                                                       refuse gets 409 with the API's message
                                                       (views.rollback_refusal); resume: a
                                                       flagged release
    GET  /ui/repository                                models, versions, sizes, signers, conversion figures

Every page but the login needs the session cookie (a GET without one is sent to the login page,
a POST or event stream gets 403); every POST needs the session's CSRF token (403 without it).
Cookies are ``Secure`` when the client came over HTTPS (itself, or said by a proxy the operator trusts);
wrong tokens lock a client out for a growing time (429; :mod:`edgesdk.ota_server.admin.client_guard`, one count
with the admin API); form bodies over 4 KiB get 413, unread (:mod:`.forms`). A device's malformed details show as
"—" and a note, never an error (:mod:`.details`).
Times, stages, statuses, boards and verdicts are written one way on every page (:mod:`.display`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError
from edgesdk.ota_server.admin.client_guard import LoginLimiter, Proxies
from edgesdk.ota_server.admin.errors import error_status
from edgesdk.ota_server.server import OTAServer

from . import views
from .display import board, status_pill, status_text, when
from .forms import FORM_MAX_BYTES, read_form
from .session import COOKIE, LOGIN_COOKIE, SESSION_S, Sessions

__all__ = ["create_console", "PREFIX"]

PREFIX = "/ui"
_HERE = Path(__file__).resolve().parent
#: How often the live view looks for a change, and how often it sends a keep-alive comment.
POLL_S, KEEPALIVE_S = 0.5, 15.0
#: Cap on one event stream (the page reconnects by itself).
STREAM_S = 3600.0
#: The error page's heading by status (the admin API's statuses: ``admin_errors.error_status``).
_TITLES = {404: "Not found", 409: "Not possible now", 400: "Refused"}
_HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
            "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff"}


def _dash(value: Any) -> Any:
    return "—" if value is None else value


def _ms(value: float | None) -> str:
    return "—" if value is None else str(round(value, 2))


def _mb(value: int | None) -> str:
    return "—" if value is None else f"{value / 1048576:.1f}"


def create_console(server: OTAServer, token: str, proxies: Proxies | None = None,
                   limiter: LoginLimiter | None = None) -> Any:
    """The console app for ``server``, its sessions keyed by the admin ``token``.

    ``proxies``: the reverse proxies whose ``X-Forwarded-Proto``/``-For`` are believed (default none);
    ``limiter``: wrong-token lockouts per client (default
    :class:`~edgesdk.ota_server.admin.client_guard.LoginLimiter`'s 5 free, then 30 s doubling).
    """
    import secrets

    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    sessions = Sessions(token)
    proxies = proxies or Proxies()
    limiter = limiter or LoginLimiter()
    metrics = getattr(server, "metrics", None)
    templates = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(["html"]))
    templates.filters.update(quote=lambda text: quote(str(text), safe=""), dash=_dash, ms=_ms, mb=_mb, when=when,
                             status=status_text, pill=status_pill, board=board)

    def render(template: str, code: int = 200, headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
        context.setdefault("now", time.time())
        html = templates.get_template(template).render(prefix=PREFIX, **context)
        return HTMLResponse(html, status_code=code, headers={**_HEADERS, **(headers or {})})

    def too_large() -> HTMLResponse:
        return render("error.html", 413, title="Too large", message=f"a console form is at most {FORM_MAX_BYTES} "
                      "bytes; this one is larger and was not read")

    def refused_login(reason: str) -> None:
        if metrics is not None and hasattr(metrics, "console_login_refused"):
            metrics.console_login_refused(reason)

    def session_of(request: Request) -> str | None:
        return sessions.nonce(request.cookies.get(COOKIE))

    def page(handler: Any) -> Any:
        """A page behind the session (and, for a POST, its CSRF token); store errors become error pages."""
        async def endpoint(request: Request) -> Response:
            nonce = session_of(request)
            if nonce is None:
                if request.method == "GET" and not request.url.path.endswith("/live"):
                    return RedirectResponse(f"{PREFIX}/login", status_code=303)
                return render("error.html", 403, title="Not logged in", message="log in with the admin token first")
            fields = await read_form(request) if request.method == "POST" else {}
            if fields is None:
                return too_large()
            if request.method == "POST" and not sessions.csrf_ok(nonce, fields.get("csrf")):
                return render("error.html", 403, title="Refused", message="the form's CSRF token is missing or "
                              "wrong; reload the page and submit it again")
            request.state.csrf, request.state.fields = sessions.csrf(nonce), fields
            try:
                response: Response = await handler(request)
                return response
            except EdgeSDKError as exc:
                code = error_status(exc)
                return render("error.html", code, title=_TITLES[code], message=str(exc), csrf=request.state.csrf)
        return endpoint

    async def login_form(request: Request) -> Response:
        login_token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
        response = render("login.html", login_token=login_token, error=None)
        response.set_cookie(LOGIN_COOKIE, login_token, httponly=True, samesite="strict", path=PREFIX,
                            secure=proxies.https(request))
        return response

    def locked_out(login_token: str, seconds: float) -> HTMLResponse:
        wait, now = max(1, math.ceil(seconds)), time.time()
        return render("login.html", 429, headers={"Retry-After": str(wait)}, login_token=login_token,
                      error="too many wrong admin tokens from your address: try again", retry_at=now + wait, now=now)

    async def login(request: Request) -> Response:
        client = proxies.client(request)
        expected = request.cookies.get(LOGIN_COOKIE) or ""
        if (wait := limiter.retry_after(client)) > 0:  # refused unread: a locked-out client learns nothing
            refused_login("locked_out")
            return locked_out(expected, wait)
        fields = await read_form(request)
        if fields is None:
            return too_large()
        cookie = sessions.login(fields.get("token", "")) if expected and fields.get("login") == expected else None
        if cookie is None:
            refused_login("wrong_token")
            if (wait := limiter.failed(client)) > 0:
                return locked_out(expected, wait)
            return render("login.html", 401, login_token=expected, error="wrong or missing admin token")
        limiter.succeeded(client)
        response = RedirectResponse(f"{PREFIX}/", status_code=303)
        response.set_cookie(COOKIE, cookie, max_age=int(SESSION_S), httponly=True, samesite="strict", path=PREFIX,
                            secure=proxies.https(request))
        return response

    async def logout(request: Request) -> Response:
        nonce = session_of(request)
        if nonce is not None:
            sessions.logout(nonce)
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=proxies.https(request))
        return response

    async def fleet(request: Request) -> Response:
        q = request.query_params
        data = await run_in_threadpool(views.fleet, server, q.get("group"), q.get("status"), q.get("after"))
        return render("fleet.html", csrf=request.state.csrf, **data)

    async def groups(request: Request) -> Response:
        return render("groups.html", csrf=request.state.csrf, groups=await run_in_threadpool(views.groups, server))

    async def device(request: Request) -> Response:
        data = await run_in_threadpool(views.device, server, request.path_params["id"])
        if data is None:
            raise NotFoundError(f"no device {request.path_params['id']!r} has reported")
        return render("device.html", csrf=request.state.csrf, **data)

    async def rollouts(request: Request) -> Response:
        return render("rollouts.html", csrf=request.state.csrf, rollouts=await run_in_threadpool(views.rollouts, server))

    async def rollout(request: Request) -> Response:
        data = await run_in_threadpool(views.rollout, server, request.path_params["id"])
        return render("rollout.html", csrf=request.state.csrf, **data)

    async def live(request: Request) -> Response:
        rollout_id = request.path_params["id"]
        first = await run_in_threadpool(views.progress, server, rollout_id)  # NotFoundError before the stream

        async def events() -> Any:
            last, quiet, loop = None, 0.0, asyncio.get_running_loop()
            started = loop.time()
            current = first
            while loop.time() - started < STREAM_S and not await request.is_disconnected():
                if current != last:
                    yield f"event: progress\ndata: {json.dumps(current)}\n\n"
                    last, quiet = current, 0.0
                elif quiet >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    quiet = 0.0
                await asyncio.sleep(POLL_S)
                quiet += POLL_S
                current = await run_in_threadpool(views.progress, server, rollout_id)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def action(request: Request) -> Response:
        rollout_id, verb = request.path_params["id"], request.path_params["action"]
        if verb not in ("promote", "abort", "rollback", "resume"):
            raise NotFoundError(f"unknown action {verb!r}; use promote, abort, rollback or resume")
        fields = request.state.fields
        summary = await run_in_threadpool(server.status, rollout_id, targets=False)
        to = fields.get("to") or None
        refusal = views.rollback_refusal
        if verb == "rollback" and (why := await run_in_threadpool(refusal, server, summary, to)):
            raise ConflictError(why)  # the API's words: one set of rules
        if fields.get("confirm") != "yes":
            return render("confirm.html", csrf=request.state.csrf, verb=verb, rollout=summary.to_json())
        if verb == "promote":
            await run_in_threadpool(server.promote, rollout_id)
        elif verb == "abort":
            await run_in_threadpool(server.abort, rollout_id, "aborted from the console")
        elif verb == "resume":
            await run_in_threadpool(server.resume, rollout_id)
        else:
            at_once = fields.get("all_at_once") == "yes"
            rollout_id = await run_in_threadpool(server.rollback, rollout_id, to, at_once)
        return RedirectResponse(f"{PREFIX}/rollouts/{quote(rollout_id, safe='')}", status_code=303)

    async def repository(request: Request) -> Response:
        return render("repository.html", csrf=request.state.csrf,
                      models=await run_in_threadpool(views.repository, server))

    return Starlette(routes=[
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", page(logout), methods=["POST"]),
        Route("/", page(fleet), methods=["GET"]),
        Route("/groups", page(groups), methods=["GET"]),
        Route("/devices/{id}", page(device), methods=["GET"]),
        Route("/rollouts", page(rollouts), methods=["GET"]),
        Route("/rollouts/{id}", page(rollout), methods=["GET"]),
        Route("/rollouts/{id}/live", page(live), methods=["GET"]),
        Route("/rollouts/{id}/{action}", page(action), methods=["POST"]),
        Route("/repository", page(repository), methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=_HERE / "static"), name="static"),
    ])
