"""The admin API's HTTP server (uvicorn in a thread): its housekeeping wakes once a second while idle, not ten times,
and it still answers with a Date header and stops when asked."""

from __future__ import annotations

import time
import urllib.request

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from edgesdk.ota_server.admin.http_api import HttpServer
from edgesdk.ota_server.broker import free_port


def test_an_idle_http_server_wakes_once_a_second_answers_with_a_date_and_stops():
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    http = HttpServer(app, port=free_port())
    ticks: list[int] = []
    on_tick = http._server.on_tick

    async def counting(counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(counter)

    http._server.on_tick = counting
    http.start()
    try:
        with urllib.request.urlopen(http.url, timeout=10) as answer:
            assert answer.read() == b"ok" and answer.headers["Date"], "uvicorn's Date header is still set"
        time.sleep(2.5)
        # uvicorn's own loop ticks every 0.1 s: ~25 here. A slow machine only makes fewer.
        assert 1 <= len(ticks) <= 5, f"{len(ticks)} housekeeping wake-ups in 2.5 s while idle"
        assert all(c % 10 == 0 for c in ticks), "each tick refreshes the Date header (uvicorn does at multiples of 10)"
    finally:
        http.stop()
    assert not http._thread.is_alive(), "stop() ended the server's thread"
