"""How a failed admin request answers: the one status mapping the admin API and the console share."""

from __future__ import annotations

from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError

__all__ = ["error_status"]


def error_status(exc: EdgeSDKError) -> int:
    """The status an admin request that failed with ``exc`` gets: 404 unknown, 409 not possible now, else 400."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    return 400
