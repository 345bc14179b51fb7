"""A cookie-keeping HTTP client for the console tests (urllib; forms posted as a browser posts them)."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

__all__ = ["Page", "ConsoleClient", "TOKEN"]

#: The admin token of the console tests' server.
TOKEN = "console-s3cret"


@dataclass
class Page:
    """One answer: status, final URL (after redirects) and HTML."""

    status: int
    url: str
    html: str

    def field(self, name: str, form_action: str | None = None) -> str:
        """The value of the hidden input ``name`` (in the form posting to ``form_action``, if given)."""
        html = self.html
        if form_action is not None:
            start = html.index(f'action="{form_action}"')
            html = html[start:html.index("</form>", start)]
        found = re.search(rf'name="{name}" value="([^"]*)"', html)
        if found is None:
            raise AssertionError(f"no field {name!r} on {self.url}")
        return found.group(1)


class ConsoleClient:
    """Keeps the console's cookies between requests, as a browser does."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def _open(self, request: urllib.request.Request) -> Page:
        try:
            with self.opener.open(request, timeout=30) as response:
                return Page(response.status, response.url, response.read().decode())
        except urllib.error.HTTPError as exc:
            return Page(exc.code, exc.url, exc.read().decode())

    def get(self, path: str) -> Page:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, fields: dict[str, str]) -> Page:
        body = urllib.parse.urlencode(fields).encode()
        return self._open(urllib.request.Request(self.base + path, data=body, method="POST",
                                                 headers={"Content-Type": "application/x-www-form-urlencoded"}))

    def login(self, token: str) -> Page:
        form = self.get("/ui/login")
        return self.post("/ui/login", {"login": form.field("login"), "token": token})

    def cookie(self, name: str) -> http.cookiejar.Cookie | None:
        return next((c for c in self.jar if c.name == name), None)
