"""Raw HTTP for the inference tests (urllib / http.client; no client library between the test and the server)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families


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


def wait_until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` every 5 ms; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def sample(endpoint, metric: str, suffix: str, model: str = "mlp") -> float:
    """The sum of ``metric + suffix`` samples for ``model`` in the endpoint's /metrics."""
    text = request(f"{endpoint.url}/metrics")[2].decode()
    for family in text_string_to_metric_families(text):
        if family.name == metric:
            return sum(s.value for s in family.samples if s.name == metric + suffix and s.labels.get("model") == model)
    raise AssertionError(f"{metric} not in /metrics")
