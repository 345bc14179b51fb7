"""Fleet fixtures: the OTA ones (a real mosquitto, session keys, signed bundles, a real server via build_server)."""

from __future__ import annotations

from tests.ota.conftest import broker, bundles, keys, start_server, wait_for

__all__ = ["broker", "bundles", "keys", "start_server", "wait_for"]
