"""Raw HTTP for the inference tests (urllib / http.client; no client library between the test and the server)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            method: str | None = None) -> tuple[int, Any, bytes]:
    """One request: status, headers (case-insensitive), body (an HTTP error status is returned, not raised)."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers, exc.read()


def error_of(status_body: tuple[int, Any, bytes]) -> tuple[int, str]:
    """The status and the V2 ``{"error": ...}`` message of an answer (the body must be that JSON object)."""
    status, _, body = status_body
    payload: Any = json.loads(body)
    assert set(payload) == {"error"}, payload
    return status, payload["error"]


def raw(url: str, head: list[str], chunks: list[bytes]) -> tuple[int, bytes]:
    """Send a request line and headers as given, then ``chunks``; the status and body the server answers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest("POST", parts.path, skip_accept_encoding=True)
        for line in head:
            name, _, value = line.partition(":")
            conn.putheader(name.strip(), value.strip())
        conn.endheaders()
        for chunk in chunks:
            try:
                conn.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered before taking the whole body, as it should for a 413
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
