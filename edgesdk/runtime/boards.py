"""Which boards may run a bundle: one rule for the runtime's note, the server's artifact choice and pre-send checks.

A bundle is planned for one device profile (``target_profile`` in its manifest). It fits

- a board of the same profile name (the plan describes that board), and
- when it is a ``generic-<arch>`` bundle, any board whose CPU architecture is ``<arch>``
  (``generic-aarch64`` runs on every aarch64 board, with figures that describe none in
  particular).

A release may hold one bundle (an *artifact*) per profile, as Mender artifacts declare a
``device_type`` and an OCI index holds one image per platform. A device gets the artifact of
its own profile when there is one, else the ``generic-<arch>`` one of its architecture, else
nothing: it is never sent a bundle planned for another board.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["fits", "artifact_for", "GENERIC_PREFIX"]

GENERIC_PREFIX = "generic-"


def fits(target_profile: str, profile: str | None, arch: str | None) -> bool:
    """True when a bundle planned for ``target_profile`` may run on a board of ``profile`` and ``arch``."""
    if profile is not None and target_profile == profile:
        return True
    return arch is not None and target_profile == f"{GENERIC_PREFIX}{arch}"


def artifact_for(artifacts: Collection[str], profile: str | None, arch: str | None) -> str | None:
    """The artifact (target profile) of ``artifacts`` a board of ``profile`` and ``arch`` gets, or None.

    Its own profile first, then ``generic-<arch>``. A device that reports no board at all (an agent
    older than per-board releases) gets a release only when the release has a single artifact, as
    before; it is never chosen between two.
    """
    if profile is not None and profile in artifacts:
        return profile
    if arch is not None and f"{GENERIC_PREFIX}{arch}" in artifacts:
        return f"{GENERIC_PREFIX}{arch}"
    if profile is None and arch is None and len(artifacts) == 1:
        return next(iter(artifacts))
    return None
