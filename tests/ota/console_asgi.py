"""The console app called in-process over ASGI, for what a socket client cannot choose: the connection's scheme
(https), its peer address (a proxy or not), and a body fed chunk by chunk (to see where reading stops).

``console_server`` builds a real server without a broker: a real FleetDB and model repository, the admin app with the
console mounted as ``edgesdk server --ui`` mounts it, devices in the store and one running rollout.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.admin.client_guard import LoginLimiter, Proxies
from edgesdk.ota_server.admin.http_api import create_app
from edgesdk.ota_server.console import PREFIX, create_console
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.server import OTAServer, ServerConfig
from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

__all__ = ["Answer", "AsgiConsole", "console_server", "TOKEN"]

TOKEN = "console-s3cret"


@dataclass
class Answer:
    """One response: status, headers (lower-case names, every value), body, and how many body bytes the app read."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    read: int = 0

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def cookies(self) -> dict[str, str]:
        """Each ``Set-Cookie`` by cookie name: the whole header line (to check its attributes)."""
        return {v.split("=", 1)[0].strip(): v for k, v in self.headers if k == "set-cookie"}

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass
class AsgiConsole:
    """Sends requests to an ASGI app, keeping cookies like a browser (per path, no expiry handling)."""

    app: Any
    scheme: str = "http"
    client: tuple[str, int] = ("198.51.100.7", 40000)
    jar: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, body: bytes | Iterable[bytes] = b"",
                headers: Iterable[tuple[str, str]] = (), client: tuple[str, int] | None = None,
                scheme: str | None = None) -> Answer:
        # A loop of its own, never set as the thread's current one: asyncio.run would leave the main thread
        # with "no current event loop", which breaks later tests in this worker that ask for one (amqtt does).
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self._request(method, path, body, list(headers), client or self.client,
                                                         scheme or self.scheme))
        finally:
            loop.close()

    async def _request(self, method: str, path: str, body: bytes | Iterable[bytes], headers: list[tuple[str, str]],
                       client: tuple[str, int], scheme: str) -> Answer:
        chunks: Iterator[bytes] = iter([body] if isinstance(body, bytes) else body)
        pending = next(chunks, None)
        read = 0
        if self.jar:
            headers.append(("cookie", "; ".join(f"{k}={v}" for k, v in self.jar.items())))
        path, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": scheme, "path": unquote(path), "raw_path": path.encode(), "query_string": query.encode(),
                 "root_path": "", "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers],
                 "client": client, "server": ("console.example", 443 if scheme == "https" else 80)}
        sent: dict[str, Any] = {"status": 0, "headers": [], "body": bytearray()}

        async def receive() -> dict[str, Any]:
            nonlocal pending, read
            if pending is None:
                await asyncio.sleep(3600)  # the app waits for a body that never ends: the caller's timeout says so
            chunk, pending = pending, next(chunks, None)
            read += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": pending is not None}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                sent["headers"] = [(k.decode().lower(), v.decode("latin-1")) for k, v in message["headers"]]
            elif message["type"] == "http.response.body":
                sent["body"] += message.get("body", b"")

        await asyncio.wait_for(self.app(scope, receive, send), timeout=30)
        answer = Answer(sent["status"], sent["headers"], bytes(sent["body"]), read)
        for name, line in answer.cookies().items():
            value = line.split("=", 1)[1].split(";", 1)[0].strip('"')
            if "max-age=0" in line.lower() or not value:
                self.jar.pop(name, None)
            else:
                self.jar[name] = value
        return answer

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, fields: dict[str, str] | bytes | Iterable[bytes], **kw: Any) -> Answer:
        body = urlencode(fields).encode() if isinstance(fields, dict) else fields
        headers = [("content-type", "application/x-www-form-urlencoded"), *kw.pop("headers", ())]
        if isinstance(body, bytes):
            headers.append(("content-length", str(len(body))))
        return self.request("POST", path, body=body, headers=headers, **kw)

    def field(self, answer: Answer, name: str) -> str:
        found = re.search(rf'name="{name}" value="([^"]*)"', answer.text)
        assert found, f"no field {name!r} in {answer.text[:300]}"
        return found.group(1)

    def login(self, token: str = TOKEN, **kw: Any) -> Answer:
        form = self.get(f"{PREFIX}/login", **kw)
        return self.post(f"{PREFIX}/login", {"login": self.field(form, "login"), "token": token}, **kw)


def console_server(folder: Path, keys: dict, bundle: Path, devices: dict[str, str | None], proxies: str = "",
                   limiter: LoginLimiter | None = None) -> tuple[OTAServer, Any, str]:
    """A server (never started: no broker) with ``devices`` (id -> details JSON text, or None) in group ``cams``
    running digits 0.9.0, ``bundle`` (digits 1.0.0) stored, and a rollout of it held at its canary: (server, the
    admin app with the console, the rollout's id)."""
    repo = ModelRepository(folder / "repo", signer_key=keys["converter_pub"])
    db = FleetDB(folder / "fleet.db")
    server = OTAServer(ServerConfig("mqtt://127.0.0.1:1"), repo, db, keys["server"])
    repo.add(bundle)
    db.upsert_devices([DeviceState(d, "cams", "online", "digits", "0.9.0", ("a",), time.time(), details=details)
                       for d, details in devices.items()])
    rollout = server.start_rollout("digits", "1.0.0", "cams", RolloutPolicy(analysis=False, canary=0.3, waves=(1.0,),
                                                                            health_window_s=3600))
    # As the server wires them: one wrong-token count for the admin API and the console.
    limiter = limiter or LoginLimiter()
    app = create_app(server, TOKEN, metrics=server.metrics, proxies=Proxies(proxies), limiter=limiter)
    app.mount(PREFIX, create_console(server, TOKEN, proxies=Proxies(proxies), limiter=limiter))
    return server, app, rollout
