"""Console sessions: signed cookies from the admin token, and a CSRF token per session.

Logging in with the admin token sets a cookie ``<expiry>.<nonce>.<signature>``: HttpOnly (no
script reads it), ``SameSite=Strict`` (no other site's page sends it), ``Path=/ui``. The
signature is an HMAC keyed by a key derived from the admin token, so every replica that shares
the token accepts the same session, and changing the token ends every session. Each form
carries ``csrf``, an HMAC of the session's nonce: a forged POST that rides on the cookie has no
way to know it. The login form, which has no session yet, carries a double-submit token (a
random value in a cookie and in the form). Logging out revokes the session's nonce in this
process (other replicas honour the cookie until it expires: 8 hours).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

__all__ = ["Sessions", "COOKIE", "LOGIN_COOKIE", "SESSION_S"]

COOKIE = "edgesdk_console"
LOGIN_COOKIE = "edgesdk_console_login"
#: How long a console session lasts.
SESSION_S = 8 * 3600.0


class Sessions:
    """Issues and checks console session cookies and CSRF tokens for one admin ``token``."""

    def __init__(self, token: str, lifetime_s: float = SESSION_S, clock: Callable[[], float] = time.time) -> None:
        self._token = token.encode()
        self._key = hmac.new(self._token, b"edgesdk console session", hashlib.sha256).digest()
        self._lifetime_s, self._clock = lifetime_s, clock
        self._revoked: set[str] = set()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def login(self, supplied: str) -> str | None:
        """A new session cookie value if ``supplied`` is the admin token, else None (compared in constant time)."""
        if not hmac.compare_digest(supplied.strip().encode(), self._token):
            return None
        body = f"{int(self._clock() + self._lifetime_s)}.{secrets.token_urlsafe(24)}"
        return f"{body}.{self._sign(body)}"

    def nonce(self, cookie: str | None) -> str | None:
        """The session's nonce if ``cookie`` is a valid, unexpired, unrevoked session; else None."""
        if not cookie or cookie.count(".") < 2:
            return None
        body, _, signature = cookie.rpartition(".")
        expires, _, nonce = body.partition(".")
        if not hmac.compare_digest(signature, self._sign(body)) or nonce in self._revoked:
            return None
        try:
            return nonce if float(expires) > self._clock() else None
        except ValueError:
            return None

    def csrf(self, nonce: str) -> str:
        """The CSRF token every form of session ``nonce`` carries."""
        return self._sign(f"csrf:{nonce}")

    def csrf_ok(self, nonce: str, supplied: str | None) -> bool:
        """Whether a form's ``csrf`` field is the session's token."""
        # As bytes: compare_digest refuses str with non-ASCII characters (a form can carry any).
        return bool(supplied) and hmac.compare_digest(str(supplied).encode("utf-8", "replace"), self.csrf(nonce).encode())

    def logout(self, nonce: str) -> None:
        """Revoke a session in this process."""
        self._revoked.add(nonce)
