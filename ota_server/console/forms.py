"""The console's capped forms (who sent a request, and how many wrong tokens it may try, is
:mod:`edgesdk.ota_server.admin.client_guard`, shared with the admin API).

A console form is a few short fields: a body over :data:`FORM_MAX_BYTES` is refused with 413, and
  reading stops at the cap (a declared ``Content-Length`` over it is refused before any byte is read).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

__all__ = ["FORM_MAX_BYTES", "read_form"]

#: The largest console form body accepted (the login form and the action forms are under 300 bytes).
FORM_MAX_BYTES = 4096


async def read_form(request: Any, cap: int = FORM_MAX_BYTES) -> dict[str, str] | None:
    """A urlencoded form's fields (the last value of each), or None when the body is over ``cap`` bytes: then no more
    than ``cap`` bytes (plus the chunk that crossed it) were read."""
    declared = request.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > cap):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            return None
    text = body.decode("utf-8", "replace")
    return {key: values[-1] for key, values in parse_qs(text).items()}
